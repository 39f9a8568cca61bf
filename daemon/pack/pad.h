/* SPDX-License-Identifier: MIT */
/*
 * Padded rows (docs/sample-order.md, sections 11 to 13): the batch layout of
 * the "pad" and "bestfit" packing modes, and the "pad" mode itself.
 *
 * In these modes a row holds whole pieces of document contributions, placed
 * from column 0 without gaps, and the rest of the row is padding. Nothing
 * crosses a row boundary: a piece's labels look only inside the piece, so a
 * row is complete without the stream that follows it.
 *
 * Planning (pad_plan here, bestfit_plan in bestfit.h) walks document lengths
 * only and records where each piece lands (row, column); filling (pad_fill)
 * turns the planned tokens into the batch arrays. The worker reads each
 * piece's tokens straight into input_ids at row * L + column, then calls
 * pad_fill. A pad_batch owns its pieces array; documents come from a
 * pack_source the caller drives (a rank's stream, or a mixture of streams).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/order/stream.h"

/* One document as a packer sees it: who it is, and how many positions it contributes. */
struct pack_doc {
	uint64_t id;     /* the caller's name for it (ORDER_DOC(shard, doc) for a plain feed) */
	uint64_t length; /* positions of its contribution (bos + tokens + eos), > 0 */
	uint64_t epoch;  /* epoch of its source's stream it belongs to */
	uint32_t source; /* mixture source index; 0 without a mixture */
	/* Where it came from, for the session: cursors and the lifetime of tokenized text. */
	uint64_t seq;          /* its visit number in its source's stream */
	struct stream_pos pos; /* its place in its source's stream (offset 0) */
	const int32_t *ids;    /* its tokens (bos/eos excluded) when they are in memory (tokenized text), else NULL */
};

/*
 * Where the packers take documents from: the rank's non-empty documents in
 * contract order (section 4, or the mixture of section 14), one whole
 * contribution at a time.
 */
struct pack_source {
	/* Stores the next document in *ret and moves past it. Returns 0 or a negative errno (-ENODATA, -ENOMEM, ...). */
	int (*next)(void *userdata, struct pack_doc *ret);
	/*
	 * May be NULL. bestfit calls it right before it takes the first document
	 * of a new buffer: the source's position then is the buffer's start,
	 * which cursors name (section 12.5).
	 */
	void (*mark)(void *userdata);
	void *userdata;
};

/* Running totals a session adds up per feed (status JSON, telemetry). */
struct pack_counters {
	uint64_t positions; /* batch positions handed out: B * L per batch */
	uint64_t tokens;    /* positions holding a real token, bos or eos; the rest is padding */
	uint64_t truncated; /* contribution positions dropped (pad mode's tails); never in a batch */
	uint64_t docs;      /* documents whose first position is in a batch */
	uint64_t cut_docs;  /* of those, documents spread over more than one row */
};

static inline void pack_counters_add(struct pack_counters *sum, const struct pack_counters *c)
{
	sum->positions += c->positions;
	sum->tokens += c->tokens;
	sum->truncated += c->truncated;
	sum->docs += c->docs;
	sum->cut_docs += c->cut_docs;
}

/* Packing efficiency: real positions / positions, 0 when nothing was packed. */
static inline double pack_counters_efficiency(const struct pack_counters *c)
{
	return c->positions ? (double)c->tokens / (double)c->positions : 0.0;
}

/* A run of one document's contribution in a row. */
struct row_piece {
	struct pack_doc doc;
	uint64_t offset; /* first position inside the contribution (0: the piece starts the document) */
	uint32_t count;  /* positions, 1 .. L */
	uint32_t row;    /* row inside the batch */
	uint32_t column; /* first column */
};

/* The plan of one batch of padded rows. */
struct pad_batch {
	uint64_t batch_index;
	uint64_t epoch; /* the epoch of the document of the batch's first piece */
	uint32_t batch_size, seq_len;
	struct row_piece *pieces; /* ordered by row, then column; each row's pieces start at column 0, no gaps */
	size_t n_pieces, cap;
	struct row_piece lookahead; /* "concat" over documents (concat.h): the position after the batch, count 1 */
	struct pack_counters counts; /* this batch's share */
};

void pad_batch_clear(struct pad_batch *b);

/* Empties b (keeping its array) for batch batch_index of B rows of L; counts.positions = B * L. */
void pad_batch_reset(struct pad_batch *b, uint32_t batch_size, uint32_t seq_len, uint64_t batch_index);

/*
 * Appends a piece to row `row` after the pieces already there (column =
 * the row's used positions). Returns 0, -ENOMEM, or -EINVAL when it would
 * overflow the row or the row is not the last one or the next.
 */
int pad_batch_push(struct pad_batch *b, const struct pack_doc *doc, uint64_t offset, uint32_t count, uint32_t row);

/*
 * "pad" mode (section 11): the next B documents of src, one per row, each cut
 * to its first L positions; the dropped tail counts as truncated. Resets and
 * fills *plan. Returns 0 or src's error (the documents taken so far are gone
 * from src: the session fails on any error).
 */
int pad_plan(const struct pack_source *src, uint32_t batch_size, uint32_t seq_len, uint64_t batch_index,
	     struct pad_batch *plan);

/*
 * Fills a batch of padded rows. input_ids (B*L) already holds each piece's
 * tokens at row * L + column .. + count - 1; the rest is overwritten with
 * pad_id. Writes labels and position_ids (B*L each) and cu_seqlens (at most
 * B*L + 1 entries): each piece is a segment, each row's padding is one more.
 * Returns the number of cu_seqlens entries; *ret_docs gets the documents
 * that start in the batch.
 */
uint32_t pad_fill(const struct pad_batch *plan, int32_t pad_id, int32_t *input_ids, int32_t *labels,
		  int32_t *position_ids, int32_t *cu_seqlens, uint32_t *ret_docs);
