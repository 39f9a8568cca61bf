/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-plan.h"
#include "daemon/feed/session-text.h"
#include "proto/macro.h"

/* ---- The streams' queues of taken, undrawn documents ---- */

static struct pack_doc *queue_at(struct session_src *x, size_t i)
{
	return &x->queue[(x->q_head + i) & (x->q_cap - 1)];
}

/*
 * Read-ahead from the plan (docs/storage.md): when the stream enters a
 * window, the shards of that window and of the next are named to the source
 * layer, so an object store fetches the next window's bytes while this one
 * is served. Local files ignore the hint.
 */
static void prefetch_windows(struct session_src *x)
{
	const struct doc_walk *w = &x->stream->walk;
	const struct order_params *p = w->params;
	if (!p || !w->ep.perm || (x->prefetch_epoch == w->ep.epoch && x->prefetch_window == (uint64_t)w->window + 1))
		return;
	x->prefetch_epoch = w->ep.epoch;
	x->prefetch_window = (uint64_t)w->window + 1;
	const struct feed *f = x->feed;
	for (uint64_t win = w->window; win <= (uint64_t)w->window + 1 && win < w->ep.n_windows; win++)
		for (uint64_t i = win * p->window; i < MIN((win + 1) * p->window, (uint64_t)p->n_shards); i++)
			if (w->ep.perm[i] < f->n_shards)
				format_prefetch(f->shards[w->ep.perm[i]]);
}

/*
 * Takes documents from stream x into its queue until it holds `want`.
 * Returns 0; -EAGAIN when a count is not known yet (tokenized text);
 * -ENODATA (the rank gets no tokens); -ENOMEM.
 */
static int queue_fill(struct session_src *x, size_t want)
{
	struct stream *st = x->stream;
	while (x->q_n < want) {
		int r = stream_settle(st);
		if (r < 0)
			return r;
		prefetch_windows(x);
		if (x->q_n == x->q_cap) {
			size_t cap = MAX(x->q_cap * 2, (size_t)64);
			struct pack_doc *q = malloc(cap * sizeof(*q));
			if (!q)
				return -ENOMEM;
			for (size_t i = 0; i < x->q_n; i++)
				q[i] = *queue_at(x, i);
			free(x->queue);
			x->queue = q;
			x->q_cap = cap;
			x->q_head = 0;
		}
		struct pack_doc d = {
			.length = st->length, .epoch = st->walk.ep.epoch, .source = x->index, .seq = st->seq,
			.pos = stream_tell(st), .ids = st->ids,
		};
		struct stream_piece piece;
		r = stream_take(st, UINT64_MAX, &piece);
		if (r < 0)
			return r;
		d.id = piece.doc;
		*queue_at(x, x->q_n++) = d;
		x->q_positions += d.length;
	}
	return 0;
}

/* The position of stream x's next undrawn document (what a cursor names for it). */
static int queue_head_pos(struct session_src *x, struct stream_pos *ret)
{
	int r = queue_fill(x, 1);
	if (r < 0)
		return r;
	*ret = queue_at(x, 0)->pos;
	return 0;
}

static uint32_t source_of(const struct session *s, uint64_t k)
{
	return s->feed->n_sources ? mix_source(&s->feed->mix, k) : 0;
}

/* pack_source.next: the next document of the (mixed) sequence. */
static int docs_next(void *userdata, struct pack_doc *ret)
{
	struct session *s = userdata;
	struct session_src *x = &s->srcs[source_of(s, s->mix_k)];
	int r = queue_fill(x, 1);
	if (r < 0)
		return r == -EAGAIN ? -EDEADLK : r; /* plan_ready() said every count was known */
	*ret = *queue_at(x, 0);
	x->q_head = (x->q_head + 1) & (x->q_cap - 1);
	x->q_n--;
	x->q_positions -= ret->length;
	s->mix_k++;
	return 0;
}

/* pack_source.mark: a bestfit buffer starts here; cursors inside it name this place. */
static void docs_mark(void *userdata)
{
	struct session *s = userdata;
	s->mark.k = s->mix_k;
	for (uint32_t i = 0; i < s->n_srcs && !s->mark.error; i++) {
		int r = queue_head_pos(&s->srcs[i], &s->mark.pos[i]);
		if (r < 0)
			s->mark.error = r == -EAGAIN ? -EDEADLK : r;
	}
}

