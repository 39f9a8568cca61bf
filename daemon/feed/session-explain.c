/* SPDX-License-Identifier: MIT */
/*
 * Provenance (feedctl explain; docs/sample-order.md, section 17.9): the
 * batches a rank would receive from a cursor or state, planned on the side
 * by the very code that plans a session's batches (no ring, no batch read),
 * written as one line per piece of a row: which virtual stream, source,
 * shard, document and token range it holds.
 *
 * Stored tokens are planned at once. Text tokenized on the way is planned
 * as a session plans it: a plan that needs counts not known yet (-EAGAIN)
 * hands the stream's next documents to the pool (session-text.c, as far as
 * the batches asked need), and the explanation goes on, on the main thread,
 * each time a chunk comes back (session_pump() of a session with `explain`
 * set lands in explain_step()). Its streams are opened, and walked, as a
 * session's are (issue #22): never counting a shard on the main loop, the
 * shards a window misses counted on the pool (session-open.c,
 * session-count.c), the explanation going on when they are back. The side
 * session owns nothing shared: its chunks and count jobs hold references to
 * it, so cancelling (the client left) only marks it closed and drops the
 * explanation's reference.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-plan.h"
#include "daemon/feed/session-text.h"
#include "proto/macro.h"

struct text {
	char *p;
	size_t n, cap;
	int error;
};

static void say(struct text *t, const char *fmt, ...) _printf_(2, 3);
static void say(struct text *t, const char *fmt, ...)
{
	for (int tries = 0; !t->error && tries < 2; tries++) {
		va_list ap;
		va_start(ap, fmt);
		int m = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
		va_end(ap);
		if (m < 0) {
			t->error = -EINVAL;
			return;
		}
		if (t->p && (size_t)m < t->cap - t->n) {
			t->n += (size_t)m;
			return;
		}
		size_t cap = MAX(t->cap * 2, t->n + (size_t)m + 4096);
		char *p = realloc(t->p, cap);
		if (!p) {
			t->error = -ENOMEM;
			return;
		}
		t->p = p;
		t->cap = cap;
	}
}

/* One piece: positions offset .. offset + count - 1 of document `doc`'s contribution (length positions). */
static void piece(struct text *t, const struct feed *f, uint64_t batch, uint32_t row, uint64_t col, int64_t vstream,
		  uint32_t source, uint64_t doc, uint64_t offset, uint64_t count, uint64_t length)
{
	const struct feed *sf = f->n_sources ? f->sources[source] : f;
	const uint64_t bos = sf->bos_id >= 0, eos = sf->eos_id >= 0, tokens = length - bos - eos;
	const uint64_t lo = MAX(offset, bos) - bos, hi = MIN(offset + count, bos + tokens) - bos;
	const uint32_t shard = ORDER_DOC_SHARD(doc);
	say(t, "batch %" PRIu64 " row %u cols %" PRIu64 "-%" PRIu64, batch, row, col, col + count - 1);
	if (vstream >= 0)
		say(t, " vstream %" PRId64, vstream);
	if (f->n_sources)
		say(t, " source %s", f->conf.mix->names[source]);
	say(t, " shard %u doc %u tokens %" PRIu64 "-%" PRIu64 " of %" PRIu64 "%s%s file %s\n", shard, ORDER_DOC_INDEX(doc),
	    lo, hi, tokens, bos && offset == 0 ? " +bos" : "", eos && offset + count == length ? " +eos" : "",
	    sf->shards[shard]->name);
}

