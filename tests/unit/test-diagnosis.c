/* SPDX-License-Identifier: MIT */
/*
 * The diagnosis rules (daemon/telemetry/diagnosis.c, docs/telemetry.md): each
 * test builds the windows a rule reads (a client's sums, its feed's stage
 * rates, the pool's busy share, the host's run queue), runs diagnose_all() and
 * checks the verdict: kind, severity, cause and the words an operator reads.
 * The last test drives the windows through telemetry_client_sample() with
 * readings, including a client that writes nonsense into its page.
 */
#include <math.h>

#include "daemon/telemetry/telemetry-internal.h"
#include "unit.h"

#define SEC NSEC_PER_SEC

static struct feed *fake_feed(const char *name)
{
	struct feed *f = calloc(1, sizeof(*f));
	REQUIRE(f, "out of memory");
	f->name = (char *)name;
	f->state = FEED_READY;
	f->kind = FEED_MEGATRON;
	return f;
}

static struct telemetry *new_tm(void)
{
	struct conf_diagnosis d = CONF_DIAGNOSIS_DEFAULTS;
	struct telemetry *tm = NULL;
	REQUIRE(telemetry_new(&d, &tm) == 0 && tm, "telemetry_new failed");
	tm->now = 1000 * SEC;
	tm->threads = 4;
	return tm;
}

/* Names the feeds of this tick (as the server does) and returns the record of f. */
static struct tfeed *tick_feed(struct telemetry *tm, struct feed *f)
{
	telemetry_tick_feed(tm, f);
	struct tfeed *t = telemetry_find_feed(tm, f);
	REQUIRE(t, "feed %s not tracked after telemetry_tick_feed", f->name);
	t->win.span_ns = 60 * SEC;
	return t;
}

/* A client attached long ago with a 60 s window: `batches` taken, `wait_ms`/`step_ms` per batch. */
static void attach(struct telemetry *tm, struct telemetry_client *c, struct feed *f, unsigned rank, unsigned world,
		   uint64_t batches, double wait_ms, double step_ms)
{
	REQUIRE(telemetry_client_attach(tm, c, f, rank, world, 8, tm->now - 600 * SEC) == 0, "attach failed");
	c->d->win.span_ns = 60 * SEC;
	c->d->win.batches = batches;
	c->d->win.wait_ns = (uint64_t)(wait_ms * 1e6 * (double)batches);
	c->d->win.step_ns = (uint64_t)(step_ms * 1e6 * (double)batches);
	c->d->win.published = batches;
	c->fill = 4;
}