/* Draws the next document's length in plan_ready()'s dry run, without drawing it. */
static int dry_take(struct session *s, size_t *used, uint64_t *k, uint64_t *ret_len)
{
	uint32_t i = source_of(s, *k);
	struct session_src *x = &s->srcs[i];
	int r = queue_fill(x, used[i] + 1);
	if (r == -EAGAIN || r == -ENODATA)
		s->starved = i; /* to tokenize further, or the stream that ran dry */
	if (r < 0)
		return r;
	*ret_len = queue_at(x, used[i])->length;
	used[i]++;
	(*k)++;
	return 0;
}

/*
 * Whether the next plan (and the cursor after it) only needs documents whose
 * counts are known: a dry run of the packer over the queues, filling them
 * from the streams. Bestfit counts a buffer's rows from below (its positions
 * / L), so it may ask for more documents than the plan takes, never fewer.
 * Returns 0; -EAGAIN with s->starved naming the stream to tokenize further;
 * -ENODATA, -ENOMEM.
 */
static int plan_ready(struct session *s)
{
	const struct feed *f = s->feed;
	const uint64_t B = s->batch_size, L = f->conf.seq_len;
	size_t used[MIX_MAX_SOURCES] = { 0 };
	uint64_t k = s->mix_k, len = 0; /* a failed dry_take leaves it: the loops then stop on r */
	int r = 0;
	s->starved = UINT32_MAX;
	if (f->conf.packing == CONF_PACKING_PAD) {
		for (uint64_t i = 0; i < B && r == 0; i++)
			r = dry_take(s, used, &k, &len);
	} else if (f->conf.packing == CONF_PACKING_CONCAT) {
		const struct concat *c = &s->concat;
		uint64_t need = B * L + 1, have = c->have ? c->cur.length - c->offset : 0;
		need = c->have ? (need > have ? need - have : 0) : need + c->skip;
		while (need > 0 && r == 0) {
			r = dry_take(s, used, &k, &len);
			need -= MIN(need, len);
		}
	} else {
		uint64_t rows = s->resume_row ? 0 : bestfit_rows_left(&s->bestfit), want = B + s->resume_row;
		while (rows < want && r == 0) {
			uint64_t total = 0;
			while (total < f->conf.pack_buffer && r == 0) {
				r = dry_take(s, used, &k, &len);
				total += len;
			}
			rows += (total + L - 1) / L;
		}
	}
	/* The cursor after the plan names every stream's next document. */
	for (uint32_t i = 0; i < s->n_srcs && r == 0; i++) {
		r = queue_fill(&s->srcs[i], used[i] + 1);
		if (r == -EAGAIN)
			s->starved = i;
	}
	return r;
}

/* Why a plan found no tokens: a mixture names the source that ran dry. */
static const char *no_tokens_why(const struct session *s, char *buf, size_t len)
{
	if (s->n_srcs < 2 || s->starved >= s->n_srcs)
		return "this rank receives no tokens";
	snprintf(buf, len, "source %s gives this rank no tokens (every document it reached was empty or skipped as bad)",
		 s->srcs[s->starved].feed->name);
	return buf;
}

/* "cannot plan batch N: why" into msg, for every way a plan fails. Returns r. */
static int plan_error(const struct session *s, int r, uint64_t batch, char *msg, size_t msglen)
{
	char why[160];
	for (uint32_t i = 0; (r == -EBADMSG || r == -ESTALE) && i < s->n_srcs; i++)
		if (s->srcs[i].feed->state == FEED_FAILED) {
			/* A damaged or changed index entry met on the way (stored tokens): the feed's error names it. */
			snprintf(msg, msglen, "cannot plan batch %" PRIu64 ": %s", batch, s->srcs[i].feed->error);
			return r;
		}
	snprintf(msg, msglen, "cannot plan batch %" PRIu64 ": %s", batch,
		 r == -ENODATA ? no_tokens_why(s, why, sizeof(why))
		 : r == -EINVAL ? "the cursor's offset lies past the end of its document"
		 : r == -EDEADLK ? "internal error: planned past the tokenized text"
		 : r == -ERANGE ? SESSION_KW_WRONG
				 : strerror(-r));
	return r;
}

