/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/integrity.h"
#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-plan.h"
#include "daemon/feed/session-text.h"
#include "daemon/gpu/staging.h"
#include "daemon/gpu/gpu.h"
#include "daemon/log/log.h"
#include "proto/macro.h"
#include "proto/vstate.h"

void session_fail(struct session *s, int code, const char *msg)
{
	if (s->parent) {
		session_fail(s->parent, code, msg);
		return;
	}
	if (s->failed || s->closed)
		return;
	s->failed = true;
	log_error("feed %s rank %u/%u: %s", s->feed->name, s->rank, s->world, msg);
	/* A shard changed: the batches published and not yet taken may hold its new bytes; withdraw them all. */
	if (s->ring) /* else an explanation's side session (session-explain.c) */
		ring_set_state(s->ring, code == -ESTALE ? FEED_RING_WITHDRAWN : FEED_RING_FAILED, code);
	if (s->on_fail)
		s->on_fail(s, code, msg, s->userdata);
}

/*
 * Whether the session's feed is known to have changed (issue #16): a write
 * the kernel has reported but the main loop has not read yet is dispatched
 * first. Then the session stops with its unread batches withdrawn.
 */
static bool feed_changed(struct session *s)
{
	feed_watch_poll(producer_watch(s->producer));
	if (!s->failed && s->feed->state == FEED_FAILED && s->feed->error_code == -ESTALE)
		session_fail(s, s->feed->error_code, s->feed->error);
	return s->failed;
}

/*
 * Publishes finished slots, strictly in order. A failed batch stops the
 * session there: the client still receives every batch before it. Nothing
 * is published once the feed's data changed.
 */
static void advance(struct session *s)
{
	uint64_t before = s->published;
	struct session_job *failed = NULL;
	int staged = 0;
	if (feed_changed(s))
		return;
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
		if (s->virt)
			session_virtual_published(s, j);
	}
	if (s->published != before)
		ring_publish(s->ring, s->published);
	for (uint32_t i = 0; s->has_text && i < s->n_srcs; i++)
		if (s->srcs[i].feed->kind == FEED_TEXT)
			session_text_retire(s, &s->srcs[i]);
	if (s->virt)
		session_virtual_text(s, false);
	if (staged < 0)
		session_fail(s, staged, s->staging->backend->error);
	if (failed) {
		/*
		 * A short read means a shard changed: the session stops with its
		 * batches withdrawn, and the whole feed is checked now, not at the
		 * next periodic check, on the checker's thread (a stat() that hangs
		 * holds up no client); it fails the feed when it finds the change.
		 * Without a checker (unit tests) the check runs here.
		 */
		if (failed->result == -ENODATA || failed->result == -ESTALE) {
			if (producer_recheck(s->producer, s->feed)) {
				session_fail(s, -ESTALE, failed->error);
				return;
			}
			if (feed_changed(s))
				return;
		}
		/* A block that does not match its checksum: every session of the feed would meet it (docs/checksums.md). */
		if (failed->result == -EUCLEAN)
			feed_fail(s->feed, -EUCLEAN, failed->error);
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
		bool was = feed_count_never_block(true); /* advance's walks too (session_virtual_text) */
		advance(s);
		feed_count_never_block(was);
		session_pump(s);
	}
}

/*
 * Plans and submits batches while the client has free slots, then hands
 * text streams more to tokenize. tail <= published <= planned throughout.
 */
static void pump(struct session *s)
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
				.fingerprint = session_fingerprint(s),
				.data = s->feed->data_id,
				.has_data = true,
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
			if (!s->virt && cursor_format(&c, j->cursor, sizeof(j->cursor)) < 0) {
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
				/* A shard of a window reached that could not be indexed (issue #22) failed its feed, naming it. */
				const struct feed *tf = s->srcs[i].feed;
				char why[640];
				snprintf(why, sizeof(why), "cannot queue documents to tokenize: %s",
					 tf->state == FEED_FAILED ? tf->error : r == -ERANGE ? SESSION_KW_WRONG : strerror(-r));
				session_fail(s, r, why);
				return;
			}
		}
		if (s->virt && session_virtual_text(s, true) < 0) {
			session_fail(s, -ENOMEM, "cannot queue documents to tokenize: out of memory");
			return;
		}
		if (s->published - tail == n && !s->full_since_ns)
			s->full_since_ns = now_ns();
		/* Full: ask for a kick on release, unless the client released meanwhile. */
		if (!ring_wait_space(s->ring))
			return;
	}
}

