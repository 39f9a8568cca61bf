/* SPDX-License-Identifier: MIT */
/*
 * The diagnosis rules (docs/telemetry.md lists each with its threshold).
 * They read only the windows telemetry.c keeps and write a verdict in words
 * and a kind per client and per feed; the first rule that matches wins:
 *
 *   client: failed > stopped > slow-release > starved (blocked on an empty ring) >
 *           warming-up / idle (too few batches) > starved > transfer-bound >
 *           compute-bound; then a straggler check against its peers.
 *   starved, why: host (workers wait for a CPU) > storage (reads off-CPU) >
 *                 a busy stage (workers busy) > latency (workers idle, batches
 *                 still late).
 *   feed:   failed > idle > <cause>-bound (its worst starved client) > keeping up.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/telemetry/telemetry-internal.h"
#include "proto/macro.h"

/* What a healthy loop holds: the batch it works on and the previous one (a copy in flight, the Loader's last). */
#define HEALTHY_HELD 2

/* "0.3" below 10, "41" above: the precision a reader needs (of a share, or a rate: never "0 MB/s" for 0.4). */
static const char *fmt_pct(double v, char buf[static 16])
{
	snprintf(buf, 16, v < 1 ? "%.2f" : v < 10 ? "%.1f" : "%.0f", v);
	return buf;
}

static void say(struct diag *d, enum diag_severity sev, const char *kind, const char *fmt, ...) _printf_(4, 5);
static void say(struct diag *d, enum diag_severity sev, const char *kind, const char *fmt, ...)
{
	d->severity = sev;
	d->kind = kind;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d->text, sizeof(d->text), fmt, ap);
	va_end(ap);
}

/* How a stage is named in a sentence: "tokenizer busy on all 2 threads". */
static const char *stage_noun(enum stage_id id)
{
	switch (id) {
	case STAGE_READ:
		return "reading";
	case STAGE_DECOMPRESS:
		return "decompression";
	case STAGE_TOKENIZE:
		return "tokenizer";
	case STAGE_PACK:
		return "packing";
	case STAGE_H2D:
		return "device copy";
	default:
		return "batch assembly";
	}
}

/*
 * Why a client of feed t waits: writes the cause (a stage name, "storage",
 * "latency" or "none") and a phrase without a kind prefix, e.g. "tokenizer
 * busy on all 2 threads at 38 MB/s (72 % of worker time); needs ~1.7x more
 * tokenizer throughput". Returns the feed's kind for this cause.
 */