/* Plans batch `batch` into j (by_docs sessions). Returns 0 or a negative errno with a message in msg. */
static int plan_docs(struct session *s, struct session_job *j, uint64_t batch, char *msg, size_t msglen)
{
	const struct feed *f = s->feed;
	const struct pack_source src = { .next = docs_next, .mark = docs_mark, .userdata = s };
	int r;
	if (s->resume_row) {
		r = bestfit_resume(&s->bestfit, &src, s->resume_row);
		if (r == -EINVAL) {
			snprintf(msg, msglen, "cursor names row %" PRIu64 " of a packed buffer of %zu rows: it is not a position of this stream",
				 s->resume_row, s->bestfit.packing.n_rows);
			return r;
		}
		if (r < 0)
			goto fail;
		s->resume_row = 0;
	}
	if (f->conf.packing == CONF_PACKING_PAD)
		r = pad_plan(&src, s->batch_size, f->conf.seq_len, batch, &j->rows);
	else if (f->conf.packing == CONF_PACKING_BESTFIT)
		r = bestfit_plan(&s->bestfit, &src, s->batch_size, batch, &j->rows);
	else
		r = concat_plan(&s->concat, &src, s->batch_size, batch, &j->rows);
	if (r == 0)
		r = s->mark.error;
	if (r < 0)
		goto fail;

	j->counts = j->rows.counts;
	for (uint32_t i = 0; i < MIX_MAX_SOURCES; i++) {
		j->src_docs[i] = 0;
		j->hold[i] = UINT64_MAX;
	}
	for (size_t i = 0; i < j->rows.n_pieces; i++) {
		const struct row_piece *p = &j->rows.pieces[i];
		j->src_docs[p->doc.source] += p->offset == 0;
		j->hold[p->doc.source] = MIN(j->hold[p->doc.source], p->doc.seq);
	}
	if (f->conf.packing == CONF_PACKING_CONCAT) {
		const struct row_piece *p = &j->rows.lookahead;
		j->hold[p->doc.source] = MIN(j->hold[p->doc.source], p->doc.seq);
	}
	return 0;
fail:
	return plan_error(s, r, batch, msg, msglen);
}

/* The cursor after the batch just planned (by_docs sessions): sections 12.5 and 14.4. */
static int cursor_docs(struct session *s, struct cursor *c)
{
	const struct feed *f = s->feed;
	const bool in_buffer = f->conf.packing == CONF_PACKING_BESTFIT && bestfit_rows_left(&s->bestfit) > 0;
	const uint64_t row = in_buffer ? s->bestfit.row : 0;
	if (!f->n_sources) {
		if (in_buffer) {
			c->pos = s->mark.pos[0];
		} else {
			int r = queue_head_pos(&s->srcs[0], &c->pos);
			if (r < 0)
				return r;
		}
		c->pos.offset = row; /* fc1's <offset> carries the row: a buffer starts at a document's start */
		return 0;
	}
	c->n_sources = f->n_sources;
	c->row = row;
	c->k = in_buffer ? s->mark.k : s->mix_k;
	for (uint32_t i = 0; i < f->n_sources; i++) {
		if (in_buffer) {
			c->src[i] = s->mark.pos[i];
		} else {
			int r = queue_head_pos(&s->srcs[i], &c->src[i]);
			if (r < 0)
				return r;
		}
		c->src[i].offset = 0;
	}
	if (f->conf.packing == CONF_PACKING_CONCAT) {
		/* The look-ahead's document is in progress: the position is inside it. */
		c->k = s->mix_k - 1;
		c->offset = s->concat.offset;
		c->src[s->concat.cur.source] = s->concat.cur.pos;
		c->src[s->concat.cur.source].offset = 0;
	}
	return 0;
}

/* A plain "concat" batch's counters (section 13.2): every position a token; documents crossing a row end. */
static void count_concat(const struct batch_plan *plan, struct pack_counters *ret)
{
	uint64_t pos = 0, L = plan->seq_len;
	*ret = (struct pack_counters){ .positions = (uint64_t)plan->batch_size * L };
	ret->tokens = ret->positions;
	for (size_t i = 0; i + 1 < plan->n_pieces; i++) {
		const struct stream_piece *p = &plan->pieces[i];
		if (p->offset == 0) {
			ret->docs++;
			ret->cut_docs += pos % L + p->length > L;
		}
		pos += p->count;
	}
}

int session_cursor_not_here(char *err, size_t errlen, uint32_t rank, const struct feed *f)
{
	snprintf(err, errlen, "cursor does not name a position in rank %u's stream of feed %s", rank, f->name);
	return -EINVAL;
}

