/* SPDX-License-Identifier: MIT */
/*
 * A rank's token stream (docs/sample-order.md): for each epoch, for each of the
 * rank's documents in epoch order, bos + tokens + eos (empty documents
 * contribute nothing). The stream is walked in pieces, each a run of
 * positions inside one document's contribution; no tokens are read here.
 *
 * A stream_pos names a place in the stream in O(1) space: epoch, window,
 * the document's index inside the window's order, and the offset inside the
 * document's contribution. Positions are kept normalised ("settled"): they
 * point at a position that exists (a non-empty document, offset < its
 * length) once the token counts they depend on are known.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/order/order.h"

struct stream_pos {
	uint64_t epoch;
	uint32_t window;
	uint64_t index;  /* the document's index in the window's full order */
	uint64_t offset; /* position inside the document's contribution */
	/*
	 * k_w, the documents of the epoch before window `window` (section 3),
	 * when has_k: a resume places the window without counting the shards
	 * before it (issue #22; fc1 cursors carry it, section 7.1).
	 */
	uint64_t k;
	bool has_k;
};

/* A run of consecutive stream positions inside one document's contribution. */
struct stream_piece {
	uint64_t doc;         /* ORDER_DOC(shard, document) */
	uint64_t offset;      /* first position inside the contribution (0 = document start) */
	uint64_t count;       /* positions in this piece */
	uint64_t length;      /* the whole contribution's length */
	const int32_t *ids;   /* the document's tokens when they are in memory (tokenized text), else NULL */
};

/*
 * Where token counts come from. Shards that store tokens know every count at
 * load; text is tokenized on the way, so a count may not be known yet.
 */
struct stream_source {
	/*
	 * The document the stream visits `seq`-th since stream_init (0 = the
	 * first), whose id is `doc`: returns 0 with its token count and, when
	 * they are in memory, its tokens (else NULL); or -EAGAIN when the
	 * count is not known yet.
	 */
	int (*doc)(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids);
	void *userdata;
	/*
	 * Optional: doc will be asked for soon (stage 0: in about
	 * DOC_WALK_AHEAD documents, 1: in half as many). Warms what doc()
	 * will read; never fails. Called for windows whose documents are
	 * computed per use (section 3.1's bijection), whose index reads are
	 * random.
	 */
	void (*prefetch)(void *userdata, uint64_t doc, unsigned stage);
	/*
	 * stream_init_source() leaves the first document unsettled and its
	 * walk cold (doc_walk.cold): the caller opens many streams, warms
	 * them together and settles each (stream_settle) before it returns
	 * (the virtual streams of an elastic session, session-virtual.c).
	 */
	bool unsettled;
};

/*
 * A rank's documents in contract order, crossing windows and epochs; no
 * lengths. The stream walks one; a tokenizing session walks a second one
 * ahead of it to know which documents to tokenize next.
 */
#define DOC_WALK_AHEAD 32
/* A walk with fewer of its documents in a window crosses windows fast: it asks for more of them ahead (stream.c). */
#define WALK_FEW_DOCS 1024

struct doc_walk {
	const struct order_params *params;
	uint32_t rank, world;
	struct order_epoch ep;
	uint32_t window;
	struct order_window win; /* this rank's documents of the current window (order_window_doc) */
	size_t n_docs, at;    /* the at-th of them is the current document */
	uint64_t first_index; /* window index of the first */
	/*
	 * A window permuted by the bijection: the ids of its documents
	 * ahead_lo .. ahead_end - 1 (at most DOC_WALK_AHEAD from at), each
	 * computed once, at ahead[m % DOC_WALK_AHEAD]; prefetch (if set) is
	 * told of each as it is computed, and again half-way.
	 */
	size_t ahead_lo, ahead_end;
	uint64_t ahead[DOC_WALK_AHEAD];
	void (*prefetch)(void *ctx, uint64_t doc, unsigned stage);
	void *prefetch_ctx;
	/*
	 * Only the current document is told to prefetch (stage 0) until the
	 * walk's first step or doc_walk_warm(): a stream opened long before
	 * its rows are made (one of an elastic session's many) reads nothing
	 * ahead that the first batches do not need.
	 */
	bool cold;
	uint32_t *held;   /* params->hold: the shards of the window held (n_held) */
	uint32_t n_held;
	/* params->hold and its context, kept: they are called when the walk is cleared, params maybe gone */
	void (*hold_fn)(void *ctx, uint32_t shard, bool on);
	void *hold_ctx;
	/*
	 * The last doc_walk_next() stopped at a window whose counts were not
	 * known yet (params->count returned -EAGAIN: they are being found off
	 * this thread): the next call enters window pending_window, having
	 * crossed pending_crossed epochs, instead of moving on. The current
	 * document is then none (doc_walk_doc must not be asked).
	 */
	bool pending;
	uint32_t pending_window;
	unsigned pending_crossed;
	/*
	 * Holds its windows' shards (params->hold): a stream's walk, whose
	 * documents are settled (their text read) before it leaves a window,
	 * and a text session's walk ahead of it, whose documents' lengths the
	 * main loop reads from the index as it hands them out (session-text.c).
	 */
	bool hold;
};

/*
 * Places w at this rank's `at`-th document of window `window` of `epoch`
 * (at = SIZE_MAX: just before the window's first, so that doc_walk_next()
 * finds the rank's first document from there; a window not counted yet,
 * params->count -EAGAIN, leaves the walk pending there). Returns 0,
 * -EINVAL (no such window or document), -ENOMEM.
 */
int doc_walk_seek(struct doc_walk *w, const struct order_params *params, uint32_t rank, uint32_t world,
		  uint64_t epoch, uint32_t window, size_t at);
