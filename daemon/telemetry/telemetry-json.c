/* SPDX-License-Identifier: MIT */
/*
 * The status JSON of telemetry (telemetry.h): a client's windows and history,
 * a feed's stage rates and verdict, the daemon-wide view. Reads only what
 * telemetry.c and diagnosis.c keep, plus the reading its caller passes.
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

json_t *telemetry_client_json(const struct telemetry_client *c, const struct telemetry_reading *r)
{
	if (!c->tm)
		return NULL;
	const struct ring_consumer *rc = &r->cons;
	uint64_t now = now_ns();

	json_t *o = json_object();
	json_object_set_new(o, "window", period_json((double)c->win.span_ns / 1e9, c->win.batches, c->win.wait_ns,
						     c->win.step_ns, c->win.h2d_ns, c->win.reports, c->win.full_ns,
						     c->win.wait, c->win.step, c->win.h2d));
	json_object_set_new(o, "since_attach",
			    period_json((double)(now - c->attach_ns) / 1e9, rc->delivered, rc->wait_ns, rc->step_ns,
					rc->h2d_ns, rc->reports, r->full_ns, rc->hist_wait, rc->hist_step, c->h2d_attach));
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

json_t *telemetry_client_diagnosis_json(const struct telemetry_client *c)
{
	if (!c->tm)
		return NULL;
	json_t *o = diag_json(&c->diag);
	json_object_set_new(o, "straggler", c->straggler[0] ? json_string(c->straggler) : json_null());
	return o;
}

json_t *telemetry_feed_diagnosis_json(const struct telemetry *tm, const struct feed *f)
{
	const struct tfeed *t = telemetry_find_feed(tm, f);
	if (!t) {
		struct diag d = { .kind = "warming-up", .text = "warming-up: no telemetry yet" };
		if (f->state != FEED_READY)
			diagnose_failed_feed(f, &d);
		return diag_json(&d);
	}
	json_t *o = diag_json(&t->diag);
	json_t *a = json_array();
	for (const struct telemetry_client *c = tm->clients; c; c = c->next)
		if (c->feed == f && c->straggler[0])
			json_array_append_new(a, json_pack("{s:i, s:i, s:s}", "rank", (int)c->rank, "world", (int)c->world,
							   "text", c->straggler));
	json_object_set_new(o, "stragglers", a);
	return o;
}

json_t *telemetry_feed_stages_json(const struct telemetry *tm, const struct feed *f)
{
	const struct tfeed *t = telemetry_find_feed(tm, f);
	json_t *o = json_object();
	double span = t ? (double)t->win.span_ns / 1e9 : 0.0;
	json_object_set_new(o, "window_s", json_real(span));
	json_object_set_new(o, "threads", json_integer(tm->threads));
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

json_t *telemetry_daemon_json(const struct telemetry *tm)
{
	char line[512];
	int sev = telemetry_worst(tm, line, sizeof(line));
	const struct conf_diagnosis *d = &tm->conf;
	json_t *th = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "min_batches", (int)d->min_batches,
			       "starved_pct", d->starved_pct, "busy_pct", d->busy_pct, "storage_pct", d->storage_pct,
			       "host_pct", d->host_pct, "full_pct", d->full_pct, "held_pct", d->held_pct, "h2d_pct",
			       d->h2d_pct, "straggler_pct", d->straggler_pct, "straggler_min_ms", d->straggler_min_ms);
	const struct host *h = &tm->host;
	double span = (double)h->win.span_ns / 1e9;
	json_t *host = json_pack("{s:i, s:f, s:i, s:o, s:o}", "cpus", (int)h->cpus, "load_avg", h->load_avg, "runnable",
				 (int)h->runnable, "workers_cpu_per_s",
				 h->unavailable || span <= 0 ? json_null() : json_real((double)h->win.cpu_ns / 1e9 / span),
				 "runqueue_pct", h->unavailable ? json_null() : json_real(telemetry_host_runqueue_pct(tm)));
	return json_pack("{s:i, s:i, s:o, s:f, s:o, s:{s:i, s:s}}", "window_s", (int)d->window_s, "history_s",
			 (int)d->history_s, "thresholds", th, "pool_busy_pct", tm->pool_busy_pct, "host", host, "worst",
			 "severity", sev, "text", line);
}
