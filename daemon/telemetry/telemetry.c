/* SPDX-License-Identifier: MIT */
/*
 * Sampling, sliding windows and the status JSON of telemetry.h; the rules
 * themselves are in diagnosis.c. Main thread only.
 *
 * Every per-second reading is turned into a delta against the previous one
 * and added to the current sub-window and to the running window sums; when a
 * sub-window is complete the oldest one is subtracted and reused. Values read
 * from a consumer page are the client's to write: a counter that goes
 * backwards counts as no progress, and deltas are clamped, so a lying client
 * only ever distorts its own figures.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/telemetry/telemetry-internal.h"
#include "proto/macro.h"

struct telemetry tm = { .conf = CONF_DIAGNOSIS_DEFAULTS };
/* Sub-window length and count for the configured window: at most WINDOW_SLOTS of whole seconds. */
static void window_geometry(unsigned *ret_slots, uint64_t *ret_step_ns)
{
	unsigned step_s = (tm.conf.window_s + WINDOW_SLOTS - 1) / WINDOW_SLOTS;
	step_s = MAX(step_s, 1u);
	*ret_slots = MIN((tm.conf.window_s + step_s - 1) / step_s, (unsigned)WINDOW_SLOTS);
	*ret_step_ns = (uint64_t)step_s * NSEC_PER_SEC;
}

/*
 * Whether a sub-window of this span is complete. Ticks come about a second
 * apart but never exactly: a sub-window closes within half a tick of its
 * length, so one that falls a little short does not wait a whole extra tick
 * (which made a 60 s window span up to 86 s).
 */
static bool subwindow_done(uint64_t span_ns, uint64_t step_ns)
{
	return span_ns + NSEC_PER_SEC / 2 >= step_ns;
}

void telemetry_configure(const struct conf_diagnosis *d)
{
	tm.conf = *d;
}

static uint64_t delta(uint64_t *prev, uint64_t cur, uint64_t cap)
{
	uint64_t d = cur >= *prev ? cur - *prev : 0;
	*prev = cur;
	return MIN(d, cap);
}

int telemetry_attach(struct session *s)
{
	struct tclient *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->slots = calloc(WINDOW_SLOTS, sizeof(*c->slots));
	c->hist_cap = tm.conf.history_s;
	c->hist = c->hist_cap ? calloc(c->hist_cap, sizeof(*c->hist)) : NULL;
	if (!c->slots || (c->hist_cap && !c->hist)) {
		free(c->slots);
		free(c->hist);
		free(c);
		return -ENOMEM;
	}
	c->s = s;
	c->last_ns = s->attach_ns;
	c->next = tm.clients;
	tm.clients = c;
	return 0;
}

void telemetry_detach(struct session *s)
{
	for (struct tclient **p = &tm.clients; *p; p = &(*p)->next) {
		if ((*p)->s != s)
			continue;
		struct tclient *c = *p;
		*p = c->next;
		free(c->slots);
		free(c->hist);
		free(c);
		return;
	}
}

struct tclient *telemetry_find_client(const struct session *s)
{
	for (struct tclient *c = tm.clients; c; c = c->next)
		if (c->s == s)
			return c;
	return NULL;
}

struct tfeed *telemetry_find_feed(const struct feed *f)
{
	for (struct tfeed *t = tm.feeds; t; t = t->next)
		if (t->f == f)
			return t;
	return NULL;
}

