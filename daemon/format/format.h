/* SPDX-License-Identifier: MIT */
/*
 * The format layer: how documents are found in a shard's bytes. A feed, its
 * sessions and its workers see shards only through this interface; which
 * format a shard is in is one `struct format` (a table of functions) chosen
 * by the feed's `format =` key. Bytes come from the source layer
 * (daemon/source/source.h), so a format reads local files and object storage
 * alike.
 *
 * Two kinds of content:
 *   FORMAT_TOKENS  documents stored as token ids (Megatron .idx/.bin). The
 *                  token count of every document is known at open
 *                  (shard->doc_tokens); doc_ranges() says which byte ranges
 *                  of which source hold a run of a document's tokens, and
 *                  widen() turns the stored ids into int32.
 *   FORMAT_TEXT    documents stored as text, tokenized on the way (JSONL,
 *                  plain text, Parquet). doc_read() says which byte range
 *                  of which source to read for a document, doc_text() finds
 *                  the document's text in those bytes once read (a JSON
 *                  member, a whole file, a row of a decoded page).
 *
 * Reads are not done by the format on the hot path: the worker gathers the
 * ranges of a whole batch (or a chunk of documents), submits them at once to
 * its source_reader, and hands the bytes back. So every read of a batch is in
 * flight together whatever the format.
 *
 * Adding a format (a checklist; Parquet, issue #23, followed it):
 *   1. daemon/format/NAME.c defines `const struct format format_NAME` with
 *      open/close/check and the functions of its kind, and sets the summary
 *      fields of struct shard in open;
 *   2. add it to the table in format.c (format_find; `format` in the
 *      config accepts what that table names);
 *   3. the feed, sessions, workers and `feedctl prep` need no change.
 *
 * Laziness (issue #22): n_docs is what the sample order needs up front;
 * everything else is asked per document. Megatron maps its index and does
 * nothing proportional to the documents at open (beyond scan_budget);
 * text formats, opened with defer_index, only stat the file at open and
 * index it (index()) when its window comes up.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/format/jsonl.h"
#include "daemon/source/source.h"

enum format_content {
	FORMAT_TOKENS,
	FORMAT_TEXT,
};

/* What a feed's configuration says about its shards, for format->open. */
struct format_opts {
	const char *cache_dir;  /* where a format may keep indexes and decompressed copies; NULL: none */
	uint64_t cache_max_bytes; /* the cap on what cache_dir holds (daemon/cache/cache.h); 0: none */
	uint64_t max_doc_bytes; /* text: a longer document is a bad record (indexed, never read) */
	const char *text_key;   /* jsonl (and columnar formats): the member/column holding the text */
	uint64_t *scan_budget;  /* index entries a format may still validate whole at open (charged); NULL: no limit */
	bool defer_store;       /* text: an index built at open is written to cache_dir later, by store() */
	bool defer_index;       /* text: open only stats the file; index() reads it when its window comes up */
};

/*
 * An open shard: a format's own state (`impl`) behind a summary that the
 * format's open fills in. Immutable after open; read by any thread.
 */
struct shard {
	const struct format *format;
	void *impl;                  /* the format's own shard (struct megatron_shard, struct text_shard, ...) */
	const char *name;            /* as the feed names it: a canonical path (Megatron: the .idx) */
	uint32_t n_docs;             /* documents, in the order the sample order numbers them */

	/* identity for the feed's fingerprint: name, then size and mtime of each file (at most 2) */
	const struct source_id *ids[2];
	unsigned n_ids;
	const char *files[2];        /* the paths whose identities ids[] are; NULL: `name` (for ids[0]) */
	/*
	 * A digest of the shard's content sums (issue #16 part B: the sidecar of
	 * block checksums), or 0 when it has none. When set it stands for the
	 * files' content in the feed's data identity instead of inode and ctime,
	 * so a copy of the same bytes on another node resumes the same cursors.
	 */
	uint64_t content_digest;

	/* FORMAT_TOKENS */
	bool counted;                /* n_tokens and n_nonempty are known (the index was scanned at open); else scan() */
	uint64_t n_tokens;
	uint32_t n_nonempty;         /* documents with at least one token */
	unsigned itemsize;           /* bytes per stored token */

	/* FORMAT_TEXT */
	uint64_t bytes;              /* of text, as read */
	bool cached;                 /* the index came from cache_dir */
	const char *truncated;       /* non-empty: the shard ends early and why (the feed's bad-record policy decides) */
	/* what happened to a damaged cache entry at open ("...; rebuilt"), for the feed to log; NULL or "": nothing */
	const char *cache_note;
	/* the bytes are a copy made on use: doc_read()'s source is valid only between acquire() and release() */
	bool lazy;
	bool store_pending;          /* its index is to be written to cache_dir by store() (format_opts.defer_store) */
	/*
	 * Opened with format_opts.defer_index: n_docs, bytes, cached and
	 * truncated mean nothing until index() has returned; the feed keeps
	 * the count (feed.h, shard_docs).
	 */
	bool deferred;
};

