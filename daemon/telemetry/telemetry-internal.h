/* SPDX-License-Identifier: MIT */
/*
 * What the files of telemetry/ share: the object, the per-feed records, the
 * host record and the sliding-window helpers. Main thread only.
 *
 *   telemetry.c       the object, clients and feeds, sampling into windows, the tick
 *   host.c            the host as the workers see it (/proc schedstat, load)
 *   diagnosis.c       the rules: a verdict per client and feed, the worst line
 *   view.c            the views status and metrics render (telemetry.h)
 */
#pragma once

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/feed/stage.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/ring_abi.h"

struct feed_slot {
	uint64_t span_ns;
	struct feed_stages d;
};

struct tfeed {
	struct tfeed *next;
	const struct feed *f; /* dereferenced only while the server lists it */
	bool seen;
	bool text; /* FEED_TEXT: reads and tokenizing run in jobs of their own, outside `job` */
	uint64_t last_ns;
	struct feed_stages prev;
	struct feed_slot slots[WINDOW_SLOTS];
	unsigned cur;
	struct feed_slot win;
	struct diag diag;
};

/*
 * The host as feedd's worker threads see it (/proc/self/task/TID/schedstat):
 * CPU time they got and time they spent runnable on a run queue, waiting for
 * a CPU. One sub-window per second group, like the feeds'.
 */
struct host_slot {
	uint64_t span_ns, cpu_ns, delay_ns;
};

struct host_thread {
	int tid;
	bool worker;               /* named like the main thread: a pool worker (not io_uring's, not CUDA's) */
	uint64_t cpu_ns, delay_ns; /* the previous reading */
};

struct host {
	struct host_slot slots[WINDOW_SLOTS];
	unsigned cur;
	struct host_slot win;
	uint64_t last_ns;
	struct host_thread *threads; /* sorted by tid */
	size_t n_threads;
	bool unavailable;    /* no schedstat (kernel without CONFIG_SCHED_INFO): the rule stays silent */
	unsigned cpus;       /* CPUs feedd may run on (sched_getaffinity) */
	double load_avg;     /* the 1-minute load average at the last sample */
	unsigned runnable;   /* runnable tasks on the host at the last sample (/proc/loadavg) */
};

struct telemetry {
	struct conf_diagnosis conf;
	struct host host;
	struct telemetry_client *clients; /* attached, embedded in their owners */
	size_t n_clients;
	struct tfeed *feeds;
	unsigned threads;
	double pool_busy_pct; /* all feeds' job time over the window, per thread */
	uint64_t now;         /* the current tick's time */
	unsigned n_slots;     /* the current window geometry (window_geometry) */
	uint64_t step_ns;
	/* object storage: 429/503 answers and retries per tick (a ring), and over the window */
	uint64_t fetch_last_throttled, fetch_last_retries;
	uint64_t fetch_throttled[64], fetch_retries[64];
	unsigned fetch_i;
	uint64_t fetch_throttled_win, fetch_retries_win;
};

/* A client-written counter's progress since *prev (none if it went backwards), at most cap. */
static inline uint64_t delta(uint64_t *prev, uint64_t cur, uint64_t cap)
{
	uint64_t d = cur >= *prev ? cur - *prev : 0;
	*prev = cur;
	return d < cap ? d : cap;
}

/*
 * Sliding windows. Every reading is turned into a delta, added to the
 * current sub-window (slot) and to the running sums; window_add() does it for
 * n u64 fields. When window_next() says the current sub-window is complete it
 * moves on to the oldest, which the caller subtracts from the sums
 * (window_sub()) and clears for reuse.
 */
static inline void window_add(uint64_t *slot, uint64_t *sum, const uint64_t *d, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		slot[k] += d[k];
		sum[k] += d[k];
	}
}

static inline void window_sub(uint64_t *sum, const uint64_t *old, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		assert(sum[k] >= old[k]); /* a sub-window leaves the sums it was added to */
		sum[k] -= old[k];
	}
}

/*
 * Whether the sub-window *cur of this span is complete; if so advances *cur
 * to the slot to retire. Ticks come about a second apart but never exactly:
 * a sub-window closes within half a tick of its length, so one that falls a
 * little short does not wait a whole extra tick (which made a 60 s window
 * span up to 86 s).
 */
static inline bool window_next(const struct telemetry *tm, unsigned *cur, uint64_t span_ns)
{
	if (span_ns + NSEC_PER_SEC / 2 < tm->step_ns)
		return false;
	*cur = (*cur + 1) % tm->n_slots;
	return true;
}

/* host.c */
/* Once a second: samples the workers' CPU and run-queue time into the host window. */
void host_sample(struct telemetry *tm);
/* Frees what the host record holds. */
void host_done(struct host *h);
/* Of the workers' runnable time over the window, the share spent waiting for a CPU (0 when unknown). */
double telemetry_host_runqueue_pct(const struct telemetry *tm);

/*
 * All the worker time of a feed over its window: its batch jobs, plus for a
 * text feed the jobs that read and tokenize documents ahead of them (their
 * stages are not inside `job`; a Megatron feed reads inside its batch jobs).
 */
static inline uint64_t tfeed_worker_ns(const struct tfeed *t)
{
	const struct feed_stages *d = &t->win.d;
	uint64_t ns = d->s[STAGE_JOB].busy_ns;
	if (t->text)
		ns += d->s[STAGE_READ].busy_ns + d->s[STAGE_DECOMPRESS].busy_ns + d->s[STAGE_TOKENIZE].busy_ns;
	return ns;
}

/* The record of feed f, or NULL when f was not named at the last tick. */
struct tfeed *telemetry_find_feed(const struct telemetry *tm, const struct feed *f);

/* Re-runs every rule over the current windows (diagnosis.c). */
void diagnose_all(struct telemetry *tm);
/* The diagnosis of a feed that failed to load or went stale. */
void diagnose_failed_feed(const struct feed *f, struct diag *d);
