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
	struct text_chunk *chunks_done; /* tokenized chunks, pushed by workers */
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

static void chunk_run(struct pool_job *pj, void *ctx)
{
	struct text_chunk *c = (struct text_chunk *)((char *)pj - offsetof(struct text_chunk, job));
	struct session *s = c->session;
	struct producer *p = s->producer;

	if (__atomic_load_n(&s->closed, __ATOMIC_RELAXED))
		c->result = -ECANCELED;
	else
		c->result = worker_tokenize(ctx, s->feed, c);

	pthread_mutex_lock(&p->lock);
	c->next_done = p->chunks_done;
	p->chunks_done = c;
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	ssize_t _unused_ n = write(p->done_efd, &one, sizeof(one));
}

static struct text_chunk *chunk_free(struct text_chunk *c)
{
	if (!c)
		return NULL;
	free(c->docs);
	free(c->start);
	free(c->ids);
	for (uint32_t i = 0; c->bad && i < c->n; i++)
		free(c->bad[i]);
	free(c->bad);
	free(c);
	return NULL;
}

/*
 * The chunk holding visit `seq`, moving chunk_cur forward. Chunks passed are
 * used by plans up to the batch being planned now at the latest.
 */
static struct text_chunk *chunk_at(struct session *s, uint64_t seq)
{
	struct text_chunk *c = s->chunk_cur ? s->chunk_cur : s->chunk_head;
	while (c && seq >= c->first_seq + c->n) {
		c->last_batch = s->first_batch + s->planned;
		c = c->next;
	}
	if (c)
		s->chunk_cur = c;
	return c && seq >= c->first_seq ? c : NULL;
}

/* The stream's source for text feeds: counts and tokens from finished chunks. */
static int text_doc(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids)
{
	struct session *s = userdata;
	struct text_chunk *c = chunk_at(s, seq);
	if (!c || !c->done)
		return -EAGAIN;
	uint32_t i = (uint32_t)(seq - c->first_seq);
	*ret_tokens = c->start[i + 1] - c->start[i];
	*ret_ids = c->ids + c->start[i];
	return 0;
}

/*
 * Stream positions known from the stream's position on, through finished
 * chunks in order, counting up to `need`.
 */
static uint64_t text_ready(struct session *s, uint64_t need)
{
	uint64_t seq = s->stream.seq, have = 0;
	struct text_chunk *c = chunk_at(s, seq);
	for (; c && c->done && have < need + s->stream.offset; c = c->next) {
		for (uint32_t i = seq > c->first_seq ? (uint32_t)(seq - c->first_seq) : 0;
		     i < c->n && have < need + s->stream.offset; i++)
			have += stream_doc_length(&s->stream, c->start[i + 1] - c->start[i]);
	}
	return have > s->stream.offset ? have - s->stream.offset : 0;
}

/* Average text bytes per token so far (4 before anything was tokenized). */
static double bytes_per_token(const struct feed *f)
{
	uint64_t tokens = __atomic_load_n(&f->tok_tokens, __ATOMIC_RELAXED);
	uint64_t bytes = __atomic_load_n(&f->stages->tokenize.bytes, __ATOMIC_RELAXED);
	return tokens > 4096 && bytes ? (double)bytes / (double)tokens : 4.0;
}

/*
 * Hands the next documents of the rank's stream to the workers to tokenize,
 * until the finished and in-flight chunks cover the free slots plus one batch.
 */
