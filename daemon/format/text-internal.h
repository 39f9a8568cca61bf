/* SPDX-License-Identifier: MIT */
/* The private half of text.c (text.h): what text.c and text_build.c share. */
#pragma once

#include <stdint.h>

#include "daemon/format/text.h"

/* "gzip", "zstd" or "plain", for messages. */
const char *text_codec_name(enum text_codec c);

/*
 * A compressed shard's copy made by the pass that indexes it (text.c,
 * index_now: text_index(), when its window comes up; never a whole-corpus
 * load's index, nor the background count's): its bytes kept in memory
 * while they fit in TEXT_MEM_MAX (what text_build_mem() makes), else
 * written on the way to the cache entry data_path within cache_max_bytes
 * (what text_build_copy() writes; data_path NULL: not kept). Given up,
 * never failing the index, when it cannot be kept (no room, no memory):
 * then neither is set, and the copy is made on use as before.
 */
struct text_keep {
	const char *data_path, *cache_dir;
	uint64_t cache_max_bytes;
	uint8_t *mem;  /* out: the copy (s->bytes of it) when it fit in memory; the caller's to free */
	bool file;     /* out: the copy was committed to data_path */
};

/*
 * Indexes the shard s (its source open as src) in one streaming pass: n_docs,
 * offsets, lengths, lines, bytes and truncated of s. A compressed or Parquet
 * shard's copy is written on the way to the cache entry data_path (with its
 * checksums, within o->cache_max_bytes), or into mem (at most mem_cap bytes),
 * or nowhere (both NULL: the index only); keep (non-NULL, with neither):
 * the copy kept as text_keep says. Returns 0 or a negative errno with a
 * message naming the file in err.
 */
int text_build_index(struct text_shard *s, struct source *src, const struct text_open_opts *o, const char *data_path,
		     uint8_t *mem, uint64_t mem_cap, struct text_keep *keep, struct source_reader *io, char *err,
		     size_t errlen);

/* s->lock held, its copy open and no read using it: onto the process's idle list (text_cache.c), as text_release() puts it. */
void text_idle_add_locked(struct text_shard *s);