static const char *explain(const struct telemetry *tm, const struct tfeed *t, double needed, unsigned slots, char *cause, size_t cause_len,
			   char *out, size_t len)
{
	const struct conf_diagnosis *k = &tm->conf;
	char a[16], rate[16], need[48];
	if (isfinite(needed) && needed < 100)
		snprintf(need, sizeof(need), "~%.1fx", needed);
	else
		snprintf(need, sizeof(need), "much");

	const struct stage *job = t ? &t->win.d.s[STAGE_JOB] : NULL;
	if (!job || job->busy_ns == 0) {
		snprintf(cause, cause_len, "none");
		snprintf(out, len, "the feed produced no batch in the last %.0f s", t ? (double)t->win.span_ns / 1e9 : 0.0);
		return "stalled";
	}
	double span = (double)t->win.span_ns / 1e9;
	/*
	 * The host first: time waiting for a CPU is also off-CPU time of the
	 * read stage and wall time of every stage, so on an oversubscribed host
	 * the rules below would blame storage or a stage for the scheduler.
	 * Workers that were runnable less than 5 % of one CPU say too little.
	 * But storage that kept the workers waiting longer than the run queue
	 * did is the cause even on a busy host: the read stage's time off a CPU,
	 * less every wait for a CPU (at most all of it was in reads), is time
	 * storage alone took (CI, stop 30: 2 MiB/s reads on a loaded VM were
	 * blamed on the host).
	 */
	const struct host *h = &tm->host;
	const struct stage *rd = &t->win.d.s[STAGE_READ];
	double runq = telemetry_host_runqueue_pct(tm);
	uint64_t io_ns = rd->offcpu_ns > h->win.delay_ns ? rd->offcpu_ns - h->win.delay_ns : 0;
	bool storage_first = !h->unavailable && rd->bytes > 0 && io_ns > h->win.delay_ns;
	if (!h->unavailable && !storage_first && h->win.span_ns && (h->win.cpu_ns + h->win.delay_ns) * 20 >= h->win.span_ns &&
	    runq >= k->host_pct) {
		char b[16];
		snprintf(cause, cause_len, "host");
		snprintf(out, len,
			 "host CPUs oversubscribed: feedd's workers waited for a CPU %s %% of the time they could run, "
			 "getting %.2f CPUs for %u threads (load average %s on %u CPUs); free CPUs for feedd before "
			 "adding threads",
			 fmt_pct(runq, a), (double)h->win.cpu_ns / (double)h->win.span_ns, tm->threads,
			 fmt_pct(h->load_avg, b), h->cpus);
		return "host-bound";
	}
	uint64_t worker_ns = tfeed_worker_ns(t);
	/*
	 * A share of the workers' time, bounded by construction (the read stage's
	 * off-CPU time is part of its busy time, which is part of the workers'),
	 * and only when something was read: a feed served from cache that waits
	 * off-CPU waits on something else.
	 */
	double offcpu = telemetry_pct(MIN(rd->offcpu_ns, rd->busy_ns), MAX(worker_ns, rd->busy_ns));
	if (rd->bytes > 0 && offcpu >= k->storage_pct && tm->fetch_throttled_win > 0) {
		snprintf(cause, cause_len, "storage");
		snprintf(out, len,
			 "object store throttling: %" PRIu64 " answers 429/503 and %" PRIu64 " retries in the last %.0f s; "
			 "workers wait on storage %s %% of their time; ask the store for more request rate or spread the keys",
			 tm->fetch_throttled_win, tm->fetch_retries_win, span, fmt_pct(offcpu, a));
		return "storage-bound";
	}
	if (rd->bytes > 0 && offcpu >= k->storage_pct) {
		snprintf(cause, cause_len, "storage");
		snprintf(out, len,
			 "reads at %s MB/s with queue depth %.1f; workers wait on storage %s %% of their time; needs %s faster storage",
			 fmt_pct(span > 0 ? (double)rd->bytes / 1e6 / span : 0.0, rate),
			 rd->depth_n ? (double)rd->depth_sum / (double)rd->depth_n : 1.0, fmt_pct(offcpu, a), need);
		return "storage-bound";
	}
	if (tm->pool_busy_pct >= k->busy_pct) {
		/* The stage holding most of the workers' time; reads count only their on-CPU part here. */
		enum stage_id best = STAGE_JOB;
		uint64_t best_ns = 0, staged = 0;
		for (unsigned i = 0; i < STAGE_JOB; i++) {
			const struct stage *s = &t->win.d.s[i];
			uint64_t ns = s->busy_ns - (i == STAGE_READ ? MIN(s->offcpu_ns, s->busy_ns) : 0);
			staged += s->busy_ns;
			if (ns > best_ns) {
				best = (enum stage_id)i;
				best_ns = ns;
			}
		}
		/* Worker time no stage claims ("other"): batch assembly outside pack and read. */
		if (worker_ns > staged && worker_ns - staged > best_ns) {
			best = STAGE_JOB;
			best_ns = worker_ns - staged;
		}
		const struct stage *s = &t->win.d.s[best];
		uint64_t bytes = best == STAGE_JOB ? job->bytes : s->bytes;
		snprintf(cause, cause_len, "%s", stage_name(best));
		snprintf(out, len, "%s busy on all %u threads at %s MB/s (%s %% of worker time); needs %s more %s throughput",
			 stage_noun(best), tm->threads, fmt_pct(span > 0 ? (double)bytes / 1e6 / span : 0.0, rate),
			 fmt_pct(telemetry_pct(best_ns, worker_ns), a), need, stage_noun(best));
		static char kind[_STAGE_MAX][24];
		snprintf(kind[best], sizeof(kind[best]), "%s-bound", stage_name(best));
		return kind[best];
	}
	snprintf(cause, cause_len, "latency");
	snprintf(out, len,
		 "workers are busy only %s %% of the time on %u threads: batches come late, not slowly (a ring of %u slots is refilled once half of it is free; more ring_slots absorb the jitter)",
		 fmt_pct(tm->pool_busy_pct, a), tm->threads, slots);
	return "latency-bound";
}

