/* SPDX-License-Identifier: MIT */
/*
 * Elastic sessions (docs/sample-order.md, section 17). A feed with virtual
 * ranks has V' virtual streams; virtual stream v is exactly the stream of
 * rank v of world V' with one row per batch, so the per-rank machinery
 * (session-plan.c, the packers, the workers) makes each row unchanged. A
 * rank's session composes the streams it serves (v mod world == rank): each
 * row of a batch comes from the live stream that has delivered the fewest
 * rows (ties: the smallest v). The state after a batch lists every served
 * stream's own cursor (those that delivered a row), so any world can resume
 * from the merge of all ranks' states.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-plan.h"
#include "daemon/feed/session-text.h"
#include "proto/macro.h"
#include "proto/vstate.h"

struct session_virtual {
	uint32_t m;             /* streams served */
	uint32_t *v;            /* their numbers, ascending */
	struct session **sub;   /* their sessions (no ring; one row per batch); NULL: it has no token at all */
	bool *dead;             /* ran dry (section 17.4): left out of the rotation */
	uint64_t *rows;         /* rows each has delivered (planned) */
	/*
	 * The live streams as a binary min-heap by (rows, v): its top is the
	 * stream the next row comes from (section 17.3) in O(log m), not a scan
	 * of every served stream per row. Dead streams leave it.
	 */
	uint32_t *heap;
	uint32_t heap_n;
	bool has_text;          /* a served stream tokenizes text on the way (batch_ready, session_virtual_text) */
	uint32_t n_cold;        /* live streams maybe not warmed yet (warm_next); 0: every one is */
	uint64_t *sim_rows;     /* scratch of batch_ready, session_virtual_text, warm_next: m rows each stream gives (shares) */
	struct cursor *cur;     /* each one's cursor after its last planned row (rows > 0) */
	char *entry;            /* each one's entry in the state (rows > 0), `stride` bytes apart */
	uint16_t *entry_len;
	size_t stride;
	char *kw;               /* each one's part of the state's <kw> list ("": none), `kw_stride` bytes apart */
	uint16_t *kw_len;
	size_t kw_stride;
	char *text;             /* the state being written */
	size_t text_cap;
	/* per source: the order its streams walk (the feed's: its shuffled windows are shared, feed-windows.c) */
	struct order_params params[MIX_MAX_SOURCES];
};

void session_virtual_free(struct session *s)
{
	struct session_virtual *x = s->virt;
	if (!x)
		return;
	for (uint32_t i = 0; i < x->m; i++)
		if (x->sub[i])
			session_unref(x->sub[i]);
	free(x->v);
	free(x->sub);
	free(x->dead);
	free(x->rows);
	free(x->heap);
	free(x->sim_rows);
	free(x->cur);
	free(x->entry);
	free(x->entry_len);
	free(x->kw);
	free(x->kw_len);
	free(x->text);
	free(x);
	s->virt = NULL;
}

void session_virtual_job_clear(struct session_job *j)
{
	free(j->long_cursor);
	j->long_cursor = NULL;
	if (!j->vrows)
		return;
	/* A row's job belongs to the batch job; its stream's session lives as long as the rank's. */
	for (uint32_t i = 0; i < j->plan.batch_size; i++) {
		pack_plan_clear(&j->vrows[i].job.plan);
		pad_batch_clear(&j->vrows[i].job.rows);
	}
	free(j->vrows);
	j->vrows = NULL;
}

/* Keeps stream i's entry (and its part of the <kw> list) for the states written after it. Returns 0 or -ENOBUFS. */
static int keep_entry(struct session_virtual *x, uint32_t i, const struct vstate_stream *e)
{
	int n = vstate_format_entry(e, x->entry + i * x->stride, x->stride);
	if (n < 0)
		return n;
	int k = vstate_format_kw(e, x->kw + i * x->kw_stride, x->kw_stride);
	if (k < 0)
		return k;
	x->entry_len[i] = (uint16_t)n;
	x->kw_len[i] = (uint16_t)k;
	return 0;
}

/*
 * Stream i resumed from an entry of a state made before the <kw> list
 * (issue #22): its k_w read from the walks just opened there (they counted
 * the windows before it), so that the states written from here on carry the
 * list at once, not only once every listed stream has delivered a row
 * since. Nothing for stored tokens only (their states stay as they were).
 */
