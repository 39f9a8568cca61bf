/* SPDX-License-Identifier: MIT */
/*
 * A fixed pool of worker threads running jobs in FIFO order. Each worker owns
 * a context made by ctx_new (its io_reader and scratch buffers), so jobs need
 * no locking of their own. Jobs are intrusive: the caller embeds a pool_job
 * and keeps it alive until its function ran.
 */
#pragma once

#include <stdint.h>

struct pool_job {
	struct pool_job *next;
	void (*run)(struct pool_job *job, void *worker_ctx);
};

struct pool;

/*
 * Starts n workers (n = 0: one per online CPU). ctx_new(i, arg) builds worker
 * i's context (NULL is an error); ctx_free tears it down. Returns 0 or a negative errno.
 */
int pool_new(unsigned n, void *(*ctx_new)(unsigned i, void *arg), void (*ctx_free)(void *ctx), void *arg,
	     struct pool **ret);
/* Runs the queued jobs to completion, stops and joins the workers. Takes NULL. */
struct pool *pool_free(struct pool *p);

void pool_submit(struct pool *p, struct pool_job *job);
unsigned pool_threads(const struct pool *p);
/* Workers currently running a job (a snapshot, for telemetry). */
unsigned pool_busy(const struct pool *p);
/* Jobs queued and not yet started. */
unsigned pool_queued(const struct pool *p);
/* Each worker's context, for reading its statistics (racy snapshot by design). */
void *pool_worker_ctx(const struct pool *p, unsigned i);
