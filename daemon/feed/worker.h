/* SPDX-License-Identifier: MIT */
/*
 * What a pool worker owns (a source reader, scratch buffers) and the one thing
 * it does: turn a batch plan into a finished batch in a ring slot, reading the
 * planned token ranges with every read in flight at once. Shards are reached
 * through the format layer and read through the source layer only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/feed/feed.h"
#include "daemon/pack/pack.h"
#include "daemon/pack/pad.h"
#include "daemon/pool/pool.h"
#include "daemon/source/source.h"
#include "daemon/tokenize/tokenize.h"
#include "proto/ring_abi.h"

struct worker {
	struct source_reader *io;
	uint8_t *raw;      /* tokens as stored, at position * 8 */
	uint8_t *is_start; /* BL + 1 */
	size_t positions;  /* capacity of the three above, in positions */
	struct source_read *reqs;
	struct widen_run *runs;
	size_t cap_reqs;

	struct tokenize_scratch tk; /* tokenizing text (daemon/tokenize) */
};

struct session;
struct session_src;

/*
 * Tokenized text: a run of consecutive documents of one rank's stream (visits
 * first_seq .. first_seq + n - 1), read and tokenized together by a worker.
 * Chunks are kept in stream order; plans point into their tokens, so a chunk
 * is freed only once every batch that used it is published. The worker's
 * input and output (worker_tokenize); the session owns it.
 */
struct text_chunk {
	struct pool_job job;
	struct session *session;
	struct session_src *src;      /* the stream it belongs to */
	struct text_chunk *next;      /* in stream order */
	struct text_chunk *next_done; /* completion list */
	uint64_t first_seq;
	uint32_t n;
	uint64_t *docs;      /* n document ids */
	uint64_t bytes;      /* of text to read */

	/* written by the worker */
	uint64_t *start;     /* n + 1 offsets into ids */
	int32_t *ids;
	uint32_t skipped;    /* bad records turned into empty documents */
	char **bad;          /* n entries: why each skipped document was bad, NULL for good ones (array NULL when none) */
	int result;
	char error[512];     /* the failure, or the first skipped record's reason */

	/* main thread */
	bool done;
	uint64_t last_batch; /* the latest batch that may use its tokens */
};

struct worker *worker_new(enum io_engine engine, unsigned depth);
struct worker *worker_free(struct worker *w);

/*
 * Reads and tokenizes the documents of chunk c of text feed f (the library's
 * tokenize_read() and tokenize_encode(), with the feed's read and tokenize
 * stages and counters), writing the chunk's start/ids (and skipped count).
 * Returns 0, or a negative errno with a message naming the file and line in
 * c->error (a bad record under on_bad_record = fail, a shard that changed,
 * no memory).
 */
int worker_tokenize(struct worker *w, struct feed *f, struct text_chunk *c);

/*
 * Produces the batch `plan` of feed f into slot (a ring slot of the feed's
 * geometry), header included. Returns 0, or a negative errno with a message
 * naming the file and offset in err.
 */
int worker_produce(struct worker *w, const struct feed *f, const struct batch_plan *plan, uint32_t rank,
		   uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
		   char *err, size_t errlen);

/*
 * Produces a batch planned as rows of whole documents (packing pad or
 * bestfit, or a mixture's concat): each piece's tokens at its row and column,
 * then pad_fill() (pack_fill() for concat). Returns like worker_produce().
 */
int worker_produce_rows(struct worker *w, const struct feed *f, const struct pad_batch *plan, uint32_t rank,
			uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
			char *err, size_t errlen);