/* Per-thread scratch for doc_text() (reused; freed by format_state_done). */
struct format_state {
	struct jsonl_record jsonl;
};

/* A document's text, found in the bytes read for it. */
struct format_text {
	const char *text;  /* points into the bytes read or into the format_state */
	size_t len;
	size_t replaced;   /* invalid UTF-8 sequences replaced by U+FFFD */
	bool utf8_valid;   /* known valid UTF-8 (the tokenizer may skip checking) */
};

struct format {
	const char *name; /* as `format =` spells it */
	enum format_content content;

	/*
	 * Opens and validates the shard `name`, reading through r, and fills s
	 * (s->format is set already). Returns 0, or a negative errno with a
	 * message naming the file and the offending field, offset or line.
	 */
	int (*open)(struct shard *s, const char *name, const struct format_opts *o, struct source_reader *r, char *err,
		    size_t errlen);
	void (*close)(struct shard *s);
	/* 0, or -ESTALE with a message: a file of the shard changed since open. */
	int (*check)(const struct shard *s, char *err, size_t errlen);

	/*
	 * FORMAT_TOKENS: calls emit(ctx, source, byte offset, tokens) per
	 * contiguous run of stored tokens offset .. offset + count - 1 of
	 * document doc, in order (the worker turns each into a source_read of
	 * tokens * itemsize bytes). Stops at emit's first negative result and
	 * returns it; -EINVAL past the document's end.
	 */
	int (*doc_ranges)(const struct shard *s, uint32_t doc, uint64_t offset, uint64_t count,
			  int (*emit)(void *ctx, struct source *src, uint64_t byte_offset, uint64_t n_tokens),
			  void *ctx);
	/*
	 * FORMAT_TOKENS: document doc's token count, the index entries it
	 * depends on checked first. Any thread. 0, or -EBADMSG with the fault
	 * (naming the file) in err.
	 */
	int (*doc_tokens)(const struct shard *s, uint32_t doc, uint64_t *ret, char *err, size_t errlen);
	/*
	 * FORMAT_TOKENS, optional: doc_tokens(doc) comes soon, from a random
	 * place (stage 0: far ahead, 1: nearer): warms the cache lines it reads.
	 * Never fails. Any thread.
	 */
	void (*doc_prefetch)(const struct shard *s, uint32_t doc, unsigned stage);
	/*
	 * FORMAT_TOKENS: validates the whole shard in one streaming pass and
	 * counts its tokens and non-empty documents (what open left undone when
	 * !s->counted). Any thread. *stop (NULL: never), looked at often, cuts
	 * it short with -ECANCELED. 0, or -EBADMSG with the fault in err, or
	 * -ESTALE where the file changed under it.
	 */
	int (*scan)(const struct shard *s, const int *stop, uint64_t *ret_tokens, uint32_t *ret_nonempty, char *err,
		    size_t errlen);
	/* Widens n stored ids at src to dst. 0, or -ERANGE with *ret_bad the first id outside 0..INT32_MAX. */
	int (*widen)(const struct shard *s, const void *src, size_t n, int32_t *dst, size_t *ret_bad);

	/*
	 * FORMAT_TEXT: the size of document doc's text as stored, in bytes: what
	 * max_document_bytes limits (a longer document is a bad record and is
	 * not read) and what runs of documents are sized by.
	 */
	uint64_t (*doc_bytes)(const struct shard *s, uint32_t doc);
	/*
	 * The range to read for document doc (ret->dst is the caller's; len 0:
	 * nothing to read). It may hold more than the document (a columnar
	 * format's page or row group): doc_text() finds the document in it.
	 */
	void (*doc_read)(const struct shard *s, uint32_t doc, struct source_read *ret);
	/*
	 * Finds document doc's text in the bytes read for it. Returns 0; -ENOMEM;
	 * or another negative errno for a bad record, with why (without the
	 * file name) in why.
	 */
	int (*doc_text)(const struct shard *s, uint32_t doc, const uint8_t *bytes, size_t len,
			struct format_state *st, struct format_text *ret, char *why, size_t whylen);
	/* Where document doc is, for messages after the shard's name (":12" for a line); "" when nothing helps. */
	void (*doc_where)(const struct shard *s, uint32_t doc, char *buf, size_t n);
	/*
	 * FORMAT_TEXT, for s->lazy shards: makes the bytes doc_read() names
	 * readable (a cache copy made again if it was evicted), until release().
	 * Any thread. 0, or a negative errno with a message; note (may be set
	 * when 0) says what was repaired, for the caller to log.
	 */
	int (*acquire)(const struct shard *s, struct source_reader *r, char *note, size_t notelen, char *err,
		       size_t errlen);
	void (*release)(const struct shard *s);
	/* FORMAT_TEXT, for s->lazy: starts making the copy acquire() would make, in the background; never blocks. */
	void (*prepare)(const struct shard *s);
	/* FORMAT_TEXT, for s->store_pending: writes the index open built to cache_dir. Any thread. 0 or -errno, message. */
	int (*store)(const struct shard *s, char *err, size_t errlen);
	/*
	 * FORMAT_TEXT, for s->deferred: reads the shard's index now (its cached
	 * one, or a pass over the file) and returns its document count. Any
	 * thread; concurrent calls wait for one another; r may be NULL. 0, or
	 * a negative errno with a message naming the file (kept: later calls
	 * fail the same way).
	 */
	int (*index)(const struct shard *s, struct source_reader *r, uint32_t *ret_docs, char *err, size_t errlen);
};