static void test_client_rules(void)
{
	struct telemetry *tm = new_tm();
	struct feed *f = fake_feed("web");
	struct tfeed *t = tick_feed(tm, f);
	/* The feed's workers did work: the starved rule explains by stage, not "stalled". */
	t->win.d.s[STAGE_JOB].busy_ns = 30 * SEC;
	t->win.d.s[STAGE_JOB].items = 1000;
	t->win.d.s[STAGE_JOB].bytes = 1000 * 4096;
	t->win.d.s[STAGE_TOKENIZE].busy_ns = 25 * SEC;
	t->win.d.s[STAGE_TOKENIZE].bytes = 600 * 1000000ull;
	t->win.d.s[STAGE_READ].busy_ns = 2 * SEC;

	struct telemetry_client c[8] = { 0 };
	/* 0: failed */
	attach(tm, &c[0], f, 0, 1, 100, 0, 10);
	c[0].failed = true;
	/* 1: ring full 95 % of the window and the client holds 7 of 8 slots */
	attach(tm, &c[1], f, 1, 2, 100, 0, 10);
	c[1].d->win.full_ns = 57 * SEC;
	c[1].held = 7;
	/* 2: blocked in next() on an empty ring, nothing delivered */
	attach(tm, &c[2], f, 2, 3, 0, 0, 0);
	c[2].waiting = true;
	/* 3: warming up: two batches, attached 10 s ago */
	attach(tm, &c[3], f, 3, 4, 2, 0, 10);
	c[3].attach_ns = tm->now - 10 * SEC;
	/* 4: idle: two batches in the window, attached long ago */
	attach(tm, &c[4], f, 4, 5, 2, 0, 10);
	/* 5: waits 40 % of its time */
	attach(tm, &c[5], f, 5, 6, 100, 20, 30);
	/* 6: copies to the GPU take 40 % of the step, data wait 1 % */
	attach(tm, &c[6], f, 6, 7, 100, 0.1, 10);
	c[6].d->win.reports = 100;
	c[6].d->win.h2d_ns = 100 * 4 * 1000000ull;
	/* 7: compute-bound */
	attach(tm, &c[7], f, 7, 8, 100, 0.1, 10);

	tm->pool_busy_pct = 95; /* workers saturated: the starved client is bound by the busiest stage */
	diagnose_all(tm);

	CHECK_STR(c[0].diag.kind, "failed");
	CHECK_INT(c[0].diag.severity, DIAG_ERROR);

	CHECK_STR(c[1].diag.kind, "slow-release");
	CHECK_INT(c[1].diag.severity, DIAG_WARNING);
	CHECK_STR(c[1].diag.cause, "release");
	CHECK_CONTAINS(c[1].diag.text, "holding 7 of 8 slots");

	CHECK_STR(c[2].diag.kind, "starved");
	CHECK(c[2].diag.stall_pct == 100.0, "blocked client: stall %.1f, expected 100", c[2].diag.stall_pct);
	CHECK(isinf(c[2].diag.needed_x), "blocked client: needed_x %.2f, expected infinity", c[2].diag.needed_x);

	CHECK_STR(c[3].diag.kind, "warming-up");
	CHECK_INT(c[3].diag.severity, DIAG_OK);
	CHECK_STR(c[4].diag.kind, "idle");
	CHECK_CONTAINS(c[4].diag.text, "4 ready in the ring");

	CHECK_STR(c[5].diag.kind, "starved");
	CHECK_INT(c[5].diag.severity, DIAG_WARNING);
	CHECK(fabs(c[5].diag.stall_pct - 40.0) < 0.01, "stall %.2f, expected 40", c[5].diag.stall_pct);
	CHECK(fabs(c[5].diag.needed_x - 50.0 / 30.0) < 0.01, "needed_x %.3f, expected 1.667", c[5].diag.needed_x);
	CHECK_STR(c[5].diag.cause, "tokenize");
	CHECK_CONTAINS(c[5].diag.text, "tokenizer busy on all 4 threads");
	CHECK_CONTAINS(c[5].diag.text, "~1.7x");

	CHECK_STR(c[6].diag.kind, "transfer-bound");
	CHECK_INT(c[6].diag.severity, DIAG_NOTICE);
	CHECK_STR(c[6].diag.cause, "h2d");

	CHECK_STR(c[7].diag.kind, "compute-bound");
	CHECK_INT(c[7].diag.severity, DIAG_OK);

	/* The feed is told by its worst starved client (the blocked one), with the stage that binds it. */
	CHECK_STR(t->diag.kind, "tokenize-bound");
	CHECK_INT(t->diag.severity, DIAG_WARNING);
	CHECK_CONTAINS(t->diag.text, "rank 2/3 waits 100 %");

	/* The worst line: the failed client, named by feed and rank. */
	char line[512];
	CHECK_INT(telemetry_worst(tm, line, sizeof(line)), DIAG_ERROR);
	CHECK_CONTAINS(line, "feed web rank 0/1: failed");

	for (unsigned i = 0; i < 8; i++)
		telemetry_client_detach(&c[i]);
	CHECK(!telemetry_client_tracked(&c[0]), "a detached client is still tracked");
	CHECK_INT(telemetry_worst(tm, line, sizeof(line)), DIAG_OK);
	telemetry_free(tm);
	free(f);
}