/*
 * doc_walk_seek() with the window's start k_w given (k: NULL when not known),
 * checked when it is known (-ERANGE: it is not that); hold: the walk holds its windows' shards
 * (params->hold), as a stream's does.
 */
int doc_walk_seek_k(struct doc_walk *w, const struct order_params *params, uint32_t rank, uint32_t world,
		    uint64_t epoch, uint32_t window, const uint64_t *k, size_t at, bool hold);
/*
 * Moves to the rank's next document, crossing windows and epochs; *ret_epochs
 * gets the number of epoch boundaries crossed. Returns 0; -ENOMEM; -ENODATA
 * when more epochs than the contract's empty-epoch bound hold no document
 * for this rank at all; -EAGAIN when a window it enters is not counted yet
 * (params->count said so: the walk is then pending, and the next call goes
 * on from there once the count is in).
 */
int doc_walk_next(struct doc_walk *w, unsigned *ret_epochs);
void doc_walk_clear(struct doc_walk *w);

/* Computes the ids of the documents ahead of a walk in a permuted window (and prefetches them). */
void doc_walk_ahead(struct doc_walk *w);
/*
 * Sets the walk's prefetch (stream_source.prefetch) and warms what it has
 * computed ahead with it; cold: only its current document (doc_walk.cold).
 */
void doc_walk_set_prefetch(struct doc_walk *w, void (*prefetch)(void *userdata, uint64_t doc, unsigned stage),
			   void *ctx, bool cold);
/* How much of a cold walk doc_walk_warm() asks for. */
enum walk_warm {
	WALK_WARM_FIRST, /* its current document's stage 1: what stream_settle reads next */
	WALK_WARM_AHEAD, /* stage 0 of every document computed ahead (reads queued, none waited for); still cold */
	WALK_WARM_ALL,   /* both stages as from a standstill (doc_walk_ahead): the walk is cold no more */
};
/* Warms a cold walk (doc_walk.cold) as `how` says; nothing for a warm one. */
void doc_walk_warm(struct doc_walk *w, enum walk_warm how);

static inline uint64_t doc_walk_doc(const struct doc_walk *w)
{
	if (w->at >= w->ahead_lo && w->at < w->ahead_end)
		return w->ahead[w->at % DOC_WALK_AHEAD];
	return order_window_doc(&w->win, w->at);
}

static inline uint64_t doc_walk_index(const struct doc_walk *w)
{
	return w->first_index + (uint64_t)w->at * w->world;
}

struct stream {
	struct doc_walk walk;
	struct stream_source src;
	bool bos, eos;
	bool epoch_had_tokens;             /* this rank met a non-empty document in the current epoch */
	unsigned empty_epochs;             /* consecutive epochs that gave this rank no token */

	uint64_t seq;         /* the current document is the seq-th visited */
	bool known;           /* its length (and tokens) are known */
	uint64_t offset;      /* inside the current document's contribution */
	uint64_t length;      /* the current document's contribution length */
	const int32_t *ids;
	bool check_offset;    /* offset came from a cursor: check it once the length is known */
	bool advancing;       /* the move to the next document waits for a window's count (walk.pending) */
};

/*
 * Positions the stream at `pos`, or at its very beginning when pos is NULL,
 * with token counts from src. Returns 0; -EINVAL when pos cannot be a
 * position of this rank's stream (wrong rank for the index, index or offset
 * out of range); -ERANGE when pos's k_w is not the window's start where
 * that is known (counted); -ENODATA when the rank receives no tokens at all; -ENOMEM.
 * With a source that does not know counts yet, the checks that need them
 * happen in stream_settle(). From the beginning, a first window not counted
 * yet (params->count -EAGAIN) leaves the stream advancing: not placed until
 * a stream_settle() finds it counted (nothing else may be asked of it).
 * At pos, a window not counted yet (params->count -EAGAIN: every shard it
 * misses asked for) is -EAGAIN: nothing kept, the caller comes back once
 * they are counted.
 */
int stream_init_source(struct stream *s, const struct order_params *params, const struct stream_source *src,
		       uint32_t rank, uint32_t world, bool bos, bool eos, const struct stream_pos *pos);
/* stream_init_source() with counts from doc_tokens[shard][document] (stored tokens). */
int stream_init(struct stream *s, const struct order_params *params, const uint32_t *const *doc_tokens,
		uint32_t rank, uint32_t world, bool bos, bool eos, const struct stream_pos *pos);
void stream_clear(struct stream *s);

/*
 * Resolves the current document and skips empty ones, so the stream points
 * at a position that exists. Returns 0; -EAGAIN when a count is not known
 * yet, a document's or a window's (call again later); -ENODATA (the rank gets no tokens); -EINVAL (a
 * cursor's offset lies past its document's end); -ENOMEM.
 */
int stream_settle(struct stream *s);

/* The current position (settled streams only). */
struct stream_pos stream_tell(const struct stream *s);

/*
 * Takes up to `max` positions from the current document into *ret and
 * advances (to the next non-empty document when this one is used up).
 * Returns 0; or what stream_settle() returns when the current document is
 * not settled, in which case nothing was taken.
 */
int stream_take(struct stream *s, uint64_t max, struct stream_piece *ret);

/* The document and offset at the current position, without advancing (settled streams only). */
struct stream_piece stream_peek(const struct stream *s);

/* Contribution length of a document with `tokens` tokens. */
static inline uint64_t stream_doc_length(const struct stream *s, uint64_t tokens)
{
	return tokens ? tokens + s->bos + s->eos : 0;
}
