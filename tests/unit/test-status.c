/* SPDX-License-Identifier: MIT */
/*
 * The status document and the STATUS= line (daemon/server/status.c) are
 * rendered from a snapshot alone: this test fills a snapshot by hand, the way
 * server_snapshot() gets it from telemetry's, gpu's and the server's views,
 * and checks that each figure lands where docs/protocol.md section 10 puts
 * it, computed as documented (rates over the span, percentiles of the
 * histograms, the GPU copy rate), with nothing read from anywhere else.
 */
#include <jansson.h>
#include <limits.h>
#include <math.h>

#include "daemon/server/status.h"
#include "unit.h"

static double num(json_t *root, const char *path)
{
	json_t *v = root;
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
		v = json_is_array(v) ? json_array_get(v, (size_t)atoi(k)) : json_object_get(v, k);
	REQUIRE(v && json_is_number(v), "%s is not a number in the document", path);
	return json_number_value(v);
}

static const char *str(json_t *root, const char *path)
{
	json_t *v = root;
	char buf[256];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
		v = json_is_array(v) ? json_array_get(v, (size_t)atoi(k)) : json_object_get(v, k);
	return v && json_is_string(v) ? json_string_value(v) : NULL;
}

#define CHECK_NUM(root, path, expected)                                                                     \
	do {                                                                                                \
		double a_ = num(root, path), e_ = (expected);                                               \
		CHECK(fabs(a_ - e_) <= 1e-9 * fmax(1.0, fabs(e_)), "%s = %.9g, expected %.9g", path, a_, e_); \
	} while (0)