int session_plan_init(struct session *s, const struct cursor *c, char *err, size_t errlen)
{
	const struct feed *f = s->feed;
	int r = 0;
	s->mix_k = c && f->n_sources ? c->k : 0;
	concat_init(&s->concat, f->conf.seq_len, c ? c->offset : 0);
	if (f->conf.packing == CONF_PACKING_BESTFIT &&
	    (r = bestfit_init(&s->bestfit, f->conf.seq_len, f->conf.pack_buffer)) < 0) {
		snprintf(err, errlen, "pack_buffer %" PRIu64 " is out of range", f->conf.pack_buffer);
		return r;
	}
	if (c)
		s->resume_row = f->n_sources ? c->row : c->pos.offset;
	if (s->has_text)
		return 0;
	/* Stored tokens: every count is known, so a cursor that names no position is refused now. */
	const struct pack_source src = { .next = docs_next, .mark = docs_mark, .userdata = s };
	if (s->resume_row) {
		r = bestfit_resume(&s->bestfit, &src, s->resume_row);
		s->resume_row = 0;
	} else if (s->concat.skip) {
		struct session_src *x = &s->srcs[source_of(s, s->mix_k)];
		r = queue_fill(x, 1);
		if (r == 0 && s->concat.skip >= queue_at(x, 0)->length)
			r = -EINVAL;
	}
	if (r == 0)
		r = s->mark.error;
	/*
	 * No plan_ready() ran first here: a window not built yet (the open's
	 * walks never build one, issue #22) is a wait, not a fault. The open
	 * tries again from the start once the pool built it (session-open.c).
	 */
	if (r == -EDEADLK || r == -EAGAIN)
		return -EAGAIN;
	if (r == -EINVAL)
		return session_cursor_not_here(err, errlen, s->rank, f);
	if (r < 0)
		snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
	return r;
}

int session_plan_ready(struct session *s, uint32_t rows)
{
	const uint32_t saved = s->batch_size;
	int r;
	s->batch_size = rows; /* a row sequence does not depend on B: ready for a batch of `rows` = for `rows` rows */
	if (s->by_docs) {
		r = s->has_text ? plan_ready(s) : 0;
	} else {
		const uint64_t bl = (uint64_t)rows * s->feed->conf.seq_len;
		r = stream_settle(&s->stream);
		if (r == 0 && s->has_text && session_text_ready(&s->srcs[0], bl + 1) < bl + 1)
			r = -EAGAIN;
	}
	s->batch_size = saved;
	return r;
}

int session_plan(struct session *s, struct session_job *j, uint64_t batch, struct cursor *cur, char *msg,
		 size_t msglen)
{
	const struct feed *f = s->feed;
	int r = 0;
	if (s->virt)
		return session_virtual_plan(s, j, batch, msg, msglen);
	if (s->by_docs) {
		/*
		 * Plan only from known counts: every document the packer may draw,
		 * and the next of each stream. Stored tokens too: a window not
		 * built yet stops a walk here (issue #22), before anything is drawn.
		 */
		r = plan_ready(s);
		if (r == -EAGAIN)
			return r;
		if (r < 0)
			return plan_error(s, r, batch, msg, msglen);
		r = plan_docs(s, j, batch, msg, msglen);
		if (r < 0)
			return r;
		r = cursor_docs(s, cur);
		if (r < 0)
			snprintf(msg, msglen, "cannot name the cursor after batch %" PRIu64 ": %s", batch, strerror(-r));
		return r;
	}
	if (s->has_text) {
		/* Plan only what is tokenized: every position of the batch and the look-ahead. */
		const uint64_t bl = (uint64_t)s->batch_size * f->conf.seq_len;
		r = stream_settle(&s->stream);
		if (r == -EAGAIN || (r == 0 && session_text_ready(&s->srcs[0], bl + 1) < bl + 1))
			return -EAGAIN;
	}
	if (r == 0)
		r = pack_plan(&s->stream, s->batch_size, f->conf.seq_len, batch, &j->plan);
	if (r == -EAGAIN)
		return r; /* a window not built yet (issue #22): the partial plan goes on from there at the next pump */
	if (r < 0)
		return plan_error(s, r, batch, msg, msglen);
	if (s->n_srcs)
		prefetch_windows(&s->srcs[0]); /* where the stream stands after this batch */
	cur->pos = j->plan.next;
	count_concat(&j->plan, &j->counts);
	return 0;
}
