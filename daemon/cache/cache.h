/* SPDX-License-Identifier: MIT */
/*
 * The cache directory (`cache_dir`): files feedd builds from shards (the
 * decompressed copies of compressed text, decoded Parquet columns, line
 * indexes) and serves from later. docs/checksums.md and
 * docs/configuration.md (cache_dir, cache_max_bytes) describe it.
 *
 *   cache_clean()       at start: removes temporary files of builds that
 *                       crashed (NAME.tmp-N that no live build holds).
 *   cache_build_*()     writes one entry: a locked NAME.tmp-N of its own, every
 *                       block checksummed (daemon/io/sums.h, a trailer),
 *                       room made as it grows (cache_evict), renamed into
 *                       place at commit. An entry that alone would pass
 *                       the cap is refused (-EFBIG) with a message.
 *   cache_pin()         a reader's hold on an entry while a shard serves
 *                       from it (a shared flock(2) on an fd of its own; it
 *                       also marks the entry used now, for LRU).
 *   cache_evict()       removes entries least recently used first until
 *                       `need` more bytes fit under the cap; an entry that
 *                       is pinned (by this process or another) or being
 *                       built is never removed.
 *
 * No state lives in memory: pins are kernel locks and use times are the
 * files' mtimes, so several feeds, threads and processes (feedd,
 * `feedctl prep`) can share one directory. Eviction decisions are
 * serialized by an exclusive lock on DIR/.lock. Concurrent builds may
 * together pass the cap by at most one growth step each (CACHE_STEP).
 *
 * Nothing here logs; every failure is a negative errno with a message.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes a build reserves ahead at a time (at most; a small cap reserves less). */
#define CACHE_STEP (64u << 20)

/*
 * Creates dir (one level) when missing and removes stale temporary files.
 * Returns the number of files removed, or a negative errno with a message.
 */
int cache_clean(const char *dir, char *err, size_t errlen);

struct cache_build;

/*
 * Starts building the entry `path` (a file in `dir`) with checksum blocks
 * of `block` bytes; max_bytes caps the directory (0: no cap). Returns 0, or
 * a negative errno with a message.
 */
int cache_build_begin(const char *dir, uint64_t max_bytes, const char *path, uint32_t block,
		      struct cache_build **ret, char *err, size_t errlen);
/*
 * Appends [p, p + n) to the entry. Returns 0; -EFBIG when the entry alone
 * would pass the cap; -ENOSPC when what is pinned or being built leaves no
 * room; another negative errno; each with a message naming the entry.
 */
int cache_build_write(struct cache_build *b, const void *p, size_t n, char *err, size_t errlen);
/* Data bytes written so far. */
uint64_t cache_build_size(const struct cache_build *b);
/*
 * Appends the checksum trailer and renames the entry into place; frees b
 * either way. Returns 0, or a negative errno with a message (the temporary
 * file removed).
 */
int cache_build_commit(struct cache_build *b, char *err, size_t errlen);
/* Removes the temporary file and frees b. Takes NULL; returns NULL. */
struct cache_build *cache_build_abort(struct cache_build *b);

struct cache_pin;
/*
 * Pins the entry `path`. Returns 0; -ENOENT when it is not there (evicted,
 * never built); another negative errno.
 */
int cache_pin(const char *path, struct cache_pin **ret);
/* The pin's fd on the entry (read-only), for reading it. */
int cache_pin_fd(const struct cache_pin *p);
/* Takes NULL; returns NULL. */
struct cache_pin *cache_unpin(struct cache_pin *p);

/*
 * Makes room for `need` more bytes in dir under max_bytes (0: no cap; then
 * nothing is removed). Returns the bytes removed; -ENOSPC when not enough
 * can be removed; another negative errno.
 */
int64_t cache_evict(const char *dir, uint64_t max_bytes, uint64_t need);

/* Bytes the files in dir take (what the cap counts). Returns them or a negative errno. */
int64_t cache_usage(const char *dir);
