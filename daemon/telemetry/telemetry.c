/* SPDX-License-Identifier: MIT */
/*
 * The telemetry object (telemetry.h): attached clients, the feeds named at
 * each tick, and sampling both into sliding windows. The rules are in
 * diagnosis.c, the host in host.c, the JSON in telemetry-json.c. Main thread
 * only.
 *
 * Every per-second reading is turned into a delta against the previous one
 * and added to the current sub-window and to the running window sums; when a
 * sub-window is complete the oldest one is subtracted and reused. Values read
 * from a consumer page are the client's to write: a counter that goes
 * backwards counts as no progress, and deltas are clamped, so a lying client
 * only ever distorts its own figures.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/telemetry/telemetry-internal.h"
#include "daemon/source/remote.h"
#include "proto/macro.h"

/* Sub-window length and count for the configured window: at most WINDOW_SLOTS of whole seconds. */
static void window_geometry(struct telemetry *tm)
{
	unsigned step_s = (tm->conf.window_s + WINDOW_SLOTS - 1) / WINDOW_SLOTS;
	step_s = MAX(step_s, 1u);
	tm->n_slots = MIN((tm->conf.window_s + step_s - 1) / step_s, (unsigned)WINDOW_SLOTS);
	tm->n_slots = MAX(tm->n_slots, 1u);
	tm->step_ns = (uint64_t)step_s * NSEC_PER_SEC;
}

int telemetry_new(const struct conf_diagnosis *d, struct telemetry **ret)
{
	struct telemetry *tm = calloc(1, sizeof(*tm));
	if (!tm)
		return -ENOMEM;
	telemetry_configure(tm, d);
	*ret = tm;
	return 0;
}

struct telemetry *telemetry_free(struct telemetry *tm)
{
	if (!tm)
		return NULL;
	/* Clients live in their owners: every owner must have detached before. */
	assert(!tm->clients && tm->n_clients == 0);
	for (struct tfeed *t = tm->feeds, *next; t; t = next) {
		next = t->next;
		free(t);
	}
	host_done(&tm->host);
	free(tm);
	return NULL;
}

void telemetry_configure(struct telemetry *tm, const struct conf_diagnosis *d)
{
	tm->conf = *d;
	window_geometry(tm);
}

int telemetry_client_attach(struct telemetry *tm, struct telemetry_client *c, const struct feed *f, unsigned rank,
			    unsigned world, unsigned slot_count, uint64_t attach_ns)
{
	assert(!c->tm); /* attach and detach pair */
	*c = (struct telemetry_client){
		.feed = f,
		.rank = rank,
		.world = world,
		.slot_count = slot_count,
		.attach_ns = attach_ns,
		.last_ns = attach_ns,
		.hist_cap = tm->conf.history_s,
	};
	c->d = calloc(1, sizeof(*c->d));
	c->hist = c->hist_cap ? calloc(c->hist_cap, sizeof(*c->hist)) : NULL;
	if (!c->d || (c->hist_cap && !c->hist)) {
		free(c->d);
		free(c->hist);
		*c = (struct telemetry_client){ 0 };
		return -ENOMEM;
	}
	c->tm = tm;
	c->next = tm->clients;
	if (c->next)
		c->next->prev = c;
	tm->clients = c;
	tm->n_clients++;
	return 0;
}

void telemetry_client_detach(struct telemetry_client *c)
{
	struct telemetry *tm = c->tm;
	if (!tm)
		return;
	assert(tm->n_clients > 0);
	if (c->prev)
		c->prev->next = c->next;
	else
		tm->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	tm->n_clients--;
	free(c->d);
	free(c->hist);
	*c = (struct telemetry_client){ 0 };
}

struct tfeed *telemetry_find_feed(const struct telemetry *tm, const struct feed *f)
{
	for (struct tfeed *t = tm->feeds; t; t = t->next)
		if (t->f == f)
			return t;
	return NULL;
}

/* Whether /proc/PID/stat says the process is stopped ('T', or 't' traced); false when unreadable. */
static bool pid_stopped(int pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	if (n <= 0)
		return false;
	buf[n] = 0;
	/* "PID (comm) S ...": comm may hold spaces and parentheses; the state follows the last ')'. */
	const char *e = strrchr(buf, ')');
	return e && e[1] == ' ' && (e[2] == 'T' || e[2] == 't');
}

