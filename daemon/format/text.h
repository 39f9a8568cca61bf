/* SPDX-License-Identifier: MIT */
/*
 * Text shards: raw documents that feedd tokenizes online.
 *
 *   jsonl  one document per line that holds anything but JSON whitespace
 *          (blank lines are not documents); the text is a string member of
 *          the line's object (extracted by jsonl.h).
 *   text   one document per file, the whole file.
 *   parquet one document per row of a Parquet file's text column (parquet.h);
 *          a null is an empty document. Its column is decoded once, at
 *          load, into the cache directory as the documents back to back,
 *          like a compressed shard's copy: document d is row d of the file,
 *          row groups in file order, so (row group, row) is first_row + row.
 *
 * Either may be compressed: NAME.gz (gzip/zlib, concatenated members) or
 * NAME.zst (zstd, concatenated frames). Neither format allows seeking into
 * the middle of a stream without extra state (gzip needs a 32 KiB window per
 * restart point, zstd has none inside a frame), and the sample order visits
 * a window's documents in shuffled order. So a compressed shard is served
 * from a decompressed copy in the cache directory, read like a plain file
 * (random reads of single documents at disk speed); a shard of at most
 * TEXT_MEM_MAX bytes of text from a copy in memory instead (text_build_mem;
 * never a file: creating one costs more than decompressing it). The copy
 * is made when the shard's window comes up, not at load (text_prepare: a
 * thread of its own, on the read-ahead hint of the walk of documents handed
 * to the workers; else text_acquire, on the worker that reads it), held
 * open and pinned while in use and a little after (a few idle shards per
 * process), and otherwise left to the cache's LRU eviction under
 * cache_max_bytes (a memory copy: freed); an evicted copy is made again
 * from the source when the shard is read again. The daemon's load does not
 * even index it (defer_index: a stat); text_index() does, when its window
 * comes up: one streaming pass, which keeps a compressed shard's copy too
 * (in memory, or its file in cache_dir: text_index_keeps_files), so that
 * the copy maker or the worker finds it made and the shard is decompressed
 * once (issue #22; docs/sample-order.md, "What is done when").
 *
 * Documents are found by an index of (offset, length) per document, built
 * with large io_uring reads and kept in the cache directory under a name
 * derived from the shard's canonical path; the index records the source's
 * size, mtime and inode, and a different file rebuilds it. Without a cache
 * directory a plain shard's index lives in memory only and a compressed shard
 * cannot be served.
 *
 * A shard is immutable after open and read by any thread. The feed reaches
 * it through the format layer (format.h: `format_jsonl`, `format_text`).
 */
#pragma once

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/source/source.h"

struct cache_build;
struct cache_pin;

enum text_kind {
	TEXT_JSONL,
	TEXT_PLAIN,
	TEXT_PARQUET,
};

enum text_codec {
	TEXT_CODEC_NONE,
	TEXT_CODEC_GZIP,
	TEXT_CODEC_ZSTD,
};

struct text_shard {
	char *path;            /* the source, canonical */
	char *data_path;       /* the file documents are read from: the source or its decompressed copy */
	struct source *data;   /* data_path (a cache copy: checked block by block as it is read) */
	struct cache_pin *pin; /* the cache copy is pinned while the shard is open */
	struct source_id id;   /* of the source, at open */
	char *text_key;        /* jsonl: the member holding the text; parquet: the column */
	enum text_kind kind;
	enum text_codec codec;
	bool cached;           /* the index came from the cache directory */

