/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-plan.h"
#include "daemon/feed/session-text.h"
#include "daemon/gpu/staging.h"
#include "daemon/gpu/gpu.h"
#include "daemon/log/log.h"
#include "proto/macro.h"

void session_fail(struct session *s, int code, const char *msg)
{
	if (s->failed || s->closed)
		return;
	s->failed = true;
	log_error("feed %s rank %u/%u: %s", s->feed->name, s->rank, s->world, msg);
	ring_set_state(s->ring, FEED_RING_FAILED, code);
	if (s->on_fail)
		s->on_fail(s, code, msg, s->userdata);
}

/*
 * Publishes finished slots, strictly in order. A failed batch stops the
 * session there: the client still receives every batch before it.
 */
static void advance(struct session *s)
{
	uint64_t before = s->published;
	struct session_job *failed = NULL;
	int staged = 0;
	assert(s->ring->tail <= s->published && s->published <= s->planned);
	while (s->published < s->planned) {
		struct session_job *j = &s->jobs[s->published % s->ring->slot_count];
		if (j->state != JOB_DONE)
			break;
		if (j->result < 0) {
			failed = j;
			break;
		}
		struct feed_slot_header *h = (struct feed_slot_header *)ring_slot(s->ring, s->published);
		h->produced_ns = now_ns();
		/* GPU staging: H2D queued and `ready` recorded before head moves (daemon/gpu/staging.h). */
		if (s->staging && (staged = staging_publish(s->staging, s->published, s->ring->tail)) < 0)
			break;
		j->state = JOB_IDLE;
		s->published++;
		feed_count_batch(s->feed, &j->counts, j->src_docs);
	}
	if (s->published != before)
		ring_publish(s->ring, s->published);
	for (uint32_t i = 0; s->has_text && i < s->n_srcs; i++)
		if (s->srcs[i].feed->kind == FEED_TEXT)
			session_text_retire(s, &s->srcs[i]);
	if (staged < 0)
		session_fail(s, staged, s->staging->backend->error);
	if (failed) {
		/* A short read means a shard changed: mark the feed now, not at the next periodic check. */
		if (failed->result == -ENODATA)
			feed_check(s->feed);
		session_fail(s, failed->result, failed->error);
	}
}

static void on_space(evutil_socket_t fd, short what, void *userdata)
{
	struct session *s = userdata;
	ring_space_ack(s->ring);
	session_pump(s);
}

void session_batch_done(struct session *s, struct session_job *j)
{
	assert(j->state == JOB_RUNNING);
	j->state = JOB_DONE;
	if (!s->failed && !s->closed) {
		advance(s);
		session_pump(s);
	}
}

/*
 * Plans and submits batches while the client has free slots, then hands
 * text streams more to tokenize. tail <= published <= planned throughout.
 */
void session_pump(struct session *s)
{
	char msg[512];
	uint32_t n = s->ring->slot_count;
	assert(s->started);
	for (;;) {
		if (s->failed || s->closed)
			return;
		if (ring_refresh_tail(s->ring) < 0) {
			session_fail(s, -EPROTO, "client wrote an invalid consumer position; disconnecting it");
			return;
		}
		uint64_t tail = s->ring->tail;
		/* ring_refresh_tail() accepts no tail past the head. */
		assert(tail <= s->published && s->published <= s->planned && s->planned - tail <= n);
		if (s->published - tail < n && s->full_since_ns) {
			s->full_ns_total += now_ns() - s->full_since_ns;
			s->full_since_ns = 0;
		}
		while (s->planned - tail < n) {
			struct session_job *j = &s->jobs[s->planned % n];
			uint64_t batch = s->first_batch + s->planned;
			int r = 0;
			/* The slot's last H2D copy may still read it; the space eventfd is kicked when it is done. */
			if (s->staging && (r = staging_host_reusable(s->staging, s->planned)) <= 0) {
				if (r < 0)
					session_fail(s, r, s->staging->backend->error);
				return;
			}
			struct cursor c = {
				.fingerprint = s->feed->fingerprint,
				.world = s->world,
				.rank = s->rank,
				.batch = batch + 1,
			};
			assert(j->state == JOB_IDLE);
			r = session_plan(s, j, batch, &c, msg, sizeof(msg));
			if (r == -EAGAIN)
				break;
			if (r < 0) {
				session_fail(s, r, msg);
				return;
			}
			if (cursor_format(&c, j->cursor, sizeof(j->cursor)) < 0) {
				session_fail(s, -ENOBUFS, "cursor does not fit");
				return;
			}
			j->state = JOB_RUNNING;
			j->pj.kind = PRODUCER_BATCH;
			j->pj.session = s;
			session_ref(s);
			s->planned++;
			producer_submit(s->producer, &j->pj);
		}
		for (uint32_t i = 0; s->has_text && i < s->n_srcs; i++) {
			if (s->srcs[i].feed->kind != FEED_TEXT)
				continue;
			int r = session_text_submit(s, &s->srcs[i]);
			if (r < 0) {
				session_fail(s, r, "cannot queue documents to tokenize: out of memory");
				return;
			}
		}
		if (s->published - tail == n && !s->full_since_ns)
			s->full_since_ns = now_ns();
		/* Full: ask for a kick on release, unless the client released meanwhile. */
		if (!ring_wait_space(s->ring))
			return;
	}
}