static void entry_kw_from_walks(struct session_virtual *x, uint32_t i)
{
	const struct session *sub = x->sub[i];
	const struct cursor *c = &x->cur[i];
	if (!sub || x->kw_len[i])
		return;
	struct vstate_stream e;
	session_entry_of_cursor(x->v[i], c, &e);
	bool lazy = false;
	for (uint32_t q = 0; q < MAX(c->n_sources, 1u) && q < sub->n_srcs; q++) {
		const struct doc_walk *w = &sub->srcs[q].stream->walk;
		const struct stream_pos *p = c->n_sources ? &c->src[q] : &c->pos;
		if (!w->ep.win_start || w->ep.epoch != p->epoch || p->window < w->ep.win_lo || p->window > w->ep.win_hi)
			return; /* the walk is past it already: the list waits for the stream's next row */
		e.kw[q] = w->ep.win_start[p->window];
		lazy |= w->params && w->params->count;
	}
	e.has_kw = lazy;
	if (lazy)
		keep_entry(x, i, &e); /* cannot fail: the same entry fitted when it was kept */
}

/* Opens virtual stream v at c (NULL: its start). Returns 0, -ENODATA (it has no token: dead), or an error in err. */
static int sub_open(struct session *s, uint32_t v, uint32_t m, const struct cursor *c, struct session **ret,
		    char *err, size_t errlen)
{
	struct session *sub = calloc(1, sizeof(*sub));
	if (!sub)
		return -ENOMEM;
	sub->refs = 1;
	sub->producer = s->producer;
	sub->feed = feed_ref(s->feed);
	sub->rank = v;
	sub->world = s->feed->vranks;
	sub->batch_size = 1;
	sub->rows_ahead = (s->rows_ahead + m - 1) / m; /* its share of a batch (of an explanation's batches), for tokenizing ahead */
	sub->parent = s;
	sub->params = s->virt->params;
	sub->attach_ns = s->attach_ns;
	int r = session_open_streams(sub, c, err, errlen);
	if (r < 0) {
		session_unref(sub);
		return r;
	}
	*ret = sub;
	return 0;
}

/*
 * A virtual stream of stored tokens is opened unsettled and cold
 * (stream_source.unsettled, doc_walk.cold): opening a rank's 1,024 streams
 * asks for what their first documents need, nothing ahead; the streams are
 * warmed as their rows come up (warm_next).
 */
static bool sub_cold(const struct session *sub)
{
	for (uint32_t i = 0; i < sub->n_srcs; i++)
		if (sub->srcs[i].stream->walk.cold)
			return true;
	return false;
}

static void sub_warm(struct session *sub, enum walk_warm how)
{
	for (uint32_t i = 0; i < sub->n_srcs; i++)
		doc_walk_warm(&sub->srcs[i].stream->walk, how);
}

/* Settles a virtual stream opened unsettled: src_open's checks (session.c). Returns 0, -ENODATA, -EINVAL or an error in err. */
static int sub_settle(struct session *sub, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < sub->n_srcs; i++) {
		const struct session_src *sx = &sub->srcs[i];
		if (sx->feed->kind == FEED_TEXT)
			continue; /* settled when opened */
		int r = stream_settle(sx->stream);
		if (r == 0 || r == -EAGAIN)
			continue;
		if (r == -ENODATA || r == -EINVAL)
			return r;
		if ((r == -EBADMSG || r == -ESTALE) && sx->feed->state == FEED_FAILED)
			snprintf(err, errlen, "%s", sx->feed->error);
		else
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
		return r;
	}
	return 0;
}

/* Heap order: fewer rows first, then the smaller v (the served streams' indices ascend with v). */
static bool heap_less(const struct session_virtual *x, uint32_t a, uint32_t b)
{
	return x->rows[a] != x->rows[b] ? x->rows[a] < x->rows[b] : a < b;
}