static void client_sample(struct tclient *c, uint64_t now, unsigned n_slots, uint64_t step_ns)
{
	struct session *s = c->s;
	const struct feed_consumer_page *cp = s->ring->cons;
	uint64_t dt = now > c->last_ns ? now - c->last_ns : 0;
	uint64_t age = now - s->attach_ns; /* nothing can have taken longer than the attachment */
	c->last_ns = now;

	uint64_t delivered = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), s->published);
	uint64_t full = s->full_ns_total + (s->full_since_ns ? now - s->full_since_ns : 0);
	struct client_slot d = {
		.span_ns = dt,
		.wait_ns = delta(&c->p_wait, __atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED), age),
		.step_ns = delta(&c->p_step, __atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED), age),
		.h2d_ns = delta(&c->p_h2d, __atomic_load_n(&cp->h2d_ns_total, __ATOMIC_RELAXED), age),
		.reports = delta(&c->p_reports, __atomic_load_n(&cp->reports, __ATOMIC_RELAXED), UINT32_MAX),
		.batches = delta(&c->p_delivered, delivered, UINT32_MAX),
		.full_ns = delta(&c->p_full, full, dt),
	};

	struct client_slot *cur = &c->slots[c->cur];
	cur->span_ns += d.span_ns;
	cur->wait_ns += d.wait_ns;
	cur->step_ns += d.step_ns;
	cur->h2d_ns += d.h2d_ns;
	cur->reports += d.reports;
	cur->batches += d.batches;
	cur->full_ns += d.full_ns;
	c->win.span_ns += d.span_ns;
	c->win.wait_ns += d.wait_ns;
	c->win.step_ns += d.step_ns;
	c->win.h2d_ns += d.h2d_ns;
	c->win.reports += d.reports;
	c->win.batches += d.batches;
	c->win.full_ns += d.full_ns;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		uint64_t w = delta(&c->p_hw[b], __atomic_load_n(&cp->hist_wait[b], __ATOMIC_RELAXED), UINT32_MAX);
		uint64_t st = delta(&c->p_hs[b], __atomic_load_n(&cp->hist_step[b], __ATOMIC_RELAXED), UINT32_MAX);
		cur->wait[b] = (uint32_t)MIN((uint64_t)cur->wait[b] + w, (uint64_t)UINT32_MAX);
		cur->step[b] = (uint32_t)MIN((uint64_t)cur->step[b] + st, (uint64_t)UINT32_MAX);
		c->win.wait[b] += w;
		c->win.step[b] += st;
	}
	/*
	 * The consumer page carries only the H2D total: each second's mean copy
	 * time goes into the histogram once per report of that second.
	 */
	if (d.reports && d.h2d_ns) {
		unsigned b = feed_hist_bucket(d.h2d_ns / d.reports);
		cur->h2d[b] = (uint32_t)MIN((uint64_t)cur->h2d[b] + d.reports, (uint64_t)UINT32_MAX);
		c->win.h2d[b] += d.reports;
		c->h2d_attach[b] += d.reports;
	}

	uint64_t tail = s->ring->tail;
	c->fill = s->published - MIN(tail, s->published);
	c->held = delivered - MIN(tail, delivered);
	c->waiting = __atomic_load_n(&cp->consumer_waiting, __ATOMIC_RELAXED) != 0 && c->fill == 0;

	if (c->hist_cap) {
		struct sample *h = &c->hist[(c->hist_head + c->hist_n) % c->hist_cap];
		if (c->hist_n == c->hist_cap)
			c->hist_head = (c->hist_head + 1) % c->hist_cap;
		else
			c->hist_n++;
		*h = (struct sample){
			.wait_ms = (float)((double)d.wait_ns / 1e6),
			.step_ms = (float)((double)d.step_ns / 1e6),
			.h2d_ms = (float)((double)d.h2d_ns / 1e6),
			.full_pct = dt ? (float)(100.0 * (double)d.full_ns / (double)dt) : 0.0f,
			.batches = (uint32_t)d.batches,
			.fill = (uint16_t)MIN(c->fill, (uint64_t)UINT16_MAX),
			.held = (uint16_t)MIN(c->held, (uint64_t)UINT16_MAX),
		};
	}

	/* Close the sub-window when complete: the oldest leaves the sums and is reused. */
	if (!subwindow_done(cur->span_ns, step_ns))
		return;
	c->cur = (c->cur + 1) % n_slots;
	struct client_slot *o = &c->slots[c->cur];
	c->win.span_ns -= o->span_ns;
	c->win.wait_ns -= o->wait_ns;
	c->win.step_ns -= o->step_ns;
	c->win.h2d_ns -= o->h2d_ns;
	c->win.reports -= o->reports;
	c->win.batches -= o->batches;
	c->win.full_ns -= o->full_ns;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		c->win.wait[b] -= o->wait[b];
		c->win.step[b] -= o->step[b];
		c->win.h2d[b] -= o->h2d[b];
	}
	memset(o, 0, sizeof(*o));
}