/*
 * The slots c held at every one of its last samples, up to HELD_SAMPLES
 * seconds (its history; the last sample alone without one). A loop caught
 * between taking a batch and giving back the one before holds one more for
 * an instant; a client that sits on slots holds them all the time.
 */
#define HELD_SAMPLES 3
static uint64_t held_throughout(const struct telemetry *tm, const struct telemetry_client *c)
{
	uint64_t held = c->held;
	unsigned n = MIN(c->hist_n, MIN((unsigned)HELD_SAMPLES, tm->conf.window_s));
	for (unsigned i = 0; i < n; i++)
		held = MIN(held, (uint64_t)c->hist[(c->hist_head + c->hist_n - 1 - i) % c->hist_cap].held);
	return held;
}

static double needed_factor(uint64_t wait, uint64_t step)
{
	return step ? (double)(wait + step) / (double)step : INFINITY;
}

static void diagnose_client(const struct telemetry *tm, struct telemetry_client *c)
{
	const struct conf_diagnosis *k = &tm->conf;
	const struct client_sums *w = &c->d->win;
	struct diag *d = &c->diag;
	char a[16], b[16];
	*d = (struct diag){ 0 };

	if (c->failed) {
		say(d, DIAG_ERROR, "failed", "failed: the stream stopped with an error (the client was told why; see the log)");
		return;
	}
	if (c->stopped) {
		snprintf(d->cause, sizeof(d->cause), "stopped");
		say(d, DIAG_WARNING, "stopped",
		    "stopped: the client process is stopped (SIGSTOP or a debugger: state T in /proc); nothing moved for %.0f s",
		    (double)(tm->now - c->progress_ns) / 1e9);
		return;
	}
	unsigned slots = c->slot_count;
	double full = telemetry_pct(w->full_ns, w->span_ns);
	/*
	 * A full ring alone is a trainer slower than the feed: healthy. It sits
	 * on slots the feed needs when it holds more than a loop does (the batch
	 * it works on and the previous one, HEALTHY_HELD) and at least held_pct
	 * of the ring, so the feed has little or nothing left to fill ahead.
	 */
	uint64_t need_held = MAX((uint64_t)ceil(k->held_pct / 100.0 * slots), (uint64_t)HEALTHY_HELD + 1);
	uint64_t held = held_throughout(tm, c);
	if (w->span_ns && full >= k->full_pct && held >= need_held) {
		snprintf(d->cause, sizeof(d->cause), "release");
		say(d, DIAG_WARNING, "slow-release", "client slow to release: ring full %s %% of the time, holding %" PRIu64 " of %u slots",
		    fmt_pct(full, a), held, slots);
		return;
	}

	double stall = telemetry_pct(w->wait_ns, w->wait_ns + w->step_ns);
	/* Blocked in next() on an empty ring and nothing delivered for the whole window: waiting is all it does. */
	bool blocked = c->waiting && w->batches == 0;
	if (blocked)
		stall = 100.0;
	d->stall_pct = stall;
	if (!blocked && w->batches < k->min_batches) {
		if (tm->now - c->attach_ns < (uint64_t)k->window_s * NSEC_PER_SEC)
			say(d, DIAG_OK, "warming-up", "warming up: %" PRIu64 " batches so far", w->batches);
		else
			say(d, DIAG_OK, "idle", "idle: %" PRIu64 " batches taken in the last %.0f s; %" PRIu64 " ready in the ring",
			    w->batches, (double)w->span_ns / 1e9, c->fill);
		return;
	}
	/*
	 * The wait is the client's word (its page); the ring's fullness is the
	 * daemon's. Batches were ready while the ring was full, so a wait over a
	 * ring full for full_pct of the window is not the feed's doing.
	 */
	bool ready = !blocked && full >= k->full_pct;
	if (stall >= k->starved_pct && !ready) {
		char why[300];
		d->needed_x = blocked ? INFINITY : needed_factor(w->wait_ns, w->step_ns);
		const char *kind = explain(tm, telemetry_find_feed(tm, c->feed), d->needed_x, slots, d->cause, sizeof(d->cause), why,
					   sizeof(why));
		say(d, DIAG_WARNING, "starved", "starved: waiting %s %% — %s%s", fmt_pct(stall, a),
		    strcmp(kind, "storage-bound") == 0 ? "storage-bound: " : "", why);
		return;
	}
	double h2d = telemetry_pct(w->h2d_ns, w->step_ns);
	if (w->reports && h2d >= k->h2d_pct) {
		snprintf(d->cause, sizeof(d->cause), "h2d");
		say(d, DIAG_NOTICE, "transfer-bound", "transfer-bound: host-to-device copies take %s %% of the step (data wait %s %%)",
		    fmt_pct(h2d, a), fmt_pct(stall, b));
		return;
	}
	if (stall >= k->starved_pct)
		say(d, DIAG_OK, "compute-bound",
		    "compute-bound: data wait %s %% of step time (as reported by the client; batches were ready, the ring full %s %% of the time)",
		    fmt_pct(stall, a), fmt_pct(full, b));
	else
		say(d, DIAG_OK, "compute-bound", "compute-bound: data wait %s %% of step time", fmt_pct(stall, a));
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return (a > b) - (a < b);
}

