/* SPDX-License-Identifier: MIT */
/*
 * An allocation tracer for feedd's RSS after clients left (docs/benchmarks.md,
 * "RSS after clients left"; bench/loadtest/rss_waves.py --trace), preloaded
 * with LD_PRELOAD: it records every live malloc'd block (address, size, a
 * sequence number, the thread, 8 frames of its call stack) in a table of its
 * own mmap'd memory, so that the heap it traces is laid out as without it.
 * SIGRTMIN+3 marks (remembers the sequence number), SIGRTMIN+4 dumps every
 * live block and /proc/self/maps to $HEAPTRACE_OUT.N (N counts the dumps):
 * the blocks made after the mark and still live after the clients left are
 * what pins the heap. Both act at the next allocation after the signal.
 */
#include <execinfo.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

/* The build hides symbols by default: these must interpose on libc's. */
#define EXPORT __attribute__((visibility("default")))

#define NF 8
#define CAP (1u << 22)
struct ent {
	void *p;
	size_t size;
	uint64_t seq;
	void *f[NF];
	int tid;
};
static struct ent *tab;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t seq, mark;
static volatile sig_atomic_t want_mark, want_dump;
static __thread int busy;
static int ready;

static size_t h(void *p)
{
	return (((uintptr_t)p >> 4) * 0x9e3779b97f4a7c15ull) >> 42;
}

static void dump(void)
{
	const char *out = getenv("HEAPTRACE_OUT");
	char name[256];
	static int n;
	snprintf(name, sizeof(name), "%s.%d", out ? out : "/tmp/heaptrace", n++);
	FILE *fp = fopen(name, "w");
	if (!fp)
		return;
	fprintf(fp, "mark %llu seq %llu\n", (unsigned long long)mark, (unsigned long long)seq);
	for (size_t i = 0; i < CAP; i++) {
		struct ent *e = &tab[i];
		if (!e->p || e->p == (void *)1)
			continue;
		fprintf(fp, "A %p %zu %llu %d", e->p, e->size, (unsigned long long)e->seq, e->tid);
		for (int k = 0; k < NF; k++)
			fprintf(fp, " %p", e->f[k]);
		fputc('\n', fp);
	}
	FILE *m = fopen("/proc/self/maps", "r");
	char line[512];
	while (m && fgets(line, sizeof(line), m))
		fprintf(fp, "M %s", line);
	if (m)
		fclose(m);
	fclose(fp);
}

static void check(void)
{
	if (want_mark) {
		want_mark = 0;
		mark = seq;
	}
	if (want_dump) {
		want_dump = 0;
		dump();
	}
}

static void add(void *p, size_t size)
{
	if (!p || !ready || busy)
		return;
	busy = 1;
	void *fr[NF + 2] = { 0 };
	int n = backtrace(fr, NF + 2);
	pthread_mutex_lock(&mu);
	check();
	size_t i = h(p);
	while (tab[i].p && tab[i].p != (void *)1 && tab[i].p != p)
		i = (i + 1) & (CAP - 1);
	tab[i].p = p;
	tab[i].size = size;
	tab[i].seq = ++seq;
	tab[i].tid = gettid();
	for (int k = 0; k < NF; k++)
		tab[i].f[k] = k + 2 < n ? fr[k + 2] : 0;
	pthread_mutex_unlock(&mu);
	busy = 0;
}

static void del(void *p)
{
	if (!p || !ready || busy)
		return;
	pthread_mutex_lock(&mu);
	size_t i = h(p);
	while (tab[i].p) {
		if (tab[i].p == p) {
			tab[i].p = (void *)1; /* tombstone */
			break;
		}
		i = (i + 1) & (CAP - 1);
	}
	pthread_mutex_unlock(&mu);
}

static void on_mark(int sig)
{
	(void)sig;
	want_mark = 1;
}
static void on_dump(int sig)
{
	(void)sig;
	want_dump = 1;
}

__attribute__((constructor)) static void init(void)
{
	tab = mmap(NULL, sizeof(struct ent) * CAP, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	void *fr[2];
	busy = 1;
	backtrace(fr, 2); /* loads libgcc_s now */
	busy = 0;
	signal(SIGRTMIN + 3, on_mark);
	signal(SIGRTMIN + 4, on_dump);
	ready = 1;
}

EXPORT void *malloc(size_t n)
{
	void *p = __libc_malloc(n);
	add(p, n);
	return p;
}
EXPORT void *calloc(size_t a, size_t b)
{
	void *p = __libc_calloc(a, b);
	add(p, a * b);
	return p;
}
EXPORT void *realloc(void *o, size_t n)
{
	void *p = __libc_realloc(o, n);
	if (p || !n) {
		del(o);
		add(p, n);
	}
	return p;
}
EXPORT void free(void *p)
{
	del(p);
	__libc_free(p);
}
EXPORT void *memalign(size_t a, size_t n)
{
	void *p = __libc_memalign(a, n);
	add(p, n);
	return p;
}
EXPORT void *aligned_alloc(size_t a, size_t n)
{
	return memalign(a, n);
}
EXPORT int posix_memalign(void **r, size_t a, size_t n)
{
	void *p = __libc_memalign(a, n);
	if (!p)
		return 12;
	add(p, n);
	*r = p;
	return 0;
}
EXPORT void *valloc(size_t n)
{
	return memalign(4096, n);
}
EXPORT void *pvalloc(size_t n)
{
	return memalign(4096, (n + 4095) & ~4095ul);
}