/* The format named `name` ("megatron", "jsonl", "text", "parquet"), or NULL. */
const struct format *format_find(const char *name);
/* The names format_find() knows, ", "-separated in table order, into buf (for messages). */
void format_names(char *buf, size_t len);

/* Opens shard `name` in format fmt. Returns like format->open. */
int format_open(const struct format *fmt, const char *name, const struct format_opts *o, struct source_reader *r,
		struct shard **ret, char *err, size_t errlen);
struct shard *format_close(struct shard *s);

static inline int format_check(const struct shard *s, char *err, size_t errlen)
{
	return s->format->check(s, err, errlen);
}

static inline int format_doc_ranges(const struct shard *s, uint32_t doc, uint64_t offset, uint64_t count,
				    int (*emit)(void *ctx, struct source *src, uint64_t byte_offset,
						uint64_t n_tokens),
				    void *ctx)
{
	return s->format->doc_ranges(s, doc, offset, count, emit, ctx);
}

static inline int format_doc_tokens(const struct shard *s, uint32_t doc, uint64_t *ret, char *err, size_t errlen)
{
	return s->format->doc_tokens(s, doc, ret, err, errlen);
}

static inline void format_doc_prefetch(const struct shard *s, uint32_t doc, unsigned stage)
{
	if (s->format->doc_prefetch)
		s->format->doc_prefetch(s, doc, stage);
}

static inline int format_widen(const struct shard *s, const void *src, size_t n, int32_t *dst, size_t *ret_bad)
{
	return s->format->widen(s, src, n, dst, ret_bad);
}

static inline uint64_t format_doc_bytes(const struct shard *s, uint32_t doc)
{
	return s->format->doc_bytes(s, doc);
}

static inline void format_doc_read(const struct shard *s, uint32_t doc, struct source_read *ret)
{
	s->format->doc_read(s, doc, ret);
}

/* Lazy shards (a copy) and deferred ones (an index that may be let go between windows) are held while read. */
static inline int format_acquire(const struct shard *s, struct source_reader *r, char *note, size_t notelen, char *err,
				 size_t errlen)
{
	return s->lazy || s->deferred ? s->format->acquire(s, r, note, notelen, err, errlen) : 0;
}

static inline void format_release(const struct shard *s)
{
	if (s->lazy || s->deferred)
		s->format->release(s);
}

static inline int format_prefetch_emit(void *ctx, struct source *src, uint64_t byte_offset, uint64_t n_tokens)
{
	(void)byte_offset;
	(void)n_tokens;
	*(struct source **)ctx = src;
	return -1; /* the source is all we wanted */
}

/*
 * The plan's hint that s's documents are read soon (its shuffle window is
 * next): the source its documents are read from (Megatron: the .bin) starts
 * fetching, if it is an object in storage (source_prefetch). Never blocks.
 */
static inline void format_prefetch(const struct shard *s)
{
	struct source *src = NULL;
	if (s->format && s->deferred && s->format->prepare) { /* indexed (and copied) ahead, on the copy maker */
		s->format->prepare(s);
		return;
	}
	if (!s->format || !s->n_docs)
		return;
	if (s->lazy) { /* a copy made on use: made ahead instead */
		s->format->prepare(s);
		return;
	}
	if (s->format->doc_ranges && s->format->doc_tokens) {
		for (uint32_t d = 0; d < s->n_docs && d < 64 && !src; d++) {
			uint64_t tokens = 0;
			char err[128];
			if (s->format->doc_tokens(s, d, &tokens, err, sizeof(err)) == 0 && tokens)
				s->format->doc_ranges(s, d, 0, 1, format_prefetch_emit, &src);
		}
	} else if (s->format->doc_read) {
		struct source_read q = { 0 };
		s->format->doc_read(s, 0, &q);
		src = q.src;
	}
	if (src)
		source_prefetch(src, 0, source_size(src));
}

static inline int format_doc_text(const struct shard *s, uint32_t doc, const uint8_t *bytes, size_t len,
				  struct format_state *st, struct format_text *ret, char *why, size_t whylen)
{
	return s->format->doc_text(s, doc, bytes, len, st, ret, why, whylen);
}

static inline void format_doc_where(const struct shard *s, uint32_t doc, char *buf, size_t n)
{
	s->format->doc_where(s, doc, buf, n);
}

void format_state_done(struct format_state *st);

/*
 * A digest of the shard's bytes as its checksum sidecar records them
 * (docs/checksums.md), for a cursor's content identity; 0 when the shard
 * has no sidecar.
 */
static inline uint64_t format_content_digest(const struct shard *s)
{
	return s->content_digest;
}

extern const struct format format_megatron, format_jsonl, format_text, format_parquet;
