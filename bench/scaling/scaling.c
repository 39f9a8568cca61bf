/* SPDX-License-Identifier: MIT */
/*
 * Experiment 7's client: one trainer rank that takes and releases batches
 * back to back. It attaches, prints "ready", waits for a line on stdin (so
 * that every client of a run starts at the same moment), then takes BATCHES
 * batches and prints one JSON object: tokens, seconds, tokens/s, its own CPU
 * seconds.
 *
 * Usage: scaling SOCKET FEED RANK WORLD BATCHES
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "feed/feed.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_seconds(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
	       (double)ru.ru_stime.tv_usec / 1e6;
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: %s SOCKET FEED RANK WORLD BATCHES\n", argv[0]);
		return 2;
	}
	uint32_t rank = (uint32_t)atoi(argv[3]), world = (uint32_t)atoi(argv[4]);
	long n = atol(argv[5]);
	feed_client *c;
	int r = feed_client_connect(argv[1], &c);
	if (r < 0 || feed_client_attach(c, argv[2], rank, world, NULL) < 0) {
		fprintf(stderr, "scaling: %s\n", r < 0 ? feed_strerror(r) : feed_client_error(c));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		return 1;

	struct feed_batch b;
	uint64_t tokens = 0, sink = 0;
	double cpu0 = cpu_seconds(), t0 = now();
	for (long i = 0; i < n; i++) {
		if (feed_client_next(c, 60000, &b) < 0) {
			fprintf(stderr, "scaling: rank %" PRIu32 ": %s\n", rank, feed_client_error(c));
			return 1;
		}
		tokens += (uint64_t)b.batch_size * b.seq_len;
		/* Touch both ends of the batch, as a trainer's copy would. */
		sink += (uint64_t)b.input_ids[0] + (uint64_t)b.labels[b.batch_size * b.seq_len - 1];
		feed_client_release(c, &b);
	}
	double secs = now() - t0;
	printf("{\"rank\": %" PRIu32 ", \"tokens\": %" PRIu64 ", \"seconds\": %.6f, \"tokens_per_s\": %.1f, "
	       "\"cpu_s\": %.4f, \"sink\": %" PRIu64 "}\n",
	       rank, tokens, secs, (double)tokens / secs, cpu_seconds() - cpu0, sink);
	feed_client_close(c);
	return 0;
}
