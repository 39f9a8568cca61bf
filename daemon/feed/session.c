/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/feed/session.h"
#include "daemon/feed/worker.h"
#include "daemon/log/log.h"
#include "proto/macro.h"

struct producer {
	struct pool *pool;
	struct event_base *base;
	int done_efd;
	struct event *done_ev;
	pthread_mutex_t lock;
	struct session_job *done; /* finished jobs, pushed by workers */
	enum io_engine engine;
	unsigned io_depth;
};

static void session_unref(struct session *s);
static void pump(struct session *s);

static void *worker_ctx_new(unsigned i, void *arg)
{
	struct producer *p = arg;
	return worker_new(p->engine, p->io_depth);
}

static void worker_ctx_free(void *ctx)
{
	worker_free(ctx);
}

static void job_run(struct pool_job *pj, void *ctx)
{
	struct session_job *j = (struct session_job *)((char *)pj - offsetof(struct session_job, job));
	struct session *s = j->session;
	struct producer *p = s->producer;

	if (__atomic_load_n(&s->closed, __ATOMIC_RELAXED)) {
		j->result = -ECANCELED;
	} else {
		uint64_t seq = j->plan.batch_index - s->first_batch;
		uint8_t *slot = ring_slot(s->ring, seq);
		((struct feed_slot_header *)slot)->seq = seq;
		j->result = worker_produce(ctx, s->feed, &j->plan, s->rank, s->world, j->cursor, s->ring->hdr, slot,
					   j->error, sizeof(j->error));
	}

	pthread_mutex_lock(&p->lock);
	j->next_done = p->done;
	p->done = j;
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	ssize_t _unused_ n = write(p->done_efd, &one, sizeof(one));
}

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
		j->state = JOB_IDLE;
		s->published++;
		uint64_t tokens = (uint64_t)j->plan.batch_size * j->plan.seq_len;
		s->feed->tokens_served += tokens;
		s->feed->batches++;
	}
	if (s->published != before)
		ring_publish(s->ring, s->published);
	if (failed) {
		/* A short read means a shard changed: mark the feed now, not at the next periodic check. */
		if (failed->result == -ENODATA)
			feed_check(s->feed);
		session_fail(s, failed->result, failed->error);
	}
}

static void on_done(evutil_socket_t fd, short what, void *userdata)
{
	struct producer *p = userdata;
	uint64_t v;
	ssize_t _unused_ n = read(fd, &v, sizeof(v));

	pthread_mutex_lock(&p->lock);
	struct session_job *list = p->done;
	p->done = NULL;
	pthread_mutex_unlock(&p->lock);

	while (list) {
		struct session_job *j = list;
		list = j->next_done;
		struct session *s = j->session;
		j->state = JOB_DONE;
		if (!s->failed && !s->closed) {
			advance(s);
			pump(s);
		}
		session_unref(s);
	}
}

static void on_space(evutil_socket_t fd, short what, void *userdata)
{
	struct session *s = userdata;
	ring_space_ack(s->ring);
	pump(s);
}

/* Plans and submits batches while the client has free slots. */
static void pump(struct session *s)
{
	char msg[256];
	uint32_t n = s->ring->slot_count;
	for (;;) {
		if (s->failed || s->closed)
			return;
		if (ring_refresh_tail(s->ring) < 0) {
			session_fail(s, -EPROTO, "client wrote an invalid consumer position; disconnecting it");
			return;
		}
		uint64_t tail = s->ring->tail;
		if (s->published - tail < n && s->full_since_ns) {
			s->full_ns_total += now_ns() - s->full_since_ns;
			s->full_since_ns = 0;
		}
		while (s->planned - tail < n) {
			struct session_job *j = &s->jobs[s->planned % n];
			uint64_t batch = s->first_batch + s->planned;
			int r = pack_plan(&s->stream, s->feed->conf.batch_size, s->feed->conf.seq_len, batch, &j->plan);
			if (r < 0) {
				snprintf(msg, sizeof(msg), "cannot plan batch %" PRIu64 ": %s", batch,
					 r == -ENODATA ? "this rank receives no tokens" : strerror(-r));
				session_fail(s, r, msg);
				return;
			}
			struct cursor c = {
				.fingerprint = s->feed->fingerprint,
				.world = s->world,
				.rank = s->rank,
				.batch = batch + 1,
				.pos = j->plan.next,
			};
			if (cursor_format(&c, j->cursor, sizeof(j->cursor)) < 0) {
				session_fail(s, -ENOBUFS, "cursor does not fit");
				return;
			}
			j->state = JOB_RUNNING;
			j->session = s;
			s->refs++;
			s->planned++;
			pool_submit(s->producer->pool, &j->job);
		}
		if (s->published - tail == n && !s->full_since_ns)
			s->full_since_ns = now_ns();
		/* Full: ask for a kick on release, unless the client released meanwhile. */
		if (!ring_wait_space(s->ring))
			return;
	}
}