static void stages_read(const struct feed_stages *src, struct feed_stages *ret)
{
	for (unsigned i = 0; i < _STAGE_MAX; i++) {
		const struct stage *a = &src->s[i];
		ret->s[i] = (struct stage){
			.items = __atomic_load_n(&a->items, __ATOMIC_RELAXED),
			.bytes = __atomic_load_n(&a->bytes, __ATOMIC_RELAXED),
			.busy_ns = __atomic_load_n(&a->busy_ns, __ATOMIC_RELAXED),
			.offcpu_ns = __atomic_load_n(&a->offcpu_ns, __ATOMIC_RELAXED),
			.depth_sum = __atomic_load_n(&a->depth_sum, __ATOMIC_RELAXED),
			.depth_n = __atomic_load_n(&a->depth_n, __ATOMIC_RELAXED),
		};
	}
}

static void stages_add(struct feed_stages *a, const struct feed_stages *b, int sign)
{
	for (unsigned i = 0; i < _STAGE_MAX; i++) {
		uint64_t *x = &a->s[i].items;
		const uint64_t *y = &b->s[i].items;
		for (unsigned k = 0; k < sizeof(struct stage) / sizeof(uint64_t); k++)
			x[k] = sign > 0 ? x[k] + y[k] : x[k] - y[k];
	}
}

static void feed_sample(struct tfeed *t, const struct feed *f, uint64_t now, unsigned n_slots, uint64_t step_ns)
{
	uint64_t dt = now > t->last_ns ? now - t->last_ns : 0;
	t->last_ns = now;
	if (!f->stages)
		return;
	struct feed_stages cur, d;
	stages_read(f->stages, &cur);
	for (unsigned i = 0; i < _STAGE_MAX; i++) {
		uint64_t *p = &t->prev.s[i].items, *c = &cur.s[i].items, *o = &d.s[i].items;
		for (unsigned k = 0; k < sizeof(struct stage) / sizeof(uint64_t); k++)
			o[k] = delta(&p[k], c[k], UINT64_MAX / 4);
	}
	struct feed_slot *sl = &t->slots[t->cur];
	sl->span_ns += dt;
	stages_add(&sl->d, &d, 1);
	t->win.span_ns += dt;
	stages_add(&t->win.d, &d, 1);
	if (!subwindow_done(sl->span_ns, step_ns))
		return;
	t->cur = (t->cur + 1) % n_slots;
	struct feed_slot *o = &t->slots[t->cur];
	t->win.span_ns -= o->span_ns;
	stages_add(&t->win.d, &o->d, -1);
	memset(o, 0, sizeof(*o));
}

void telemetry_tick_begin(void)
{
	for (struct tfeed *t = tm.feeds; t; t = t->next)
		t->seen = false;
}

void telemetry_tick_feed(const struct feed *f)
{
	uint64_t now = now_ns();
	unsigned n_slots;
	uint64_t step_ns;
	window_geometry(&n_slots, &step_ns);
	struct tfeed *t = telemetry_find_feed(f);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return;
		t->f = f;
		t->last_ns = now;
		if (f->stages)
			stages_read(f->stages, &t->prev);
		t->next = tm.feeds;
		tm.feeds = t;
	} else {
		feed_sample(t, f, now, n_slots, step_ns);
	}
	t->seen = true;
	t->text = f->kind == FEED_TEXT;
}

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
static void host_sample(uint64_t now, unsigned n_slots, uint64_t step_ns)
{
	struct host *h = &tm.host;
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
	sl->span_ns += dt;
	sl->cpu_ns += cpu;
	sl->delay_ns += delay;
	h->win.span_ns += dt;
	h->win.cpu_ns += cpu;
	h->win.delay_ns += delay;
	if (!subwindow_done(sl->span_ns, step_ns))
		return;
	h->cur = (h->cur + 1) % n_slots;
	struct host_slot *o = &h->slots[h->cur];
	h->win.span_ns -= o->span_ns;
	h->win.cpu_ns -= o->cpu_ns;
	h->win.delay_ns -= o->delay_ns;
	*o = (struct host_slot){ 0 };
}

double telemetry_host_runqueue_pct(void)
{
	const struct host_slot *w = &tm.host.win;
	return w->delay_ns ? 100.0 * (double)w->delay_ns / (double)(w->delay_ns + w->cpu_ns) : 0.0;
}

