/* SPDX-License-Identifier: MIT */
/*
 * A test client: attaches through libfeed and prints one line per batch,
 * flushed at once so a test can SIGKILL it at any moment and still know the
 * last batch it consumed:
 *
 *   batch <index> <epoch> <fnv64 of input_ids|labels|position_ids> <cursor>
 *
 * Usage: stream-client SOCKET FEED RANK WORLD BATCHES [CURSOR|-] [SLEEP_MS] [HOLD]
 * HOLD=1 keeps every batch unreleased once the ring is full (a client that
 * stops consuming); the process then waits until killed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "feed/feed.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * UINT64_C(0x100000001b3);
	return h;
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: %s SOCKET FEED RANK WORLD BATCHES [CURSOR|-] [SLEEP_MS] [HOLD]\n", argv[0]);
		return 2;
	}
	const char *cursor = argc > 6 && strcmp(argv[6], "-") != 0 ? argv[6] : NULL;
	long sleep_ms = argc > 7 ? atol(argv[7]) : 0;
	int hold = argc > 8 ? atoi(argv[8]) : 0;
	long batches = atol(argv[5]);
	setvbuf(stdout, NULL, _IOLBF, 0);

	feed_client *c;
	char why[1024];
	int r = feed_client_connect_err(argv[1], why, sizeof(why), &c);
	if (r < 0) {
		fprintf(stderr, "connect: %s\n", why);
		return 1;
	}
	/* $STREAM_RECONNECT_MS: libfeed's reconnect_timeout; unset, libfeed's default (300 s, or $FEED_RECONNECT_TIMEOUT). */
	const char *rt = getenv("STREAM_RECONNECT_MS");
	if (rt)
		feed_client_set_reconnect_timeout(c, atoll(rt));
	r = feed_client_attach(c, argv[2], (uint32_t)atoi(argv[3]), (uint32_t)atoi(argv[4]), cursor);
	if (r < 0) {
		fprintf(stderr, "attach: %s\n", feed_client_error(c));
		feed_client_close(c);
		return 1;
	}
	printf("attached\n");
	unsigned n_held = 0; /* batches kept unreleased (HOLD) */
	for (long i = 0; i < batches; i++) {
		struct feed_batch b;
		r = feed_client_next(c, hold && n_held == feed_client_slots(c) ? 0 : 30000, &b);
		if (r < 0) {
			if (hold && r == -ENOBUFS) {
				printf("holding %u\n", n_held);
				for (;;)
					pause();
			}
			fprintf(stderr, "next: %d %s\n", r, feed_client_error(c));
			printf("error %d %s\n", r, feed_client_error(c));
			feed_client_close(c);
			return 1;
		}
		size_t n = (size_t)b.batch_size * b.seq_len * sizeof(int32_t);
		uint64_t h = UINT64_C(0xcbf29ce484222325);
		h = fnv(h, b.input_ids, n);
		h = fnv(h, b.labels, n);
		h = fnv(h, b.position_ids, n);
		printf("batch %" PRIu64 " %" PRIu64 " %016" PRIx64 " %s\n", b.index, b.epoch, h, b.cursor);
		if (hold)
			n_held++;
		else
			feed_client_release(c, &b);
		if (sleep_ms > 0)
			nanosleep(&(struct timespec){ .tv_sec = sleep_ms / 1000, .tv_nsec = sleep_ms % 1000 * 1000000 }, NULL);
	}
	printf("done\n");
	feed_client_close(c);
	return 0;
}
