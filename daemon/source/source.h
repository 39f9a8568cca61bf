/* SPDX-License-Identifier: MIT */
/*
 * The source layer: where a shard's bytes come from. Everything above it
 * (the formats, the workers, the feed's change check) names an object by the
 * string the configuration gave, and reads byte ranges of it; only this layer
 * knows whether that is a local file (today: io_uring, or pread(2) where
 * io_uring is unavailable) or, later, an object in S3-compatible storage
 * (issue #24), which adds an implementation behind the same calls.
 *
 *   struct source         one open object: its name, size and identity.
 *                         Immutable after open; any thread may read it.
 *   struct source_reader  one per thread: the engines that carry reads
 *                         (an io_uring today; a curl multi handle later).
 *   source_submit()       queues reads of byte ranges, of any sources;
 *   source_complete()     waits until every read queued is done.
 *
 * Reads are submitted and completed rather than run one by one, so that a
 * network implementation keeps many requests in flight, and the local one
 * keeps a whole batch in one io_uring submission, as the workers always did.
 *
 * Identity is what tells that an object changed under a running feed
 * (docs/sample-order.md: a shard must not change while it is served): for a
 * local file its device, inode, size, mtime and ctime; an object store will
 * use its size, ETag and Last-Modified.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "daemon/io/reader.h"

struct source_id {
	uint64_t dev;
	uint64_t ino;
	uint64_t size;
	struct timespec mtime;
	struct timespec ctime;
};

struct source;
struct source_reader;
struct sums;

/* One read: len bytes of src at offset, to dst. */
struct source_read {
	struct source *src;
	uint64_t offset;
	size_t len;
	void *dst;
};

/*
 * Opens the object `name` (a path today). Returns 0; or a negative errno
 * with a message naming it in err: -ENOENT, -EACCES, ..., -EINVAL when it
 * is not a regular file, -EPROTONOSUPPORT for a URL scheme no implementation
 * serves. A FIFO or device is refused without waiting for a writer: it is
 * opened O_NONBLOCK and checked before anything reads it.
 */
int source_open(const char *name, struct source **ret, char *err, size_t errlen);
/* Whether name is a URL served by object storage (s3://, http(s)://) rather than a local path. */
bool source_is_remote(const char *name);
/* Whether name (an object in storage) is known not to exist without a request (a listing of this load left it out). */
bool source_known_absent(const char *name);
/*
 * A source over len bytes in memory (bytes: malloc'ed, taken, freed with the
 * source; a copy made in memory, say), named `name` in messages. Its reads
 * are copies made at submission; it has no fd, no identity but its size,
 * and no checksums. Returns 0 or -ENOMEM with a message (bytes freed).
 */
int source_open_mem(const char *name, void *bytes, size_t len, struct source **ret, char *err, size_t errlen);
struct source *source_close(struct source *s);

const char *source_name(const struct source *s);
uint64_t source_size(const struct source *s);
/* The identity recorded at open. */
const struct source_id *source_identity(const struct source *s);

/*
 * Attaches block checksums (daemon/io/sums.h) to s, which owns them from
 * then on: every later read of s reads the whole blocks it touches and
 * checks them (source_complete fails with -EUCLEAN, source_reader_error()
 * names the file and the block's offset). Call before s is shared with other
 * threads. Returns 0, or -EINVAL when they cover more than the file holds.
 */
int source_set_sums(struct source *s, struct sums *sums);
/* The checksums attached to s, or NULL. */
const struct sums *source_sums(const struct source *s);
/*
 * Marks s as a cache entry of feedd's own (cache_dir), checked by its sums on
 * every read: the check after reads then compares only file and size, since
 * the cache dates an entry's last use by its mtime (cache.c). A user's file,
 * sums or not, keeps the whole identity, ctime included: a write is a change
 * (-ESTALE, batches withdrawn), not damage.
 */
void source_set_cache_entry(struct source *s);

/* The identity `name` has now. Returns 0 or a negative errno. */
int source_identify(const char *name, struct source_id *ret);
bool source_id_equal(const struct source_id *a, const struct source_id *b);
/*
 * Checks that `name` still names the object whose identity was `was`.
 * Returns 0, or -ESTALE with "NAME: changed while serving (...)" in err.
 */
int source_check(const char *name, const struct source_id *was, char *err, size_t errlen);

/*
 * Maps the whole object read-only and shared (a local file: mmap(2), so its
 * pages are the page cache, shared by every feed and every restart, not
 * this process's anonymous memory). Returns 0 with the mapping and its
 * length (unmap with source_unmap); -EOPNOTSUPP where the implementation
 * cannot map (the caller then reads a copy); -EINVAL for an empty object.
 */