int main(void)
{
	struct conf_diagnosis conf = CONF_DIAGNOSIS_DEFAULTS;
	struct feed f = {
		.name = (char *)"web",
		.conf = { .format = (char *)"megatron", .seq_len = 8, .batch_size = 2 },
		.io_engine = (char *)"pread",
		.n_shards = 3,
		.bos_id = -1,
		.eos_id = 0,
	};
	struct feed *feeds[1] = { &f };
	struct status_feed fi = { .memory = 1 << 20, .clients = 1, .draining = true };
	fi.stages = (struct telemetry_stages_view){ .span_s = 10, .threads = 4, .worker_ns = 5000000000ull, .has_total = true };
	fi.stages.win.s[STAGE_JOB].items = 500;
	fi.stages.win.s[STAGE_READ].bytes = 20000000;
	fi.stages.win.s[STAGE_READ].busy_ns = 2000000000;
	fi.stages.win.s[STAGE_READ].offcpu_ns = 500000000;
	fi.stages.total.s[STAGE_PACK].bytes = 123456;
	fi.verdict = (struct telemetry_feed_view){ .diag = { .severity = DIAG_OK, .kind = "keeping-up", .text = "keeping up" } };

	/* One client: a window of 10 s, waits all in one bucket, two seconds of history, a GPU. */
	static uint64_t hw[FEED_HIST_BUCKETS], hs[FEED_HIST_BUCKETS], hh[FEED_HIST_BUCKETS];
	unsigned b = feed_hist_bucket(3000000); /* 3 ms */
	hw[b] = 100;
	hs[feed_hist_bucket(10000000)] = 100;
	struct sample hist[3] = { { .wait_ms = 1.2344f, .batches = 7, .fill = 3 }, { .wait_ms = 2.0f, .batches = 9, .held = 1 } };
	struct diag cd = { .severity = DIAG_WARNING, .kind = "starved", .cause = "tokenize", .needed_x = 1.5,
			   .text = "starved: waiting 23 %" };
	struct status_client c = {
		.id = 7, .pid = 1234, .uid = 1000, .name = "train.py", .feed = &f, .rank = 1, .world = 4, .ring_slots = 8,
		.first_batch = 5, .attached_ns = 20000000000ull, .published = 60, .delivered = 50, .wait_ns = 3000000000ull,
		.step_ns = 10000000000ull, .fill = 3, .full_ns = 2000000000ull, .tokens_per_s = 1500, .stall_pct_tick = 23,
		.stall_pct = 100.0 * 3 / 13, .gpu = true,
		.gpu_view = { .device = 1, .vmm = true, .memory_bytes = 4096,
			      .n = { .copies = 50, .bytes = 1000, .h2d_ns = 2000000, .timed = 40, .timed_bytes = 800000 } },
	};
	c.tv = (struct telemetry_client_view){
		.tracked = true,
		.window = { .span_s = 10, .batches = 100, .wait_ns = 300000000, .step_ns = 1000000000, .full_ns = 1000000000,
			    .hist_wait = hw, .hist_step = hs, .hist_h2d = hh },
		.since_attach = { .span_s = 20, .batches = 50, .wait_ns = 3000000000ull, .step_ns = 10000000000ull,
				  .hist_wait = hw, .hist_step = hs, .hist_h2d = hh },
		.ring_fill = 3, .held = 1, .hist = hist, .hist_cap = 3, .hist_head = 2, .hist_n = 2, .diag = &cd, .straggler = "",
	};
	/* hist_head 2 of 3: the oldest sample is hist[2], then hist[0]. */
	hist[2] = hist[0];
	hist[0] = hist[1];

	struct status_input in = {
		.socket_path = "/run/feedd.sock", .uptime_ns = 5000000000ull, .threads = 4, .threads_busy = 1,
		.io_engine = "pread", .io_fallback = -ENOSYS, .gpu_status = "unavailable: test",
		.feeds = feeds, .feed_info = &fi, .n_feeds = 1, .clients = &c, .n_clients = 1, .connections = 2,
		.ring_memory = 1 << 20, .counters = { .accepted = 3, .oversized = 1, .protocol_errors = 1 },
	};
	in.telemetry = (struct telemetry_daemon_view){ .conf = &conf, .pool_busy_pct = 12.5, .cpus = 2, .host_known = false,
						       .workers_cpu_per_s = NAN, .worst_severity = DIAG_WARNING };
	snprintf(in.telemetry.worst, sizeof(in.telemetry.worst), "feed web rank 1/4: starved: waiting 23 %%");

	unsigned longest = 0;
	char *text = status_json(&in, UINT_MAX, &longest);
	REQUIRE(text, "status_json failed");
	json_error_t err;
	json_t *root = json_loads(text, 0, &err);
	REQUIRE(root, "not JSON: %s", err.text);
	/* The four members, in the documented order. */
	CHECK(strncmp(text, "{\"daemon\":", 10) == 0, "document starts %.20s", text);
	const char *order[] = { "\"daemon\":", "\"feeds\":", "\"clients\":", "\"telemetry\":{\"window_s\"" };
	const char *at = text;
	for (unsigned i = 0; i < 4; i++) {
		const char *p = strstr(at, order[i]);
		CHECK(p != NULL, "%s missing or out of order", order[i]);
		at = p ? p : at;
	}

	CHECK_STR(str(root, "daemon.io_engine"), "pread");
	CHECK_CONTAINS(str(root, "daemon.io_fallback"), "io_uring unavailable");
	CHECK_NUM(root, "daemon.dropped.oversized", 1);
	CHECK_NUM(root, "daemon.ring_memory_bytes", 1 << 20);

	CHECK_NUM(root, "feeds.0.clients", 1);
	CHECK(json_is_true(json_object_get(json_array_get(json_object_get(root, "feeds"), 0), "draining")), "draining");
	CHECK_NUM(root, "feeds.0.stages.job.items_per_s", 50);
	CHECK_NUM(root, "feeds.0.stages.read.mb_per_s", 2);
	CHECK_NUM(root, "feeds.0.stages.read.offcpu_pct", 25);
	CHECK_NUM(root, "feeds.0.stages.workers.busy_threads", 0.5);
	CHECK_NUM(root, "feeds.0.stages.workers.ms_per_batch", 10);
	CHECK_NUM(root, "feeds.0.stages.pack.total_bytes", 123456);
	CHECK_STR(str(root, "feeds.0.diagnosis.kind"), "keeping-up");
	/* A verdict telemetry does not track yet has no stragglers list. */
	CHECK(!json_object_get(json_object_get(json_array_get(json_object_get(root, "feeds"), 0), "diagnosis"), "stragglers"),
	      "stragglers listed for an untracked feed");

	CHECK_STR(str(root, "clients.0.feed"), "web");
	CHECK_NUM(root, "clients.0.rank", 1);
	CHECK_NUM(root, "clients.0.ring_slots", 8);
	CHECK_NUM(root, "clients.0.ring_full_pct", 10);
	CHECK_STR(str(root, "clients.0.diagnosis.kind"), "starved");
	CHECK_STR(str(root, "clients.0.diagnosis.cause"), "tokenize");
	CHECK_NUM(root, "clients.0.diagnosis.needed_x", 1.5);
	CHECK_NUM(root, "clients.0.telemetry.window.batches_per_s", 10);
	CHECK_NUM(root, "clients.0.telemetry.window.stall_pct", 100.0 * 0.3 / 1.3);
	CHECK_NUM(root, "clients.0.telemetry.window.ring_full_pct", 10);
	/* The p50 of 100 waits in one bucket is that bucket's midpoint. */
	double lo = (double)feed_hist_lower(b), hi = (double)feed_hist_lower(b + 1);
	CHECK_NUM(root, "clients.0.telemetry.window.wait.p50_ms", (lo + hi) / 2 / 1e6);
	CHECK_NUM(root, "clients.0.telemetry.window.wait.mean_ms", 3);
	CHECK_NUM(root, "clients.0.telemetry.since_attach.span_s", 20);
	CHECK_NUM(root, "clients.0.telemetry.history.batches.0", 7);
	CHECK_NUM(root, "clients.0.telemetry.history.batches.1", 9);
	CHECK_NUM(root, "clients.0.telemetry.history.wait_ms.0", 1.234);
	CHECK_STR(str(root, "clients.0.gpu.export"), "vmm");
	CHECK_NUM(root, "clients.0.gpu.copies", 50);
	CHECK_NUM(root, "clients.0.gpu.h2d_gb_per_s", 0.4);

	CHECK_NUM(root, "telemetry.window_s", 60);
	CHECK_NUM(root, "telemetry.pool_busy_pct", 12.5);
	CHECK(json_is_null(json_object_get(json_object_get(json_object_get(root, "telemetry"), "host"), "runqueue_pct")),
	      "runqueue_pct not null without schedstat");
	CHECK_NUM(root, "telemetry.worst.severity", DIAG_WARNING);
	json_decref(root);
	free(text);

	char line[512];
	status_line(&in, line, sizeof(line));
	CHECK_STR(line, "1 feeds (0 failed, 1 draining), 1 clients, 1.5k tokens/s, worst stall 23.0% (web rank 1/4); "
			"feed web rank 1/4: starved: waiting 23 %");
	return unit_exit("status");
}