int producer_new(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
		 struct producer **ret)
{
	struct producer *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->base = base;
	p->engine = engine;
	p->io_depth = io_depth;
	p->done_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int r = p->done_efd < 0 ? -errno : 0;
	if (r == 0) {
		p->done_ev = event_new(base, p->done_efd, EV_READ | EV_PERSIST, on_done, p);
		r = p->done_ev && event_add(p->done_ev, NULL) == 0 ? 0 : -ENOMEM;
	}
	if (r == 0)
		r = pool_new(threads, worker_ctx_new, worker_ctx_free, p, &p->pool);
	if (r < 0) {
		producer_free(p);
		return r;
	}
	*ret = p;
	return 0;
}

struct producer *producer_free(struct producer *p)
{
	if (!p)
		return NULL;
	/* Joining the pool finishes every queued job; their completions are dropped with it. */
	p->pool = pool_free(p->pool);
	if (p->done_ev) {
		/* Deliver what finished, so sessions drop the references their jobs held. */
		on_done(p->done_efd, EV_READ, p);
		event_free(p->done_ev);
	}
	if (p->done_efd >= 0)
		close(p->done_efd);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return NULL;
}

struct pool *producer_pool(struct producer *p)
{
	return p->pool;
}

static void session_unref(struct session *s)
{
	if (--s->refs > 0)
		return;
	if (s->space_ev)
		event_free(s->space_ev);
	for (uint32_t i = 0; s->jobs && i < s->ring->slot_count; i++)
		pack_plan_clear(&s->jobs[i].plan);
	free(s->jobs);
	stream_clear(&s->stream);
	ring_free(s->ring);
	s->feed->clients--;
	feed_unref(s->feed);
	free(s);
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
	if (world > f->n_nonempty) {
		snprintf(err, errlen,
			 "feed %s has %" PRIu64 " non-empty documents, fewer than the world size %u: some ranks would get no data",
			 f->name, f->n_nonempty, world);
		return -EINVAL;
	}
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
	}

	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->refs = 1;
	s->producer = p;
	s->feed = feed_ref(f);
	f->clients++;
	s->rank = rank;
	s->world = world;
	s->first_batch = c ? c->batch : 0;
	s->on_fail = on_fail;
	s->userdata = userdata;
	s->attach_ns = now_ns();

	struct ring_geometry g = { .slot_count = slots, .batch_size = f->conf.batch_size, .seq_len = f->conf.seq_len,
				   .rank = rank, .world = world };
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
	for (unsigned i = 0; i < slots; i++)
		s->jobs[i].job.run = job_run;

	r = stream_init(&s->stream, &f->params, f->doc_tokens, rank, world, f->conf.bos != CONF_TOKEN_NONE,
			f->conf.eos != CONF_TOKEN_NONE, c ? &c->pos : NULL);
	if (r < 0) {
		if (r == -EINVAL)
			snprintf(err, errlen, "cursor does not name a position in rank %u's stream of feed %s", rank,
				 f->name);
		else if (r == -ENODATA)
			snprintf(err, errlen, "rank %u of world %u receives no tokens from feed %s", rank, world,
				 f->name);
		else
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
		goto fail;
	}

	s->space_ev = event_new(p->base, s->ring->space_efd, EV_READ | EV_PERSIST, on_space, s);
	if (!s->space_ev || event_add(s->space_ev, NULL) < 0) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	*ret = s;
	pump(s);
	return 0;
fail:
	session_unref(s);
	return r;
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