	/* A copy made on use (text_acquire; text_cache.c): data and pin are set while it is open. */
	bool lazy;
	bool mem;              /* its copy is made in memory, never in cache_dir: bytes <= TEXT_MEM_MAX */
	bool verified;         /* the copy was checked whole (or built) since load */
	unsigned users;        /* text_acquire()s not yet released */
	pthread_mutex_t lock;  /* data, pin, users, verified of a lazy shard */
	struct text_shard *idle_prev, *idle_next; /* open and unused: the process's idle list */
	bool idle;
	char *cache_dir;
	uint64_t cache_max_bytes, max_doc_bytes;
	char *idx_path;        /* store_pending: where text_store_index() writes the index */
	struct text_shard *make_next; /* on the copy maker's queue (text_prepare) */
	bool make_queued, making;
	bool cancel; /* being freed: a copy under way is given up between blocks (text_cache.c, maker_forget) */
	char *maker_note;      /* a repair the copy maker made ("...; rebuilt"), for the next text_acquire() to return; NULL: none */
	bool open_now;         /* relaxed atomics, for status: the copy is open; copies made since load */
	uint32_t copies_made;
	uint32_t decompressions; /* passes that decompressed it: indexes and copies (not text_count's); relaxed */
	bool copy_unchecked;   /* its copy was kept by load's count: the source is checked unchanged at the first read */
	bool store_pending;
	bool defer_store;      /* text_open_opts.defer_store */

	/*
	 * Deferred (text_open_opts.defer_index): load only stat'ed the file;
	 * text_index() reads it when its window comes up. indexed is set
	 * (release) once n_docs, offsets, lengths, lines, bytes, truncated and
	 * (plain shards) data are; a failure stays, in index_error/index_err.
	 */
	bool indexed;
	/*
	 * Walks in a window of this shard (text_hold). When the last leaves, the
	 * index goes on the process's list of unheld indexes, and the oldest
	 * of those are let go (TEXT_UNHELD_MAX) and rebuilt when a window of
	 * the shard comes up again: memory follows the windows in use, not
	 * the shards read so far. holds, unheld and uh_* under text.c's
	 * unheld_lock (not lock, which an index build or a copy holds).
	 */
	unsigned holds;
	bool unheld;
	bool defer_index_counted; /* counted in text_indexes_in_memory() while indexed */
	struct text_shard *uh_prev, *uh_next;
	int index_error;
	char *index_err;       /* NULL until it fails (every shard holds these: kept small) */

	uint32_t n_docs;
	uint64_t *offsets;     /* n_docs: first byte of each document in data_path */
	uint32_t *lengths;     /* n_docs: bytes, without the line end */
	uint64_t *lines;       /* n_docs: 1-based line of each document; NULL when document i is line i + 1 */
	uint64_t bytes;        /* of data_path */

	/*
	 * A compressed stream that ends early: the documents complete before
	 * the cut are kept, the partial last line is not, and this says why
	 * (empty when the stream is whole). The feed's bad-record policy
	 * decides whether that is fatal.
	 */
	char truncated[256];
	/* A damaged cache entry found at open, and rebuilt (for the feed to log); empty when none. */
	char *cache_note;      /* NULL when none */
};

/*
 * A compressed text shard that decompresses to at most this many bytes gets
 * its copy in memory (text_build_mem), not in cache_dir: creating a file
 * costs milliseconds on a busy ext4, decompressing a small shard tens of
 * microseconds, and thousands of small shards are read in the first minute
 * of an epoch. Open memory copies are bounded by TEXT_MEM_IDLE_BYTES idle
 * plus those being read.
 */
#define TEXT_MEM_MAX (4u << 20)
#define TEXT_MEM_IDLE_BYTES (64u << 20)

/*
 * The daemon's load (text_open_opts.defer_store) keeps the index it built of
 * a shard of fewer bytes (decompressed) than this only in memory: indexing
 * it again at the next start takes tens of microseconds, while writing it to
 * cache_dir creates a file, milliseconds of CPU on a busy ext4, which at
 * thousands of small shards set the pace of the first epoch (the scanner
 * thread writes them while the workers read). A larger shard's index is
 * written (a pass over megabytes costs more than a file), and any index
 * found in cache_dir is used.
 */
#define TEXT_STORE_MIN (64u << 10)