void session_ref(struct session *s)
{
	assert(s->refs > 0);
	s->refs++;
}

void session_unref(struct session *s)
{
	assert(s->refs > 0);
	if (--s->refs > 0)
		return;
	if (s->space_ev)
		event_free(s->space_ev);
	for (uint32_t i = 0; s->jobs && i < s->ring->slot_count; i++) {
		pack_plan_clear(&s->jobs[i].plan);
		pad_batch_clear(&s->jobs[i].rows);
	}
	free(s->jobs);
	for (uint32_t i = 0; s->srcs && i < s->n_srcs; i++) {
		struct session_src *x = &s->srcs[i];
		if (x->stream)
			stream_clear(x->stream);
		free(x->queue);
		doc_walk_clear(&x->ahead);
		while (x->chunk_head) {
			struct session_chunk *c = x->chunk_head;
			x->chunk_head = c->next;
			session_chunk_free(c);
		}
	}
	free(s->srcs);
	bestfit_clear(&s->bestfit);
	/* The staging's copies read the ring: gpu_retire frees both, or keeps both while a copy may still run. */
	if (!s->staging)
		ring_free(s->ring);
	else if (gpu_retire(s->staging, s->ring) > 0)
		log_warning("feed %s rank %u/%u: GPU copies of a departed client have not run yet; its ring and device "
			    "memory are kept until they have", s->feed->name, s->rank, s->world);
	feed_unref(s->feed);
	free(s);
}

/*
 * Stored tokens: a document's count, its index entries checked first (the
 * index is mapped and validated lazily, daemon/feed/feed-scan.c). A fault
 * fails the feed, whose error the session's message then names.
 */
static int stored_doc(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids)
{
	struct session_src *x = userdata;
	char err[512];
	*ret_ids = NULL;
	int r = feed_doc_tokens(x->feed, doc, ret_tokens, err, sizeof(err));
	if (r < 0)
		feed_fail(x->feed, r, err);
	return r;
}

/*
 * Opens stream x at pos (NULL: the start). Returns 0 or a negative errno
 * with the attach error in err.
 */
static int src_open(struct session *s, struct session_src *x, const struct stream_pos *pos, char *err, size_t errlen)
{
	const struct feed *f = x->feed;
	int r;
	struct stream_source src = { .doc = f->kind == FEED_TEXT ? session_text_doc : stored_doc, .userdata = x };
	r = stream_init_source(x->stream, &f->params, &src, s->rank, s->world, f->bos_id >= 0, f->eos_id >= 0, pos);
	if (r == 0 && f->kind == FEED_TEXT) {
		/* Tokenizing starts at the stream's own document and runs ahead of it. */
		const struct doc_walk *w = &x->stream->walk;
		r = doc_walk_seek(&x->ahead, &f->params, s->rank, s->world, w->ep.epoch, w->window, w->at);
		x->ahead_seq = x->stream->seq;
		if (r < 0) {
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
			return r;
		}
	}
	if (r == -EINVAL)
		session_cursor_not_here(err, errlen, s->rank, f);
	else if (r == -ENODATA)
		snprintf(err, errlen, "rank %u of world %u receives no tokens from feed %s", s->rank, s->world, f->name);
	else if (r == -EBADMSG && f->state == FEED_FAILED)
		snprintf(err, errlen, "%s", f->error);
	else if (r < 0)
		snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
	return r;
}

