/* SPDX-License-Identifier: MIT */
/*
 * Walking a rank's stream. Moving forward builds each window's document list
 * once (O(documents in the window)); nothing ever walks backwards. A
 * document's count may arrive later than the walk (tokenized text): the
 * stream then waits at that document, unsettled, and stream_settle() goes on
 * once the count is known. Settling only ever moves through known counts, so
 * where a stream stops does not depend on when counts arrive.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/order/stream.h"
#include "proto/macro.h"

/* Lets go of the shards held (params->hold), and of the list. */
static void unhold(const struct doc_walk *w, uint32_t *held, uint32_t n)
{
	for (uint32_t i = 0; w->hold_fn && i < n; i++)
		w->hold_fn(w->hold_ctx, held[i], false);
	free(held);
}

void doc_walk_clear(struct doc_walk *w)
{
	unhold(w, w->held, w->n_held);
	order_epoch_clear(&w->ep);
	order_window_clear(&w->win);
	*w = (struct doc_walk){ 0 };
}

static int enter_window(struct doc_walk *w, uint32_t window);

/* Whether window w of ep holds a document of `rank` of `world` (order_window_build's `mine` > 0). */
static bool window_has_rank(const struct order_epoch *ep, uint32_t w, uint32_t rank, uint32_t world)
{
	uint64_t k0 = ep->win_start[w], n = ep->win_start[w + 1] - k0;
	return (rank + world - k0 % world) % world < n;
}

static int load_window(struct doc_walk *w, uint32_t window)
{
	/* The new window's shards are held before they are made ready, the old one's let go after. */
	uint32_t *prev = w->held, n_prev = w->n_held;
	w->held = NULL;
	w->n_held = 0;
	const struct order_params *p = w->params;
	if (w->hold && p->hold && window < w->ep.n_windows) {
		uint32_t lo = window * p->window, hi = (uint32_t)MIN((uint64_t)(window + 1) * p->window, (uint64_t)p->n_shards);
		w->hold_fn = p->hold;
		w->hold_ctx = p->count_ctx;
		w->held = malloc(MAX(hi - lo, 1u) * sizeof(*w->held));
		if (!w->held) {
			unhold(w, prev, n_prev);
			return -ENOMEM;
		}
		for (uint32_t i = lo; i < hi; i++) {
			w->held[w->n_held++] = w->ep.perm[i];
			p->hold(p->count_ctx, w->ep.perm[i], true);
		}
	}
	int r = enter_window(w, window);
	unhold(w, prev, n_prev);
	return r;
}

