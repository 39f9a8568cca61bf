/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon/pool/pool.h"
#include "proto/macro.h"

struct worker {
	struct pool *pool;
	pthread_t thread;
	void *ctx;
	bool started;
};

struct pool {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct pool_job *head, *tail;
	unsigned queued, busy;
	bool stopping;
	unsigned n;
	void (*ctx_free)(void *ctx);
	struct worker *workers;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct pool *p = w->pool;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->head && !p->stopping)
			pthread_cond_wait(&p->cond, &p->lock);
		struct pool_job *job = p->head;
		if (!job)
			break;
		p->head = job->next;
		if (!p->head)
			p->tail = NULL;
		p->queued--;
		p->busy++;
		pthread_mutex_unlock(&p->lock);
		job->run(job, w->ctx);
		pthread_mutex_lock(&p->lock);
		p->busy--;
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int pool_new(unsigned n, void *(*ctx_new)(unsigned i, void *arg), void (*ctx_free)(void *ctx), void *arg,
	     struct pool **ret)
{
	if (n == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		n = cpus > 0 ? (unsigned)cpus : 1;
	}
	struct pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->n = n;
	p->ctx_free = ctx_free;
	p->workers = calloc(n, sizeof(*p->workers));
	if (!p->workers) {
		pool_free(p);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < n; i++) {
		struct worker *w = &p->workers[i];
		w->pool = p;
		w->ctx = ctx_new(i, arg);
		if (!w->ctx) {
			pool_free(p);
			return -ENOMEM;
		}
		int e = pthread_create(&w->thread, NULL, worker_main, w);
		if (e != 0) {
			pool_free(p);
			return -e;
		}
		w->started = true;
	}
	*ret = p;
	return 0;
}

struct pool *pool_free(struct pool *p)
{
	if (!p)
		return NULL;
	pthread_mutex_lock(&p->lock);
	p->stopping = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; p->workers && i < p->n; i++) {
		struct worker *w = &p->workers[i];
		if (w->started)
			pthread_join(w->thread, NULL);
		if (w->ctx && p->ctx_free)
			p->ctx_free(w->ctx);
	}
	free(p->workers);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return NULL;
}

void pool_submit(struct pool *p, struct pool_job *job)
{
	job->next = NULL;
	pthread_mutex_lock(&p->lock);
	if (p->tail)
		p->tail->next = job;
	else
		p->head = job;
	p->tail = job;
	p->queued++;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

unsigned pool_threads(const struct pool *p)
{
	return p->n;
}

unsigned pool_busy(const struct pool *p)
{
	return __atomic_load_n(&p->busy, __ATOMIC_RELAXED);
}

unsigned pool_queued(const struct pool *p)
{
	return __atomic_load_n(&p->queued, __ATOMIC_RELAXED);
}

void *pool_worker_ctx(const struct pool *p, unsigned i)
{
	return i < p->n ? p->workers[i].ctx : NULL;
}