void telemetry_client_sample(struct telemetry_client *c, const struct telemetry_reading *r)
{
	struct telemetry *tm = c->tm;
	if (!tm)
		return;
	uint64_t now = tm->now;
	const struct ring_consumer *rc = &r->cons;
	uint64_t dt = now > c->last_ns ? now - c->last_ns : 0;
	uint64_t age = now - c->attach_ns; /* nothing can have taken longer than the attachment */
	c->last_ns = now;
	c->failed = r->failed;

	struct client_slot d = {
		.span_ns = dt,
		.wait_ns = delta(&c->p_wait, rc->wait_ns, age),
		.step_ns = delta(&c->p_step, rc->step_ns, age),
		.h2d_ns = delta(&c->p_h2d, rc->h2d_ns, age),
		.reports = delta(&c->p_reports, rc->reports, UINT32_MAX),
		.batches = delta(&c->p_delivered, rc->delivered, UINT32_MAX),
		.full_ns = delta(&c->p_full, r->full_ns, dt),
		.published = delta(&c->p_published, r->published, UINT32_MAX),
	};
	/*
	 * A client frozen by SIGSTOP (or a debugger) moves nothing on its page;
	 * neither does one that is merely idle or blocked. The kernel tells them
	 * apart: only when the page did not move is /proc/PID/stat read.
	 *
	 * The wait or step a client was in when it was stopped ends, and is
	 * counted by libfeed, only after it resumes: that time was a stop, not a
	 * wait or a computation, and would make it look starved for a window.
	 */
	if (c->stopped)
		d.wait_ns = d.step_ns = d.h2d_ns = 0;
	uint64_t released = delta(&c->p_tail, rc->tail, UINT64_MAX);
	if (d.wait_ns || d.step_ns || d.batches || released || d.reports || c->progress_ns == 0)
		c->progress_ns = now;
	c->stopped = now - c->progress_ns >= NSEC_PER_SEC / 2 && r->pid > 0 && pid_stopped(r->pid);
	c->d->attach_wait_ns += d.wait_ns;
	c->d->attach_step_ns += d.step_ns;
	c->d->attach_h2d_ns += d.h2d_ns;
	c->d->attach_reports += d.reports;
	struct client_slot *cur = &c->d->slots[c->cur];
	window_add(cur->v, c->d->win.v, d.v, CLIENT_SCALARS);
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		uint64_t w = delta(&c->d->p_hw[b], rc->hist_wait[b], UINT32_MAX);
		uint64_t st = delta(&c->d->p_hs[b], rc->hist_step[b], UINT32_MAX);
		cur->wait[b] = (uint32_t)MIN((uint64_t)cur->wait[b] + w, (uint64_t)UINT32_MAX);
		cur->step[b] = (uint32_t)MIN((uint64_t)cur->step[b] + st, (uint64_t)UINT32_MAX);
		c->d->win.wait[b] += w;
		c->d->win.step[b] += st;
		c->d->attach_wait[b] += w;
		c->d->attach_step[b] += st;
	}
	/*
	 * The consumer page carries only the H2D total: each second's mean copy
	 * time goes into the histogram once per report of that second.
	 */
	if (d.reports && d.h2d_ns) {
		unsigned b = feed_hist_bucket(d.h2d_ns / d.reports);
		cur->h2d[b] = (uint32_t)MIN((uint64_t)cur->h2d[b] + d.reports, (uint64_t)UINT32_MAX);
		c->d->win.h2d[b] += d.reports;
		c->d->h2d_attach[b] += d.reports;
	}

	c->fill = r->published - MIN(r->tail, r->published);
	c->held = rc->delivered - MIN(r->tail, rc->delivered);
	c->waiting = rc->waiting && c->fill == 0;

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

	if (!window_next(tm, &c->cur, cur->span_ns))
		return;
	struct client_slot *o = &c->d->slots[c->cur];
	window_sub(c->d->win.v, o->v, CLIENT_SCALARS);
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		c->d->win.wait[b] -= o->wait[b];
		c->d->win.step[b] -= o->step[b];
		c->d->win.h2d[b] -= o->h2d[b];
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

/* A feed slot as u64 fields: its span, then every stage's counters. */
#define FEED_SLOT_FIELDS (sizeof(struct feed_slot) / sizeof(uint64_t))
_Static_assert(sizeof(struct feed_slot) % sizeof(uint64_t) == 0, "feed_slot is all u64");