static int enter_window(struct doc_walk *w, uint32_t window)
{
	/* The window being left is released first: at most one window's list is held. */
	order_window_leave(&w->win);
	w->n_docs = 0;
	/* Its start and end: counting its shards (and any before it not counted yet) when not known (issue #22). */
	int r = order_epoch_window(w->params, &w->ep, window);
	if (r < 0)
		return r;
	/*
	 * A cursor's k_w (issue #22), checked once the shards before its window
	 * are counted. Ownership depends on k_w mod world only and every later
	 * start moves with it, so one off by a multiple of world walked the very
	 * stream: corrected (the cursors made from here on carry the right one).
	 * Off by anything else, the cursor's index was altered with it and the
	 * documents since were not the rank's: -ERANGE (section 7.3).
	 */
	uint64_t seeded, k;
	if (order_epoch_check_seed(&w->ep, &seeded, &k) < 0) {
		if ((k > seeded ? k - seeded : seeded - k) % w->world)
			return -ERANGE;
		order_epoch_adopt_shared(&w->ep);
		r = order_epoch_window(w->params, &w->ep, window);
		if (r < 0)
			return r;
	}
	r = order_window_build(w->params, &w->ep, window, w->rank, w->world, &w->win);
	if (r < 0)
		return r;
	w->n_docs = w->win.mine;
	w->first_index = w->win.first;
	/*
	 * The next window holding one of this rank's documents is shuffled
	 * ahead, off this thread, while this one is read; nothing from a
	 * window the rank only passes through (none of its documents: most
	 * windows of a virtual stream, section 17). Asking for the next window
	 * whatever it holds left windows built ahead that the asking walk
	 * never took, pushing out those built for walks that read them.
	 */
	const struct order_windows *ws = w->params->windows;
	/*
	 * A walk with few documents in each window (a virtual stream's: a
	 * row of it crosses several) asks seven windows ahead: the main loop
	 * never builds one (issue #22), so a walk that reaches a window not
	 * built yet waits for the pool; one ahead is not built before such a
	 * walk reaches it.
	 */
	unsigned ahead = w->win.mine < WALK_FEW_DOCS ? 7 : 1;
	uint32_t next = window + 1;
	for (unsigned a = 0; ws && w->params->shuffle && w->win.mine && a < ahead; a++, next++) {
		/*
		 * A window over list_max has no list to build ahead (section 3.1).
		 * Windows whose counts are not known yet are not searched (their
		 * starts are not known): the builder counts them.
		 */
		while (next < w->ep.n_windows && order_epoch_has(&w->ep, next) &&
		       !window_has_rank(&w->ep, next, w->rank, w->world))
			next++;
		if (next >= w->ep.n_windows) {
			ws->prefetch(ws->ctx, w->ep.epoch + 1, 0, 0, a > 0);
			break;
		}
		/* Not counted yet: the builder counts it (and drops it if it is over list_max); nothing past it is known. */
		if (!order_epoch_has(&w->ep, next)) {
			ws->prefetch(ws->ctx, w->ep.epoch, next, w->ep.win_start[next], a > 0);
			break;
		}
		if (!order_window_permuted(w->params, w->ep.win_start[next + 1] - w->ep.win_start[next]))
			ws->prefetch(ws->ctx, w->ep.epoch, next, w->ep.win_start[next], a > 0);
	}
	w->window = window;
	w->at = 0;
	w->ahead_lo = w->ahead_end = 0;
	doc_walk_ahead(w);
	return 0;
}

void doc_walk_ahead(struct doc_walk *w)
{
	if (!w->win.permuted || w->at >= w->n_docs)
		return;
	if (w->at < w->ahead_lo || w->at > w->ahead_end)
		w->ahead_end = w->at; /* a jump: nothing computed is of use */
	w->ahead_lo = w->at;
	/* From a standstill (a start, a jump, a new window) every document up to `near` is warmed at once. */
	bool fresh = w->ahead_end == w->at;
	/* A cold walk computes the ids ahead and asks for its current document only (doc_walk.cold). */
	bool tell = w->prefetch && !w->cold;
	size_t end = MIN(w->n_docs, w->at + DOC_WALK_AHEAD);
	for (; w->ahead_end < end; w->ahead_end++) {
		uint64_t id = order_window_doc(&w->win, w->ahead_end);
		w->ahead[w->ahead_end % DOC_WALK_AHEAD] = id;
		if (tell)
			w->prefetch(w->prefetch_ctx, id, 0);
	}
	size_t near = w->at + DOC_WALK_AHEAD / 2;
	if (!w->prefetch)
		return;
	if (w->cold) {
		if (fresh)
			w->prefetch(w->prefetch_ctx, w->ahead[w->at % DOC_WALK_AHEAD], 0);
		return;
	}
	for (size_t m = fresh ? w->at : near; m <= near && m < w->ahead_end; m++)
		w->prefetch(w->prefetch_ctx, w->ahead[m % DOC_WALK_AHEAD], 1);
}

