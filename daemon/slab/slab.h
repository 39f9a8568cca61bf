/* SPDX-License-Identifier: MIT */
/*
 * A small-object allocator apart from malloc's heap, for objects whose
 * lifetimes interleave with the heap's in a way that pins it: libevent's
 * (event_set_mem_functions). After a wave of clients, libevent's per-fd
 * records (one per fd number ever added to the loop, kept until the loop is
 * freed) were the live objects left between the freed connections', each
 * pinning a page of the heap that malloc_trim cannot give back
 * (docs/benchmarks.md, "RSS after clients left").
 *
 * Objects up to SLAB_MAX_SMALL bytes come from 64 KiB slabs of one size
 * class each, mmap'd apart from the heap; a slab whose last object is freed
 * is unmapped (one empty slab a class is kept, its pages given back with
 * MADV_DONTNEED). So long-lived objects of one size sit together, and a
 * size class whose objects all went gives all its memory back. Larger
 * objects get a mapping of their own. Thread-safe (one mutex; the callers
 * are few and mostly the main thread).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define SLAB_MAX_SMALL 4096

/* Like malloc, realloc and free (free and realloc take NULL; realloc to 0 frees and returns NULL). */
void *slab_malloc(size_t n);
void *slab_realloc(void *p, size_t n);
void slab_free(void *p);

/* What the allocator holds now. */
struct slab_stats {
	uint64_t objects;      /* live objects */
	uint64_t bytes;        /* their bytes, as asked */
	uint64_t mapped_bytes; /* mapped for them: slabs (empty ones kept included) and large objects' mappings */
	uint64_t slabs;        /* small-object slabs mapped */
};
void slab_stats(struct slab_stats *ret);
