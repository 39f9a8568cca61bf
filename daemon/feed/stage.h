/* SPDX-License-Identifier: MIT */
/*
 * Per-feed, per-stage counters: where a feed's worker time goes. Workers bump
 * them with relaxed atomic adds, once per stage per batch (never per token),
 * so keeping them on costs a handful of uncontended atomics per batch
 * (docs/telemetry.md measures it). The main thread reads them once a second
 * and turns differences into rates over a sliding window (telemetry.c).
 *
 * A stage counts the batches (or documents) through it, the bytes it
 * handled, the wall time threads spent in it, and of that the time off the
 * CPU (blocked on storage, for the read stage). Which bytes a stage counts:
 *   read:       bytes read from shards (.bin, or compressed input)
 *   decompress: bytes of decompressed output
 *   tokenize:   bytes of text tokenized
 *   pack:       bytes of tokens written into ring slots (int32)
 *   h2d:        bytes copied to device memory
 *   job:        a whole batch job, end to end (its ns cover every stage and
 *               what no stage claims); bytes = the batch's tokens (int32)
 * The read stage also counts io_uring queue depth samples (one per
 * submission: requests in flight), for the mean depth.
 *
 * The feed owns its counters (struct feed_stages, feed->stages; a mixture's
 * sources borrow their mixture's); they live as long as the feed. Telemetry
 * (daemon/telemetry) only reads them, so feed/ does not depend on it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "proto/macro.h"

struct stage {
	uint64_t items;     /* batches or documents through the stage */
	uint64_t bytes;     /* bytes handled, as listed above */
	uint64_t busy_ns;   /* thread wall time in the stage */
	uint64_t offcpu_ns; /* of busy_ns, time the thread was off the CPU (waiting) */
	uint64_t depth_sum; /* read: sum of requests in flight over submissions */
	uint64_t depth_n;   /* read: submissions sampled */
};

enum stage_id {
	STAGE_READ,
	STAGE_DECOMPRESS,
	STAGE_TOKENIZE,
	STAGE_PACK,
	STAGE_H2D,
	STAGE_JOB,
	_STAGE_MAX,
};

/* By name in the workers (f->stages->read), by index in the telemetry loops (s[STAGE_READ]). */
struct feed_stages {
	union {
		struct {
			struct stage read, decompress, tokenize, pack, h2d, job;
		};
		struct stage s[_STAGE_MAX];
	};
};
_Static_assert(__builtin_offsetof(struct feed_stages, job) == STAGE_JOB * sizeof(struct stage), "stage order");

/* Names as they appear in status JSON and diagnoses ("read", "tokenize", ...). */
const char *stage_name(enum stage_id id);

/* Adds one item of `bytes` that took `ns` of a worker's time (any thread). */
static inline void stage_add(struct stage *s, uint64_t bytes, uint64_t ns)
{
	__atomic_fetch_add(&s->items, 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->bytes, bytes, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->busy_ns, ns, __ATOMIC_RELAXED);
}

/* As stage_add, plus off-CPU time and queue-depth samples (the read stage). */
static inline void stage_add_io(struct stage *s, uint64_t bytes, uint64_t ns, uint64_t offcpu_ns, uint64_t depth_sum,
				uint64_t depth_n)
{
	stage_add(s, bytes, ns);
	__atomic_fetch_add(&s->offcpu_ns, offcpu_ns, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->depth_sum, depth_sum, __ATOMIC_RELAXED);
	__atomic_fetch_add(&s->depth_n, depth_n, __ATOMIC_RELAXED);
}

/* This thread's CPU time in ns: with a wall clock around a stage, gives its off-CPU time. */
static inline uint64_t stage_thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Whether stages are timed at all ([diagnosis] stage_counters, default on;
 * off exists to measure what they cost). A process-wide measurement switch,
 * set by the server from the config (stage.c); workers read it once per stage.
 */
void stage_timing_set(bool on);
bool stage_timing_on(void);

/* A stage's start, taken by stage_begin() and consumed by stage_end*(). */
struct stage_clock {
	uint64_t wall, cpu;
};

static inline void stage_begin(struct stage_clock *c, bool with_cpu)
{
	if (!stage_timing_on()) {
		c->wall = 0;
		return;
	}
	c->wall = now_ns();
	c->cpu = with_cpu ? stage_thread_cpu_ns() : 0;
}

/* Counts one item of `bytes` through s, timed since stage_begin(c). */
static inline void stage_end(struct stage *s, const struct stage_clock *c, uint64_t bytes)
{
	if (c->wall)
		stage_add(s, bytes, now_ns() - c->wall);
}

/* As stage_end, for a stage begun with_cpu: also off-CPU time and queue-depth samples. */
static inline void stage_end_io(struct stage *s, const struct stage_clock *c, uint64_t bytes, uint64_t depth_sum,
				uint64_t depth_n)
{
	if (!c->wall)
		return;
	uint64_t wall = now_ns() - c->wall, cpu = stage_thread_cpu_ns() - c->cpu;
	stage_add_io(s, bytes, wall, wall > cpu ? wall - cpu : 0, depth_sum, depth_n);
}