void doc_walk_warm(struct doc_walk *w, enum walk_warm how)
{
	if (!w->cold)
		return;
	if (how == WALK_WARM_ALL)
		w->cold = false;
	if (!w->prefetch || !w->win.permuted || w->at < w->ahead_lo || w->at >= w->ahead_end)
		return;
	/* As from a standstill (doc_walk_ahead): the ids are computed already. */
	if (how != WALK_WARM_FIRST)
		for (size_t m = w->at; m < w->ahead_end; m++)
			w->prefetch(w->prefetch_ctx, w->ahead[m % DOC_WALK_AHEAD], 0);
	if (how == WALK_WARM_AHEAD)
		return;
	size_t near = how == WALK_WARM_ALL ? w->at + DOC_WALK_AHEAD / 2 : w->at;
	for (size_t m = w->at; m <= near && m < w->ahead_end; m++)
		w->prefetch(w->prefetch_ctx, w->ahead[m % DOC_WALK_AHEAD], 1);
}

void doc_walk_set_prefetch(struct doc_walk *w, void (*prefetch)(void *userdata, uint64_t doc, unsigned stage),
			   void *ctx, bool cold)
{
	w->prefetch = prefetch;
	w->prefetch_ctx = ctx;
	w->cold = cold && prefetch;
	/* What was computed ahead without it is computed again, and warmed (a fresh start at the walk's next place). */
	size_t at = w->at == SIZE_MAX ? 0 : w->at;
	w->ahead_lo = w->ahead_end = at;
	if (w->at != SIZE_MAX)
		doc_walk_ahead(w);
}

static int walk_seek(struct doc_walk *w, const struct order_params *params, uint32_t rank, uint32_t world,
		     uint64_t epoch, uint32_t window, const uint64_t *k, size_t at, bool hold)
{
	*w = (struct doc_walk){ .params = params, .rank = rank, .world = world, .hold = hold };
	int r = order_epoch_build(params, epoch, &w->ep);
	if (r < 0)
		goto fail;
	r = -EINVAL;
	if (window >= w->ep.n_windows)
		goto fail;
	/*
	 * A cursor's k_w: the shards before the window are not counted (or
	 * checked against it when they are, now or later: enter_window). At
	 * most 2^32 - 2 documents per shard before it, so no start wraps.
	 */
	r = -ERANGE;
	if (k && (*k > (uint64_t)MIN((uint64_t)window * params->window, (uint64_t)params->n_shards) *
			       (ORDER_DOCS_UNKNOWN - 1) ||
		  order_epoch_seed(&w->ep, window, *k) < 0))
		goto fail;
	r = load_window(w, window);
	if (r == -EAGAIN && at == SIZE_MAX) {
		/* Not counted yet (issue #22): doc_walk_next() enters it once it is, as if from just before it. */
		w->pending = true;
		w->pending_window = window;
		w->pending_crossed = 0;
		w->window = window;
		w->n_docs = 0;
		w->at = SIZE_MAX;
		return 0;
	}
	if (r < 0)
		goto fail;
	r = -EINVAL;
	if (at != SIZE_MAX && at >= w->n_docs)
		goto fail;
	w->at = at;
	doc_walk_ahead(w);
	return 0;
fail:
	doc_walk_clear(w);
	return r;
}

int doc_walk_seek_k(struct doc_walk *w, const struct order_params *params, uint32_t rank, uint32_t world,
		    uint64_t epoch, uint32_t window, const uint64_t *k, size_t at, bool hold)
{
	return walk_seek(w, params, rank, world, epoch, window, k, at, hold);
}

int doc_walk_seek(struct doc_walk *w, const struct order_params *params, uint32_t rank, uint32_t world,
		  uint64_t epoch, uint32_t window, size_t at)
{
	return walk_seek(w, params, rank, world, epoch, window, NULL, at, false);
}

/*
 * How many epochs in a row may give a rank no token before it is told it
 * never will. Without shuffling every epoch deals the same documents, so one
 * is proof; with shuffling a rank of a feed with few non-empty documents may
 * wait several epochs for one (tests/ref/feed_ref.py uses the same bound).
 */
#define MAX_EMPTY_EPOCHS_SHUFFLED 1000

static unsigned max_empty_epochs(const struct order_params *p)
{
	return p->shuffle ? MAX_EMPTY_EPOCHS_SHUFFLED : 1;
}