/* Mean time between the batches the daemon published for c over its window (ms); INFINITY when none. */
static double batch_interval_ms(const struct telemetry_client *c)
{
	const struct client_sums *w = &c->d->win;
	return w->published ? (double)w->span_ns / (double)w->published / 1e6 : INFINITY;
}

/*
 * Names a rank whose mean time per batch exceeds the median of its
 * peers (same feed, same world, at least two of them with enough batches) by
 * straggler_pct and straggler_min_ms.
 */
static void find_straggler(const struct telemetry *tm, struct telemetry_client *c)
{
	const struct conf_diagnosis *k = &tm->conf;
	c->straggler[0] = 0;
	if (c->d->win.batches < k->min_batches)
		return;
	size_t n = 0;
	for (const struct telemetry_client *p = tm->clients; p; p = p->next)
		n += p != c && p->feed == c->feed && p->world == c->world && p->d->win.batches >= k->min_batches;
	if (n < 2)
		return;
	_cleanup_free_ double *v = malloc(n * sizeof(*v));
	if (!v)
		return;
	/*
	 * The time between batches the daemon published for each rank: its own
	 * count, not the client's page, so a client that lies about its waits
	 * and steps can move only its own figures, never get a peer named.
	 */
	size_t i = 0;
	for (const struct telemetry_client *p = tm->clients; p; p = p->next)
		if (p != c && p->feed == c->feed && p->world == c->world && p->d->win.batches >= k->min_batches)
			v[i++] = batch_interval_ms(p);
	qsort(v, n, sizeof(*v), cmp_double);
	double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
	double mine = batch_interval_ms(c);
	if (isfinite(mine) && isfinite(med) && mine - med >= k->straggler_min_ms && mine > med * (1 + k->straggler_pct / 100.0))
		snprintf(c->straggler, sizeof(c->straggler),
			 "straggler: a batch every %.1f ms vs a median of %.1f ms over its %zu peers (+%.0f %%)", mine, med, n,
			 med > 0 ? 100.0 * (mine - med) / med : 100.0);
}

void diagnose_failed_feed(const struct feed *f, struct diag *d)
{
	say(d, DIAG_ERROR, "failed", "failed: %s", f->error);
}