void telemetry_tick_end(struct pool *pool)
{
	uint64_t now = now_ns();
	unsigned n_slots;
	uint64_t step_ns;
	window_geometry(&n_slots, &step_ns);
	/* Forget feeds no longer served (removed by a reload: they may be freed now). */
	for (struct tfeed **p = &tm.feeds; *p;) {
		struct tfeed *t = *p;
		if (t->seen) {
			p = &t->next;
			continue;
		}
		*p = t->next;
		free(t);
	}

	for (struct tclient *c = tm.clients; c; c = c->next)
		client_sample(c, now, n_slots, step_ns);
	host_sample(now, n_slots, step_ns);

	/* The pool is shared: its busy share over the window is every feed's job time together. */
	uint64_t job = 0, span = 0;
	for (struct tfeed *t = tm.feeds; t; t = t->next) {
		job += tfeed_worker_ns(t);
		span = MAX(span, t->win.span_ns);
	}
	tm.threads = pool ? pool_threads(pool) : 1;
	tm.pool_busy_pct = span ? MIN(100.0, 100.0 * (double)job / ((double)span * tm.threads)) : 0.0;

	diagnose_all();
}

/* A representative value of bucket b: its midpoint (exact below 4). */
static double bucket_mid(unsigned b)
{
	if (b < 4)
		return b;
	double lo = (double)feed_hist_lower(b);
	double hi = b + 1 < 252 ? (double)feed_hist_lower(b + 1) : lo;
	return (lo + hi) / 2;
}

double telemetry_quantile(const uint64_t *h, double q)
{
	uint64_t total = 0;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++)
		total += h[b];
	if (total == 0)
		return NAN;
	/* Nearest rank: the smallest value with at least q of the samples at or below it. */
	uint64_t k = (uint64_t)ceil(q * (double)total);
	k = MAX(k, (uint64_t)1);
	uint64_t acc = 0;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		acc += h[b];
		if (acc >= k)
			return bucket_mid(b);
	}
	return NAN;
}

static json_t *ms_or_null(double ns)
{
	return isnan(ns) ? json_null() : json_real(ns / 1e6);
}

/* {count, mean_ms, p50_ms, p95_ms, p99_ms, max_ms} of a histogram and its exact total. */
static json_t *dist_json(const uint64_t *h, uint64_t sum_ns)
{
	uint64_t n = 0;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++)
		n += h[b];
	json_t *o = json_object();
	json_object_set_new(o, "count", json_integer((json_int_t)n));
	json_object_set_new(o, "mean_ms", n ? json_real((double)sum_ns / (double)n / 1e6) : json_null());
	json_object_set_new(o, "p50_ms", ms_or_null(telemetry_quantile(h, 0.50)));
	json_object_set_new(o, "p95_ms", ms_or_null(telemetry_quantile(h, 0.95)));
	json_object_set_new(o, "p99_ms", ms_or_null(telemetry_quantile(h, 0.99)));
	json_object_set_new(o, "max_ms", ms_or_null(telemetry_quantile(h, 1.0)));
	return o;
}

static double pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static json_t *period_json(double span_s, uint64_t batches, uint64_t wait, uint64_t step, uint64_t h2d,
			   uint64_t reports, uint64_t full, const uint64_t *hw, const uint64_t *hs, const uint64_t *hh)
{
	uint64_t span_ns = (uint64_t)(span_s * 1e9);
	json_t *o = json_object();
	json_object_set_new(o, "span_s", json_real(span_s));
	json_object_set_new(o, "batches", json_integer((json_int_t)batches));
	json_object_set_new(o, "batches_per_s", json_real(span_s > 0 ? (double)batches / span_s : 0.0));
	json_object_set_new(o, "wait_s", json_real((double)wait / 1e9));
	json_object_set_new(o, "step_s", json_real((double)step / 1e9));
	json_object_set_new(o, "h2d_s", json_real((double)h2d / 1e9));
	json_object_set_new(o, "reports", json_integer((json_int_t)reports));
	json_object_set_new(o, "stall_pct", json_real(pct(wait, wait + step)));
	json_object_set_new(o, "h2d_pct_of_step", json_real(pct(h2d, step)));
	json_object_set_new(o, "ring_full_pct", json_real(MIN(100.0, pct(full, span_ns))));
	json_object_set_new(o, "ring_empty_pct", json_real(MIN(100.0, pct(wait, span_ns))));
	json_object_set_new(o, "wait", dist_json(hw, wait));
	json_object_set_new(o, "step", dist_json(hs, step));
	json_object_set_new(o, "h2d", dist_json(hh, h2d));
	return o;
}

