/* SPDX-License-Identifier: MIT */
/*
 * What a pool worker owns (a source reader, scratch buffers) and the one thing
 * it does: turn a batch plan into a finished batch in a ring slot, reading the
 * planned token ranges with every read in flight at once. Shards are reached
 * through the format layer and read through the source layer only.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/feed/feed.h"
#include "daemon/pack/pack.h"
#include "daemon/pack/pad.h"
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
	int32_t *rows_tok;          /* worker_produce_concat_rows: every row's positions and look-ahead */
	uint32_t *rows_cu;          /* and one row's cu_seqlens */
	size_t rows_cap;            /* positions of rows_tok (rows_cu: as many) */
};

struct worker *worker_new(enum io_engine engine, unsigned depth);
struct worker *worker_free(struct worker *w);

/*
 * Reads and tokenizes the documents of chunk t of text feed f (the library's
 * tokenize_read() and tokenize_encode(), with the feed's read and tokenize
 * stages and counters), writing t's outputs (which t's owner frees with
 * tokenize_chunk_done(), also after a failure). Returns 0, or a negative
 * errno with a message naming the file and line in t->error (a bad record
 * under on_bad_record = fail, a shard that changed, no memory).
 */
int worker_tokenize(struct worker *w, struct feed *f, struct tokenize_chunk *t);

/*
 * Produces the batch `plan` of feed f into slot (a ring slot of the feed's
 * geometry), header included. Returns 0, or a negative errno with a message
 * naming the file and offset in err.
 */
int worker_produce(struct worker *w, const struct feed *f, const struct batch_plan *plan, uint32_t rank,
		   uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
		   char *err, size_t errlen);

/*
 * The rows of an elastic batch (docs/sample-order.md, section 17.3) whose
 * virtual streams pack plain "concat": plans[i] is row i's one-row plan (L + 1
 * positions, the look-ahead included). Every row's reads are queued and run
 * together (one submission, not one per row), then each row is filled as its
 * own one-row batch at row i of slot: cu_seqlens shifted by i*L without each
 * row's last entry, then B*L. Writes the arrays, not the header: returns 0
 * with *ret_n_cu and *ret_docs, or a negative errno with err.
 */
int worker_produce_concat_rows(struct worker *w, const struct feed *f, const struct batch_plan *const *plans,
			       uint32_t batch_size, uint32_t seq_len, const struct feed_ring_header *geom,
			       uint8_t *slot, uint32_t *ret_n_cu, uint32_t *ret_docs, char *err, size_t errlen);

/*
 * Produces a batch planned as rows of whole documents (packing pad or
 * bestfit, or a mixture's concat): each piece's tokens at its row and column,
 * then pad_fill() (pack_fill() for concat). Returns like worker_produce().
 */
int worker_produce_rows(struct worker *w, const struct feed *f, const struct pad_batch *plan, uint32_t rank,
			uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
			char *err, size_t errlen);