/* The pieces of session s's plan j, its rows numbered from `row0`. */
static void plan_pieces(struct text *t, const struct session *s, const struct session_job *j, uint64_t batch,
			uint32_t row0, int64_t vstream)
{
	const uint64_t L = s->feed->conf.seq_len;
	if (s->by_docs) {
		for (size_t i = 0; i < j->rows.n_pieces; i++) {
			const struct row_piece *p = &j->rows.pieces[i];
			piece(t, s->feed, batch, row0 + p->row, p->column, vstream, p->doc.source, p->doc.id, p->offset,
			      p->count, p->doc.length);
		}
		return;
	}
	/* Plain concat: pieces run across rows (the last is the look-ahead); cut them at row ends. */
	uint64_t pos = 0;
	for (size_t i = 0; i + 1 < j->plan.n_pieces; i++) {
		const struct stream_piece *p = &j->plan.pieces[i];
		for (uint64_t done = 0; done < p->count;) {
			uint64_t n = MIN(p->count - done, L - pos % L);
			piece(t, s->feed, batch, row0 + (uint32_t)(pos / L), pos % L, vstream, 0, p->doc, p->offset + done, n,
			      p->length);
			pos += n;
			done += n;
		}
	}
}

struct session_explain {
	struct session *s;     /* the side session (s->explain points back) */
	struct session_job j;
	struct text t;
	uint32_t b, batches;   /* batches explained, asked */
	session_explain_fn done;
	void *userdata;
};

static void explain_free(struct session_explain *e)
{
	if (!e)
		return;
	session_virtual_job_clear(&e->j);
	pack_plan_clear(&e->j.plan);
	pad_batch_clear(&e->j.rows);
	if (e->s) {
		e->s->explain = NULL;
		/* Chunks and counts still out come back to nothing (the pool reads it: count jobs stop at their next shard). */
		__atomic_store_n(&e->s->closed, true, __ATOMIC_RELAXED);
		session_unref(e->s);
	}
	free(e->t.p);
	free(e);
}

/* Text chunks of the side session (and its virtual streams') out with the workers. */
static unsigned explain_inflight(const struct session *s)
{
	unsigned n = s->virt ? session_virtual_inflight(s) : 0;
	for (uint32_t i = 0; i < s->n_srcs; i++)
		n += s->srcs[i].chunks_inflight;
	return n;
}

/* A plan waits for text: hands the pool what it needs. Returns 0 (wait for a chunk), or -EIO/-ENOMEM with err. */
static int explain_tokenize(struct session *s, char *err, size_t errlen)
{
	int r = s->virt ? session_virtual_text(s, true) : 0;
	for (uint32_t i = 0; r == 0 && s->has_text && i < s->n_srcs; i++)
		if (s->srcs[i].feed->kind == FEED_TEXT)
			r = session_text_submit(s, &s->srcs[i]);
	if (r < 0) {
		snprintf(err, errlen, "cannot queue documents to tokenize: %s", strerror(-r));
		return r;
	}
	session_count_ask(s); /* the shards and windows the walks wait for (issue #22) */
	session_window_ask(s);
	if (explain_inflight(s) == 0 && !s->count_jobs && !s->window_job && !s->failed) {
		snprintf(err, errlen, "internal error: a plan waits for text that nothing tokenizes");
		return -EIO;
	}
	return 0;
}

static int explain_walk(struct session_explain *e, int *ret_code, char *err, size_t errlen);

/*
 * Plans the batches not explained yet. Returns 1: all explained (or failed:
 * e->t.error, with the message in err); 0: waiting for the pool.
 */
static int explain_plan(struct session_explain *e, int *ret_code, char *err, size_t errlen)
{
	struct session *s = e->s;
	if (s->count_jobs || s->window_job)
		return 0; /* a chunk came back, the counts or windows a walk waits for did not yet: their job steps again */
	bool was = feed_count_never_block(true);
	feed_count_wanted(NULL, 0);
	feed_windows_wanted(NULL, 0);
	int done = explain_walk(e, ret_code, err, errlen);
	feed_count_never_block(was);
	return done;
}