/* Why a starved client waits, rule by rule: storage, latency, stalled, host. */
static void test_starved_causes(void)
{
	struct telemetry *tm = new_tm();
	struct feed *f = fake_feed("books");
	struct tfeed *t = tick_feed(tm, f);
	struct telemetry_client c = { 0 };
	attach(tm, &c, f, 0, 1, 100, 20, 30);

	/* No batch job ran in the window: the feed produced nothing. */
	diagnose_all(tm);
	CHECK_STR(c.diag.kind, "starved");
	CHECK_STR(c.diag.cause, "none");
	CHECK_CONTAINS(c.diag.text, "produced no batch");
	CHECK_STR(t->diag.kind, "stalled");

	/* Reads off-CPU 60 % of the worker time: storage-bound, whatever the pool's business. */
	t->win.d.s[STAGE_JOB].busy_ns = 10 * SEC;
	t->win.d.s[STAGE_READ].busy_ns = 7 * SEC;
	t->win.d.s[STAGE_READ].offcpu_ns = 6 * SEC;
	t->win.d.s[STAGE_READ].bytes = 120 * 1000000ull;
	tm->pool_busy_pct = 95;
	diagnose_all(tm);
	CHECK_STR(c.diag.cause, "storage");
	CHECK_CONTAINS(c.diag.text, "storage-bound: reads at 2.0 MB/s");
	CHECK_STR(t->diag.kind, "storage-bound");

	/* Reads on the CPU, workers mostly idle: batches come late, not slowly. */
	t->win.d.s[STAGE_READ].offcpu_ns = 0;
	tm->pool_busy_pct = 20;
	diagnose_all(tm);
	CHECK_STR(c.diag.cause, "latency");
	CHECK_STR(t->diag.kind, "latency-bound");
	CHECK_CONTAINS(c.diag.text, "a ring of 8 slots");

	/* Workers runnable but waiting for a CPU 40 % of the time: the host, before any stage. */
	tm->pool_busy_pct = 95;
	tm->host.win = (struct host_slot){ .span_ns = 60 * SEC, .cpu_ns = 30 * SEC, .delay_ns = 20 * SEC };
	tm->host.cpus = 2;
	diagnose_all(tm);
	CHECK_STR(c.diag.cause, "host");
	CHECK_STR(t->diag.kind, "host-bound");
	CHECK_CONTAINS(c.diag.text, "host CPUs oversubscribed");
	/* ... unless the kernel has no schedstat: then the rule stays silent. */
	tm->host.unavailable = true;
	diagnose_all(tm);
	CHECK(strcmp(c.diag.cause, "host") != 0, "host blamed without schedstat (cause %s)", c.diag.cause);

	telemetry_client_detach(&c);
	telemetry_free(tm);
	free(f);
}

/*
 * A rank whose time between batches (the daemon's count of batches published
 * into its ring) is far above its peers' median is named a straggler; others
 * of another world are not peers. What the clients write into their pages
 * (wait, step) does not move it: rank 0 claims a 1000 ms step.
 */
static void test_straggler(void)
{
	struct telemetry *tm = new_tm();
	struct feed *f = fake_feed("web");
	tick_feed(tm, f);
	struct telemetry_client c[5] = { 0 };
	attach(tm, &c[0], f, 0, 4, 100, 0.1, 10);
	attach(tm, &c[1], f, 1, 4, 100, 0.1, 11);
	attach(tm, &c[2], f, 2, 4, 100, 0.1, 10.5);
	attach(tm, &c[3], f, 3, 4, 100, 0.1, 30); /* three times slower */
	attach(tm, &c[4], f, 0, 2, 100, 0.1, 90); /* another world: not a peer of the others */
	/* 60 s windows: a batch every 10, 11, 10.5, 30 and 90 ms */
	static const uint64_t published[5] = { 6000, 5454, 5714, 2000, 666 };
	for (unsigned i = 0; i < 5; i++)
		c[i].d->win.published = published[i];
	c[0].d->win.step_ns = 100 * 1000 * 1000000ull; /* a lie: 1000 ms per batch */
	diagnose_all(tm);
	CHECK_STR(c[3].diag.kind, "straggler");
	CHECK_INT(c[3].diag.severity, DIAG_NOTICE);
	CHECK_CONTAINS(c[3].straggler, "a batch every 30.0 ms vs a median of 10.5 ms over its 3 peers");
	for (unsigned i = 0; i < 3; i++) {
		CHECK_STR(c[i].diag.kind, "compute-bound");
		CHECK(c[i].straggler[0] == 0, "rank %u named a straggler: %s", i, c[i].straggler);
	}
	CHECK(c[4].straggler[0] == 0, "a lone rank of world 2 named a straggler: %s", c[4].straggler);
	for (unsigned i = 0; i < 5; i++)
		telemetry_client_detach(&c[i]);
	telemetry_free(tm);
	free(f);
}

