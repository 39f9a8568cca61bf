/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <event2/event.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/feed/checker.h"
#include "daemon/feed/producer.h"
#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-text.h"
#include "daemon/feed/worker.h"
#include "proto/macro.h"

struct producer {
	struct pool *pool;      /* NULL: manual (tests) */
	struct event_base *base;
	int done_efd;
	struct event *done_ev;
	pthread_mutex_t lock;
	struct producer_job *done; /* finished jobs, pushed by workers (newest first) */
	enum io_engine engine;
	unsigned io_depth;
	unsigned threads;
	struct feed_watch *watch; /* the daemon's change watch (integrity.h), polled before publishing; may be NULL */
	struct checker *checker;  /* the daemon's shard checker (checker.h); may be NULL */

	/* manual */
	struct pool_job *queue_head, *queue_tail;
	unsigned queued;
	struct worker *worker;
};

/*
 * A job is finished: onto the completion list, and a kick for the main loop.
 * The one way back from a worker, for every kind of job.
 */
static void producer_complete(struct producer *p, struct producer_job *j)
{
	pthread_mutex_lock(&p->lock);
	j->next_done = p->done;
	p->done = j;
	bool first = !j->next_done;
	pthread_mutex_unlock(&p->lock);
	/*
	 * Only the job that finds the list empty kicks: the main loop reads the
	 * eventfd before it takes the list, so a kick already made covers every
	 * job pushed before that take (issue 18: one write, and one wakeup, for
	 * a burst of completions instead of one each).
	 */
	if (first) {
		uint64_t one = 1;
		ssize_t _unused_ n = write(p->done_efd, &one, sizeof(one));
	}
}

/* A batch: produced into its ring slot (header included). */
static void job_run(struct session_job *j, struct worker *w)
{
	struct session *s = j->pj.session;
	if (__atomic_load_n(&s->closed, __ATOMIC_RELAXED)) {
		j->result = -ECANCELED;
		return;
	}
	uint64_t seq = (s->by_docs ? j->rows.batch_index : j->plan.batch_index) - s->first_batch;
	uint8_t *slot = ring_slot(s->ring, seq);
	((struct feed_slot_header *)slot)->seq = seq;
	if (s->virt)
		j->result = session_virtual_produce(s, j, w, slot);
	else if (s->by_docs)
		j->result = worker_produce_rows(w, s->feed, &j->rows, s->rank, s->world, j->cursor, s->ring->hdr, slot,
						j->error, sizeof(j->error));
	else
		j->result = worker_produce(w, s->feed, &j->plan, s->rank, s->world, j->cursor, s->ring->hdr, slot,
					   j->error, sizeof(j->error));
}

/* A chunk of text: read and tokenized. */
static void chunk_run(struct session_chunk *c, struct worker *w)
{
	if (__atomic_load_n(&session_root(c->pj.session)->closed, __ATOMIC_RELAXED))
		c->result = -ECANCELED;
	else
		c->result = worker_tokenize(w, c->src->feed, &c->t);
}

static void run(struct pool_job *pool_job, void *ctx)
{
	struct producer_job *j = container_of(pool_job, struct producer_job, job);
	if (j->kind == PRODUCER_BATCH)
		job_run(container_of(j, struct session_job, pj), ctx);
	else if (j->kind == PRODUCER_EPOCH)
		session_epoch_run(container_of(j, struct session_epoch_job, pj));
	else if (j->kind == PRODUCER_COUNT)
		session_count_run(container_of(j, struct session_count_job, pj));
	else if (j->kind == PRODUCER_WINDOW)
		session_window_run(container_of(j, struct session_window_job, pj));
	else
		chunk_run(container_of(j, struct session_chunk, pj), ctx);
	producer_complete(j->session->producer, j);
}

