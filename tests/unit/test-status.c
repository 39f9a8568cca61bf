/* SPDX-License-Identifier: MIT */
/*
 * The status document and the STATUS= line (daemon/server/status.c) are
 * rendered from a snapshot alone: this test fills a snapshot by hand, the way
 * server_snapshot() gets it from telemetry's, gpu's and the server's views,
 * and checks that each figure lands where docs/protocol.md section 10 puts
 * it, computed as documented (rates over the span, percentiles of the
 * histograms, the GPU copy rate), with nothing read from anywhere else.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/server/status.h"
#include "proto/wire.h"
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

/* The "clients" member of a document: from its '[' to the ']' before "telemetry". */
static char *clients_part(const char *text)
{
	const char *a = strstr(text, ",\"clients\":["), *b = strstr(text, "],\"telemetry\":{");
	if (!a || !b || b < a)
		return NULL;
	a += strlen(",\"clients\":");
	return strndup(a, (size_t)(b - a + 1));
}

/* Is the text what jansson makes of it again (reals, escapes, separators as json_dumps writes them)? */
static bool redumps_same(const char *text)
{
	json_t *root = json_loads(text, 0, NULL);
	char *again = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	bool same = again && strcmp(again, text) == 0;
	if (!same && again)
		for (size_t i = 0; text[i]; i++)
			if (text[i] != again[i]) {
				fprintf(stderr, "differs at %zu: %.60s | %.60s\n", i, text + i, again + i);
				break;
			}
	free(again);
	json_decref(root);
	return same;
}