static void heap_down(struct session_virtual *x, uint32_t at)
{
	uint32_t *h = x->heap;
	for (;;) {
		uint32_t l = 2 * at + 1, best = at;
		if (l < x->heap_n && heap_less(x, h[l], h[best]))
			best = l;
		if (l + 1 < x->heap_n && heap_less(x, h[l + 1], h[best]))
			best = l + 1;
		if (best == at)
			return;
		uint32_t t = h[at];
		h[at] = h[best];
		h[best] = t;
		at = best;
	}
}

static void heap_push(struct session_virtual *x, uint32_t i)
{
	uint32_t *h = x->heap, at = x->heap_n++;
	h[at] = i;
	while (at > 0 && heap_less(x, h[at], h[(at - 1) / 2])) {
		uint32_t up = (at - 1) / 2, t = h[at];
		h[at] = h[up];
		h[up] = t;
		at = up;
	}
}

int session_virtual_open(struct session *s, const struct vstate *st, char *err, size_t errlen)
{
	const struct feed *f = s->feed;
	const uint32_t V = f->vranks;
	if (st) {
		if (st->fingerprint != f->fingerprint || st->vranks != V) {
			snprintf(err, errlen,
				 "state belongs to another feed or another version of feed %s (fingerprint %016" PRIx64
				 ", %u virtual ranks; the feed's are %016" PRIx64 ", %u): its shards or parameters changed",
				 f->name, st->fingerprint, st->vranks, f->fingerprint, V);
			return -EINVAL;
		}
		if (st->world && (st->world != s->world || st->rank != s->rank)) {
			snprintf(err, errlen,
				 "state is rank %u's of world %u, not rank %u's of world %u: to resume with another world, merge "
				 "the states of all %u ranks (feed.merge_states, feed_merge_states) and attach every rank with the result",
				 st->rank, st->world, s->rank, s->world, st->world);
			return -EINVAL;
		}
	}

	const uint32_t m = (V - s->rank + s->world - 1) / s->world;
	struct session_virtual *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	s->virt = x;
	x->m = m;
	x->v = calloc(x->m, sizeof(*x->v));
	x->sub = calloc(x->m, sizeof(*x->sub));
	x->rows = calloc(x->m, sizeof(*x->rows));
	x->cur = calloc(x->m, sizeof(*x->cur));
	x->dead = calloc(x->m, sizeof(*x->dead));
	x->heap = calloc(x->m, sizeof(*x->heap));
	x->stride = VSTATE_ENTRY_MAX(f->n_sources);
	x->entry = malloc(x->m * x->stride);
	x->entry_len = calloc(x->m, sizeof(*x->entry_len));
	x->kw_stride = VSTATE_KW_MAX(f->n_sources);
	x->kw = malloc(x->m * x->kw_stride);
	x->kw_len = calloc(x->m, sizeof(*x->kw_len));
	x->text_cap = VSTATE_HEAD_MAX + x->m * (x->stride + x->kw_stride) + VSTATE_CHECK_LEN + 1;
	x->text = malloc(x->text_cap);
	if (!x->v || !x->sub || !x->rows || !x->cur || !x->dead || !x->heap || !x->entry || !x->entry_len || !x->kw ||
	    !x->kw_len || !x->text) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		x->params[i] = (f->n_sources ? f->sources[i] : f)->params;
	}
	s->first_batch = st ? st->batch : 0;
	size_t e = 0;
	uint32_t live = 0;
	bool wait = false; /* a stream's window is not counted yet: the others are opened still, to ask for theirs */
	for (uint32_t i = 0; i < x->m; i++) {
		uint32_t v = s->rank + i * s->world;
		x->v[i] = v;
		while (st && e < st->n && st->s[e].v < v)
			e++;
		const struct cursor *c = NULL;
		if (st && e < st->n && st->s[e].v == v) {
			if (st->s[e].n_sources != f->n_sources)
				return session_cursor_not_here(err, errlen, s->rank, f);
			session_cursor_of_entry(f, v, &st->s[e], &x->cur[i]);
			x->rows[i] = x->cur[i].batch;
			if (keep_entry(x, i, &st->s[e]) < 0)
				return session_cursor_not_here(err, errlen, s->rank, f);
			c = &x->cur[i];
		}
		int r = sub_open(s, v, x->m, c, &x->sub[i], err, errlen);
		if (r == -ENODATA)
			continue; /* a stream with no token (left): dead, left out of the rotation */
		wait |= r == -EAGAIN;
		if (r == -EAGAIN)
			continue; /* issue #22: every stream's missing counts asked for in one attempt (session-open.c) */
		if (r == -ERANGE) {
			/* Its <kw> list disagrees with the counts known: src_open's message, naming the stream. */
			char why[512];
			snprintf(why, sizeof(why), "%s", err);
			snprintf(err, errlen, "state's virtual stream %u: %s", v, why);
			return -EINVAL;
		}
		if (r < 0) {
			if (r == -EINVAL)
				snprintf(err, errlen, "state does not name a position of virtual stream %u of feed %s", v, f->name);
			return r;
		}
		if (c)
			entry_kw_from_walks(x, i);
	}
	if (wait)
		return -EAGAIN;
	/*
	 * Every stream's first document was asked for as it was opened (its
	 * doc_idx), then its length for all of them, and only then is each
	 * settled: a cold index is read with every stream's pages in flight,
	 * not one stream's reads after another's.
	 */
	for (uint32_t i = 0; i < x->m; i++)
		if (x->sub[i])
			sub_warm(x->sub[i], WALK_WARM_FIRST);
	for (uint32_t i = 0; i < x->m; i++) {
		if (!x->sub[i])
			continue;
		/* A stream's next window not built yet is not built here (issue #22): it waits (-EAGAIN), settled later. */
		bool was = feed_count_never_block(true);
		int r = sub_settle(x->sub[i], err, errlen);
		feed_count_never_block(was);
		if (r == -ENODATA) {
			session_unref(x->sub[i]);
			x->sub[i] = NULL; /* no token at all: dead, as one that failed to open so */
			continue;
		}
		if (r < 0) {
			if (r == -EINVAL)
				snprintf(err, errlen, "state does not name a position of virtual stream %u of feed %s", x->v[i],
					 f->name);
			return r;
		}
		x->has_text |= x->sub[i]->has_text;
		live++;
	}
	x->n_cold = live;
	x->sim_rows = calloc(x->m, sizeof(*x->sim_rows));
	if (!x->sim_rows) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < x->m; i++)
		if (x->sub[i])
			heap_push(x, i);
	if (!live) {
		snprintf(err, errlen, "rank %u of world %u receives no tokens from feed %s (its %u virtual streams have none)",
			 s->rank, s->world, f->name, x->m);
		return -ENODATA;
	}
	return 0;
}

