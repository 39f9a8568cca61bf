/* SPDX-License-Identifier: MIT */
/*
 * The host as feedd's worker threads see it (telemetry-internal.h, struct
 * host): CPUs, load, and from /proc/self/task/TID/schedstat the CPU time the
 * workers got and the time they waited on a run queue, in a sliding window
 * like the feeds'. Main thread only.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/telemetry/telemetry-internal.h"
#include "proto/macro.h"

#define HOST_SLOT_FIELDS (sizeof(struct host_slot) / sizeof(uint64_t))
_Static_assert(sizeof(struct host_slot) % sizeof(uint64_t) == 0, "host_slot is all u64");

/* Reads a small /proc file into buf (NUL-terminated). Returns its length or a negative errno. */
static ssize_t read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, len - 1);
	int e = errno;
	close(fd);
	if (n < 0)
		return -e;
	buf[n] = 0;
	return n;
}

static int cmp_tid(const void *a, const void *b)
{
	int x = ((const struct host_thread *)a)->tid, y = ((const struct host_thread *)b)->tid;
	return (x > y) - (x < y);
}

/*
 * Once a second: the CPU time feedd's worker threads got and the time they
 * waited on a run queue (schedstat), differenced per thread, so threads that
 * come and go (a reload resizing the pool) add only what they did. Workers
 * are the threads named like the main thread other than the main thread:
 * io_uring's (iou-*) and CUDA's helpers rename themselves.
 */
void host_sample(struct telemetry *tm)
{
	struct host *h = &tm->host;
	uint64_t now = tm->now;
	char buf[256], path[64];
	uint64_t dt = h->last_ns && now > h->last_ns ? now - h->last_ns : 0;
	h->last_ns = now;

	cpu_set_t set;
	h->cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? (unsigned)CPU_COUNT(&set) : 0;
	if (h->cpus == 0)
		h->cpus = (unsigned)MAX(sysconf(_SC_NPROCESSORS_ONLN), 1L);
	unsigned running = 0;
	if (read_small("/proc/loadavg", buf, sizeof(buf)) > 0 && sscanf(buf, "%lf %*f %*f %u/", &h->load_avg, &running) >= 1)
		h->runnable = running;

	char comm[32] = "";
	if (read_small("/proc/self/comm", comm, sizeof(comm)) < 0 || h->unavailable)
		return;
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return;
	struct host_thread *now_threads = NULL;
	size_t n = 0, cap = 0;
	uint64_t cpu = 0, delay = 0;
	int self = getpid();
	for (struct dirent *e; (e = readdir(d));) {
		int tid = atoi(e->d_name);
		if (tid <= 0 || tid == self)
			continue;
		struct host_thread key = { .tid = tid }, *old = h->threads ?
			bsearch(&key, h->threads, h->n_threads, sizeof(key), cmp_tid) : NULL;
		bool worker;
		if (old) {
			worker = old->worker;
		} else {
			char c[32];
			snprintf(path, sizeof(path), "/proc/self/task/%d/comm", tid);
			if (read_small(path, c, sizeof(c)) < 0)
				continue;
			worker = strcmp(c, comm) == 0;
		}
		struct host_thread t = { .tid = tid, .worker = worker };
		if (worker) {
			unsigned long long on = 0, wait = 0;
			snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", tid);
			ssize_t r = read_small(path, buf, sizeof(buf));
			if (r == -ENOENT && !old) {
				/* No schedstat at all (CONFIG_SCHED_INFO off): say nothing rather than guess. */
				h->unavailable = true;
				break;
			}
			if (r < 0 || sscanf(buf, "%llu %llu", &on, &wait) != 2)
				continue;
			t.cpu_ns = on;
			t.delay_ns = wait;
			if (old) {
				cpu += on >= old->cpu_ns ? on - old->cpu_ns : 0;
				delay += wait >= old->delay_ns ? wait - old->delay_ns : 0;
			}
		}
		if (n == cap) {
			size_t ncap = cap ? 2 * cap : 16;
			struct host_thread *x = realloc(now_threads, ncap * sizeof(*x));
			if (!x)
				break;
			now_threads = x;
			cap = ncap;
		}
		now_threads[n++] = t;
	}
	closedir(d);
	if (n)
		qsort(now_threads, n, sizeof(*now_threads), cmp_tid);
	free(h->threads);
	h->threads = now_threads;
	h->n_threads = n;

	struct host_slot *sl = &h->slots[h->cur];
	struct host_slot add = { .span_ns = dt, .cpu_ns = cpu, .delay_ns = delay };
	window_add((uint64_t *)sl, (uint64_t *)&h->win, (const uint64_t *)&add, HOST_SLOT_FIELDS);
	if (!window_next(tm, &h->cur, sl->span_ns))
		return;
	struct host_slot *o = &h->slots[h->cur];
	window_sub((uint64_t *)&h->win, (const uint64_t *)o, HOST_SLOT_FIELDS);
	*o = (struct host_slot){ 0 };
}

void host_done(struct host *h)
{
	free(h->threads);
	h->threads = NULL;
	h->n_threads = 0;
}

double telemetry_host_runqueue_pct(const struct telemetry *tm)
{
	const struct host_slot *w = &tm->host.win;
	return w->delay_ns ? 100.0 * (double)w->delay_ns / (double)(w->delay_ns + w->cpu_ns) : 0.0;
}