int doc_walk_next(struct doc_walk *w, unsigned *ret_epochs)
{
	unsigned crossed = 0;
	/* A window that was not counted yet (issue #22): entered again, nothing else moves. */
	bool again = w->pending;
	if (again) {
		crossed = w->pending_crossed;
	} else {
		/* A cold walk's first step: its rows are being made, every document ahead is wanted now. */
		if (w->at != SIZE_MAX)
			doc_walk_warm(w, WALK_WARM_ALL);
		w->at++;
	}
	while (again || w->at >= w->n_docs) {
		uint32_t next = w->pending_window;
		if (!again) {
			next = w->window + 1;
			if (next >= w->ep.n_windows) {
				/* An epoch with no document at all for this rank: bounded like empty ones. */
				if (++crossed > max_empty_epochs(w->params))
					return -ENODATA;
				int r = order_epoch_build(w->params, w->ep.epoch + 1, &w->ep);
				if (r < 0)
					return r;
				next = 0;
			}
		}
		again = false;
		int r = load_window(w, next);
		w->pending = r == -EAGAIN;
		if (r == -EAGAIN) {
			/* Its count is found off this thread: the caller comes back (the window list was let go). */
			w->pending_window = next;
			w->pending_crossed = crossed;
			w->n_docs = 0;
		}
		if (r < 0)
			return r;
	}
	doc_walk_ahead(w);
	*ret_epochs = crossed;
	return 0;
}

/*
 * Moves to the rank's next document; its count is not looked at yet. A
 * window not counted yet (-EAGAIN) leaves the stream advancing: the move is
 * made again by the next stream_settle().
 */
static int next_document(struct stream *s)
{
	unsigned crossed;
	s->advancing = true;
	int r = doc_walk_next(&s->walk, &crossed);
	if (r < 0)
		return r;
	s->advancing = false;
	for (unsigned i = 0; i < crossed; i++) {
		s->empty_epochs = s->epoch_had_tokens ? 0 : s->empty_epochs + 1;
		s->epoch_had_tokens = false;
		if (s->empty_epochs >= max_empty_epochs(s->walk.params))
			return -ENODATA;
	}
	s->seq++;
	s->known = false;
	s->offset = 0;
	s->length = 0;
	s->ids = NULL;
	return 0;
}

int stream_settle(struct stream *s)
{
	if (s->advancing) {
		int r = next_document(s);
		if (r < 0)
			return r;
	}
	for (;;) {
		if (!s->known) {
			uint64_t tokens;
			const int32_t *ids = NULL;
			/* Counts computed with the window (stored tokens, built ahead) need no call. */
			if (!order_window_count(&s->walk.win, s->walk.at, &tokens)) {
				int r = s->src.doc(s->src.userdata, s->seq, doc_walk_doc(&s->walk), &tokens, &ids);
				if (r < 0)
					return r;
			}
			s->known = true;
			s->length = stream_doc_length(s, tokens);
			s->ids = ids;
			s->epoch_had_tokens |= s->length > 0;
			if (s->check_offset) {
				/* A cursor must name a place inside one of this rank's non-empty documents. */
				s->check_offset = false;
				if (s->offset >= s->length)
					return -EINVAL;
			}
		}
		if (s->length > 0)
			return 0;
		int r = next_document(s);
		if (r < 0)
			return r;
	}
}

void stream_clear(struct stream *s)
{
	doc_walk_clear(&s->walk);
	*s = (struct stream){ 0 };
}

