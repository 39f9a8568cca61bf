/* SPDX-License-Identifier: MIT */
/*
 * Telemetry's views for status and metrics (telemetry.h): plain structs
 * filled from what telemetry.c and diagnosis.c keep, plus the reading the
 * caller passes. Nothing here formats; daemon/server/status.c renders the
 * JSON and daemon/metrics the Prometheus text.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/telemetry/telemetry-internal.h"
#include "proto/macro.h"

/* A representative value of bucket b: its midpoint (exact below 4). */
static double bucket_mid(unsigned b)
{
	if (b < 4)
		return b;
	double lo = (double)feed_hist_lower(b);
	double hi = b + 1 < FEED_HIST_BUCKETS ? (double)feed_hist_lower(b + 1) : lo;
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

void telemetry_client_view(const struct telemetry_client *c, const struct telemetry_reading *r, uint64_t now,
			   struct telemetry_client_view *ret)
{
	if (!c->tm) {
		*ret = (struct telemetry_client_view){ 0 };
		return;
	}
	const struct ring_consumer *rc = &r->cons;
	*ret = (struct telemetry_client_view){
		.tracked = true,
		.window = {
			.span_s = (double)c->d->win.span_ns / 1e9,
			.batches = c->d->win.batches,
			.wait_ns = c->d->win.wait_ns,
			.step_ns = c->d->win.step_ns,
			.h2d_ns = c->d->win.h2d_ns,
			.reports = c->d->win.reports,
			.full_ns = c->d->win.full_ns,
			.hist_wait = c->d->win.wait,
			.hist_step = c->d->win.step,
			.hist_h2d = c->d->win.h2d,
		},
		.since_attach = {
			.span_s = (double)(now - c->attach_ns) / 1e9,
			.batches = rc->delivered,
			.wait_ns = c->d->attach_wait_ns,
			.step_ns = c->d->attach_step_ns,
			.h2d_ns = c->d->attach_h2d_ns,
			.reports = c->d->attach_reports,
			.full_ns = r->full_ns,
			.hist_wait = c->d->attach_wait,
			.hist_step = c->d->attach_step,
			.hist_h2d = c->d->h2d_attach,
		},
		.ring_fill = c->fill,
		.held = c->held,
		.hist = c->hist,
		.hist_cap = c->hist_cap,
		.hist_head = c->hist_head,
		.hist_n = c->hist_n,
		.diag = &c->diag,
		.straggler = c->straggler,
	};
}

void telemetry_stages_view(const struct telemetry *tm, const struct feed *f, struct telemetry_stages_view *ret)
{
	const struct tfeed *t = telemetry_find_feed(tm, f);
	*ret = (struct telemetry_stages_view){ .threads = tm->threads };
	if (t) {
		ret->span_s = (double)t->win.span_ns / 1e9;
		ret->worker_ns = tfeed_worker_ns(t);
		ret->win = t->win.d;
	}
	if (f->stages) {
		ret->has_total = true;
		for (unsigned i = 0; i < _STAGE_MAX; i++) {
			const struct stage *a = &f->stages->s[i];
			ret->total.s[i] = (struct stage){
				.items = __atomic_load_n(&a->items, __ATOMIC_RELAXED),
				.bytes = __atomic_load_n(&a->bytes, __ATOMIC_RELAXED),
				.busy_ns = __atomic_load_n(&a->busy_ns, __ATOMIC_RELAXED),
				.offcpu_ns = __atomic_load_n(&a->offcpu_ns, __ATOMIC_RELAXED),
				.depth_sum = __atomic_load_n(&a->depth_sum, __ATOMIC_RELAXED),
				.depth_n = __atomic_load_n(&a->depth_n, __ATOMIC_RELAXED),
			};
		}
	}
}

void telemetry_feed_view(const struct telemetry *tm, const struct feed *f, struct telemetry_feed_view *ret)
{
	const struct tfeed *t = telemetry_find_feed(tm, f);
	if (t) {
		*ret = (struct telemetry_feed_view){ .diag = t->diag, .tracked = true };
		return;
	}
	*ret = (struct telemetry_feed_view){ .diag = { .kind = "warming-up", .text = "warming-up: no telemetry yet" } };
	if (f->state != FEED_READY)
		diagnose_failed_feed(f, &ret->diag);
}

const struct telemetry_client *telemetry_next_straggler(const struct telemetry *tm, const struct feed *f,
							 const struct telemetry_client *prev)
{
	for (const struct telemetry_client *c = prev ? prev->next : tm->clients; c; c = c->next)
		if (c->feed == f && c->straggler[0])
			return c;
	return NULL;
}

void telemetry_daemon_view(const struct telemetry *tm, struct telemetry_daemon_view *ret)
{
	const struct host *h = &tm->host;
	double span = (double)h->win.span_ns / 1e9;
	*ret = (struct telemetry_daemon_view){
		.conf = &tm->conf,
		.pool_busy_pct = tm->pool_busy_pct,
		.cpus = h->cpus,
		.runnable = h->runnable,
		.load_avg = h->load_avg,
		.host_known = !h->unavailable,
		.workers_cpu_per_s = span > 0 ? (double)h->win.cpu_ns / 1e9 / span : NAN,
		.runqueue_pct = telemetry_host_runqueue_pct(tm),
	};
	ret->worst_severity = telemetry_worst(tm, ret->worst, sizeof(ret->worst));
}