struct text_open_opts {
	enum text_kind kind;
	const char *cache_dir;     /* NULL: no cache */
	uint64_t cache_max_bytes;  /* cap on what cache_dir holds (daemon/cache/cache.h); 0: none */
	uint64_t max_doc_bytes;    /* a longer document is indexed with this many bytes + 1, and refused when read */
	const char *text_key;      /* jsonl: the member holding the text; parquet: the column (NULL: "text") */
	bool defer_store;          /* an index built now is written by text_store_index() later (not Parquet's) */
	const bool *cancel;        /* a compressed shard's copy: given up (-ECANCELED) once *cancel is set */
	bool defer_index;          /* stat the file only; text_index() reads it when first needed (local files) */
	bool count_only;           /* text_build_index(): count the documents, keep nothing per document (text_count) */
};

/* The codec a shard's name implies (".gz", ".zst", else none). */
enum text_codec text_codec_of(const char *path);

/*
 * Opens the shard at `path` (canonical), using or building its index.
 * Returns 0; or a negative errno with a message naming the file and the
 * offset or line in err.
 */
int text_open(const char *path, const struct text_open_opts *o, struct source_reader *io, struct text_shard **ret,
	      char *err, size_t errlen);
struct text_shard *text_free(struct text_shard *s);

/* Whether s's index is there (n_docs and the documents' places); any thread. */
static inline bool text_indexed(const struct text_shard *s)
{
	return __atomic_load_n(&s->indexed, __ATOMIC_ACQUIRE);
}

/*
 * Indexes a deferred shard now (any thread; others wait for it): its cached
 * index, or a pass over the file, which must still be the file load saw
 * (-ESTALE). io may be NULL (a reader of its own). An index built here is
 * written to cache_dir at once. Returns 0 (and at once when indexed
 * already), or a negative errno with a message naming the file in err; a
 * failure is kept and returned again.
 */
int text_index(struct text_shard *s, struct source_reader *io, char *err, size_t errlen);
/*
 * text_index() keeps the copy of a compressed shard it indexes (made in the
 * same pass: the shard is decompressed once, not once for its index and
 * again for its copy): in memory when it fits (TEXT_MEM_MAX), else as its
 * file in cache_dir when the calling thread keeps files (on by default: a
 * walk's window, a worker, the copy maker; a read follows). A feed's load
 * turns files off on its thread: it counts the first shards only to know
 * their documents, and READY must not wait for writing their copies.
 * Returns the previous setting.
 */
bool text_index_keeps_files(bool on);
/* text_index() with s->lock held (text_cache.c: indexed and acquired under one hold of the lock). */
int text_index_locked(struct text_shard *s, struct source_reader *io, char *err, size_t errlen);

/*
 * Line indexes of shards no walk holds are kept, most recently released
 * last, up to this many shards and bytes per process; older ones are let go.
 * Generous on purpose: with the default 1,024 virtual streams the shards a
 * feed reads at once span many windows (each stream's walk and its
 * tokenizing ahead), and bounds of 256 shards / 64 MiB measured a 20-30x
 * drop of tokens/s at 1,000 small shards (indexes let go and built again
 * over and over). These bound the memory of a corpus of billions of
 * documents (48 GB of line indexes at DCLM's size) to about 1 GiB plus the
 * windows in use.
 */
#define TEXT_UNHELD_MAX 65536u
#define TEXT_UNHELD_BYTES (UINT64_C(1) << 30)

/*
 * A walk enters (on) or leaves (!on) a window holding s (any thread): a
 * held shard's index stays; one no walk holds may be let go (above), and
 * text_index() builds it again. Never blocks on I/O.
 */
void text_hold(struct text_shard *s, bool on);
/* Shards whose line index is in memory now, process-wide (status). */
uint64_t text_indexes_in_memory(void);

/* The 1-based line of document d (for messages). */
static inline uint64_t text_doc_line(const struct text_shard *s, uint32_t d)
{
	return s->lines ? s->lines[d] : (uint64_t)d + 1;
}

