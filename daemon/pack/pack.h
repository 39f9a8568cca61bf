/* SPDX-License-Identifier: MIT */
/*
 * Packing a rank's stream into batches (docs/sample-order.md, "concat"):
 * batch b holds stream positions bBL .. bBL+BL-1 as B rows of L. Planning walks
 * document lengths only (cheap, sequential, on the main thread); filling turns
 * the planned positions' tokens into the batch arrays (on a worker).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/order/stream.h"

/* The positions of one batch, as pieces of documents, plus one look-ahead position. */
struct batch_plan {
	uint64_t batch_index;
	uint64_t epoch;     /* epoch of the first position */
	uint32_t batch_size, seq_len;
	struct stream_piece *pieces;
	size_t n_pieces, cap;
	struct stream_pos next; /* where the following batch starts */
	/*
	 * pack_plan() stopped on -EAGAIN with `left` positions still to take
	 * (the pieces before them taken from the stream): the next call for the
	 * same batch goes on from there.
	 */
	bool partial;
	uint64_t left;
};

/*
 * Plans the next batch: takes B*L positions from the stream, then records
 * the following position as a one-position look-ahead piece (its token is the
 * last label; whether it starts a document decides that label's mask).
 * Returns 0, -ENODATA, -ENOMEM; -EAGAIN when the stream needs a count or
 * a window that is not known yet (issue #22: a window is never built on
 * the main loop), in which case the stream has moved and the plan is
 * partial: calling again for the same batch_index goes on where it
 * stopped (the pieces taken are kept), so that a plan never takes a
 * position twice. A caller whose counts arrive late (tokenized text) plans
 * only once B*L + 1 positions from the stream's position are known.
 */
int pack_plan(struct stream *s, uint32_t batch_size, uint32_t seq_len, uint64_t batch_index,
	      struct batch_plan *plan);
void pack_plan_clear(struct batch_plan *plan);

/*
 * Fills a batch from its tokens: tok[0 .. BL-1] and the look-ahead token (the
 * first position of the next batch), with is_start[i] = 1 where position i
 * is a document's first, 0 elsewhere (BL + 1 entries, the last for the
 * look-ahead). tok may be input_ids itself (the worker reads tokens straight
 * into the slot); otherwise it is copied there. Writes labels, position_ids
 * (BL each) and cu_seqlens (up to BL + 1 entries). Returns the number of
 * cu_seqlens entries; *ret_docs gets the documents starting in the batch.
 */
uint32_t pack_fill(const int32_t *tok, int32_t lookahead, const uint8_t *is_start, uint32_t batch_size,
		   uint32_t seq_len, int32_t *input_ids, int32_t *labels, int32_t *position_ids, int32_t *cu_seqlens,
		   uint32_t *ret_docs);