/* The tree's output, long: */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
static const char golden_full[] =
	"[{\"id\":7,\"pid\":1234,\"uid\":1000,\"name\":\"train.py\",\"feed\":\"web\",\"rank\":1,\"world\":4,\"attache"
	"d_s\":20.0,\"first_batch\":5,\"batches_published\":60,\"batches_delivered\":50,\"ring_slots\":8,\"ring_fill\""
	":3,\"ring_full_pct\":10.0,\"tokens_per_s\":1500.0,\"wait_s\":3.0,\"step_s\":10.0,\"state\":\"streaming\",\"s"
	"tall_pct\":23.076923076923077,\"reports\":0,\"reported_step_s\":0.0,\"h2d_s\":0.0,\"reconnects\":0,\"reconne"
	"ct_s\":0.0,\"diagnosis\":{\"kind\":\"starved\",\"severity\":2,\"text\":\"starved: waiting 23 %\",\"cause\":\""
	"tokenize\",\"needed_x\":1.5,\"straggler\":null},\"telemetry\":{\"window\":{\"span_s\":10.0,\"batches\":100,\""
	"batches_per_s\":10.0,\"wait_s\":0.29999999999999999,\"step_s\":1.0,\"h2d_s\":0.0,\"reports\":0,\"stall_pct\""
	":23.076923076923077,\"h2d_pct_of_step\":0.0,\"ring_full_pct\":10.0,\"ring_empty_pct\":3.0,\"wait\":{\"count\""
	":100,\"mean_ms\":3.0,\"p50_ms\":2.8835839999999999,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.88358399999999"
	"99,\"max_ms\":2.8835839999999999},\"step\":{\"count\":100,\"mean_ms\":10.0,\"p50_ms\":9.4371840000000002,\"p"
	"95_ms\":9.4371840000000002,\"p99_ms\":9.4371840000000002,\"max_ms\":9.4371840000000002},\"h2d\":{\"count\":0"
	",\"mean_ms\":null,\"p50_ms\":null,\"p95_ms\":null,\"p99_ms\":null,\"max_ms\":null}},\"since_attach\":{\"span"
	"_s\":20.0,\"batches\":50,\"batches_per_s\":2.5,\"wait_s\":3.0,\"step_s\":10.0,\"h2d_s\":0.0,\"reports\":0,\""
	"stall_pct\":23.076923076923077,\"h2d_pct_of_step\":0.0,\"ring_full_pct\":0.0,\"ring_empty_pct\":15.0,\"wait\""
	":{\"count\":100,\"mean_ms\":30.0,\"p50_ms\":2.8835839999999999,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.88"
	"35839999999999,\"max_ms\":2.8835839999999999},\"step\":{\"count\":100,\"mean_ms\":100.0,\"p50_ms\":9.4371840"
	"000000002,\"p95_ms\":9.4371840000000002,\"p99_ms\":9.4371840000000002,\"max_ms\":9.4371840000000002},\"h2d\""
	":{\"count\":0,\"mean_ms\":null,\"p50_ms\":null,\"p95_ms\":null,\"p99_ms\":null,\"max_ms\":null}},\"ring_fill"
	"\":3,\"held\":1,\"history\":{\"interval_s\":1,\"wait_ms\":[1.234,2.0],\"step_ms\":[0.0,0.0],\"h2d_ms\":[0.0,"
	"0.0],\"batches\":[7,9],\"ring_full_pct\":[0.0,0.0],\"ring_fill\":[3,0],\"held\":[0,1],\"omitted\":0}},\"gpu\""
	":{\"device\":1,\"export\":\"vmm\",\"memory_bytes\":4096,\"copies\":50,\"h2d_bytes\":1000,\"events_waited\":0"
	",\"h2d_ms\":2.0,\"copies_timed\":40,\"h2d_gb_per_s\":0.40000000000000002,\"refills_deferred\":0},\"stuck\":f"
	"alse,\"idle_s\":0.0,\"memory_bytes\":0,\"epoch\":0},{\"id\":8,\"pid\":-1,\"uid\":-2,\"name\":\"x\\\"\\\\\\n/"
	"\342\202\254\177\",\"feed\":\"web\",\"rank\":0,\"world\":0,\"attached_s\":0.0,\"first_batch\":0,\"batches_pu"
	"blished\":0,\"batches_delivered\":0,\"ring_slots\":0,\"ring_fill\":0,\"ring_full_pct\":0.0,\"tokens_per_s\":"
	"0.10000000000000001,\"wait_s\":1.0000000000000001e-9,\"step_s\":0.0,\"state\":\"failed\",\"stall_pct\":0.0,\""
	"reports\":0,\"reported_step_s\":0.0,\"h2d_s\":0.0,\"reconnects\":9223372036854775807,\"reconnect_s\":0.0,\"d"
	"iagnosis\":null,\"telemetry\":null,\"gpu\":null,\"stuck\":true,\"idle_s\":1.0000000000000001e-9,\"memory_byt"
	"es\":1099511627776,\"epoch\":3},{\"id\":9,\"pid\":1234,\"uid\":1000,\"name\":\"train.py\",\"feed\":\"web\",\""
	"rank\":1,\"world\":4,\"attached_s\":20.0,\"first_batch\":5,\"batches_published\":60,\"batches_delivered\":50"
	",\"ring_slots\":8,\"ring_fill\":3,\"ring_full_pct\":10.0,\"tokens_per_s\":1.0000000000000001e300,\"wait_s\":"
	"3.0,\"step_s\":10.0,\"state\":\"streaming\",\"reports\":0,\"reported_step_s\":0.0,\"h2d_s\":0.0,\"reconnects"
	"\":0,\"reconnect_s\":0.0,\"diagnosis\":{\"kind\":\"warming-up\",\"severity\":0,\"text\":\"a \\\"quoted\\\"\\"
	"ttab \\\\ /slash\\u0001 \303\251\",\"cause\":null,\"needed_x\":null,\"straggler\":\"rank 3 is 2.5x slower\"}"
	",\"telemetry\":{\"window\":{\"span_s\":0.0,\"batches\":100,\"batches_per_s\":0.0,\"wait_s\":0.29999999999999"
	"999,\"step_s\":1.0,\"h2d_s\":0.0,\"reports\":0,\"stall_pct\":23.076923076923077,\"h2d_pct_of_step\":0.0,\"ri"
	"ng_full_pct\":0.0,\"ring_empty_pct\":0.0,\"wait\":{\"count\":100,\"mean_ms\":3.0,\"p50_ms\":2.88358399999999"
	"99,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.8835839999999999,\"max_ms\":2.8835839999999999},\"step\":{\"co"
	"unt\":100,\"mean_ms\":10.0,\"p50_ms\":9.4371840000000002,\"p95_ms\":9.4371840000000002,\"p99_ms\":9.43718400"
	"00000002,\"max_ms\":9.4371840000000002},\"h2d\":{\"count\":0,\"mean_ms\":null,\"p50_ms\":null,\"p95_ms\":nul"
	"l,\"p99_ms\":null,\"max_ms\":null}},\"since_attach\":{\"span_s\":20.0,\"batches\":50,\"batches_per_s\":2.5,\""
	"wait_s\":3.0,\"step_s\":10.0,\"h2d_s\":0.0,\"reports\":0,\"stall_pct\":23.076923076923077,\"h2d_pct_of_step\""
	":0.0,\"ring_full_pct\":0.0,\"ring_empty_pct\":15.0,\"wait\":{\"count\":100,\"mean_ms\":30.0,\"p50_ms\":2.883"
	"5839999999999,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.8835839999999999,\"max_ms\":2.8835839999999999},\"s"
	"tep\":{\"count\":100,\"mean_ms\":100.0,\"p50_ms\":9.4371840000000002,\"p95_ms\":9.4371840000000002,\"p99_ms\""
	":9.4371840000000002,\"max_ms\":9.4371840000000002},\"h2d\":{\"count\":0,\"mean_ms\":null,\"p50_ms\":null,\"p"
	"95_ms\":null,\"p99_ms\":null,\"max_ms\":null}},\"ring_fill\":3,\"held\":1,\"history\":{\"interval_s\":1,\"wa"
	"it_ms\":[0.0,0.5,30000000.0],\"step_ms\":[0.0,0.0,0.0,0.0],\"h2d_ms\":[0.0,0.0,0.0],\"batches\":[0,1,0,40000"
	"00000],\"ring_full_pct\":[0.0,0.0,33.299999999999997,0.0],\"ring_fill\":[0,0,0,65535],\"held\":[0,0,0,0],\"o"
	"mitted\":0}},\"gpu\":{\"device\":1,\"export\":\"vmm\",\"memory_bytes\":4096,\"copies\":50,\"h2d_bytes\":1000"
	",\"events_waited\":0,\"h2d_ms\":0.0,\"copies_timed\":40,\"h2d_gb_per_s\":null,\"refills_deferred\":0},\"stuc"
	"k\":false,\"idle_s\":0.0,\"memory_bytes\":0,\"epoch\":0}]";