/*
 * After every read of s, `also` (taken: closed with s) is checked as s is:
 * a change to either, or `also` gone, fails the read with -ESTALE. For a
 * file whose reads are addressed by another (a Megatron .bin by its mapped
 * .idx). `also` stays open while the daemon holds few files; past a quarter
 * of RLIMIT_NOFILE it is closed and checked by name, so that a shard holds
 * one descriptor. Returns 0 or -ENOMEM.
 */
int source_check_with(struct source *s, struct source *also);

int source_map(const struct source *s, const void **ret, size_t *ret_len);
void source_unmap(const void *p, size_t len);

/*
 * Expands shard patterns: each in the given order, its matches sorted by
 * name bytes (docs/sample-order.md fixes this order), then made canonical
 * (a local path: realpath) so that fingerprints and the duplicate check do
 * not depend on how the config spells a name. Returns 0 with the names in
 * *ret (caller frees each and the array); or a negative errno with a message
 * in err: -ENOENT (a pattern matches nothing), -EINVAL (a name twice),
 * -ENOMEM, -EIO.
 */
int source_glob(const char *const *patterns, size_t n_patterns, char ***ret, size_t *ret_n, char *err, size_t errlen);

/*
 * A thread's reader. engine and depth configure the local implementation
 * (reader.h): with IO_ENGINE_AUTO a failed io_uring setup falls back to
 * pread and source_reader_fallback() tells why. Returns 0, -ENOMEM, or the
 * io_uring error with IO_ENGINE_URING.
 */
int source_reader_new(enum io_engine engine, unsigned depth, struct source_reader **ret);
struct source_reader *source_reader_free(struct source_reader *r);
/* The local engine: "io_uring" or "pread". */
const char *source_reader_engine(const struct source_reader *r);
int source_reader_fallback(const struct source_reader *r);
const struct io_stats *source_reader_stats(const struct source_reader *r);

/*
 * Queues n reads (the array is copied; the destinations must stay valid
 * until source_complete()). Returns 0 or -ENOMEM; nothing is queued then.
 */
int source_submit(struct source_reader *r, const struct source_read *reads, size_t n);
/*
 * Waits for every read queued since the last completion and forgets them.
 * Returns 0; or a negative errno with *ret_failed (if not NULL) the index,
 * in submission order, of a failing read: -ENODATA when the object ended
 * before the read did (it shrank under us), -ESTALE when an object read is
 * no longer as opened (its identity, ctime included, moved: it was written
 * while or before it was read), -EUCLEAN when a block of a checksummed
 * source does not match (source_reader_error() says where), the read's own
 * error otherwise.
 * On error the destinations' contents are unspecified.
 */
int source_complete(struct source_reader *r, size_t *ret_failed);

/* The message of the reader's last checksum failure ("NAME: block at byte N ... does not match its checksum"). */
const char *source_reader_error(const struct source_reader *r);
/*
 * After -ESTALE from source_complete: the message when it was the file that
 * says where the bytes are (source_check_with: a Megatron .idx) that moved,
 * naming it; NULL when the file read itself moved.
 */
const char *source_reader_stale(const struct source_reader *r);
/*
 * A hint that [offset, offset + len) of s will be read soon: an object in
 * storage starts fetching it (bounded by the fetcher's memory), without
 * waiting; a local file ignores it. Never blocks on I/O.
 */
void source_prefetch(struct source *s, uint64_t offset, uint64_t len);

/* source_submit() then source_complete(). */
int source_read(struct source_reader *r, const struct source_read *reads, size_t n, size_t *ret_failed);
/* Reads the whole object into a new buffer (caller frees). */
int source_read_all(struct source_reader *r, struct source *s, void **ret);

/*
 * Progress of a long load on the calling thread (daemon/feed/loader.h):
 * while fn is set, each open, pattern expansion and read of this layer on
 * this thread calls fn(userdata, name) as it starts, so that a load stuck on
 * a FIFO or a hung mount can be told from a slow one, and named. NULL: off.
 */
void source_set_progress(void (*fn)(void *userdata, const char *name), void *userdata);
/* Reports progress on name to this thread's hook (a long computation over a source's bytes). */
void source_progress(const char *name);

/*
 * The message for a failed read of `name` at [offset, offset + len) into err:
 * -ENODATA (the object ends before what its `index` — ".idx", "index" — points
 * to) and -ESTALE (written while read) say the file changed while serving;
 * anything else names the errno.
 */
void source_read_error(char *err, size_t errlen, int r, const char *name, const char *index, uint64_t offset,
		       uint64_t len);