static int text_submit(struct session *s)
{
	const struct feed *f = s->feed;
	const uint64_t bl = (uint64_t)f->conf.batch_size * f->conf.seq_len;
	const unsigned threads = pool_threads(s->producer->pool);
	const uint64_t free_slots = s->ring->slot_count - (s->planned - s->ring->tail);
	const uint64_t target = (free_slots + 1) * bl + 1;
	const double bpt = bytes_per_token(f);
	/* Chunks small enough to spread one batch over every thread, large enough to amortise a job. */
	const uint64_t chunk_bytes = MIN(MAX((uint64_t)((double)bl * bpt) / MAX(threads, 1u), UINT64_C(16) << 10),
					 UINT64_C(1) << 20);

	while (!s->ahead_end && s->chunks_inflight < 2 * threads + 1) {
		uint64_t have = text_ready(s, target) + (uint64_t)((double)s->inflight_bytes / bpt);
		if (have >= target)
			break;
		struct text_chunk *c = calloc(1, sizeof(*c));
		uint32_t cap = 64;
		if (c)
			c->docs = malloc(cap * sizeof(*c->docs));
		if (!c || !c->docs) {
			chunk_free(c);
			return -ENOMEM;
		}
		c->first_seq = s->ahead_seq;
		c->session = s;
		c->job.run = chunk_run;
		while (c->n < 65536 && c->bytes < chunk_bytes) {
			if (c->n == cap) {
				uint64_t *d = realloc(c->docs, 2 * cap * sizeof(*d));
				if (!d) {
					chunk_free(c);
					return -ENOMEM;
				}
				c->docs = d;
				cap *= 2;
			}
			uint64_t doc = doc_walk_doc(&s->ahead);
			c->docs[c->n++] = doc;
			c->bytes += f->texts[ORDER_DOC_SHARD(doc)]->lengths[ORDER_DOC_INDEX(doc)];
			s->ahead_seq++;
			unsigned crossed;
			int r = doc_walk_next(&s->ahead, &crossed);
			if (r == -ENODATA) {
				s->ahead_end = true;
				break;
			}
			if (r < 0) {
				chunk_free(c);
				return r;
			}
		}
		if (s->chunk_tail)
			s->chunk_tail->next = c;
		else
			s->chunk_head = c;
		s->chunk_tail = c;
		if (!s->chunk_cur)
			s->chunk_cur = c;
		s->chunks_inflight++;
		s->inflight_bytes += c->bytes;
		s->refs++;
		pool_submit(s->producer->pool, &c->job);
	}
	return 0;
}

/* Frees the chunks no plan in flight or to come uses any more. */
static void text_retire(struct session *s)
{
	while (s->chunk_head && s->chunk_head != s->chunk_cur && s->chunk_head->done &&
	       s->chunk_head->last_batch < s->first_batch + s->published) {
		struct text_chunk *c = s->chunk_head;
		s->chunk_head = c->next;
		if (!s->chunk_head)
			s->chunk_tail = NULL;
		chunk_free(c);
	}
}