static const char golden_trimmed[] =
	"[{\"id\":7,\"pid\":1234,\"uid\":1000,\"name\":\"train.py\",\"feed\":\"web\",\"rank\":1,\"world\":4,\"attache"
	"d_s\":20.0,\"first_batch\":5,\"batches_published\":60,\"batches_delivered\":50,\"ring_slots\":8,\"ring_fill\""
	":3,\"ring_full_pct\":10.0,\"tokens_per_s\":1500.0,\"wait_s\":3.0,\"step_s\":10.0,\"state\":\"streaming\",\"s"
	"tall_pct\":23.076923076923077,\"reports\":0,\"reported_step_s\":0.0,\"h2d_s\":0.0,\"reconnects\":0,\"reconne"
	"ct_s\":0.0,\"diagnosis\":{\"kind\":\"starved\",\"severity\":2,\"text\":\"starved: waiting 23 %\",\"cause\":\""
	"tokenize\",\"needed_x\":1.5,\"straggler\":null},\"telemetry\":{\"window\":{\"span_s\":10.0,\"batches\":100,\""
	"batches_per_s\":10.0,\"wait_s\":0.29999999999999999,\"step_s\":1.0,\"h2d_s\":0.0,\"reports\":0,\"stall_pct\""
	":23.076923076923077,\"h2d_pct_of_step\":0.0,\"ring_full_pct\":10.0,\"ring_empty_pct\":3.0,\"wait\":{\"count\""
	":100,\"mean_ms\":3.0,\"p50_ms\":2.8835839999999999,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.88358399999999"
	"99,\"max_ms\":2.8835839999999999},\"step\":{\"count\":100,\"mean_ms\":10.0,\"p50_ms\":9.4371840000000002,\"p"
	"95_ms\":9.4371840000000002,\"p99_ms\":9.4371840000000002,\"max_ms\":9.4371840000000002},\"h2d\":{\"count\":0"
	",\"mean_ms\":null,\"p50_ms\":null,\"p95_ms\":null,\"p99_ms\":null,\"max_ms\":null}},\"since_attach\":{\"span"
	"_s\":20.0,\"batches\":50,\"batches_per_s\":2.5,\"wait_s\":3.0,\"step_s\":10.0,\"h2d_s\":0.0,\"reports\":0,\""
	"stall_pct\":23.076923076923077,\"h2d_pct_of_step\":0.0,\"ring_full_pct\":0.0,\"ring_empty_pct\":15.0,\"wait\""
	":{\"count\":100,\"mean_ms\":30.0,\"p50_ms\":2.8835839999999999,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.88"
	"35839999999999,\"max_ms\":2.8835839999999999},\"step\":{\"count\":100,\"mean_ms\":100.0,\"p50_ms\":9.4371840"
	"000000002,\"p95_ms\":9.4371840000000002,\"p99_ms\":9.4371840000000002,\"max_ms\":9.4371840000000002},\"h2d\""
	":{\"count\":0,\"mean_ms\":null,\"p50_ms\":null,\"p95_ms\":null,\"p99_ms\":null,\"max_ms\":null}},\"ring_fill"
	"\":3,\"held\":1,\"history\":{\"interval_s\":1,\"wait_ms\":[1.234,2.0],\"step_ms\":[0.0,0.0],\"h2d_ms\":[0.0,"
	"0.0],\"batches\":[7,9],\"ring_full_pct\":[0.0,0.0],\"ring_fill\":[3,0],\"held\":[0,1],\"omitted\":0}},\"gpu\""
	":{\"device\":1,\"export\":\"vmm\",\"memory_bytes\":4096,\"copies\":50,\"h2d_bytes\":1000,\"events_waited\":0"
	",\"h2d_ms\":2.0,\"copies_timed\":40,\"h2d_gb_per_s\":0.40000000000000002,\"refills_deferred\":0},\"stuck\":f"
	"alse,\"idle_s\":0.0,\"memory_bytes\":0,\"epoch\":0},{\"id\":8,\"pid\":-1,\"uid\":-2,\"name\":\"x\\\"\\\\\\n/"
	"\342\202\254\177\",\"feed\":\"web\",\"rank\":0,\"world\":0,\"attached_s\":0.0,\"first_batch\":0,\"batches_pu"
	"blished\":0,\"batches_delivered\":0,\"ring_slots\":0,\"ring_fill\":0,\"ring_full_pct\":0.0,\"tokens_per_s\":"
	"0.10000000000000001,\"wait_s\":1.0000000000000001e-9,\"step_s\":0.0,\"state\":\"failed\",\"stall_pct\":0.0,\""
	"reports\":0,\"reported_step_s\":0.0,\"h2d_s\":0.0,\"reconnects\":9223372036854775807,\"reconnect_s\":0.0,\"d"
	"iagnosis\":null,\"telemetry\":null,\"gpu\":null,\"stuck\":true,\"idle_s\":1.0000000000000001e-9,\"memory_byt"
	"es\":1099511627776,\"epoch\":3},{\"id\":9,\"pid\":1234,\"uid\":1000,\"name\":\"train.py\",\"feed\":\"web\",\""
	"rank\":1,\"world\":4,\"attached_s\":20.0,\"first_batch\":5,\"batches_published\":60,\"batches_delivered\":50"
	",\"ring_slots\":8,\"ring_fill\":3,\"ring_full_pct\":10.0,\"tokens_per_s\":1.0000000000000001e300,\"wait_s\":"
	"3.0,\"step_s\":10.0,\"state\":\"streaming\",\"reports\":0,\"reported_step_s\":0.0,\"h2d_s\":0.0,\"reconnects"
	"\":0,\"reconnect_s\":0.0,\"diagnosis\":{\"kind\":\"warming-up\",\"severity\":0,\"text\":\"a \\\"quoted\\\"\\"
	"ttab \\\\ /slash\\u0001 \303\251\",\"cause\":null,\"needed_x\":null,\"straggler\":\"rank 3 is 2.5x slower\"}"
	",\"telemetry\":{\"window\":{\"span_s\":0.0,\"batches\":100,\"batches_per_s\":0.0,\"wait_s\":0.29999999999999"
	"999,\"step_s\":1.0,\"h2d_s\":0.0,\"reports\":0,\"stall_pct\":23.076923076923077,\"h2d_pct_of_step\":0.0,\"ri"
	"ng_full_pct\":0.0,\"ring_empty_pct\":0.0,\"wait\":{\"count\":100,\"mean_ms\":3.0,\"p50_ms\":2.88358399999999"
	"99,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.8835839999999999,\"max_ms\":2.8835839999999999},\"step\":{\"co"
	"unt\":100,\"mean_ms\":10.0,\"p50_ms\":9.4371840000000002,\"p95_ms\":9.4371840000000002,\"p99_ms\":9.43718400"
	"00000002,\"max_ms\":9.4371840000000002},\"h2d\":{\"count\":0,\"mean_ms\":null,\"p50_ms\":null,\"p95_ms\":nul"
	"l,\"p99_ms\":null,\"max_ms\":null}},\"since_attach\":{\"span_s\":20.0,\"batches\":50,\"batches_per_s\":2.5,\""
	"wait_s\":3.0,\"step_s\":10.0,\"h2d_s\":0.0,\"reports\":0,\"stall_pct\":23.076923076923077,\"h2d_pct_of_step\""
	":0.0,\"ring_full_pct\":0.0,\"ring_empty_pct\":15.0,\"wait\":{\"count\":100,\"mean_ms\":30.0,\"p50_ms\":2.883"
	"5839999999999,\"p95_ms\":2.8835839999999999,\"p99_ms\":2.8835839999999999,\"max_ms\":2.8835839999999999},\"s"
	"tep\":{\"count\":100,\"mean_ms\":100.0,\"p50_ms\":9.4371840000000002,\"p95_ms\":9.4371840000000002,\"p99_ms\""
	":9.4371840000000002,\"max_ms\":9.4371840000000002},\"h2d\":{\"count\":0,\"mean_ms\":null,\"p50_ms\":null,\"p"
	"95_ms\":null,\"p99_ms\":null,\"max_ms\":null}},\"ring_fill\":3,\"held\":1,\"history\":{\"interval_s\":1,\"wa"
	"it_ms\":[0.5,30000000.0],\"step_ms\":[0.0,0.0],\"h2d_ms\":[0.0,0.0],\"batches\":[0,4000000000],\"ring_full_p"
	"ct\":[33.299999999999997,0.0],\"ring_fill\":[0,65535],\"held\":[0,0],\"omitted\":2}},\"gpu\":{\"device\":1,\""
	"export\":\"vmm\",\"memory_bytes\":4096,\"copies\":50,\"h2d_bytes\":1000,\"events_waited\":0,\"h2d_ms\":0.0,\""
	"copies_timed\":40,\"h2d_gb_per_s\":null,\"refills_deferred\":0},\"stuck\":false,\"idle_s\":0.0,\"memory_byte"
	"s\":0,\"epoch\":0}]";