static void feed_sample(struct telemetry *tm, struct tfeed *t, const struct feed *f)
{
	uint64_t now = tm->now;
	uint64_t dt = now > t->last_ns ? now - t->last_ns : 0;
	t->last_ns = now;
	if (!f->stages)
		return;
	struct feed_stages cur;
	struct feed_slot d = { .span_ns = dt };
	stages_read(f->stages, &cur);
	uint64_t *p = &t->prev.s[0].items, *c = &cur.s[0].items, *o = &d.d.s[0].items;
	for (unsigned k = 0; k < sizeof(struct feed_stages) / sizeof(uint64_t); k++)
		o[k] = delta(&p[k], c[k], UINT64_MAX / 4);
	struct feed_slot *sl = &t->slots[t->cur];
	window_add((uint64_t *)sl, (uint64_t *)&t->win, (const uint64_t *)&d, FEED_SLOT_FIELDS);
	if (!window_next(tm, &t->cur, sl->span_ns))
		return;
	struct feed_slot *old = &t->slots[t->cur];
	window_sub((uint64_t *)&t->win, (const uint64_t *)old, FEED_SLOT_FIELDS);
	memset(old, 0, sizeof(*old));
}

uint64_t telemetry_tick_begin(struct telemetry *tm)
{
	tm->now = now_ns();
	for (struct tfeed *t = tm->feeds; t; t = t->next)
		t->seen = false;
	return tm->now;
}

void telemetry_tick_feed(struct telemetry *tm, const struct feed *f)
{
	struct tfeed *t = telemetry_find_feed(tm, f);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return;
		t->f = f;
		t->last_ns = tm->now;
		if (f->stages)
			stages_read(f->stages, &t->prev);
		t->next = tm->feeds;
		tm->feeds = t;
	} else {
		feed_sample(tm, t, f);
	}
	t->seen = true;
	t->text = f->kind == FEED_TEXT;
}

/* The object store's throttling over the last window's ticks (at most 64). */
static void fetch_sample(struct telemetry *tm)
{
	struct remote_stats f;
	remote_stats(&f);
	unsigned n = MIN(MAX(tm->n_slots, 1u), (unsigned)ARRAY_SIZE(tm->fetch_throttled));
	tm->fetch_i = (tm->fetch_i + 1) % n;
	tm->fetch_throttled[tm->fetch_i] = f.throttled - MIN(f.throttled, tm->fetch_last_throttled);
	tm->fetch_retries[tm->fetch_i] = f.retries - MIN(f.retries, tm->fetch_last_retries);
	tm->fetch_last_throttled = f.throttled;
	tm->fetch_last_retries = f.retries;
	tm->fetch_throttled_win = tm->fetch_retries_win = 0;
	for (unsigned i = 0; i < n; i++) {
		tm->fetch_throttled_win += tm->fetch_throttled[i];
		tm->fetch_retries_win += tm->fetch_retries[i];
	}
}

void telemetry_feed_forget(struct telemetry *tm, const struct feed *f)
{
	for (struct tfeed **p = &tm->feeds; *p; p = &(*p)->next) {
		if ((*p)->f != f)
			continue;
		struct tfeed *t = *p;
		*p = t->next;
		free(t);
		return;
	}
}

void telemetry_tick_end(struct telemetry *tm, struct pool *pool)
{
	/* Forget feeds no longer served (removed by a reload: they may be freed now). */
	for (struct tfeed **p = &tm->feeds; *p;) {
		struct tfeed *t = *p;
		if (t->seen) {
			p = &t->next;
			continue;
		}
		*p = t->next;
		free(t);
	}
	host_sample(tm);

	/* The pool is shared: its busy share over the window is every feed's job time together. */
	uint64_t job = 0, span = 0;
	for (struct tfeed *t = tm->feeds; t; t = t->next) {
		job += tfeed_worker_ns(t);
		span = MAX(span, t->win.span_ns);
	}
	tm->threads = pool ? pool_threads(pool) : 1;
	tm->pool_busy_pct = span ? MIN(100.0, 100.0 * (double)job / ((double)span * tm->threads)) : 0.0;
	fetch_sample(tm);

	diagnose_all(tm);
}