/* A chunk came back from a worker (main thread). */
static void chunk_done(struct session *s, struct text_chunk *c)
{
	struct feed *f = s->feed;
	c->done = true;
	s->chunks_inflight--;
	s->inflight_bytes -= c->bytes;
	if (s->failed || s->closed)
		return;
	if (c->result < 0) {
		if (c->result == -ENODATA)
			feed_check(f);
		session_fail(s, c->result, c->error);
		return;
	}
	if (c->skipped) {
		for (uint32_t i = 0; i < c->n; i++) {
			if (!c->bad[i])
				continue;
			int r = feed_mark_bad(f, c->docs[i]);
			if (r < 0) {
				session_fail(s, -ENOMEM, "out of memory counting bad records");
				return;
			}
			if (r == 0)
				continue; /* met before, in another epoch or by another rank */
			snprintf(f->last_bad, sizeof(f->last_bad), "%s", c->bad[i]);
			/* Logged, but not a line per record for a feed full of them. */
			if (f->bad_records <= 10)
				log_warning("feed %s: skipped a bad record: %s%s", f->name, c->bad[i],
					    f->bad_records == 10 ? " (further ones are only counted)" : "");
		}
		if ((double)f->bad_records > f->conf.max_bad_fraction * (double)f->n_docs) {
			char msg[1024];
			snprintf(msg, sizeof(msg),
				 "%" PRIu64 " bad records skipped, more than max_bad_fraction %g of the feed's %" PRIu64
				 " documents; the latest: %s",
				 f->bad_records, f->conf.max_bad_fraction, f->n_docs, f->last_bad);
			if (f->state == FEED_READY) {
				f->state = FEED_FAILED;
				f->error_code = -EBADMSG;
				snprintf(f->error, sizeof(f->error), "%.*s", (int)sizeof(f->error) - 1, msg);
			}
			session_fail(s, -EBADMSG, msg);
		}
	}
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
	int staged = 0;
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
		uint64_t tokens = (uint64_t)j->plan.batch_size * j->plan.seq_len;
		s->feed->tokens_served += tokens;
		s->feed->batches++;
	}
	if (s->published != before)
		ring_publish(s->ring, s->published);
	if (s->feed->kind == FEED_TEXT)
		text_retire(s);
	if (staged < 0)
		session_fail(s, staged, s->staging->backend->error);
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
	struct text_chunk *chunks = p->chunks_done;
	p->chunks_done = NULL;
	pthread_mutex_unlock(&p->lock);

	while (chunks) {
		struct text_chunk *c = chunks;
		chunks = c->next_done;
		struct session *s = c->session;
		chunk_done(s, c);
		if (!s->failed && !s->closed)
			pump(s);
		session_unref(s);
	}

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
		const bool text = s->feed->kind == FEED_TEXT;
		const uint64_t bl = (uint64_t)s->feed->conf.batch_size * s->feed->conf.seq_len;
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
			if (text) {
				/* Plan only what is tokenized: every position of the batch and the look-ahead. */
				r = stream_settle(&s->stream);
				if (r == -EAGAIN || (r == 0 && text_ready(s, bl + 1) < bl + 1))
					break;
			}
			if (r == 0)
				r = pack_plan(&s->stream, s->feed->conf.batch_size, s->feed->conf.seq_len, batch, &j->plan);
			if (r < 0) {
				snprintf(msg, sizeof(msg), "cannot plan batch %" PRIu64 ": %s", batch,
					 r == -ENODATA ? "this rank receives no tokens"
					 : r == -EINVAL ? "the cursor's offset lies past the end of its document"
							: strerror(-r));
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
		if (text) {
			int r = text_submit(s);
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
	bool leaked = false;
	s->staging = staging_free(s->staging, &leaked); /* before the ring: its copies read the ring */
	if (leaked)
		log_warning("feed %s rank %u/%u: GPU copies did not finish; keeping their memory", s->feed->name,
			    s->rank, s->world);
	for (uint32_t i = 0; s->jobs && i < s->ring->slot_count; i++)
		pack_plan_clear(&s->jobs[i].plan);
	free(s->jobs);
	stream_clear(&s->stream);
	doc_walk_clear(&s->ahead);
	while (s->chunk_head) {
		struct text_chunk *c = s->chunk_head;
		s->chunk_head = c->next;
		chunk_free(c);
	}
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

	struct stream_source src = { .doc = text_doc, .userdata = s };
	if (f->kind == FEED_TEXT)
		r = stream_init_source(&s->stream, &f->params, &src, rank, world, f->bos_id >= 0, f->eos_id >= 0,
				       c ? &c->pos : NULL);
	else
		r = stream_init(&s->stream, &f->params, f->doc_tokens, rank, world, f->bos_id >= 0, f->eos_id >= 0,
				c ? &c->pos : NULL);
	if (r == 0 && f->kind == FEED_TEXT) {
		/* Tokenizing starts at the stream's own document and runs ahead of it. */
		const struct doc_walk *w = &s->stream.walk;
		r = doc_walk_seek(&s->ahead, &f->params, rank, world, w->ep.epoch, w->window, w->at);
		s->ahead_seq = s->stream.seq;
		if (r < 0) {
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
			goto fail;
		}
	}
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