uint64_t session_virtual_epoch(const struct session *s)
{
	const struct session_virtual *x = s->virt;
	uint64_t e = UINT64_MAX;
	for (uint32_t i = 0; i < x->m; i++)
		if (x->sub[i] && !x->dead[i])
			e = MIN(e, x->sub[i]->stream.walk.ep.epoch);
	return e == UINT64_MAX ? 0 : e;
}

bool session_virtual_live(const struct session *s, uint32_t i)
{
	const struct session_virtual *x = s->virt;
	return x && i < x->m && x->sub[i] && !x->dead[i];
}

/* The live stream that has delivered the fewest rows, the smallest v on ties; UINT32_MAX: none. */
static uint32_t next_stream(const struct session_virtual *x)
{
	return x->heap_n ? x->heap[0] : UINT32_MAX;
}

/* The top stream ran dry (section 17.4): it leaves the rotation. */
static void heap_drop_top(struct session_virtual *x)
{
	x->dead[x->heap[0]] = true;
	x->heap[0] = x->heap[--x->heap_n];
	heap_down(x, 0);
}

/* Marks stream k dead wherever it is in the heap (rare: batch_ready finds it out). */
static void heap_drop(struct session_virtual *x, uint32_t k)
{
	x->dead[k] = true;
	for (uint32_t at = 0; at < x->heap_n; at++) {
		if (x->heap[at] != k)
			continue;
		x->heap[at] = x->heap[--x->heap_n];
		/* Rebuild: the moved element may belong above or below; m is small next to a text chunk's work. */
		for (uint32_t p = x->heap_n / 2; p-- > 0;)
			heap_down(x, p);
		return;
	}
}