void session_pump(struct session *s)
{
	/* Issue #22: a resume's streams wait for their windows' counts (session-open.c), then it goes on. */
	if (s->opening && !session_open_pump(s))
		return;
	if (s->explain) { /* a side session of feedctl explain: a chunk it waited for came back */
		session_explain_step(s->explain);
		return;
	}
	/* The attach could not tell whether the feed has R documents: nothing is planned until it is told. */
	if (s->world_check && (session_world_check(s) < 0 || s->world_check))
		return;
	/* Issue #22: the walks here read no shard; one they wait for is counted on the pool, then they go on. */
	bool was = feed_count_never_block(true);
	feed_count_wanted(NULL, 0);
	feed_windows_wanted(NULL, 0);
	pump(s);
	feed_count_never_block(was);
	session_count_ask(s);
	session_window_ask(s);
}

void session_ref(struct session *s)
{
	assert(s->refs > 0);
	s->refs++;
}

void session_streams_clear(struct session *s)
{
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
	s->srcs = NULL;
	s->n_srcs = 0;
	s->has_text = false;
	memset(&s->mark, 0, sizeof(s->mark)); /* a failed attempt's (session_plan_init) is not the next one's */
	bestfit_clear(&s->bestfit);
	session_virtual_free(s);
}

void session_unref(struct session *s)
{
	assert(s->refs > 0);
	if (--s->refs > 0)
		return;
	if (s->space_ev)
		event_free(s->space_ev);
	for (uint32_t i = 0; s->jobs && i < s->ring->slot_count; i++) {
		session_virtual_job_clear(&s->jobs[i]);
		pack_plan_clear(&s->jobs[i].plan);
		pad_batch_clear(&s->jobs[i].rows);
	}
	free(s->jobs);
	session_streams_clear(s);
	session_opening_free(s);
	session_window_clear(s);
	/* The staging's copies read the ring: gpu_retire frees both, or keeps both while a copy may still run. */
	if (!s->ring)
		;
	else if (!s->staging)
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

/* Stored tokens: a document the stream reaches soon, at a random place of the index (section 3.1's windows). */
static void stored_prefetch(void *userdata, uint64_t doc, unsigned stage)
{
	struct session_src *x = userdata;
	format_doc_prefetch(x->feed->shards[ORDER_DOC_SHARD(doc)], ORDER_DOC_INDEX(doc), stage);
}

/*
 * Opens stream x at pos (NULL: the start). Returns 0 or a negative errno
 * with the attach error in err.
 */
static int src_open(struct session *s, struct session_src *x, const struct stream_pos *pos, char *err, size_t errlen)
{
	const struct feed *f = x->feed;
	const struct order_params *op = s->params ? &s->params[x->index] : &f->params;
	int r;
	/* A virtual stream of stored tokens: its session warms and settles it with the others (session-virtual.c). */
	struct stream_source src = { .doc = f->kind == FEED_TEXT ? session_text_doc : stored_doc, .userdata = x,
				     .prefetch = f->kind == FEED_TEXT ? NULL : stored_prefetch,
				     .unsettled = s->parent && f->kind != FEED_TEXT };
	/*
	 * No window is counted here on the main loop (issue #22; the caller set
	 * feed_count_never_block): from the start, a stream whose first window
	 * is not counted yet waits for it like any later one (session-count.c);
	 * a cursor's window not counted yet stops the open (-EAGAIN, no message:
	 * session-open.c tries again once the pool has counted it).
	 */
	r = stream_init_source(x->stream, op, &src, s->rank, s->world, f->bos_id >= 0, f->eos_id >= 0, pos);
	if (r == -EAGAIN)
		return r;
	if (r == 0 && f->kind == FEED_TEXT && x->stream->advancing) {
		/* Tokenizing starts where the stream does, from its start, once its first window is counted. */
		r = doc_walk_seek_k(&x->ahead, op, s->rank, s->world, 0, 0, NULL, SIZE_MAX, true);
		x->ahead_seq = 0;
		x->ahead_unplaced = true;
		if (r < 0 && r != -EAGAIN)
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
		if (r < 0)
			return r;
	} else if (r == 0 && f->kind == FEED_TEXT) {
		/* Tokenizing starts at the stream's own document and runs ahead of it. */
		const struct doc_walk *w = &x->stream->walk;
		/* The stream's window start: a resume counts nothing before it twice (issue #22). */
		/*
		 * It holds its windows' shards too: the documents it hands out are
		 * sized from the shard's index here (format_doc_bytes), which another
		 * stream leaving a window of the shard may otherwise let go meanwhile.
		 */
		r = doc_walk_seek_k(&x->ahead, op, s->rank, s->world, w->ep.epoch, w->window, &w->ep.win_start[w->window],
				    w->at, true);
		x->ahead_seq = x->stream->seq;
		if (r < 0 && r != -EAGAIN)
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
		if (r < 0)
			return r;
	}
	if (r == -EINVAL)
		session_cursor_not_here(err, errlen, s->rank, f);
	else if (r == -ERANGE && pos && pos->has_k)
		/* Section 7.3: a carried k_w is checked against the counts known (issue #22). */
		snprintf(err, errlen,
			 "cursor's <kw> (k_w %" PRIu64 ") is not the number of documents before window %u of epoch %" PRIu64
			 " in rank %u's stream of feed %s: the cursor was altered, or made on other data",
			 pos->k, pos->window, pos->epoch, s->rank, f->name);
	else if (r == -ENODATA)
		snprintf(err, errlen, "rank %u of world %u receives no tokens from feed %s", s->rank, s->world, f->name);
	else if ((r == -EBADMSG || r == -ESTALE) && f->state == FEED_FAILED)
		snprintf(err, errlen, "%s", f->error);
	else if (r < 0)
		snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
	return r;
}

/*
 * The streams of rank/world of feed f at cursor c (NULL: the start), for a
 * session s whose identity fields are set: cursor checks, streams opened,
 * whole-document planning set up. Shared by a rank's session and by the
 * virtual streams of an elastic one (session-virtual.c). Returns 0 or a
 * negative errno with the attach error in err.
 */
int session_open_streams(struct session *s, const struct cursor *c, char *err, size_t errlen)
{
	struct feed *f = s->feed;
	const uint32_t rank = s->rank, world = s->world;
	uint64_t fingerprint = session_fingerprint(s);
	int r;
	const bool by_docs = f->n_sources > 0 || f->conf.packing != CONF_PACKING_CONCAT;
	/* Section 8: a text feed's cursor made under the old feistel8 rule names the same order. */
	if (c && !s->plain && f->fingerprint_alt && c->fingerprint == f->fingerprint_alt)
		fingerprint = f->fingerprint_alt;
	if (c) {
		/* Same shards, sizes, mtimes and parameters, other data: a shard rewritten in place (issue #16). */
		if (c->has_data && c->data != f->data_id && c->fingerprint == fingerprint) {
			snprintf(err, errlen,
				 "cursor was taken on other data: the data of feed %s changed since (data identity %016" PRIx64
				 ", now %016" PRIx64 ") though no size or mtime did: a shard was rewritten in place, or this "
				 "is a copy on another file system; resume with a cursor taken on the current data",
				 f->name, c->data, f->data_id);
			return -EINVAL;
		}
		if (c->fingerprint != fingerprint && c->has_data && c->data != f->data_id) {
			snprintf(err, errlen,
				 "cursor belongs to another feed or another version of feed %s (fingerprint %016" PRIx64
				 ", the feed's is %016" PRIx64 "): the data changed (data identity %016" PRIx64 ", now %016" PRIx64
				 ": a shard was added, removed, rewritten or replaced), or the cursor is another feed's",
				 f->name, c->fingerprint, fingerprint, c->data, f->data_id);
			return -EINVAL;
		}
		if (c->fingerprint != fingerprint) {
			snprintf(err, errlen,
				 "cursor belongs to another feed or another version of feed %s (fingerprint %016" PRIx64
				 ", the feed's is %016" PRIx64 "): its shards or parameters changed",
				 f->name, c->fingerprint, fingerprint);
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
	s->by_docs = by_docs;
	s->starved = UINT32_MAX;
	s->first_batch = c ? c->batch : 0;
	s->n_srcs = MAX(f->n_sources, 1u);
	s->srcs = calloc(s->n_srcs, sizeof(*s->srcs));
	if (!s->srcs) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
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
		if (r == -ERANGE && pos && pos->has_k && !s->parent)
			return -EINVAL; /* refused as any cursor is (section 7.3), the message naming <kw> */
		if (r < 0)
			return r;
		/*
		 * Section 8: a text cursor without k_w made with the fingerprint that
		 * names no bijection was made by a feedd that shuffled every window
		 * with Fisher-Yates; resuming inside a window over shuffle_list_max
		 * would then change its order mid-window. Refused there only.
		 */
		if (pos && !pos->has_k && !s->parent && x->feed->kind == FEED_TEXT && !f->n_sources &&
		    c->fingerprint != f->fingerprint_alt &&
		    x->stream->walk.win.permuted) {
			snprintf(err, errlen,
				 "cursor of feed %s was made by a feedd that shuffled windows over shuffle_list_max (%" PRIu64
				 ") as lists, and resumes inside one: its order there is not this one's (docs/sample-order.md, section 8)",
				 f->name, f->conf.shuffle_list_max);
			return -EINVAL;
		}
	}
	if (by_docs && (r = session_plan_init(s, c, err, errlen)) < 0)
		return r;
	return 0;
}

int session_new(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		const struct vstate *state, unsigned slots, session_fail_fn on_fail, void *userdata,
		struct session **ret, char *err, size_t errlen)
{
	int r;
	/*
	 * Section 17.7: a cursor saved without virtual ranks (fingerprint F0) of a world other than V' resumes
	 * exactly the stream it was taken on, one rank's of sections 3 to 16 (with V' = R it becomes the state of
	 * stream r instead, below).
	 */
	bool plain = f->vranks && c && !state && c->fingerprint == f->fingerprint_plain && world != f->vranks;
	/*
	 * Section 17.1: with virtual_ranks left at its default, a job larger
	 * than it starts (attach with no cursor) on one stream per rank, as
	 * before the default, instead of being refused; only a value the
	 * config sets is a promise to refuse larger worlds.
	 */
	const bool plain_start = f->vranks && !c && !state && world > f->vranks && !f->conf.virtual_ranks_set;
	if (plain_start)
		plain = true;
	const uint32_t vranks = plain ? 0 : f->vranks;
	if (f->state != FEED_READY) {
		snprintf(err, errlen, "feed %s is not available: %s", f->name, f->error);
		return f->error_code < 0 ? f->error_code : -EIO;
	}
	bool world_check = false;
	for (uint32_t i = 0; !vranks && i < MAX(f->n_sources, 1u); i++) {
		struct feed *sf = f->n_sources ? f->sources[i] : f;
		/*
		 * Counted only as far as needed: the index is validated lazily
		 * (feed-scan.c). Text: from the shards counted so far; when they
		 * do not tell, decided after the attach, the shards counted on the
		 * pool (session-count.c), never here on the main loop.
		 */
		int enough = feed_docs_known_at_least(sf, world);
		if (enough == -EAGAIN) {
			world_check = true;
			continue;
		}
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
	if (vranks && world > f->vranks) {
		snprintf(err, errlen,
			 "feed %s has %u virtual ranks (virtual_ranks, at most the documents of an epoch), fewer than the world size %u: "
			 "raise virtual_ranks to at least the largest world the job will run with",
			 f->name, f->vranks, world);
		return -EINVAL;
	}
	struct vstate from_v1;
	struct vstate_stream from_v1_entry;
	if (vranks && c) {
		/* Section 17.7: a cursor saved before virtual_ranks was set resumes when V' equals its world. */
		if (session_virtual_from_cursor(f, c, rank, world, &from_v1, &from_v1_entry) < 0) {
			snprintf(err, errlen,
				 "feed %s has virtual ranks: resume it from an elastic state (fv1-...); a cursor of one rank's stream "
				 "(fc1/fc2) resumes only when it is of this feed without virtual ranks, of this rank, and of a world "
				 "of %u (its virtual ranks)", f->name, f->vranks);
			return -EINVAL;
		}
		state = &from_v1;
		c = NULL;
	}
	if (!vranks && state) {
		snprintf(err, errlen, "feed %s has no virtual ranks (virtual_ranks): an elastic state (fv1-...) is not one of its cursors",
			 f->name);
		return -EINVAL;
	}

	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->refs = 1;
	s->producer = p;
	s->feed = feed_ref(f);
	s->rank = rank;
	s->world = world;
	s->plain = plain;
	s->batch_size = f->conf.batch_size;
	s->rows_ahead = f->conf.batch_size;
	s->on_fail = on_fail;
	s->userdata = userdata;
	s->attach_ns = now_ns();
	s->starved = UINT32_MAX;
	s->world_check = world_check;

	struct ring_geometry g = { .slot_count = slots, .batch_size = f->conf.batch_size, .seq_len = f->conf.seq_len,
				   .rank = rank, .world = world };
	/* Elastic states longer than a cursor go to each slot's state area (section 17.5). */
	const size_t state_max = vranks ? vstate_max_len((f->vranks - rank + world - 1) / world, f->n_sources) : 0;
	if (state_max > FEED_CURSOR_MAX)
		g.state_bytes = (uint32_t)ALIGN_UP(state_max, (size_t)64);
	r = ring_new(&g, &s->ring);
	if (r < 0) {
		snprintf(err, errlen, "cannot reserve a ring of %u slots x %zu bytes: %s", slots,
			 ring_slot_bytes(g.batch_size, g.seq_len), strerror(-r));
		goto fail;
	}
	s->jobs = calloc(slots, sizeof(*s->jobs));
	if (!s->jobs) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* Issue #22: no window counted here; a resume whose windows are not counted yet opens after the attach. */
	s->first_batch = state ? state->batch : c ? c->batch : 0;
	r = session_open(s, vranks ? NULL : c, vranks ? state : NULL, err, errlen);
	if (r < 0)
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
	session_close(s); /* closed: a count job of its open still out comes back to nothing */
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

bool session_opening(const struct session *s)
{
	return s->opening && !s->failed;
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
	if (s->virt)
		return session_virtual_epoch(s);
	return s->stream.walk.ep.epoch;
}
