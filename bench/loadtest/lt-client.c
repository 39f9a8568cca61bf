/* SPDX-License-Identifier: MIT */
/*
 * The load test's clients (bench/loadtest/run.py), many in one process so
 * that the machine measures feedd and not a thousand interpreters.
 *
 *   lt-client trainers SOCKET FEED CLIENTS SECONDS BATCHES STEP_MS
 *     CLIENTS threads; each attaches (rank i % 8 of 8) through libfeed,
 *     reads BATCHES batches with a STEP_MS simulated training step after
 *     each, closes and attaches again, until SECONDS have passed (a session
 *     then open stops at once). Prints
 *     "BATCHES_READ FAILED ATTACHES".
 *
 *   lt-client flood SOCKET SECONDS HOLD
 *     One thread opens connections as fast as connect() returns, never says
 *     HELLO, keeps the last HOLD open (closing the oldest) and retries at
 *     once on a refusal (EAGAIN from a full backlog, a reset from feedd's
 *     per-uid limit). Prints "OPENED REFUSED".
 *
 *   lt-client burn SECONDS PERCENT
 *     Spins PERCENT of each 10 ms on one core, touching no socket: the
 *     flooder's CPU without its connections, the control that tells what a
 *     flood costs a small machine from what it costs feedd. Prints "0 0".
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "feed/feed.h"

static const char *sock_path, *feed_name;
static long batches, step_ms;
static double deadline;
static atomic_long n_batches, n_failed, n_attaches;
static atomic_uint next_rank;
static atomic_int n_told; /* failures told on stderr: the first few of each process */

static void tell(const char *what, const char *why)
{
	if (atomic_fetch_add(&n_told, 1) < 5)
		fprintf(stderr, "lt-client: %s: %s\n", what, why);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *trainer(void *arg)
{
	(void)arg;
	while (now_s() < deadline) {
		unsigned rank = atomic_fetch_add(&next_rank, 1) % 8;
		atomic_fetch_add(&n_attaches, 1);
		feed_client *c;
		char why[256];
		if (feed_client_connect_err(sock_path, why, sizeof(why), &c) < 0) {
			tell("connect", why);
			atomic_fetch_add(&n_failed, 1);
			usleep(100000);
			continue;
		}
		if (feed_client_attach(c, feed_name, rank, 8, NULL) < 0) {
			tell("attach", feed_client_error(c));
			atomic_fetch_add(&n_failed, 1);
			feed_client_close(c);
			usleep(100000);
			continue;
		}
		/* Past the deadline a client stops mid-session too (bench/loadtest/cpu_cost.py reads without end). */
		for (long i = 0; i < batches && now_s() < deadline; i++) {
			struct feed_batch b;
			if (feed_client_next(c, 30000, &b) < 0) {
				tell("next", feed_client_error(c));
				atomic_fetch_add(&n_failed, 1);
				break;
			}
			feed_client_release(c, &b);
			atomic_fetch_add(&n_batches, 1);
			if (step_ms > 0)
				nanosleep(&(struct timespec){ .tv_sec = step_ms / 1000, .tv_nsec = step_ms % 1000 * 1000000 },
					  NULL);
		}
		feed_client_close(c);
	}
	return NULL;
}

static int flood(double seconds, long hold)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	int *held = calloc((size_t)hold, sizeof(int));
	if (!held)
		return 1;
	for (long i = 0; i < hold; i++)
		held[i] = -1;
	long opened = 0, refused = 0, at = 0;
	double end = now_s() + seconds;
	while (now_s() < end) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			return 1;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(fd);
			refused++;
			continue;
		}
		opened++;
		if (held[at] >= 0)
			close(held[at]);
		held[at] = fd;
		at = (at + 1) % hold;
	}
	printf("%ld %ld\n", opened, refused);
	return 0;
}

static int burn(double seconds, double percent)
{
	double end = now_s() + seconds, busy = percent / 100 * 0.010;
	volatile unsigned long spin = 0;
	while (now_s() < end) {
		double t = now_s();
		while (now_s() - t < busy)
			spin++;
		if (busy < 0.010)
			nanosleep(&(struct timespec){ .tv_nsec = (long)((0.010 - busy) * 1e9) }, NULL);
	}
	printf("0 0\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "burn") == 0)
		return burn(atof(argv[2]), atof(argv[3]));
	if (argc == 5 && strcmp(argv[1], "flood") == 0) {
		sock_path = argv[2];
		return flood(atof(argv[3]), atol(argv[4]) > 0 ? atol(argv[4]) : 1);
	}
	if (argc != 8 || strcmp(argv[1], "trainers") != 0) {
		fprintf(stderr, "usage: %s trainers SOCKET FEED CLIENTS SECONDS BATCHES STEP_MS\n"
				"       %s flood SOCKET SECONDS HOLD\n       %s burn SECONDS PERCENT\n", argv[0], argv[0], argv[0]);
		return 2;
	}
	sock_path = argv[2];
	feed_name = argv[3];
	long n = atol(argv[4]);
	deadline = now_s() + atof(argv[5]);
	batches = atol(argv[6]);
	step_ms = atol(argv[7]);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	pthread_t *t = calloc((size_t)n, sizeof(*t));
	if (!t)
		return 1;
	long started = 0;
	for (; started < n; started++)
		if (pthread_create(&t[started], &attr, trainer, NULL) != 0)
			break;
	for (long i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	printf("%ld %ld %ld\n", atomic_load(&n_batches), atomic_load(&n_failed) + (n - started), atomic_load(&n_attaches));
	return 0;
}