/*
 * The rows each live stream gives to the next n rows of the rank (section
 * 17.3: the fewest rows first, the smallest v on ties) into out[] (0 for
 * the dead): the level T the rows fill every stream up to, found by
 * bisection, and the rest of n to the streams below T in order. O(m log n),
 * no simulation row by row. Returns false when every stream is dead.
 */
static bool shares(const struct session_virtual *x, uint64_t n, uint64_t *out)
{
	uint64_t lo = UINT64_MAX;
	for (uint32_t k = 0; k < x->m; k++)
		if (x->sub[k] && !x->dead[k])
			lo = MIN(lo, x->rows[k]);
	if (lo == UINT64_MAX)
		return false;
	/* The smallest T with fill(T) >= n, fill(T) = sum of max(0, T - rows[k]); fill(lo) = 0 < n (n > 0). */
	uint64_t a = lo, b = lo + n; /* fill(a) < n <= fill(b) */
	while (b - a > 1) {
		uint64_t t = a + (b - a) / 2, fill = 0;
		for (uint32_t k = 0; k < x->m && fill < n; k++)
			if (x->sub[k] && !x->dead[k] && x->rows[k] < t)
				fill += t - x->rows[k];
		if (fill >= n)
			b = t;
		else
			a = t;
	}
	uint64_t left = n;
	for (uint32_t k = 0; k < x->m; k++) {
		out[k] = x->sub[k] && !x->dead[k] && x->rows[k] < a ? a - x->rows[k] : 0;
		left -= out[k];
	}
	for (uint32_t k = 0; k < x->m && left; k++)
		if (x->sub[k] && !x->dead[k] && x->rows[k] <= a) {
			out[k]++;
			left--;
		}
	return true;
}

/*
 * The streams whose rows come next, in section 17.3's order (shares()):
 * the documents ahead of those of the next `now + soon` rows asked for
 * (stage 0: reads queued, none waited for), then those of the `now` rows
 * (this batch's) warmed whole, whose stage 1 reads what stage 0 asked for:
 * the pages of the `soon` rows arrive while this batch is made. Once every
 * live stream has been warmed this costs nothing.
 */
static void warm_next(struct session_virtual *x, uint32_t now, uint32_t soon)
{
	if (!x->n_cold)
		return;
	uint32_t cold = 0;
	for (int pass = 0; pass < 2; pass++) {
		if (!shares(x, pass == 0 ? (uint64_t)now + soon : now, x->sim_rows)) {
			x->n_cold = 0; /* every stream dead */
			return;
		}
		cold = 0;
		for (uint32_t k = 0; k < x->m; k++) {
			if (!x->sub[k] || x->dead[k] || !sub_cold(x->sub[k]))
				continue;
			if (x->sim_rows[k])
				sub_warm(x->sub[k], pass == 0 ? WALK_WARM_AHEAD : WALK_WARM_ALL);
			else
				cold++; /* the second pass's count: cold still */
		}
	}
	x->n_cold = cold;
}

/*
 * Text tokenized on the way (section 15.2): a batch is planned only once
 * every row it takes is known, so nothing is taken from a stream unless the
 * whole batch can be made. Returns 0, or -EAGAIN.
 */
static int batch_ready(struct session_virtual *x, uint32_t B)
{
	if (!x->has_text)
		return 0; /* stored tokens: every row can be planned */
	for (;;) {
		uint64_t *need = x->sim_rows;
		if (!shares(x, B, need))
			return 0; /* every stream dead: planning says so */
		bool again = false;
		for (uint32_t k = 0; k < x->m; k++) {
			if (!need[k] || !x->sub[k]->has_text)
				continue;
			int r = session_plan_ready(x->sub[k], (uint32_t)need[k]);
			if (r == -ENODATA) {
				heap_drop(x, k); /* section 17.4; the rows go to other streams: check again */
				again = true;
				break;
			}
			if (r < 0)
				return r;
		}
		if (!again)
			return 0;
	}
}

int session_virtual_published(struct session *s, const struct session_job *j)
{
	for (uint32_t i = 0; j->vrows && i < s->batch_size; i++) {
		struct session *sub = j->vrows[i].sub;
		const struct session_job *rj = &j->vrows[i].job;
		uint64_t row = (sub->by_docs ? rj->rows.batch_index : rj->plan.batch_index) + 1 - sub->first_batch;
		sub->published = MAX(sub->published, row);
	}
	return 0;
}