json_t *telemetry_client_json(const struct session *s)
{
	const struct tclient *c = telemetry_find_client(s);
	if (!c)
		return NULL;
	const struct feed_consumer_page *cp = s->ring->cons;
	uint64_t hw[FEED_HIST_BUCKETS], hs[FEED_HIST_BUCKETS];
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		hw[b] = __atomic_load_n(&cp->hist_wait[b], __ATOMIC_RELAXED);
		hs[b] = __atomic_load_n(&cp->hist_step[b], __ATOMIC_RELAXED);
	}
	uint64_t now = now_ns();
	uint64_t full = s->full_ns_total + (s->full_since_ns ? now - s->full_since_ns : 0);
	uint64_t delivered = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), s->published);

	json_t *o = json_object();
	json_object_set_new(o, "window", period_json((double)c->win.span_ns / 1e9, c->win.batches, c->win.wait_ns,
						     c->win.step_ns, c->win.h2d_ns, c->win.reports, c->win.full_ns,
						     c->win.wait, c->win.step, c->win.h2d));
	json_object_set_new(o, "since_attach",
			    period_json((double)(now - s->attach_ns) / 1e9, delivered,
					__atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED),
					__atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED),
					__atomic_load_n(&cp->h2d_ns_total, __ATOMIC_RELAXED),
					__atomic_load_n(&cp->reports, __ATOMIC_RELAXED), full, hw, hs, c->h2d_attach));
	json_object_set_new(o, "ring_fill", json_integer((json_int_t)c->fill));
	json_object_set_new(o, "held", json_integer((json_int_t)c->held));

	/* Per-second samples, oldest first: totals within each second. */
	json_t *h = json_object(), *a[7];
	static const char *const keys[7] = { "wait_ms", "step_ms", "h2d_ms", "batches", "ring_full_pct", "ring_fill", "held" };
	for (unsigned k = 0; k < 7; k++)
		a[k] = json_array();
	for (unsigned i = 0; i < c->hist_n; i++) {
		const struct sample *x = &c->hist[(c->hist_head + i) % c->hist_cap];
		json_array_append_new(a[0], json_real(round(x->wait_ms * 1000.0) / 1000.0));
		json_array_append_new(a[1], json_real(round(x->step_ms * 1000.0) / 1000.0));
		json_array_append_new(a[2], json_real(round(x->h2d_ms * 1000.0) / 1000.0));
		json_array_append_new(a[3], json_integer(x->batches));
		json_array_append_new(a[4], json_real(round(x->full_pct * 10.0) / 10.0));
		json_array_append_new(a[5], json_integer(x->fill));
		json_array_append_new(a[6], json_integer(x->held));
	}
	json_object_set_new(h, "interval_s", json_integer(1));
	for (unsigned k = 0; k < 7; k++)
		json_object_set_new(h, keys[k], a[k]);
	json_object_set_new(o, "history", h);
	return o;
}

static json_t *diag_json(const struct diag *d)
{
	json_t *o = json_object();
	json_object_set_new(o, "kind", json_string(d->kind ? d->kind : "warming-up"));
	json_object_set_new(o, "severity", json_integer(d->severity));
	json_object_set_new(o, "text", json_string(d->text));
	json_object_set_new(o, "cause", d->cause[0] ? json_string(d->cause) : json_null());
	json_object_set_new(o, "needed_x", d->needed_x > 0 && isfinite(d->needed_x) ? json_real(d->needed_x) : json_null());
	return o;
}

json_t *telemetry_client_diagnosis_json(const struct session *s)
{
	const struct tclient *c = telemetry_find_client(s);
	if (!c)
		return NULL;
	json_t *o = diag_json(&c->diag);
	json_object_set_new(o, "straggler", c->straggler[0] ? json_string(c->straggler) : json_null());
	return o;
}

json_t *telemetry_feed_diagnosis_json(const struct feed *f)
{
	const struct tfeed *t = telemetry_find_feed(f);
	if (!t) {
		struct diag d = { .kind = "warming-up", .text = "warming-up: no telemetry yet" };
		if (f->state != FEED_READY)
			diagnose_failed_feed(f, &d);
		return diag_json(&d);
	}
	json_t *o = diag_json(&t->diag);
	json_t *a = json_array();
	for (const struct tclient *c = tm.clients; c; c = c->next)
		if (c->s->feed == f && c->straggler[0])
			json_array_append_new(a, json_pack("{s:i, s:i, s:s}", "rank", (int)c->s->rank, "world",
							   (int)c->s->world, "text", c->straggler));
	json_object_set_new(o, "stragglers", a);
	return o;
}

