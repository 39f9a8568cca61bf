/* SPDX-License-Identifier: MIT */
/*
 * Tokenizing a chunk of text documents: read every document of the chunk
 * through the source layer (one batch of reads, all in flight at once), find
 * each document's text through the format layer, and encode it with the
 * tokenizer. Shared by the daemon's workers (feed/worker.c, which adds its
 * telemetry around the two phases) and `feedctl prep`, so that prepared
 * shards hold exactly the tokens a text feed serves.
 *
 * A bad record (not JSON, no text member, longer than max_doc_bytes, a
 * tokenizer error) is fatal under skip_bad_records = false; otherwise it
 * becomes an empty document, named in bad[i], and counted in skipped.
 *
 * No logging, no feed: this sits in the library below the policy layer.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/format/format.h"
#include "daemon/source/source.h"
#include "daemon/tok/tok.h"

struct tok;
struct tok_part;
struct tok_state;

/* How a text feed's documents become tokens. */
struct tokenize_params {
	struct shard *const *shards;  /* indexed by ORDER_DOC_SHARD(doc) */
	const struct tok *tok;
	uint64_t tok_generation;      /* tells apart toks that reuse an address (per-thread states) */
	uint64_t max_doc_bytes;
	bool encode_specials;         /* special tokens in the text are encoded as such */
	bool skip_bad_records;
	/*
	 * A streamed document (TOKENIZE_STREAM_BYTES) of more tokens than this
	 * keeps only its count (tokenize_chunk.lazy): its ids are made again
	 * when needed (tokenize_pool_get()). 0: every document's ids are kept.
	 */
	uint64_t lazy_tokens;
};

/* A run of documents: docs in, tokens out. */
struct tokenize_chunk {
	uint32_t n;
	const uint64_t *docs; /* n document ids (ORDER_DOC) */
	uint64_t bytes;       /* of text to read, for messages */

	/* written by tokenize_encode() */
	uint64_t *start;      /* n + 1 offsets into ids (malloc'd, the caller's to free) */
	int32_t *ids;         /* malloc'd */
	uint32_t skipped;     /* bad records turned into empty documents */
	char **bad;           /* n entries, why each skipped document was bad (NULL when none was) */
	uint64_t *lazy;       /* n entries or NULL: the token count of a document whose ids are not held, else 0 */
	uint64_t read_bytes;  /* bytes read and handed to the tokenizer */
	uint64_t tokens;
	uint64_t replaced;    /* invalid UTF-8 sequences replaced */
	char error[512];      /* the failure, or the first skipped record's reason */
	char note[384];       /* tokenize_read(): a damaged cache copy that was made again (for the caller to log) */
};

/* A thread's reusable buffers and tokenizer states. */
struct tokenize_scratch {
	uint8_t *text;
	size_t text_cap;
	struct source_read *reqs;
	size_t reqs_cap, n_reqs;
	uint32_t *held;       /* shards whose copies tokenize_read() holds while it reads (format_acquire) */
	size_t held_cap, n_held;
	struct format_state fmt;
	struct source_reader *reader; /* tokenize_read()'s, for documents read a segment at a time */
	uint8_t *seg;                 /* a streamed document's segment, and its decoded text */
	uint8_t *seg_text;
	size_t seg_cap;
	struct tok_part *part;
	struct {
		uint64_t generation;
		struct tok_state *st;
	} toks[4];            /* per-thread states of the tokenizers met lately */
	unsigned toks_next;
};

void tokenize_scratch_done(struct tokenize_scratch *t);
/* This thread's state for p's tokenizer (made on first use), or NULL when out of memory. */
struct tok_state *tokenize_scratch_state(struct tokenize_scratch *t, const struct tokenize_params *p);

/*
 * A document over this many bytes (jsonl and text formats, byte-level
 * tokenizers) is not read whole: phase 2 reads it TOKENIZE_SEGMENT bytes at
 * a time, JSON-decodes and tokenizes each segment as it comes (tok_part_*),
 * with the same ids; past lazy_tokens not even its ids are held.
 */
#define TOKENIZE_STREAM_BYTES (4u << 20)
#define TOKENIZE_SEGMENT (1u << 20)

/*
 * Phase 1: reads the chunk's documents into t->text through r (but the
 * streamed ones, which phase 2 reads through r). Returns 0, the chunk's
 * lazy shards (text copies) held for phase 2, which must follow and lets
 * go of them; or a negative errno with a message naming the file and byte
 * in c->error, nothing held.
 */
int tokenize_read(struct tokenize_scratch *t, struct source_reader *r, const struct tokenize_params *p,
		  struct tokenize_chunk *c);
/*
 * Phase 2: tokenizes what tokenize_read() read, filling c's outputs.
 * Returns 0; -EBADMSG for a bad record under skip_bad_records = false,
 * -ENOMEM; with a message in c->error.
 */