/*
 * Builds a Parquet shard's copy and index (text_parquet.c): column `column`
 * of src (read through io) decoded row by row into the cache entry dst,
 * s->offsets/lengths/n_docs/bytes set. Returns 0, or a negative errno with
 * a message naming the file and the byte offset in err.
 */
int text_parquet_build(struct text_shard *s, struct source *src, struct source_reader *io, const char *column,
		       uint64_t max_doc_bytes, struct cache_build *dst, char *err, size_t errlen);

/*
 * Opens the cache copy data_path of s for serving (text_cache.c): pinned
 * while s is open, its checksums attached to s->data so that every read is
 * checked, and with verify_all every block checked now. Returns 0; -ENOENT
 * when there is no copy; or a negative errno with a message naming the file
 * and offset in err.
 */
int text_open_copy(struct text_shard *s, const char *data_path, struct source_reader *io, bool verify_all, char *err,
		   size_t errlen);

/*
 * Makes a lazy shard's copy servable (text_cache.c): pinned and opened, made
 * again from the source when it is not in the cache (the source unchanged
 * since load and the same documents, else -ESTALE), and checked whole the
 * first time after load (a damaged copy is made again, and note says so).
 * Any thread; s->data may be read until text_release(). A shard that is not
 * lazy returns 0 at once. Returns 0 or a negative errno with a message.
 */
int text_acquire(struct text_shard *s, struct source_reader *io, char *note, size_t notelen, char *err,
		 size_t errlen);
void text_release(struct text_shard *s);
/* Takes a lazy shard off the idle list before it is freed (text_free). */
void text_idle_forget(struct text_shard *s);
/*
 * Asks the process's copy maker thread to make and open s's copy (then idle,
 * for the read that comes). Never blocks; a shard that is not lazy, open, or
 * queued already is left alone. Failures are left for the read to report.
 */
void text_prepare(struct text_shard *s);
/* Closes every idle copy (their pins go, so the cache may evict them). */
void text_idle_flush(void);

/*
 * Writes s's copy (s->data_path) from its source again, checked to hold
 * the documents the index says (text.c). Returns 0 or a negative errno with
 * a message.
 */
int text_build_copy(struct text_shard *s, struct source_reader *io, char *err, size_t errlen);
/*
 * A small compressed shard's copy made in memory instead (s->mem): what
 * text_build_copy() would write, checked the same way, as a source named
 * s->path over a buffer of its own (source_open_mem: no checksums, since it
 * never leaves the process). Returns 0 or a negative errno with a message.
 */
int text_build_mem(struct text_shard *s, struct source_reader *io, struct source **ret, char *err, size_t errlen);

/* Writes the index open built (store_pending) to the cache. Any thread. Returns 0 or a negative errno with a message. */
int text_store_index(const struct text_shard *s, char *err, size_t errlen);

/*
 * Counts a deferred shard's documents without indexing it (issue #22: the
 * background count pass, daemon/feed/feed-counts.c): one streaming pass
 * over the source, checked to be the file load saw, decompressed on the way;
 * nothing of s changes and its lock is not taken, so it never waits for, or
 * holds up, a walk or a worker. *ret_bytes: its text's bytes;
 * *ret_truncated: a compressed stream that ends early (its documents are
 * then for the walk to count, with the bad-record policy). Given up between
 * blocks once *cancel is set (-ECANCELED). Parquet: -EOPNOTSUPP. Returns 0
 * or a negative errno with a message.
 */
int text_count(const struct text_shard *s, struct source_reader *io, const bool *cancel, uint32_t *ret_docs,
	       uint64_t *ret_bytes, bool *ret_truncated, char *err, size_t errlen);

/* Checks that the source did not change since open. Returns 0 or -ESTALE with a message. */
int text_check(const struct text_shard *s, char *err, size_t errlen);

