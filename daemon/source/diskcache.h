/* SPDX-License-Identifier: MIT */
/*
 * The fetcher's on-disk tier (fetch.c): fetched blocks kept as files, so a
 * restart or a second feedd on the node reads them instead of the store. A
 * file is named by its object's URL and ETag hashes and the block index, so
 * a changed object never reads an old block; written to a temporary name and
 * renamed, so a reader sees a whole block or none. Bounded: past max_bytes
 * the oldest files this cache wrote are removed first. Not thread-safe: the
 * fetcher calls it under its lock. A minimal bound of its own until a shared
 * cache module (cache_max_bytes, issue #16) takes over.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct diskcache;

/* Returns a cache over dir (created if missing), or NULL (no disk tier). */
struct diskcache *diskcache_new(const char *dir, uint64_t max_bytes);
struct diskcache *diskcache_free(struct diskcache *c);

/* Reads block idx of the object keyed prefix into dst when a file of exactly len bytes holds it. */
bool diskcache_load(struct diskcache *c, const char *key, uint64_t idx, void *dst, size_t len);
/* Keeps a block (best effort: a full disk or a failed write only means a later fetch). */
void diskcache_store(struct diskcache *c, const char *key, uint64_t idx, const void *data, size_t len);
/* Bytes this cache wrote and still holds. */
uint64_t diskcache_bytes(const struct diskcache *c);