int session_virtual_text(struct session *s, bool submit)
{
	struct session_virtual *x = s->virt;
	if (x->has_text && submit) {
		/* The batches tokenized for: the ring's free slots and one more (an explanation's: all it asked for). */
		uint64_t n = s->ring ? (s->ring->slot_count - (s->planned - s->ring->tail) + 1) * (uint64_t)s->batch_size
				     : s->rows_ahead;
		if (shares(x, MAX(n, 1u), x->sim_rows))
			for (uint32_t k = 0; k < x->m; k++)
				if (x->sub[k])
					x->sub[k]->text_rows = x->sim_rows[k];
	}
	for (uint32_t k = 0; x->has_text && k < x->m; k++) {
		struct session *sub = x->sub[k];
		if (!sub || !sub->has_text || x->dead[k])
			continue;
		for (uint32_t i = 0; i < sub->n_srcs; i++) {
			if (sub->srcs[i].feed->kind != FEED_TEXT)
				continue;
			if (!submit) {
				session_text_retire(sub, &sub->srcs[i]);
				continue;
			}
			int r = session_text_submit(sub, &sub->srcs[i]);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

unsigned session_virtual_inflight(const struct session *s)
{
	const struct session_virtual *x = s->virt;
	unsigned n = 0;
	for (uint32_t k = 0; x->has_text && k < x->m; k++)
		for (uint32_t i = 0; x->sub[k] && i < x->sub[k]->n_srcs; i++)
			n += x->sub[k]->srcs[i].chunks_inflight;
	return n;
}

int session_virtual_plan(struct session *s, struct session_job *j, uint64_t batch, char *msg, size_t msglen)
{
	struct session_virtual *x = s->virt;
	const struct feed *f = s->feed;
	const uint32_t B = s->batch_size;
	/*
	 * A plan a window stopped (issue #22: windows are never built on the
	 * main loop) goes on at the row it stopped in: the rows before it took
	 * their streams' documents already.
	 */
	const bool resumed = j->vrows && j->vrow_next && j->plan.batch_index == batch;
	const uint32_t from = resumed ? j->vrow_next - 1 : 0;
	j->vrow_next = 0;
	int ready = resumed ? 0 : batch_ready(x, B);
	if (ready == -EAGAIN)
		return ready;
	if (ready < 0) {
		snprintf(msg, msglen, "cannot plan batch %" PRIu64 ": %s", batch, strerror(-ready));
		return ready;
	}
	if (!j->vrows && !(j->vrows = calloc(B, sizeof(*j->vrows)))) {
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	if (!resumed) {
		warm_next(x, B, 2 * B);
		j->plan.batch_index = batch;
		j->plan.batch_size = B;
		j->plan.seq_len = f->conf.seq_len;
		j->counts = (struct pack_counters){ 0 };
		memset(j->src_docs, 0, sizeof(j->src_docs));
	}
	for (uint32_t i = from; i < B; i++) {
		struct session_vrow *row = &j->vrows[i];
		/* Only the row a window stopped goes on with its partial plan (pack_plan); any other starts afresh. */
		if (i != from || !resumed)
			row->job.plan.partial = false;
		for (;;) {
			uint32_t k = next_stream(x);
			if (k == UINT32_MAX) {
				snprintf(msg, msglen, "cannot plan batch %" PRIu64 ": this rank receives no tokens (every virtual stream it serves ran dry)",
					 batch);
				return -ENODATA;
			}
			struct session *sub = x->sub[k];
			struct cursor c = { .fingerprint = f->fingerprint, .world = sub->world, .rank = sub->rank,
					    .batch = x->rows[k] + 1 };
			char why[512];
			int r = session_plan(sub, &row->job, x->rows[k], &c, why, sizeof(why));
			if (r == -ENODATA) {
				/* Section 17.4: a stream that runs dry leaves the rotation (earlier rows may be in flight: keep it). */
				heap_drop_top(x);
				continue;
			}
			if (r == -EAGAIN) {
				/*
				 * A window not built yet (issue #22; text: one let go since
				 * batch_ready): this row goes on from here at the next pump,
				 * its stream's partial plan (pack_plan) with it.
				 */
				j->vrow_next = i + 1;
				return r;
			}
			if (r < 0) {
				snprintf(msg, msglen, "virtual stream %u: %s", sub->rank, why);
				return r;
			}
			row->sub = sub;
			sub->planned++;
			x->cur[k] = c;
			x->rows[k]++;
			heap_down(x, 0); /* k is the top: one more row sends it down */
			struct vstate_stream e;
			session_entry_of_cursor(sub->rank, &c, &e);
			r = keep_entry(x, k, &e);
			if (r < 0) {
				snprintf(msg, msglen, "cannot write virtual stream %u's state: %s", sub->rank, strerror(-r));
				return r;
			}
			break;
		}
		pack_counters_add(&j->counts, &row->job.counts);
		for (uint32_t q = 0; q < MIX_MAX_SOURCES; q++)
			j->src_docs[q] += row->job.src_docs[q];
	}

	/* The state after this batch: every served stream that delivered a row (their entries kept as they move). */
	struct vstate st = { .fingerprint = f->fingerprint, .vranks = f->vranks, .world = s->world, .rank = s->rank,
			     .batch = batch + 1 };
	bool all_kw = true; /* the <kw> list is all or nothing (an entry resumed from an older state has none) */
	for (uint32_t i = 0; i < x->m; i++) {
		st.n += x->rows[i] > 0;
		all_kw &= !x->rows[i] || x->kw_len[i] > 0;
	}
	int n = vstate_format_head(&st, x->text, x->text_cap);
	for (uint32_t i = 0; n >= 0 && i < x->m; i++) {
		if (!x->rows[i])
			continue;
		memcpy(x->text + n, x->entry + i * x->stride, x->entry_len[i]);
		n += x->entry_len[i];
	}
	for (uint32_t i = 0; n >= 0 && all_kw && i < x->m; i++) {
		if (!x->rows[i])
			continue;
		memcpy(x->text + n, x->kw + i * x->kw_stride, x->kw_len[i]);
		n += x->kw_len[i];
	}
	if (n >= 0)
		n = vstate_format_check(x->text, (size_t)n, x->text_cap);
	if (n < 0) {
		snprintf(msg, msglen, "cannot write the state after batch %" PRIu64 ": %s", batch, strerror(-n));
		return n;
	}
	const char *text = x->text;
	if (j->long_cursor)
		j->long_cursor[0] = '\0'; /* kept for the job's next batch: no 20 KB allocation per batch */
	if ((size_t)n < sizeof(j->cursor)) {
		memcpy(j->cursor, text, (size_t)n + 1);
		return 0;
	}
	/* Longer than a cursor: in the slot's state area, the cursor says so (ring_abi.h). */
	if (s->ring && (size_t)n >= s->ring->hdr->state_capacity) {
		snprintf(msg, msglen, "the state after batch %" PRIu64 " takes %d characters, more than a slot holds (%u)",
			 batch, n, s->ring->hdr->state_capacity);
		return -E2BIG;
	}
	snprintf(j->cursor, sizeof(j->cursor), "%s", FEED_CURSOR_IN_STATE_AREA);
	if (!j->long_cursor && !(j->long_cursor = malloc(x->text_cap))) {
		snprintf(msg, msglen, "out of memory");
		return -ENOMEM;
	}
	memcpy(j->long_cursor, text, (size_t)n + 1);
	return 0;
}

/* The state text after the batch, and the header: what every way of filling a slot ends with. */
static void produce_header(struct session *s, struct session_job *j, uint8_t *slot, uint32_t n_cu, uint32_t docs,
			   uint64_t epoch)
{
	const struct feed_ring_header *geom = s->ring->hdr;
	struct feed_slot_header *h = (struct feed_slot_header *)slot;
	h->batch_index = j->plan.batch_index;
	h->epoch = epoch;
	h->rank = s->rank;
	h->world = s->world;
	h->batch_size = j->plan.batch_size;
	h->seq_len = j->plan.seq_len;
	h->n_cu_seqlens = n_cu;
	h->n_docs = docs;
	snprintf(h->cursor, sizeof(h->cursor), "%s", j->cursor);
	if (j->long_cursor && j->long_cursor[0])
		memcpy(slot + feed_slot_state_offset(geom->off_cu_seqlens, geom->cu_capacity), j->long_cursor,
		       strlen(j->long_cursor) + 1);
}

int session_virtual_produce(struct session *s, struct session_job *j, struct worker *w, uint8_t *slot)
{
	const struct feed_ring_header *geom = s->ring->hdr;
	const uint32_t B = j->plan.batch_size, L = j->plan.seq_len;
	if (!j->vrows[0].sub->by_docs) {
		/* Plain "concat" streams (every served stream packs alike): the rows' reads go out together. */
		_cleanup_free_ const struct batch_plan **plans = malloc(B * sizeof(*plans));
		if (!plans) {
			snprintf(j->error, sizeof(j->error), "out of memory");
			return -ENOMEM;
		}
		for (uint32_t i = 0; i < B; i++)
			plans[i] = &j->vrows[i].job.plan;
		uint32_t n_cu, docs;
		int r = worker_produce_concat_rows(w, s->feed, plans, B, L, geom, slot, &n_cu, &docs, j->error,
						   sizeof(j->error));
		if (r < 0)
			return r;
		produce_header(s, j, slot, n_cu, docs, plans[0]->epoch);
		return 0;
	}
	/* One row's slot: header and arrays, laid out as the ring lays out a slot of one row. */
	const size_t arr = ALIGN_UP((size_t)L * 4, (size_t)64), cu = ALIGN_UP(((size_t)L + 1) * 4, (size_t)64);
	struct feed_ring_header g1 = { .batch_size = 1, .seq_len = L, .off_input_ids = FEED_SLOT_HEADER_SIZE,
				       .off_labels = (uint32_t)(FEED_SLOT_HEADER_SIZE + arr),
				       .off_position_ids = (uint32_t)(FEED_SLOT_HEADER_SIZE + 2 * arr),
				       .off_cu_seqlens = (uint32_t)(FEED_SLOT_HEADER_SIZE + 3 * arr), .cu_capacity = L + 1 };
	_cleanup_free_ uint8_t *one = aligned_alloc(64, FEED_SLOT_HEADER_SIZE + 3 * arr + cu);
	if (!one) {
		snprintf(j->error, sizeof(j->error), "out of memory for a row of %u positions", L);
		return -ENOMEM;
	}
	int32_t *ids = (int32_t *)(slot + geom->off_input_ids), *labels = (int32_t *)(slot + geom->off_labels);
	int32_t *pids = (int32_t *)(slot + geom->off_position_ids), *cus = (int32_t *)(slot + geom->off_cu_seqlens);
	uint32_t n_cu = 0, docs = 0;
	uint64_t epoch = 0;
	for (uint32_t i = 0; i < B; i++) {
		const struct session_vrow *row = &j->vrows[i];
		const struct session *sub = row->sub;
		int r = sub->by_docs ? worker_produce_rows(w, sub->feed, &row->job.rows, sub->rank, sub->world, "", &g1, one,
							   j->error, sizeof(j->error))
				     : worker_produce(w, sub->feed, &row->job.plan, sub->rank, sub->world, "", &g1, one,
						      j->error, sizeof(j->error));
		if (r < 0)
			return r;
		const struct feed_slot_header *h1 = (const struct feed_slot_header *)one;
		memcpy(ids + (size_t)i * L, one + g1.off_input_ids, (size_t)L * 4);
		memcpy(labels + (size_t)i * L, one + g1.off_labels, (size_t)L * 4);
		memcpy(pids + (size_t)i * L, one + g1.off_position_ids, (size_t)L * 4);
		const int32_t *c1 = (const int32_t *)(one + g1.off_cu_seqlens);
		for (uint32_t q = 0; q + 1 < h1->n_cu_seqlens; q++)
			cus[n_cu++] = c1[q] + (int32_t)(i * L);
		docs += h1->n_docs;
		if (i == 0)
			epoch = h1->epoch;
	}
	cus[n_cu++] = (int32_t)((size_t)B * L);
	produce_header(s, j, slot, n_cu, docs, epoch);
	return 0;
}