static void test_feed_rules(void)
{
	struct telemetry *tm = new_tm();
	struct feed *f = fake_feed("web"), *g = fake_feed("code");
	struct tfeed *t = tick_feed(tm, f), *u = tick_feed(tm, g);
	diagnose_all(tm);
	CHECK_STR(t->diag.kind, "idle");

	struct telemetry_client c = { 0 };
	attach(tm, &c, f, 0, 1, 100, 0.5, 10);
	tm->pool_busy_pct = 30;
	diagnose_all(tm);
	CHECK_STR(t->diag.kind, "keeping-up");
	CHECK_CONTAINS(t->diag.text, "1 client wait at most 4.8 %");

	/* A feed that failed (shards changed under it) says why, and is the worst line without a failed client. */
	g->state = FEED_FAILED;
	snprintf(g->error, sizeof(g->error), "shard a.bin changed");
	diagnose_all(tm);
	CHECK_STR(u->diag.kind, "failed");
	CHECK_INT(u->diag.severity, DIAG_ERROR);
	char line[512];
	CHECK_INT(telemetry_worst(tm, line, sizeof(line)), DIAG_ERROR);
	CHECK_STR(line, "feed code: failed: shard a.bin changed");

	/* A feed not named at a tick is forgotten. */
	telemetry_tick_begin(tm);
	telemetry_tick_feed(tm, f);
	telemetry_tick_end(tm, NULL);
	CHECK(telemetry_find_feed(tm, g) == NULL, "feed no longer served still tracked");
	CHECK(telemetry_find_feed(tm, f) != NULL, "feed served forgotten");

	telemetry_client_detach(&c);
	telemetry_free(tm);
	free(f);
	free(g);
}

/* Readings into windows: deltas per second, a page that goes backwards counts as no progress, and a full window rotates. */
static void test_sampling(void)
{
	struct telemetry *tm = new_tm();
	struct feed *f = fake_feed("web");
	uint64_t t0 = 1000 * SEC;
	struct telemetry_client c = { 0 };
	REQUIRE(telemetry_client_attach(tm, &c, f, 0, 1, 8, t0) == 0, "attach failed");
	struct telemetry_reading r = { .published = 8, .tail = 2 };
	for (unsigned s = 1; s <= 70; s++) {
		tm->now = t0 + s * SEC;
		r.cons.delivered = 10 * s;
		r.published = 10 * s + 8;
		r.tail = 10 * s;
		r.cons.wait_ns = s * 100000000ull; /* 0.1 s a second */
		r.cons.step_ns = s * 900000000ull;
		if (s == 30)
			r.cons.wait_ns = 0; /* a lying client: its total goes backwards */
		telemetry_client_sample(&c, &r);
		if (s == 30)
			r.cons.wait_ns = 30 * 100000000ull;
	}
	/*
	 * 60 one-second sub-windows; each tick closes one, and the oldest
	 * becomes the (empty) current one: the window holds the last 59 seconds
	 * at 10 batches a second.
	 */
	CHECK_U64(c.d->win.batches, 590);
	CHECK_U64(c.d->win.span_ns, 59 * SEC);
	CHECK_U64(c.d->win.step_ns, 59 * 900000000ull);
	/* Seconds 30 (went back to 0) and 31 (back up from 0 to 3.1 s, clamped to the attachment's age) distort only this client. */
	CHECK(c.d->win.wait_ns >= 57 * 100000000ull && c.d->win.wait_ns <= 59 * 100000000ull + 31 * 100000000ull, "window wait %" PRIu64 " lost more than the lying seconds", c.d->win.wait_ns);
	CHECK_U64(c.fill, 8);
	CHECK_U64(c.held, 0);
	CHECK_U64(c.hist_n, 70);
	CHECK(c.hist[(c.hist_head + 69) % c.hist_cap].batches == 10, "last second's batches %u, expected 10",
	      c.hist[(c.hist_head + 69) % c.hist_cap].batches);
	telemetry_client_detach(&c);
	telemetry_free(tm);
	free(f);
}

/*
 * Issue 19: a full ring is healthy unless the client holds more than a loop
 * does; a stopped client is "stopped"; a wait over a ring the daemon saw full
 * is the client's word only; no storage verdict without bytes read, and the
 * storage share is at most 100 %.
 */