int tokenize_encode(struct tokenize_scratch *t, const struct tokenize_params *p, struct tokenize_chunk *c);

/*
 * Whether path names a Hugging Face tokenizer.json (by its ".json" name);
 * anything else is a tiktoken rank file, which needs a preset.
 */
bool tokenize_tok_is_hf(const char *path);
/*
 * Loads the tokenizer a text feed names (tok_load_hf or tok_load_rankfile
 * by tokenize_tok_is_hf). Returns like those, with a message in *ret_error.
 */
int tokenize_tok_load(const char *path, const char *preset, struct tok **ret, char **ret_error);

/* Frees c's outputs (start, ids, bad, lazy), keeping docs. */
void tokenize_chunk_done(struct tokenize_chunk *c);

/* Document i's token count, and its ids (NULL when they are not held: tokenize_pool_get()). */
static inline uint64_t tokenize_chunk_tokens(const struct tokenize_chunk *c, uint32_t i)
{
	return c->lazy && c->lazy[i] ? c->lazy[i] : c->start[i + 1] - c->start[i];
}

static inline const int32_t *tokenize_chunk_ids(const struct tokenize_chunk *c, uint32_t i)
{
	return c->lazy && c->lazy[i] ? NULL : c->ids + c->start[i];
}

/* The default lazy_tokens of the daemon's text feeds: 4 MiB of ids. */
#define TOKENIZE_LAZY_TOKENS (1u << 20)

/*
 * A streamed document read, JSON-decoded and tokenized a segment at a time
 * (tokenize_stream_step() hands one segment's ids to the sink). seg and
 * seg_text are the caller's, TOKENIZE_SEGMENT bytes each.
 */
struct tokenize_stream {
	struct source_read q; /* the whole document */
	const char *key;
	bool json, in_text;
	struct tok_part *part;
	uint8_t *seg, *seg_text;
	size_t have;          /* bytes of seg not decoded yet */
	uint64_t at;          /* bytes of the document read */
	int tok_error;        /* TOKENIZE_STREAM_BAD: the tokenizer's errno */
};

enum {
	TOKENIZE_STREAM_END = 1,   /* the document's last ids were handed over */
	TOKENIZE_STREAM_WHOLE = 2, /* the record must be read whole (what the scanner leaves to jansson) */
	TOKENIZE_STREAM_BAD = 3,   /* the tokenizer failed (tok_error) */
};

/* Returns 0, TOKENIZE_STREAM_WHOLE (a tok that cannot be streamed) or -ENOMEM. */
int tokenize_stream_begin(struct tokenize_stream *z, const struct tokenize_params *p, uint64_t doc, unsigned flags,
			  uint8_t *seg, uint8_t *seg_text);
/*
 * Reads and tokenizes the next segment. Returns 0 (more to come), one of
 * the TOKENIZE_STREAM_* above, -ENOMEM (a sink's failure too), or another
 * negative errno for a read failure, with err set.
 */
int tokenize_stream_step(struct tokenize_stream *z, struct source_reader *r, struct tok_state *st, tok_sink_fn sink,
			 void *userdata, char *err, size_t errlen);
void tokenize_stream_done(struct tokenize_stream *z);
/* Bytes [at, at + len) of document doc into dst; a read failure named in err. */
int tokenize_stream_read(struct source_reader *r, const struct source_read *doc, uint64_t at, size_t len,
			 uint8_t *dst, char *err, size_t errlen);

/*
 * A feed's cursors over its huge documents (tokenize-cursor.c): the ids of
 * a document the chunk kept only the count of, made again from its start
 * and handed out in order; a cursor keeps about the last segment's ids, so
 * rows that ask in order (or slightly out of it) never start over, and at
 * most a few cursors are kept. Thread-safe.
 */
struct tokenize_pool;
int tokenize_pool_new(struct tokenize_pool **ret);
struct tokenize_pool *tokenize_pool_free(struct tokenize_pool *pl);
/*
 * Writes ids [from, from + count) of document doc (by p, read through r,
 * with the calling thread's tokenizer state st) to dst. Returns 0; -ENOMEM;
 * another negative errno with err set.
 */
int tokenize_pool_get(struct tokenize_pool *pl, const struct tokenize_params *p, struct source_reader *r,
		      struct tok_state *st, uint64_t doc, uint64_t from, size_t count, int32_t *dst, char *err, size_t errlen);
/*
 * Frees the cursors not in use and given back idle_ns or longer before now
 * (now_ns()): each holds a segment's bytes, its decoded text and the ids
 * kept (5-8 MB), which a document read once should not keep until the feed
 * goes. Returns how many were freed.
 */
unsigned tokenize_pool_trim(struct tokenize_pool *pl, uint64_t now, uint64_t idle_ns);
