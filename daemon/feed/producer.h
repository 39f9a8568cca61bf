/* SPDX-License-Identifier: MIT */
/*
 * The producer: the worker pool of the feeds, and the one completion path
 * back to the main loop. Sessions hand it two kinds of jobs: a batch to
 * produce into a ring slot, and a chunk of text to tokenize. A worker runs a
 * job and pushes it onto the completion list (producer_complete(), the only
 * place that does), then kicks an eventfd; the main loop takes the whole list
 * and hands each job back to its session, which publishes, plans further and
 * drops the reference the job held.
 *
 * Threads: jobs run on pool workers; everything else on the main thread.
 * A manual producer (producer_new_manual) has no threads: jobs wait until the
 * caller runs them with producer_run_queued(), so that tests drive sessions
 * step by step, deterministically, through the same completion path.
 */
#pragma once

#include <stdbool.h>

#include "daemon/source/source.h" /* enum io_engine */
#include "daemon/pool/pool.h"

struct event_base;
struct producer;
struct session;

enum producer_job_kind {
	PRODUCER_BATCH, /* a struct session_job: produce a batch into its ring slot */
	PRODUCER_CHUNK, /* a struct session_chunk: tokenize text ahead of planning */
	PRODUCER_EPOCH, /* a struct session_epoch_job: measure an epoch's length (session-epoch.h) */
	PRODUCER_COUNT, /* a struct session_count_job: count a text shard a walk waits for (session-count.c) */
	PRODUCER_WINDOW, /* a struct session_window_job: build the shuffled windows walks wait for (session-window.c) */
};

/* Embedded in each job; the session sets kind and session, the producer the rest. */
struct producer_job {
	struct pool_job job;
	enum producer_job_kind kind;
	struct session *session;       /* holds a reference while the job is out */
	struct producer_job *next_done; /* completion list */
};

/*
 * Starts `threads` pool workers (0: one per CPU), each with an io_reader of
 * `engine` and `io_depth`, and the completion event on base. Returns 0 or a
 * negative errno.
 */
int producer_new(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
		 struct producer **ret);
/*
 * A producer without threads, for tests: submitted jobs queue until
 * producer_run_queued() runs them on the caller's thread. `threads` is what
 * producer_threads() reports (sessions size their text chunks by it).
 */
int producer_new_manual(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
			struct producer **ret);
/* Finishes every queued job, delivers the completions and frees. Takes NULL. */
struct producer *producer_free(struct producer *p);

/* The pool (NULL for a manual producer): telemetry reads its load. */
struct pool *producer_pool(struct producer *p);
unsigned producer_threads(const struct producer *p);
/* The engine the workers read with ("io_uring", "pread"; "none" without workers yet). */
const char *producer_io_engine(const struct producer *p);
/* 0, or why the workers fell back from io_uring to pread (negative errno). */
int producer_io_fallback(const struct producer *p);
/* The main loop completions arrive on (sessions watch their rings on it too). */
struct event_base *producer_event_base(const struct producer *p);

/* The change watch sessions poll before publishing (integrity.h); NULL: none. The producer does not own it. */
struct feed_watch;
void producer_set_watch(struct producer *p, struct feed_watch *w);
struct feed_watch *producer_watch(const struct producer *p);
/*
 * The shard checker (checker.h) that a short read asks to check a feed in
 * full, off the main loop; NULL: none. The producer does not own it.
 * producer_recheck: checker_recheck(the checker, f).
 */
struct checker;
struct feed;
void producer_set_checker(struct producer *p, struct checker *c);
bool producer_recheck(struct producer *p, struct feed *f); /* true: handed to the checker; false: checked here */

/* Hands j to a worker; the caller has set j->kind and j->session and holds a session reference for it. */
void producer_submit(struct producer *p, struct producer_job *j);

/*
 * Manual producer: runs up to max queued jobs (oldest first) on this thread.
 * Their completions arrive through the event loop, as from a worker. Returns
 * how many ran.
 */
unsigned producer_run_queued(struct producer *p, unsigned max);
/* Manual producer: jobs queued and not yet run. */
unsigned producer_queued(const struct producer *p);