static int explain_walk(struct session_explain *e, int *ret_code, char *err, size_t errlen)
{
	struct session *s = e->s;
	const struct feed *f = s->feed;
	while (e->b < e->batches) {
		uint64_t batch = s->first_batch + e->b;
		struct cursor cur = { .fingerprint = f->fingerprint, .world = s->world, .rank = s->rank, .batch = batch + 1 };
		int r = session_plan(s, &e->j, batch, &cur, err, errlen);
		if (r == -EAGAIN && (r = explain_tokenize(s, err, errlen)) == 0)
			return 0;
		if (r < 0) {
			*ret_code = r;
			return 1;
		}
		if (!s->virt)
			plan_pieces(&e->t, s, &e->j, batch, 0, -1);
		for (uint32_t i = 0; s->virt && i < s->batch_size; i++)
			plan_pieces(&e->t, e->j.vrows[i].sub, &e->j.vrows[i].job, batch, i, e->j.vrows[i].sub->rank);
		e->b++;
		s->planned = e->b;
	}
	*ret_code = e->t.error;
	return 1;
}

/* The outcome for the caller: the text (taken) or the error. */
static void explain_finish(struct session_explain *e, int code, const char *msg)
{
	char *text = NULL;
	if (code == 0) {
		text = e->t.p ? e->t.p : strdup("");
		e->t.p = NULL;
		if (!text) {
			code = -ENOMEM;
			msg = "out of memory";
		}
	}
	session_explain_fn done = e->done;
	void *userdata = e->userdata;
	explain_free(e);
	done(code, text, msg, userdata);
}

void session_explain_step(struct session_explain *e)
{
	char err[512] = "";
	int code = 0;
	if (explain_plan(e, &code, err, sizeof(err)))
		explain_finish(e, code, err);
}

/* The side session failed (a chunk that could not be read or tokenized). */
static void explain_failed(struct session *s, int code, const char *msg, void *userdata)
{
	explain_finish(userdata, code, msg);
}

struct session_explain *session_explain_cancel(struct session_explain *e)
{
	explain_free(e);
	return NULL;
}

int session_explain(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		    const struct vstate *st, uint32_t batches, session_explain_fn done, void *userdata,
		    struct session_explain **ret_pending, char **ret_text, char *err, size_t errlen)
{
	if (f->state != FEED_READY) {
		snprintf(err, errlen, "feed %s is not available: %s", f->name, f->error);
		return f->error_code < 0 ? f->error_code : -EIO;
	}
	if (f->vranks ? world > f->vranks || c : !!st) {
		snprintf(err, errlen, "%s",
			 !f->vranks ? "the feed has no virtual ranks: give a cursor (fc1/fc2), not a state"
			 : c        ? "the feed has virtual ranks: give a state (fv1-...), not a cursor"
				    : "the world is larger than the feed's virtual ranks");
		return -EINVAL;
	}
	struct session_explain *e = calloc(1, sizeof(*e));
	struct session *s = calloc(1, sizeof(*s));
	if (!e || !s) {
		free(e);
		free(s);
		return -ENOMEM;
	}
	e->s = s;
	e->batches = batches;
	e->done = done;
	e->userdata = userdata;
	s->refs = 1;
	s->feed = feed_ref(f);
	s->producer = p;
	s->explain = e;
	s->on_fail = explain_failed;
	s->userdata = e;
	s->rank = rank;
	s->world = world;
	s->batch_size = f->conf.batch_size;
	/* Text: tokenize what the batches asked need, at once (section 15.2's look-ahead, bounded by them). */
	s->rows_ahead = (uint32_t)MIN((uint64_t)f->conf.batch_size * MAX(batches, 1u), (uint64_t)UINT32_MAX);
	s->starved = UINT32_MAX;
	s->started = true;
	/* Issue #22: streams whose windows are not counted yet open once the pool has counted them. */
	int r = session_open(s, f->vranks ? NULL : c, f->vranks ? st : NULL, err, errlen);
	if (r < 0) {
		explain_free(e);
		return r;
	}
	if (s->opening) {
		*ret_pending = e;
		return 0;
	}
	int code = 0;
	if (!explain_plan(e, &code, err, errlen)) {
		*ret_pending = e;
		return 0;
	}
	if (code < 0) {
		explain_free(e);
		return code;
	}
	*ret_text = e->t.p ? e->t.p : strdup("");
	e->t.p = NULL;
	explain_free(e);
	return *ret_text ? 1 : -ENOMEM;
}