static void test_no_false_alarms(void)
{
	struct telemetry *tm = new_tm();
	struct feed *f = fake_feed("web");
	struct tfeed *t = tick_feed(tm, f);
	struct telemetry_client c[6] = { 0 };
	/* 0: a loop holding the batch it works on and the previous one, ring full all the time: compute-bound */
	attach(tm, &c[0], f, 0, 6, 100, 0.1, 50);
	c[0].slot_count = 4;
	c[0].d->win.full_ns = 60 * SEC;
	c[0].held = 2;
	/* 1: holds 3 of 4, ring full: sits on slots the feed needs */
	attach(tm, &c[1], f, 1, 6, 100, 0.1, 50);
	c[1].slot_count = 4;
	c[1].d->win.full_ns = 60 * SEC;
	c[1].held = 3;
	/* 2: a ring of 2 slots, both held: a loop's normal state */
	attach(tm, &c[2], f, 2, 6, 100, 0.1, 50);
	c[2].slot_count = 2;
	c[2].d->win.full_ns = 60 * SEC;
	c[2].held = 2;
	/* 3: stopped */
	attach(tm, &c[3], f, 3, 6, 100, 0.1, 50);
	c[3].stopped = true;
	c[3].progress_ns = tm->now - 7 * SEC;
	/* 4: reports waiting 50 % while the daemon saw its ring full 95 % of the window */
	attach(tm, &c[4], f, 4, 6, 100, 10, 10);
	c[4].d->win.full_ns = 57 * SEC;
	c[4].held = 1;
	/* 5: starved; its feed read nothing (served from cache) but reads show off-CPU time above the workers' */
	attach(tm, &c[5], f, 5, 6, 100, 20, 30);
	t->win.d.s[STAGE_JOB].busy_ns = 10 * SEC;
	t->win.d.s[STAGE_READ].busy_ns = 8 * SEC;
	t->win.d.s[STAGE_READ].offcpu_ns = 30 * SEC; /* impossible: more than the reads' own time */
	t->win.d.s[STAGE_READ].bytes = 0;
	tm->pool_busy_pct = 20;
	diagnose_all(tm);

	CHECK_STR(c[0].diag.kind, "compute-bound");
	CHECK_INT(c[0].diag.severity, DIAG_OK);
	CHECK_STR(c[1].diag.kind, "slow-release");
	CHECK_CONTAINS(c[1].diag.text, "holding 3 of 4 slots");
	CHECK_STR(c[2].diag.kind, "compute-bound");
	CHECK_STR(c[3].diag.kind, "stopped");
	CHECK_INT(c[3].diag.severity, DIAG_WARNING);
	CHECK_CONTAINS(c[3].diag.text, "nothing moved for 7 s");
	CHECK_STR(c[4].diag.kind, "compute-bound");
	CHECK_CONTAINS(c[4].diag.text, "as reported by the client");
	CHECK_STR(c[5].diag.kind, "starved");
	CHECK(strcmp(c[5].diag.cause, "storage") != 0, "storage blamed with 0 bytes read: %s", c[5].diag.text);

	/* With bytes read, storage is named, its off-CPU time counted at most up to the reads' busy time (8 of 10 s). */
	t->win.d.s[STAGE_READ].bytes = 1000000;
	diagnose_all(tm);
	CHECK_STR(c[5].diag.cause, "storage");
	CHECK_CONTAINS(c[5].diag.text, "workers wait on storage 80 % of their time");
	CHECK(telemetry_pct(5, 3) == 100.0 && telemetry_pct(3, 0) == 0.0 && telemetry_pct(UINT64_MAX, 1) == 100.0,
	      "telemetry_pct is not bounded");

	char worst[512];
	CHECK_INT(telemetry_worst(tm, worst, sizeof(worst)), DIAG_WARNING);
	/* Ties among warnings go to what the daemon saw itself (a stop), not to the highest stall a client reports. */
	CHECK_CONTAINS(worst, "feed web rank 3/6: stopped");
	for (unsigned i = 0; i < 6; i++)
		telemetry_client_detach(&c[i]);
	telemetry_free(tm);
	free(f);
}

int main(void)
{
	test_no_false_alarms();
	test_client_rules();
	test_starved_causes();
	test_straggler();
	test_feed_rules();
	test_sampling();
	return unit_exit("diagnosis");
}