int stream_init_source(struct stream *s, const struct order_params *params, const struct stream_source *src,
		       uint32_t rank, uint32_t world, bool bos, bool eos, const struct stream_pos *pos)
{
	int r;
	*s = (struct stream){ .src = *src, .bos = bos, .eos = eos };
	uint64_t epoch_docs = 0;
	for (uint32_t i = 0; i < params->n_shards && !epoch_docs; i++) {
		uint32_t n;
		/* A shard not counted yet is not looked at (the feed's load found a document). */
		epoch_docs += order_shard_docs_known(params, i, &n) ? n : 1;
	}
	if (world == 0 || rank >= world || epoch_docs == 0)
		return -EINVAL;

	if (!pos) {
		/* The rank's first document may lie in a later window. */
		r = walk_seek(&s->walk, params, rank, world, 0, 0, NULL, SIZE_MAX, true);
		if (r < 0)
			goto fail;
		doc_walk_set_prefetch(&s->walk, src->prefetch, src->userdata, src->unsettled);
		s->seq = UINT64_MAX; /* the first document is visit 0 */
		r = next_document(s);
		if (r == -EAGAIN)
			return 0; /* its first window waits for its count: stream_settle() goes on (advancing) */
		if (r < 0)
			goto fail;
	} else {
		r = walk_seek(&s->walk, params, rank, world, pos->epoch, pos->window, pos->has_k ? &pos->k : NULL, SIZE_MAX,
			      true);
		if (r < 0)
			goto fail;
		/* Its window not counted yet (issue #22): the position is checked once it is (the caller comes back). */
		r = -EAGAIN;
		if (s->walk.pending)
			goto fail;
		doc_walk_set_prefetch(&s->walk, src->prefetch, src->userdata, src->unsettled);
		/* A cursor must name one of this rank's documents of that window. */
		r = -EINVAL;
		const struct doc_walk *w = &s->walk;
		if (pos->index < w->first_index || (pos->index - w->first_index) % world != 0)
			goto fail;
		uint64_t m = (pos->index - w->first_index) / world;
		if (m >= w->n_docs)
			goto fail;
		s->walk.at = (size_t)m;
		doc_walk_ahead(&s->walk);
		s->offset = pos->offset;
		s->check_offset = true;
		s->epoch_had_tokens = true;
	}
	if (src->unsettled)
		return 0; /* the caller warms, then settles (stream_source.unsettled) */
	r = stream_settle(s);
	if (r == 0 || r == -EAGAIN)
		return 0;
fail:
	stream_clear(s);
	return r;
}

static int counts_doc(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids)
{
	const uint32_t *const *doc_tokens = userdata;
	*ret_tokens = doc_tokens[ORDER_DOC_SHARD(doc)][ORDER_DOC_INDEX(doc)];
	*ret_ids = NULL;
	return 0;
}

int stream_init(struct stream *s, const struct order_params *params, const uint32_t *const *doc_tokens,
		uint32_t rank, uint32_t world, bool bos, bool eos, const struct stream_pos *pos)
{
	struct stream_source src = { .doc = counts_doc, .userdata = (void *)doc_tokens };
	return stream_init_source(s, params, &src, rank, world, bos, eos, pos);
}

struct stream_pos stream_tell(const struct stream *s)
{
	return (struct stream_pos){
		.epoch = s->walk.ep.epoch,
		.window = s->walk.window,
		.index = doc_walk_index(&s->walk),
		.offset = s->offset,
		/* Only where counts may be unknown (text, issue #22): stored tokens' cursors stay as they were. */
		.k = s->walk.ep.win_start ? s->walk.ep.win_start[s->walk.window] : 0,
		.has_k = s->walk.ep.win_start && s->walk.params && s->walk.params->count,
	};
}

struct stream_piece stream_peek(const struct stream *s)
{
	return (struct stream_piece){
		.doc = doc_walk_doc(&s->walk),
		.offset = s->offset,
		.count = 1,
		.length = s->length,
		.ids = s->ids,
	};
}

int stream_take(struct stream *s, uint64_t max, struct stream_piece *ret)
{
	int r = stream_settle(s);
	if (r < 0)
		return r;
	uint64_t n = MIN(max, s->length - s->offset);
	*ret = (struct stream_piece){
		.doc = doc_walk_doc(&s->walk),
		.offset = s->offset,
		.count = n,
		.length = s->length,
		.ids = s->ids,
	};
	s->offset += n;
	if (s->offset < s->length)
		return 0;
	/* The piece is taken: a next window or count not known yet is met by the next settle. */
	r = next_document(s);
	if (r == 0)
		r = stream_settle(s);
	return r == -EAGAIN ? 0 : r;
}
