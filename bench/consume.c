/* SPDX-License-Identifier: MIT */
/*
 * Benchmark client: how fast does one client receive batches, and what does
 * feed_client_next() cost when a batch is already waiting?
 *
 * Phase 1 (throughput): take and release N batches back to back; tokens/s.
 * Phase 2 (latency): M times, wait until the daemon has refilled the ring,
 * then time one next() and, separately, its release(); p50/p99/max in ns.
 *
 * Usage: consume SOCKET FEED BATCHES SAMPLES PAUSE_MS   (prints one JSON object)
 *
 * PAUSE_MS is the idle time before each timed next(), like a training step:
 * after 20 ms the caches and TLB are cold, after 1 ms they are warm.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "feed/feed.h"

static uint64_t ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s SOCKET FEED BATCHES SAMPLES PAUSE_MS\n", argv[0]);
		return 2;
	}
	long n = atol(argv[3]), m = atol(argv[4]);
	feed_client *c;
	int r = feed_client_connect(argv[1], &c);
	if (r < 0 || feed_client_attach(c, argv[2], 0, 1, NULL) < 0) {
		fprintf(stderr, "consume: %s\n", r < 0 ? feed_strerror(r) : feed_client_error(c));
		return 1;
	}
	struct feed_batch b;
	uint64_t tokens = 0, sink = 0;
	uint64_t t0 = ns();
	for (long i = 0; i < n; i++) {
		if (feed_client_next(c, 60000, &b) < 0) {
			fprintf(stderr, "consume: %s\n", feed_client_error(c));
			return 1;
		}
		tokens += (uint64_t)b.batch_size * b.seq_len;
		sink += (uint64_t)b.input_ids[0] + (uint64_t)b.labels[b.batch_size * b.seq_len - 1];
		feed_client_release(c, &b);
	}
	double secs = (double)(ns() - t0) / 1e9;

	uint64_t *lat = calloc((size_t)m, sizeof(*lat)), *rel = calloc((size_t)m, sizeof(*rel));
	long pause_ms = atol(argv[5]);
	struct timespec pause = { .tv_sec = pause_ms / 1000, .tv_nsec = pause_ms % 1000 * 1000000 };
	for (long i = 0; i < m; i++) {
		nanosleep(&pause, NULL);
		uint64_t a = ns();
		r = feed_client_next(c, 60000, &b);
		uint64_t z = ns();
		if (r < 0)
			return 1;
		feed_client_release(c, &b);
		lat[i] = z - a;
		rel[i] = ns() - z;
		sink += (uint64_t)b.input_ids[0];
	}
	qsort(lat, (size_t)m, sizeof(*lat), cmp);
	qsort(rel, (size_t)m, sizeof(*rel), cmp);
	printf("{\"batches\": %ld, \"seconds\": %.4f, \"tokens_per_s\": %.1f, \"next_p50_ns\": %llu, "
	       "\"next_p99_ns\": %llu, \"next_max_ns\": %llu, \"release_p50_ns\": %llu, \"release_p99_ns\": %llu, "
	       "\"sink\": %llu}\n",
	       n, secs, (double)tokens / secs, (unsigned long long)lat[m / 2], (unsigned long long)lat[m * 99 / 100],
	       (unsigned long long)lat[m - 1], (unsigned long long)rel[m / 2], (unsigned long long)rel[m * 99 / 100],
	       (unsigned long long)sink);
	free(lat);
	free(rel);
	feed_client_close(c);
	return 0;
}
