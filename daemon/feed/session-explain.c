/* SPDX-License-Identifier: MIT */
/*
 * Provenance (feedctl explain; docs/sample-order.md, section 17.9): the
 * batches a rank would receive from a cursor or state, planned on the side
 * by the very code that plans a session's batches (no ring, nothing read),
 * written as one line per piece of a row: which virtual stream, source,
 * shard, document and token range it holds.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-plan.h"
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

int session_explain(struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c, const struct vstate *st,
		    uint32_t batches, char **ret_text, char *err, size_t errlen)
{
	if (f->state != FEED_READY) {
		snprintf(err, errlen, "feed %s is not available: %s", f->name, f->error);
		return f->error_code < 0 ? f->error_code : -EIO;
	}
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		if ((f->n_sources ? f->sources[i] : f)->kind == FEED_TEXT) {
			snprintf(err, errlen, "feed %s tokenizes text on the way: explain plans from stored token counts only",
				 f->name);
			return -EOPNOTSUPP;
		}
	}
	if (f->vranks ? world > f->vranks || c : !!st) {
		snprintf(err, errlen, "%s",
			 !f->vranks ? "the feed has no virtual ranks: give a cursor (fc1/fc2), not a state"
			 : c        ? "the feed has virtual ranks: give a state (fv1-...), not a cursor"
				    : "the world is larger than the feed's virtual ranks");
		return -EINVAL;
	}
	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->refs = 1;
	s->feed = feed_ref(f);
	s->rank = rank;
	s->world = world;
	s->batch_size = s->rows_ahead = f->conf.batch_size;
	s->starved = UINT32_MAX;
	struct text t = { 0 };
	struct session_job j = { 0 };
	int r = f->vranks ? session_virtual_open(s, st, err, errlen) : session_open_streams(s, c, err, errlen);
	for (uint32_t b = 0; r == 0 && b < batches; b++) {
		uint64_t batch = s->first_batch + b;
		struct cursor cur = { .fingerprint = f->fingerprint, .world = world, .rank = rank, .batch = batch + 1 };
		r = session_plan(s, &j, batch, &cur, err, errlen);
		if (r < 0)
			break;
		if (!s->virt)
			plan_pieces(&t, s, &j, batch, 0, -1);
		for (uint32_t i = 0; s->virt && i < s->batch_size; i++)
			plan_pieces(&t, j.vrows[i].sub, &j.vrows[i].job, batch, i, j.vrows[i].sub->rank);
	}
	session_virtual_job_clear(&j);
	pack_plan_clear(&j.plan);
	pad_batch_clear(&j.rows);
	session_unref(s);
	if (r == 0 && t.error)
		r = t.error;
	if (r < 0) {
		free(t.p);
		return r;
	}
	*ret_text = t.p ? t.p : strdup("");
	return *ret_text ? 0 : -ENOMEM;
}