#pragma GCC diagnostic pop

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

	char *text = status_json(&in, 0, UINT_MAX, NULL);
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
	/*
	 * The clients array, written without a jansson tree, is byte for byte
	 * what the tree made of it: the golden text below is the tree's output
	 * (add a field to both when one is added). Odd clients too: untracked,
	 * escapes and UTF-8 in names, NaN and infinite samples (jansson left
	 * those out), tiny and huge reals, a name that is not UTF-8 (the whole
	 * client left out, as json_pack did).
	 */
	struct sample hist3[4] = { { .wait_ms = NAN, .step_ms = 1e-7f, .batches = 1 }, { .wait_ms = 0.5f, .h2d_ms = INFINITY, .full_pct = 33.3f },
				   { .wait_ms = 3e7f, .batches = 4000000000u, .fill = 65535 } };
	struct diag cd3 = { .severity = DIAG_OK, .kind = NULL, .text = "a \"quoted\"\ttab \\ /slash\x01 \xc3\xa9", .needed_x = INFINITY };
	struct status_client cs[4] = { c, c, c, c };
	cs[1] = (struct status_client){ .id = 8, .pid = -1, .uid = 4294967294u, .name = "x\"\\\n/\xe2\x82\xac\x7f", .feed = &f,
					.failed = true, .stuck = true, .idle_ns = 1, .wait_ns = 1, .tokens_per_s = 0.1,
					.reconnects = UINT64_MAX, .epoch = 3, .memory = 1ull << 40 };
	cs[2].id = 9;
	cs[2].tokens_per_s = 1e300;
	cs[2].stall_pct = NAN;
	cs[2].gpu_view.n.h2d_ns = 0;
	cs[2].tv.diag = &cd3;
	cs[2].tv.straggler = "rank 3 is 2.5x slower";
	cs[2].tv.hist = hist3;
	cs[2].tv.hist_cap = 4;
	cs[2].tv.hist_head = 3;
	cs[2].tv.hist_n = 4;
	cs[2].tv.window.span_s = 0;
	cs[3].name = "bad \xff utf-8";
	in.clients = cs;
	in.n_clients = 4;
	for (unsigned keep = 0; keep < 2; keep++) {
		struct status_render st = { 0 };
		char *t = status_json(&in, 0, keep ? 2 : UINT_MAX, &st);
		REQUIRE(t, "status_json failed");
		CHECK(redumps_same(t), "the document is not what json_dumps writes (history_max %u)", keep ? 2 : UINT_MAX);
		char *part = clients_part(t);
		CHECK(part != NULL, "no clients array");
		if (getenv("STATUS_PRINT_CLIENTS"))
			printf("%s\n", part ? part : "");
		CHECK(part && strcmp(part, keep ? golden_trimmed : golden_full) == 0, "clients array differs (keep %u):\n%s", keep,
		      part ? part : "");
		CHECK(st.longest == 4, "longest history %u, expected 4", st.longest);
		free(part);
		free(t);
	}

	/*
	 * What a STATUS's flags leave out (feedctl status asks for neither):
	 * gone, key and all, from every tracked client, and the rest the same
	 * bytes as the whole document's with those members cut out.
	 */
	{
		char *whole = status_json(&in, 0, UINT_MAX, NULL);
		char *cut = status_json(&in, WIRE_STATUS_NO_HISTORY | WIRE_STATUS_NO_SINCE_ATTACH, UINT_MAX, NULL);
		REQUIRE(whole && cut, "status_json failed");
		CHECK(redumps_same(cut), "the document without history is not what json_dumps writes");
		json_t *w = json_loads(whole, 0, &err), *k = json_loads(cut, 0, &err);
		REQUIRE(w && k, "not JSON: %s", err.text);
		json_t *wc = json_object_get(w, "clients"), *kc = json_object_get(k, "clients");
		CHECK(json_array_size(kc) == json_array_size(wc) && json_array_size(kc) == 3, "%zu clients, expected 3",
		      json_array_size(kc));
		for (size_t i = 0; i < json_array_size(wc); i++) {
			json_t *t = json_object_get(json_array_get(wc, i), "telemetry");
			if (json_is_object(t)) {
				json_object_del(t, "history");
				json_object_del(t, "since_attach");
			}
		}
		CHECK(json_equal(w, k), "the document without history differs from the whole one in more than those");
		CHECK(strlen(cut) < strlen(whole), "leaving out made it no smaller");
		json_decref(w);
		json_decref(k);
		free(whole);
		free(cut);
	}

	/*
	 * The cost of the document of 1,000 tracked clients with 10 s of history
	 * each (clients that come and go, as in bench/loadtest) and with 600 s
	 * (history_s's default): printed, not checked.
	 */
	enum { N = 1000, H = 600 };
	struct status_client *many = calloc(N, sizeof(*many));
	struct sample *h600 = calloc(H, sizeof(*h600));
	REQUIRE(many && h600, "out of memory");
	/* Reals of every magnitude in the history (written without printf where that gives the same bytes). */
	uint64_t seed = 42;
	for (unsigned i = 0; i < H; i++) {
		float v[4];
		for (unsigned k = 0; k < 4; k++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			double u = (double)(seed >> 11) / 9007199254740992.0;
			v[k] = (float)(u * pow(10.0, (double)((seed >> 3) % 12) - 4.0));
		}
		h600[i] = (struct sample){ .wait_ms = v[0], .step_ms = v[1], .h2d_ms = v[2], .full_pct = fmodf(v[3], 100.0f),
					   .batches = i, .fill = 1, .held = 2 };
	}
	for (unsigned i = 0; i < 50; i++) {
		many[i] = c;
		many[i].tv.hist = h600;
		many[i].tv.hist_cap = H;
		many[i].tv.hist_head = i * 7 % H;
		many[i].tv.hist_n = H;
	}
	in.clients = many;
	in.n_clients = 50;
	char *rnd = status_json(&in, 0, UINT_MAX, NULL);
	REQUIRE(rnd, "status_json failed");
	CHECK(redumps_same(rnd), "random history reals are not what json_dumps writes");
	free(rnd);

	for (unsigned i = 0; i < H; i++)
		h600[i] = (struct sample){ .wait_ms = 0.001f * (float)i, .step_ms = 12.5f + (float)(i % 7), .h2d_ms = 0.25f,
					   .full_pct = (float)(i % 100), .batches = i % 50, .fill = (uint16_t)(i % 8), .held = 1 };
	size_t brief_len = 0;
	for (unsigned hn = 10; hn <= H; hn += H - 10) {
	for (unsigned i = 0; i < N; i++) {
		many[i] = c;
		many[i].id = i;
		many[i].rank = i % 125;
		many[i].world = 125;
		many[i].tv.hist = h600;
		many[i].tv.hist_cap = H;
		many[i].tv.hist_head = i % H;
		many[i].tv.hist_n = hn;
	}
	in.clients = many;
	in.n_clients = N;
	double best = INFINITY;
	size_t len = 0;
	for (unsigned r = 0; r < 5; r++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		char *t = status_json(&in, 0, UINT_MAX, NULL);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		REQUIRE(t, "status_json failed");
		len = strlen(t);
		free(t);
		best = fmin(best, (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
	}
	printf("status_json: %u clients x %u s of history: %.1f ms (best of 5), %zu bytes\n", N, hn, best, len);

	/*
	 * What a STATUS answers in a reply of 16 MiB: the whole document when
	 * it fits; else each client's newest history, as much as fits, found
	 * without rendering the whole first. Timed against what was done
	 * before: whole, then without history, then trimmed.
	 */
	best = INFINITY;
	double before = INFINITY;
	for (unsigned r = 0; r < 3; r++) {
		struct timespec t0, t1, t2;
		char *t = NULL;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		int e = status_json_fit(&in, 0, WIRE_MAX_REPLY, &t);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		REQUIRE(e == 0, "status_json_fit: %d", e);
		size_t fl = strlen(t);
		CHECK(fl <= WIRE_MAX_REPLY, "%zu bytes over the reply's %u", fl, WIRE_MAX_REPLY);
		if (len <= WIRE_MAX_REPLY)
			CHECK(fl == len, "a document that fits was cut: %zu of %zu bytes", fl, len);
		else
			CHECK(fl > WIRE_MAX_REPLY / 8 * 7, "cut to %zu bytes, far below the reply's %u", fl, WIRE_MAX_REPLY);
		free(t);
		/* The former way, for the figure: the whole, and when over, the base and one trimmed render. */
		struct status_render st = { 0 };
		char *a = status_json(&in, 0, UINT_MAX, &st);
		char *a0 = len > WIRE_MAX_REPLY ? status_json(&in, 0, 0, NULL) : NULL;
		char *a1 = len > WIRE_MAX_REPLY ? status_json(&in, 0, st.longest * 5 / 8, NULL) : NULL;
		clock_gettime(CLOCK_MONOTONIC, &t2);
		free(a);
		free(a0);
		free(a1);
		best = fmin(best, (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
		before = fmin(before, (double)(t2.tv_sec - t1.tv_sec) * 1e3 + (double)(t2.tv_nsec - t1.tv_nsec) / 1e6);
	}
	printf("status_json_fit: %u clients x %u s of history in %u MiB: %.1f ms (best of 3; before: %.1f ms)\n",
	       N, hn, WIRE_MAX_REPLY >> 20, best, before);

	/* What feedctl status asks for: the same size whatever the history's length. */
	char *brief = NULL;
	REQUIRE(status_json_fit(&in, WIRE_STATUS_NO_HISTORY | WIRE_STATUS_NO_SINCE_ATTACH, WIRE_MAX_REPLY, &brief) == 0,
		"status_json_fit without history failed");
	if (hn == 10)
		brief_len = strlen(brief);
	else
		CHECK(strlen(brief) == brief_len, "without history: %zu bytes with %u s of it, %zu with 10 s", strlen(brief),
		      hn, brief_len);
	printf("status_json_fit without history and since_attach: %u clients: %zu bytes\n", N, strlen(brief));
	free(brief);
	}

	/* At the limit: whole at exactly its length, cut one byte below it, refused when nothing fits. */
	in.n_clients = 40;
	char *whole = status_json(&in, 0, UINT_MAX, NULL), *t = NULL;
	REQUIRE(whole, "status_json failed");
	size_t wl = strlen(whole);
	REQUIRE(status_json_fit(&in, 0, wl, &t) == 0, "status_json_fit at the whole length failed");
	CHECK(strcmp(t, whole) == 0, "the document that fits exactly was changed");
	free(t);
	REQUIRE(status_json_fit(&in, 0, wl - 1, &t) == 0, "status_json_fit a byte short failed");
	json_t *cut = json_loads(t, 0, &err);
	CHECK(strlen(t) <= wl - 1 && cut, "a byte short: %zu bytes, %s", strlen(t), cut ? "JSON" : err.text);
	CHECK(cut && num(cut, "clients.0.telemetry.history.omitted") >= 1, "nothing omitted from the history");
	CHECK(cut && num(cut, "clients.39.telemetry.history.omitted") == num(cut, "clients.0.telemetry.history.omitted"),
	      "clients' history cut unevenly");
	json_decref(cut);
	free(t);
	char *base = status_json(&in, 0, 0, NULL);
	REQUIRE(base, "status_json failed");
	CHECK(status_json_fit(&in, 0, strlen(base) - 1, &t) == -EMSGSIZE, "no -EMSGSIZE below the document without history");
	free(base);
	free(whole);
	free(many);
	free(h600);
	return unit_exit("status");
}
