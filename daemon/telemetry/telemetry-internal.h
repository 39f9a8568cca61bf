/* SPDX-License-Identifier: MIT */
/*
 * What telemetry.c (sampling, windows, JSON) and diagnosis.c (the rules)
 * share: the per-client and per-feed records and the module's state. Main
 * thread only.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/feed/stage.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/ring_abi.h"

#define WINDOW_SLOTS 60

struct diag {
	enum diag_severity severity;
	const char *kind;   /* "compute-bound", "starved", ... (docs/telemetry.md) */
	char cause[24];     /* the stage or reason a starved client or a feed is bound by, or "" */
	double stall_pct;   /* the client's (or the feed's worst client's) data wait share */
	double needed_x;    /* throughput factor that would end the wait, 0 if none */
	char text[384];
};

/* One sub-window of a client, or (with u64 buckets) the running window sums. */
struct client_slot {
	uint64_t span_ns, wait_ns, step_ns, h2d_ns, reports, batches, full_ns;
	uint32_t wait[FEED_HIST_BUCKETS], step[FEED_HIST_BUCKETS], h2d[FEED_HIST_BUCKETS];
};

struct client_sums {
	uint64_t span_ns, wait_ns, step_ns, h2d_ns, reports, batches, full_ns;
	uint64_t wait[FEED_HIST_BUCKETS], step[FEED_HIST_BUCKETS], h2d[FEED_HIST_BUCKETS];
};

/* One second of a client's history: totals within that second. 24 bytes. */
struct sample {
	float wait_ms, step_ms, h2d_ms, full_pct;
	uint32_t batches;
	uint16_t fill, held;
};

struct tclient {
	struct tclient *next;
	struct session *s;
	uint64_t last_ns;
	/* the previous readings, to difference against */
	uint64_t p_wait, p_step, p_h2d, p_reports, p_delivered, p_full;
	uint64_t p_hw[FEED_HIST_BUCKETS], p_hs[FEED_HIST_BUCKETS];
	uint64_t h2d_attach[FEED_HIST_BUCKETS]; /* per-second mean H2D times since attach */
	struct client_slot *slots;              /* WINDOW_SLOTS */
	unsigned cur;
	struct client_sums win;
	struct sample *hist; /* ring of hist_cap seconds */
	unsigned hist_cap, hist_head, hist_n;
	uint64_t fill, held; /* at the last sample */
	bool waiting;        /* blocked in next() on an empty ring at the last sample */
	struct diag diag;
	char straggler[192];
};

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

/* Of the workers' runnable time over the window, the share spent waiting for a CPU (0 when unknown). */
double telemetry_host_runqueue_pct(void);

struct telemetry {
	struct conf_diagnosis conf;
	struct host host;
	struct tclient *clients;
	struct tfeed *feeds;
	unsigned threads;
	double pool_busy_pct; /* all feeds' job time over the window, per thread */
};

extern struct telemetry tm;

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

struct tclient *telemetry_find_client(const struct session *s);
struct tfeed *telemetry_find_feed(const struct feed *f);
/* Value (ns) at quantile q of a histogram (bucket midpoint, nearest rank); NAN when empty. */
double telemetry_quantile(const uint64_t *h, double q);

/* Re-runs every rule over the current windows (diagnosis.c). */
void diagnose_all(void);
/* The diagnosis of a feed that failed to load or went stale. */
void diagnose_failed_feed(const struct feed *f, struct diag *d);
