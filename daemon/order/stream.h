/* SPDX-License-Identifier: MIT */
/*
 * A rank's token stream (docs/sample-order.md): for each epoch, for each of the
 * rank's documents in epoch order, bos + tokens + eos (empty documents
 * contribute nothing). The stream is walked in pieces, each a run of
 * positions inside one document's contribution; no tokens are read here.
 *
 * A stream_pos names a place in the stream in O(1) space: epoch, window,
 * the document's index inside the window's order, and the offset inside the
 * document's contribution. Positions are kept normalised: they always point
 * at a position that exists (a non-empty document, offset < its length).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/order/order.h"

struct stream_pos {
	uint64_t epoch;
	uint32_t window;
	uint64_t index;  /* the document's index in the window's full order */
	uint64_t offset; /* position inside the document's contribution */
};

/* A run of consecutive stream positions inside one document's contribution. */
struct stream_piece {
	uint64_t doc;    /* ORDER_DOC(shard, document) */
	uint64_t offset; /* first position inside the contribution (0 = document start) */
	uint64_t count;  /* positions in this piece */
	uint64_t length; /* the whole contribution's length */
};

struct stream {
	const struct order_params *params;
	const uint32_t *const *doc_tokens; /* doc_tokens[s][d]: tokens of document d of shard s */
	uint32_t rank, world;
	bool bos, eos;
	uint64_t epoch_docs;               /* documents in one epoch */
	bool epoch_had_tokens;             /* this rank met a non-empty document in the current epoch */
	unsigned empty_epochs;             /* consecutive epochs that gave this rank no token */

	struct order_epoch ep;
	uint32_t window;
	uint64_t *docs;       /* this rank's documents of the current window */
	size_t n_docs, at;    /* docs[at] is the current document */
	uint64_t first_index; /* window index of docs[0] */
	uint64_t offset;      /* inside the current document's contribution */
	uint64_t length;      /* the current document's contribution length */
};

/*
 * Positions the stream at `pos`, or at its very beginning when pos is NULL.
 * Returns 0; -EINVAL when pos cannot be a position of this rank's stream (wrong
 * rank for the index, index or offset out of range); -ENODATA when the rank
 * receives no tokens at all; -ENOMEM.
 */
int stream_init(struct stream *s, const struct order_params *params, const uint32_t *const *doc_tokens,
		uint32_t rank, uint32_t world, bool bos, bool eos, const struct stream_pos *pos);
void stream_clear(struct stream *s);

/* The current position. */
struct stream_pos stream_tell(const struct stream *s);

/*
 * Takes up to `max` positions from the current document into *ret and
 * advances (to the next non-empty document when this one is used up).
 * Returns 0, -ENODATA, -ENOMEM.
 */
int stream_take(struct stream *s, uint64_t max, struct stream_piece *ret);

/* The document and offset at the current position, without advancing. */
struct stream_piece stream_peek(const struct stream *s);

/* Contribution length of a document with `tokens` tokens. */
static inline uint64_t stream_doc_length(const struct stream *s, uint64_t tokens)
{
	return tokens ? tokens + s->bos + s->eos : 0;
}