json_t *telemetry_feed_stages_json(const struct feed *f)
{
	const struct tfeed *t = telemetry_find_feed(f);
	json_t *o = json_object();
	double span = t ? (double)t->win.span_ns / 1e9 : 0.0;
	json_object_set_new(o, "window_s", json_real(span));
	json_object_set_new(o, "threads", json_integer(tm.threads));
	/* All the feed's worker time (batch jobs, and a text feed's read-and-tokenize jobs), per batch produced. */
	uint64_t wns = t ? tfeed_worker_ns(t) : 0, batches = t ? t->win.d.s[STAGE_JOB].items : 0;
	json_object_set_new(o, "workers", json_pack("{s:f, s:o}", "busy_threads", span > 0 ? (double)wns / 1e9 / span : 0.0,
						    "ms_per_batch", batches ? json_real((double)wns / 1e6 / (double)batches) : json_null()));
	for (unsigned i = 0; i < _STAGE_MAX; i++) {
		const struct stage *w = t ? &t->win.d.s[i] : &(struct stage){ 0 };
		json_t *s = json_object();
		json_object_set_new(s, "items_per_s", json_real(span > 0 ? (double)w->items / span : 0.0));
		json_object_set_new(s, "mb_per_s", json_real(span > 0 ? (double)w->bytes / 1e6 / span : 0.0));
		/* Thread-seconds per second: 1.0 = one thread busy all the time. */
		json_object_set_new(s, "busy_threads", json_real(span > 0 ? (double)w->busy_ns / 1e9 / span : 0.0));
		json_object_set_new(s, "busy_ms_per_item",
				    w->items ? json_real((double)w->busy_ns / 1e6 / (double)w->items) : json_null());
		json_object_set_new(s, "offcpu_pct", json_real(pct(w->offcpu_ns, w->busy_ns)));
		if (i == STAGE_READ)
			json_object_set_new(s, "queue_depth",
					    json_real(w->depth_n ? (double)w->depth_sum / (double)w->depth_n : 0.0));
		if (f->stages) {
			const struct stage *a = &f->stages->s[i];
			json_object_set_new(s, "total_bytes", json_integer((json_int_t)__atomic_load_n(&a->bytes, __ATOMIC_RELAXED)));
			json_object_set_new(s, "total_items", json_integer((json_int_t)__atomic_load_n(&a->items, __ATOMIC_RELAXED)));
		}
		json_object_set_new(o, stage_name(i), s);
	}
	return o;
}

json_t *telemetry_daemon_json(void)
{
	char line[512];
	int sev = telemetry_worst(line, sizeof(line));
	const struct conf_diagnosis *d = &tm.conf;
	json_t *th = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "min_batches", (int)d->min_batches,
			       "starved_pct", d->starved_pct, "busy_pct", d->busy_pct, "storage_pct", d->storage_pct,
			       "host_pct", d->host_pct, "full_pct", d->full_pct, "held_pct", d->held_pct, "h2d_pct",
			       d->h2d_pct, "straggler_pct", d->straggler_pct, "straggler_min_ms", d->straggler_min_ms);
	const struct host *h = &tm.host;
	double span = (double)h->win.span_ns / 1e9;
	json_t *host = json_pack("{s:i, s:f, s:i, s:o, s:o}", "cpus", (int)h->cpus, "load_avg", h->load_avg, "runnable",
				 (int)h->runnable, "workers_cpu_per_s",
				 h->unavailable || span <= 0 ? json_null() : json_real((double)h->win.cpu_ns / 1e9 / span),
				 "runqueue_pct", h->unavailable ? json_null() : json_real(telemetry_host_runqueue_pct()));
	return json_pack("{s:i, s:i, s:o, s:f, s:o, s:{s:i, s:s}}", "window_s", (int)d->window_s, "history_s",
			 (int)d->history_s, "thresholds", th, "pool_busy_pct", tm.pool_busy_pct, "host", host, "worst",
			 "severity", sev, "text", line);
}