/* Main loop: hands each finished job back to its session, in the order they finished. */
static void on_done(evutil_socket_t fd, short what, void *userdata)
{
	struct producer *p = userdata;
	uint64_t v;
	ssize_t _unused_ n = read(fd, &v, sizeof(v));

	pthread_mutex_lock(&p->lock);
	struct producer_job *list = p->done, *fifo = NULL;
	p->done = NULL;
	pthread_mutex_unlock(&p->lock);
	while (list) {
		struct producer_job *j = list;
		list = j->next_done;
		j->next_done = fifo;
		fifo = j;
	}

	while (fifo) {
		struct producer_job *j = fifo;
		fifo = j->next_done;
		struct session *s = j->session;
		if (j->kind == PRODUCER_BATCH)
			session_batch_done(s, container_of(j, struct session_job, pj));
		else if (j->kind == PRODUCER_EPOCH)
			session_epoch_done(s, container_of(j, struct session_epoch_job, pj));
		else if (j->kind == PRODUCER_COUNT)
			session_count_done(s, container_of(j, struct session_count_job, pj));
		else if (j->kind == PRODUCER_WINDOW)
			session_window_done(s, container_of(j, struct session_window_job, pj));
		else
			session_chunk_done(s, container_of(j, struct session_chunk, pj));
		session_unref(s);
	}
}

void producer_submit(struct producer *p, struct producer_job *j)
{
	assert(j->session && j->session->refs > 0);
	j->job.run = run;
	j->job.next = NULL;
	if (p->pool) {
		pool_submit(p->pool, &j->job);
		return;
	}
	if (p->queue_tail)
		p->queue_tail->next = &j->job;
	else
		p->queue_head = &j->job;
	p->queue_tail = &j->job;
	p->queued++;
}

unsigned producer_run_queued(struct producer *p, unsigned max)
{
	unsigned ran = 0;
	while (ran < max && p->queue_head) {
		struct pool_job *job = p->queue_head;
		p->queue_head = job->next;
		if (!p->queue_head)
			p->queue_tail = NULL;
		p->queued--;
		job->run(job, p->worker);
		ran++;
	}
	return ran;
}

unsigned producer_queued(const struct producer *p)
{
	return p->queued;
}

static void *worker_ctx_new(unsigned i, void *arg)
{
	struct producer *p = arg;
	return worker_new(p->engine, p->io_depth);
}

static void worker_ctx_free(void *ctx)
{
	worker_free(ctx);
}

static int producer_make(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
			 bool manual, struct producer **ret)
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
	if (r == 0 && manual) {
		p->threads = MAX(threads, 1u);
		p->worker = worker_new(engine, io_depth);
		r = p->worker ? 0 : -ENOMEM;
	} else if (r == 0) {
		r = pool_new(threads, worker_ctx_new, worker_ctx_free, p, &p->pool);
		if (r == 0)
			p->threads = pool_threads(p->pool);
	}
	if (r < 0) {
		producer_free(p);
		return r;
	}
	*ret = p;
	return 0;
}

int producer_new(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
		 struct producer **ret)
{
	return producer_make(base, threads, engine, io_depth, false, ret);
}

int producer_new_manual(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
			struct producer **ret)
{
	return producer_make(base, threads, engine, io_depth, true, ret);
}

struct producer *producer_free(struct producer *p)
{
	if (!p)
		return NULL;
	/* Joining the pool finishes every queued job; their completions are dropped with it. */
	p->pool = pool_free(p->pool);
	if (p->worker) {
		producer_run_queued(p, UINT_MAX);
		p->worker = worker_free(p->worker);
	}
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

unsigned producer_threads(const struct producer *p)
{
	return p->threads;
}

struct event_base *producer_event_base(const struct producer *p)
{
	return p->base;
}

/* Every worker reads with the same engine: the first one's says. */
static const struct worker *first_worker(const struct producer *p)
{
	return p->pool ? pool_worker_ctx(p->pool, 0) : p->worker;
}

const char *producer_io_engine(const struct producer *p)
{
	const struct worker *w = first_worker(p);
	return w ? source_reader_engine(w->io) : "none";
}

int producer_io_fallback(const struct producer *p)
{
	const struct worker *w = first_worker(p);
	return w ? source_reader_fallback(w->io) : 0;
}

void producer_set_watch(struct producer *p, struct feed_watch *w)
{
	p->watch = w;
}

struct feed_watch *producer_watch(const struct producer *p)
{
	return p->watch;
}

void producer_set_checker(struct producer *p, struct checker *c)
{
	p->checker = c;
}

bool producer_recheck(struct producer *p, struct feed *f)
{
	checker_recheck(p->checker, f);
	return p->checker != NULL;
}
