/* SPDX-License-Identifier: MIT */
/*
 * An example trainer in C: attaches to a feed through libfeed, "trains" with a
 * simulated step time, and reports what a trainer cares about: tokens/s and
 * the share of wall time spent waiting for data.
 *
 * Nothing here deals with feedd restarting (a crash, `systemctl restart`, a
 * package upgrade): libfeed reconnects by itself and the step that met it
 * just waits longer (docs/operations.md). An error it returns is one that
 * did not go away: it says why, and the cursor printed resumes the run.
 *
 * Usage: train_c [--socket PATH] [--feed NAME] [--rank R --world W]
 *                [--steps N] [--step-ms MS] [--cursor C]
 */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "feed/feed.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Burns CPU like a real step would (a sleep would not compete for cores). */
static uint64_t fake_step(const struct feed_batch *b, double seconds)
{
	uint64_t acc = 0;
	double end = now_s() + seconds;
	size_t n = (size_t)b->batch_size * b->seq_len;
	do {
		for (size_t i = 0; i < n; i += 64)
			acc += (uint64_t)b->input_ids[i] * 31u + (uint64_t)b->labels[i];
	} while (now_s() < end);
	return acc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' }, { "feed", required_argument, NULL, 'f' },
		{ "rank", required_argument, NULL, 'r' },   { "world", required_argument, NULL, 'w' },
		{ "steps", required_argument, NULL, 'n' },  { "step-ms", required_argument, NULL, 't' },
		{ "cursor", required_argument, NULL, 'c' }, { 0 },
	};
	const char *sock = NULL, *feed = "demo", *cursor = NULL;
	unsigned rank = 0, world = 1;
	long steps = 200;
	double step_ms = 20;
	int opt;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 's': sock = optarg; break;
		case 'f': feed = optarg; break;
		case 'r': rank = (unsigned)atoi(optarg); break;
		case 'w': world = (unsigned)atoi(optarg); break;
		case 'n': steps = atol(optarg); break;
		case 't': step_ms = atof(optarg); break;
		case 'c': cursor = optarg; break;
		default: return 2;
		}
	}

	feed_client *c;
	int r = feed_client_connect(sock, &c);
	if (r < 0) {
		fprintf(stderr, "train_c: cannot reach feedd: %s\n", feed_strerror(r));
		return 1;
	}
	r = feed_client_attach(c, feed, rank, world, cursor);
	if (r < 0) {
		fprintf(stderr, "train_c: attach: %s\n", feed_client_error(c));
		feed_client_close(c);
		return 1;
	}

	double t0 = now_s(), waited = 0;
	uint64_t tokens = 0, sink = 0;
	for (long i = 0; i < steps; i++) {
		struct feed_batch b;
		double w0 = now_s();
		r = feed_client_next(c, 30000, &b);
		waited += now_s() - w0;
		if (r < 0) {
			fprintf(stderr, "train_c: step %ld: %s\n", i, feed_client_error(c));
			printf("resume with: --cursor %s\n", feed_client_cursor(c));
			feed_client_close(c);
			return 1;
		}
		sink += fake_step(&b, step_ms / 1000.0);
		tokens += (uint64_t)b.batch_size * b.seq_len;
		if ((i + 1) % 50 == 0 || i + 1 == steps) {
			double el = now_s() - t0;
			printf("step %5ld  batch %6llu  epoch %llu  %9.0f tokens/s  data wait %5.2f%%\n", i + 1,
			       (unsigned long long)b.index, (unsigned long long)b.epoch, (double)tokens / el,
			       100.0 * waited / el);
		}
		feed_client_release(c, &b);
	}
	double el = now_s() - t0;
	printf("done: %ld steps, %llu tokens in %.2f s = %.0f tokens/s, data wait %.2f%% of wall time\n", steps,
	       (unsigned long long)tokens, el, (double)tokens / el, 100.0 * waited / el);
	printf("resume with: --cursor %s\n", feed_client_cursor(c));
	feed_client_close(c);
	return sink == 42 ? 3 : 0; /* keep the fake work from being optimised away */
}