static void diagnose_feed(const struct telemetry *tm, struct tfeed *t)
{
	const struct feed *f = t->f;
	struct diag *d = &t->diag;
	char a[16], b[16];
	*d = (struct diag){ 0 };
	if (f->state != FEED_READY) {
		diagnose_failed_feed(f, d);
		return;
	}
	const struct telemetry_client *worst = NULL;
	unsigned n = 0;
	double max_stall = 0;
	for (const struct telemetry_client *c = tm->clients; c; c = c->next) {
		if (c->feed != f)
			continue;
		n++;
		max_stall = MAX(max_stall, c->diag.stall_pct);
		if (strcmp(c->diag.kind ? c->diag.kind : "", "starved") == 0 &&
		    (!worst || c->diag.stall_pct > worst->diag.stall_pct))
			worst = c;
	}
	if (n == 0) {
		say(d, DIAG_OK, "idle", "idle: no clients attached");
		return;
	}
	if (worst) {
		char why[300];
		const char *kind = explain(tm, t, worst->diag.needed_x, worst->slot_count, d->cause, sizeof(d->cause),
					   why, sizeof(why));
		d->stall_pct = worst->diag.stall_pct;
		d->needed_x = worst->diag.needed_x;
		say(d, DIAG_WARNING, kind, "%s: %s (rank %u/%u waits %s %%)", kind, why, worst->rank, worst->world,
		    fmt_pct(worst->diag.stall_pct, a));
		return;
	}
	d->stall_pct = max_stall;
	say(d, DIAG_OK, "keeping-up", "keeping up: %u client%s wait at most %s %%; workers busy %s %%", n, n == 1 ? "" : "s",
	    fmt_pct(max_stall, a), fmt_pct(tm->pool_busy_pct, b));
}

void diagnose_all(struct telemetry *tm)
{
	for (struct telemetry_client *c = tm->clients; c; c = c->next)
		diagnose_client(tm, c);
	for (struct telemetry_client *c = tm->clients; c; c = c->next) {
		find_straggler(tm, c);
		if (c->straggler[0] && c->diag.severity < DIAG_NOTICE) {
			char old[sizeof(c->diag.text)];
			memcpy(old, c->diag.text, sizeof(old));
			say(&c->diag, DIAG_NOTICE, "straggler", "%s; %s", c->straggler, old);
		}
	}
	for (struct tfeed *t = tm->feeds; t; t = t->next)
		diagnose_feed(tm, t);
}

/*
 * How much of a verdict the daemon saw itself, for ties in the worst line:
 * a stop (/proc), a ring held full (its own clock, the slots it cannot
 * refill), a straggler (the batches it published) before a stall, which is
 * the client's own account of its waits and steps.
 */
static int evidence(const struct diag *d)
{
	static const char *const kinds[] = { "stopped", "slow-release", "straggler" };
	for (size_t i = 0; i < ARRAY_SIZE(kinds); i++)
		if (d->kind && strcmp(d->kind, kinds[i]) == 0)
			return (int)(ARRAY_SIZE(kinds) - i);
	return 0;
}

int telemetry_worst(const struct telemetry *tm, char *buf, size_t len)
{
	const struct diag *best = NULL;
	const struct telemetry_client *bc = NULL;
	const struct tfeed *bf = NULL;
	for (const struct telemetry_client *c = tm->clients; c; c = c->next) {
		if (!c->diag.kind)
			continue;
		if (!best || c->diag.severity > best->severity ||
		    (c->diag.severity == best->severity && evidence(&c->diag) > evidence(best)) ||
		    (c->diag.severity == best->severity && evidence(&c->diag) == evidence(best) &&
		     c->diag.stall_pct > best->stall_pct)) {
			best = &c->diag;
			bc = c;
			bf = NULL;
		}
	}
	for (const struct tfeed *t = tm->feeds; t; t = t->next) {
		/* A feed's starvation is already told by its client; a failed feed has no client to tell it. */
		if (t->diag.kind && t->diag.severity == DIAG_ERROR && (!best || best->severity < DIAG_ERROR)) {
			best = &t->diag;
			bf = t;
			bc = NULL;
		}
	}
	if (!best) {
		snprintf(buf, len, "no clients attached");
		return DIAG_OK;
	}
	if (bc)
		snprintf(buf, len, "feed %s rank %u/%u: %s", bc->feed->name, bc->rank, bc->world, best->text);
	else
		snprintf(buf, len, "feed %s: %s", bf->f->name, best->text);
	return (int)best->severity;
}