int session_new(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		unsigned slots, session_fail_fn on_fail, void *userdata, struct session **ret, char *err,
		size_t errlen)
{
	int r;
	if (f->state != FEED_READY) {
		snprintf(err, errlen, "feed %s is not available: %s", f->name, f->error);
		return f->error_code < 0 ? f->error_code : -EIO;
	}
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		struct feed *sf = f->n_sources ? f->sources[i] : f;
		int enough = feed_nonempty_at_least(sf, world);
		if (enough < 0) {
			snprintf(err, errlen, "feed %s is not available: %s", sf->name, sf->error);
			return enough;
		}
		if (!enough) {
			snprintf(err, errlen,
				 "feed %s has %" PRIu64 " non-empty documents, fewer than the world size %u: some ranks would get no data",
				 sf->name, sf->n_nonempty, world);
			return -EINVAL;
		}
	}
	const bool by_docs = f->n_sources > 0 || f->conf.packing != CONF_PACKING_CONCAT;
	if (c) {
		if (c->fingerprint != f->fingerprint) {
			snprintf(err, errlen,
				 "cursor belongs to another feed or another version of feed %s (fingerprint %016" PRIx64
				 ", the feed's is %016" PRIx64 "): its shards or parameters changed",
				 f->name, c->fingerprint, f->fingerprint);
			return -EINVAL;
		}
		if (c->world != world || c->rank != rank) {
			snprintf(err, errlen, "cursor is for rank %u of world %u, not rank %u of world %u", c->rank,
				 c->world, rank, world);
			return -EINVAL;
		}
		/* Only bestfit has rows inside a buffer, only a mixture's concat an offset inside its document k. */
		uint64_t row = f->n_sources ? c->row : by_docs ? c->pos.offset : 0;
		if (c->n_sources != f->n_sources || (row && f->conf.packing != CONF_PACKING_BESTFIT) ||
		    (c->offset && f->conf.packing != CONF_PACKING_CONCAT))
			return session_cursor_not_here(err, errlen, rank, f);
	}

	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->refs = 1;
	s->producer = p;
	s->feed = feed_ref(f);
	s->rank = rank;
	s->world = world;
	s->first_batch = c ? c->batch : 0;
	s->on_fail = on_fail;
	s->userdata = userdata;
	s->attach_ns = now_ns();
	s->by_docs = by_docs;
	s->starved = UINT32_MAX;

	struct ring_geometry g = { .slot_count = slots, .batch_size = f->conf.batch_size, .seq_len = f->conf.seq_len,
				   .rank = rank, .world = world };
	r = ring_new(&g, &s->ring);
	if (r < 0) {
		snprintf(err, errlen, "cannot reserve a ring of %u slots x %zu bytes: %s", slots,
			 ring_slot_bytes(g.batch_size, g.seq_len), strerror(-r));
		goto fail;
	}
	s->jobs = calloc(slots, sizeof(*s->jobs));
	s->n_srcs = MAX(f->n_sources, 1u);
	s->srcs = calloc(s->n_srcs, sizeof(*s->srcs));
	if (!s->jobs || !s->srcs) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < s->n_srcs; i++) {
		struct session_src *x = &s->srcs[i];
		*x = (struct session_src){ .session = s, .feed = f->n_sources ? f->sources[i] : f, .index = i };
		x->stream = i == 0 ? &s->stream : &x->own;
		s->has_text |= x->feed->kind == FEED_TEXT;
		struct stream_pos at;
		const struct stream_pos *pos = NULL;
		if (c) {
			at = f->n_sources ? c->src[i] : c->pos;
			if (by_docs)
				at.offset = 0; /* by_docs streams stand at a document's start; fc1 carries the row there */
			pos = &at;
		}
		r = src_open(s, x, pos, err, errlen);
		if (r < 0)
			goto fail;
	}

	if (by_docs && (r = session_plan_init(s, c, err, errlen)) < 0)
		goto fail;

	s->space_ev = event_new(producer_event_base(p), s->ring->space_efd, EV_READ | EV_PERSIST, on_space, s);
	if (!s->space_ev) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* Nothing produced yet: the owner wires the session, then calls session_start(). */
	*ret = s;
	return 0;
fail:
	session_unref(s);
	return r;
}

void session_attach_staging(struct session *s, struct staging *st)
{
	assert(!s->started && !s->staging);
	s->staging = st;
}

void session_start(struct session *s)
{
	assert(!s->started && !s->closed);
	s->started = true;
	if (event_add(s->space_ev, NULL) < 0) {
		session_fail(s, -ENOMEM, "cannot watch the ring's space eventfd: out of memory");
		return;
	}
	session_pump(s);
}

struct session *session_close(struct session *s)
{
	if (!s)
		return NULL;
	__atomic_store_n(&s->closed, true, __ATOMIC_RELAXED);
	if (s->space_ev)
		event_del(s->space_ev);
	session_unref(s);
	return NULL;
}

uint64_t session_fill(struct session *s)
{
	ring_refresh_tail(s->ring);
	return s->published - s->ring->tail;
}

void session_stop(struct session *s)
{
	ring_set_state(s->ring, FEED_RING_STOPPING, -ESHUTDOWN);
}

struct feed *session_feed(const struct session *s)
{
	return s->feed;
}

struct ring *session_ring(const struct session *s)
{
	return s->ring;
}

struct staging *session_staging(const struct session *s)
{
	return s->staging;
}

uint32_t session_rank(const struct session *s)
{
	return s->rank;
}

uint32_t session_world(const struct session *s)
{
	return s->world;
}

uint64_t session_first_batch(const struct session *s)
{
	return s->first_batch;
}

uint64_t session_published(const struct session *s)
{
	return s->published;
}

uint64_t session_in_flight(const struct session *s)
{
	return s->planned - s->published;
}

bool session_failed(const struct session *s)
{
	return s->failed;
}

uint64_t session_attach_ns(const struct session *s)
{
	return s->attach_ns;
}

uint64_t session_full_ns(const struct session *s, uint64_t now)
{
	return s->full_ns_total + (s->full_since_ns ? now - s->full_since_ns : 0);
}

uint64_t session_epoch(const struct session *s)
{
	return s->stream.walk.ep.epoch;
}
