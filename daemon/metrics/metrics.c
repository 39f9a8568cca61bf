/* SPDX-License-Identifier: MIT */
/*
 * The metrics endpoint and the exposition text (metrics.h). Names follow
 * Prometheus' conventions: the feedd_ prefix, base units (seconds, bytes),
 * _total on counters, a HELP and a TYPE line before each family, and every
 * sample of a family together. Label values are escaped as the format says
 * (backslash, double quote, newline).
 *
 * Client series carry feed, rank and world: a trainer restarted on the same
 * rank continues the same series (a pid or connection id would start new ones
 * at every restart, unbounded for alerting and recording rules). One process
 * may hold two connections for the same rank, and two series with the same
 * labels would make the whole scrape invalid: the second and later get
 * conn="2", "3", ... in the order status lists them.
 *
 * The wait histogram is the consumer page's log-linear histogram (4 buckets
 * per power of two, in ns) folded into one Prometheus bucket per power of
 * two from 2^10 ns to 2^34 ns: every `le` is a boundary of the ring's
 * buckets, so the counts are exact, not interpolated. Ring buckets are
 * half-open, [lo, hi): `le` = 2^k ns counts the waits below 2^k ns, which at
 * nanosecond resolution is the waits of at most 2^k - 1 ns.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "config.h"
#include "daemon/metrics/metrics.h"
#include "daemon/server/server.h"
#include "daemon/telemetry/telemetry.h" /* the stage views it renders */
#include "proto/macro.h"

#define HIST_FIRST_POW 10 /* 1.024 us */
#define HIST_LAST_POW 34  /* 17.2 s */

struct metrics {
	struct evhttp *http;
	struct server *srv;
	char address[INET6_ADDRSTRLEN + 16];
	struct metrics_self self;
};

/* The output buffer and whether any append failed (checked once at the end). */
struct out {
	struct evbuffer *b;
	bool failed;
};

static void put(struct out *o, const char *fmt, ...) _printf_(2, 3);
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (evbuffer_add_vprintf(o->b, fmt, ap) < 0)
		o->failed = true;
	va_end(ap);
}

static void family(struct out *o, const char *name, const char *type, const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Seconds from nanoseconds, exactly: "12.000345678". */
static const char *secs(uint64_t ns, char buf[static 32])
{
	snprintf(buf, 32, "%" PRIu64 ".%09" PRIu64, ns / NSEC_PER_SEC, ns % NSEC_PER_SEC);
	return buf;
}

/* A float as the format spells it: NaN, +Inf, -Inf, or the shortest exact decimal. */
static const char *num(double v, char buf[static 32])
{
	if (isnan(v))
		return "NaN";
	if (isinf(v))
		return v > 0 ? "+Inf" : "-Inf";
	snprintf(buf, 32, "%.17g", v);
	return buf;
}

/* Appends v to a label string, escaped; returns the new length (capped at cap - 1). */
static size_t escape(char *buf, size_t len, size_t cap, const char *v)
{
	for (; *v && len + 3 < cap; v++) {
		if (*v == '\\' || *v == '"') {
			buf[len++] = '\\';
			buf[len++] = *v;
		} else if (*v == '\n') {
			buf[len++] = '\\';
			buf[len++] = 'n';
		} else {
			buf[len++] = *v;
		}
	}
	buf[len] = 0;
	return len;
}

/* feed="name" */
static void feed_labels(const struct feed *f, char *buf, size_t cap)
{
	size_t n = (size_t)snprintf(buf, cap, "feed=\"");
	n = escape(buf, n, cap, f->name);
	snprintf(buf + n, cap - n, "\"");
}

/* feed="name",rank="r",world="w", and conn="n" for the n-th connection (n >= 2) on the same feed, rank and world */
static void client_labels(const struct status_client *c, unsigned dup, char *buf, size_t cap)
{
	size_t n = (size_t)snprintf(buf, cap, "feed=\"");
	n = escape(buf, n, cap, c->feed->name);
	n += (size_t)snprintf(buf + n, cap - n, "\",rank=\"%u\",world=\"%u\"", c->rank, c->world);
	if (dup > 1 && n < cap)
		snprintf(buf + n, cap - n, ",conn=\"%u\"", dup);
}

#define LABELS_MAX 640 /* a feed name is a config section name: far shorter */

static void render_daemon(struct out *o, const struct status_input *in, const struct metrics_self *self)
{
	char a[32];
	const struct server_counters *n = &in->counters;
	family(o, "feedd_build_info", "gauge", "The feedd version running; always 1.");
	put(o, "feedd_build_info{version=\"%s\",systemd=\"%s\"} 1\n", FEEDD_VERSION, HAVE_SYSTEMD ? "yes" : "no");
	family(o, "feedd_uptime_seconds", "gauge", "Seconds since feedd started serving.");
	put(o, "feedd_uptime_seconds %s\n", secs(in->uptime_ns, a));
	family(o, "feedd_gpu_available", "gauge", "1 when batches can be staged on a GPU, 0 in host-only mode.");
	put(o, "feedd_gpu_available %d\n", in->gpu_available ? 1 : 0);
	family(o, "feedd_worker_threads", "gauge", "Threads of the worker pool.");
	put(o, "feedd_worker_threads %u\n", in->threads);
	family(o, "feedd_worker_threads_busy", "gauge", "Worker threads running a job now.");
	put(o, "feedd_worker_threads_busy %u\n", in->threads_busy);
	family(o, "feedd_worker_jobs_queued", "gauge", "Jobs waiting for a worker thread.");
	put(o, "feedd_worker_jobs_queued %u\n", in->jobs_queued);
	family(o, "feedd_clients", "gauge", "Clients attached to a feed.");
	put(o, "feedd_clients %zu\n", in->n_clients);
	family(o, "feedd_connections", "gauge", "Open connections on the control socket, attached or not.");
	put(o, "feedd_connections %zu\n", in->connections);
	family(o, "feedd_connections_accepted_total", "counter", "Connections accepted, refused ones included.");
	put(o, "feedd_connections_accepted_total %" PRIu64 "\n", n->accepted);
	family(o, "feedd_connections_refused_total", "counter",
	       "Connections or requests refused: credentials (allow lists), limit (connection limits), "
	       "memory (ring memory limits, at attach), admin (reload or drain from an unprivileged peer).");
	put(o, "feedd_connections_refused_total{reason=\"credentials\"} %" PRIu64 "\n", n->refused_credentials);
	put(o, "feedd_connections_refused_total{reason=\"limit\"} %" PRIu64 "\n", n->refused_limit);
	put(o, "feedd_connections_refused_total{reason=\"memory\"} %" PRIu64 "\n", n->refused_memory);
	put(o, "feedd_connections_refused_total{reason=\"admin\"} %" PRIu64 "\n", n->refused_admin);
	family(o, "feedd_connections_dropped_total", "counter", "Connections dropped for breaking the protocol, by what they did.");
	static const struct {
		const char *reason;
		size_t off;
	} dropped[] = {
		{ "bad_magic", offsetof(struct server_counters, bad_magic) },
		{ "bad_version", offsetof(struct server_counters, bad_version) },
		{ "unknown_type", offsetof(struct server_counters, unknown_type) },
		{ "oversized", offsetof(struct server_counters, oversized) },
		{ "bad_message", offsetof(struct server_counters, bad_message) },
		{ "passed_fds", offsetof(struct server_counters, passed_fds) },
		{ "unread_output", offsetof(struct server_counters, unread_output) },
		{ "ring_protocol", offsetof(struct server_counters, ring_protocol) },
	};
	for (size_t i = 0; i < ARRAY_SIZE(dropped); i++)
		put(o, "feedd_connections_dropped_total{reason=\"%s\"} %" PRIu64 "\n", dropped[i].reason,
		    *(const uint64_t *)((const char *)n + dropped[i].off));
	family(o, "feedd_clients_reaped_total", "counter", "Connections closed because the client process exited.");
	put(o, "feedd_clients_reaped_total %" PRIu64 "\n", n->clients_reaped);
	family(o, "feedd_stuck_clients_total", "counter", "Times a client was reported for releasing no batch for stuck_client_s.");
	put(o, "feedd_stuck_clients_total %" PRIu64 "\n", n->stuck_clients);
	family(o, "feedd_ring_memory_bytes", "gauge", "Shared memory held by all clients' rings.");
	put(o, "feedd_ring_memory_bytes %" PRIu64 "\n", in->ring_memory);
	family(o, "feedd_metrics_scrapes_total", "counter", "Scrapes of this endpoint answered before this one.");
	put(o, "feedd_metrics_scrapes_total %" PRIu64 "\n", self->scrapes);
	family(o, "feedd_metrics_scrape_duration_seconds", "gauge",
	       "Time the previous scrape took to take the snapshot and render it.");
	put(o, "feedd_metrics_scrape_duration_seconds %s\n", secs(self->scrape_ns, a));
	const struct remote_stats *x = &in->fetch;
	family(o, "feedd_fetch_bytes_total", "counter", "Bytes fetched from object storage (all feeds: one fetcher per node)");
	put(o, "feedd_fetch_bytes_total %" PRIu64 "\n", x->bytes);
	family(o, "feedd_fetch_requests_total", "counter", "HTTP requests sent to object storage, retries included");
	put(o, "feedd_fetch_requests_total %" PRIu64 "\n", x->requests);
	family(o, "feedd_fetch_retries_total", "counter", "Requests retried (5xx, 429, resets, timeouts, short bodies)");
	put(o, "feedd_fetch_retries_total %" PRIu64 "\n", x->retries);
	family(o, "feedd_fetch_throttled_total", "counter", "Answers 429 or 503 from object storage");
	put(o, "feedd_fetch_throttled_total %" PRIu64 "\n", x->throttled);
	family(o, "feedd_fetch_errors_total", "counter", "Requests that failed for good");
	put(o, "feedd_fetch_errors_total %" PRIu64 "\n", x->errors);
	family(o, "feedd_fetch_in_flight", "gauge", "Requests to object storage in flight");
	put(o, "feedd_fetch_in_flight %u\n", x->inflight);
	family(o, "feedd_fetch_readahead_bytes", "gauge", "Read-ahead: the measured bandwidth-delay product");
	put(o, "feedd_fetch_readahead_bytes %" PRIu64 "\n", x->readahead_bytes);
	family(o, "feedd_fetch_cache_bytes", "gauge", "Fetched blocks held, by tier");
	put(o, "feedd_fetch_cache_bytes{tier=\"memory\"} %" PRIu64 "\n", x->memory_bytes);
	put(o, "feedd_fetch_cache_bytes{tier=\"disk\"} %" PRIu64 "\n", x->disk_bytes);
}

/* A per-feed family with an integer value per feed. */
#define FEED_FAMILY(name, type, help, expr)                                                       \
	do {                                                                                      \
		family(o, name, type, help);                                                      \
		for (size_t i = 0; i < in->n_feeds; i++) {                                        \
			const struct feed *f = in->feeds[i];                                      \
			(void)f;                                                                  \
			put(o, name "{%s} %" PRIu64 "\n", fl[i], (uint64_t)(expr));                \
		}                                                                                 \
	} while (0)

static void render_feeds(struct out *o, const struct status_input *in, char (*fl)[LABELS_MAX])
{
	char a[32];
	FEED_FAMILY("feedd_feed_ready", "gauge", "1 while the feed serves, 0 when it failed to load or went stale.",
		    f->state == FEED_READY);
	FEED_FAMILY("feedd_feed_draining", "gauge", "1 when the feed takes no new attaches (drained or removed by a reload).",
		    in->feed_info[i].draining);
	FEED_FAMILY("feedd_feed_clients", "gauge", "Clients attached to the feed.", in->feed_info[i].clients);
	FEED_FAMILY("feedd_feed_documents", "gauge", "Documents in one epoch of the feed, empty ones included.", f->n_docs);
	FEED_FAMILY("feedd_feed_batches_total", "counter", "Batches published to the feed's clients.", f->counters.batches);
	FEED_FAMILY("feedd_feed_tokens_total", "counter", "Tokens in the batches published to the feed's clients.",
		    f->counters.tokens_served);
	FEED_FAMILY("feedd_feed_read_bytes_total", "counter", "Bytes read from the feed's shards by the workers.",
		    in->feed_info[i].stages.total.read.bytes);
	FEED_FAMILY("feedd_feed_documents_tokenized_total", "counter",
		    "Documents of a text feed tokenized by the workers (0 for stored tokens).",
		    __atomic_load_n(&f->tok_docs, __ATOMIC_RELAXED));
	FEED_FAMILY("feedd_feed_bad_records_total", "counter",
		    "Distinct records of a text feed skipped as bad (on_bad_record = skip), whatever the epoch or rank.",
		    f->counters.bad_records);
	FEED_FAMILY("feedd_feed_ring_memory_bytes", "gauge", "Shared memory held by the rings of the feed's clients.",
		    in->feed_info[i].memory);
	/* Packing (docs/sample-order.md, 13.2): efficiency is rate(tokens) / rate(positions). */
	FEED_FAMILY("feedd_feed_packed_positions_total", "counter", "Positions (B * L per batch) of the batches packed.",
		    f->counters.packed.positions);
	FEED_FAMILY("feedd_feed_packed_tokens_total", "counter",
		    "Positions of the batches packed that hold a token, bos or eos rather than padding.", f->counters.packed.tokens);
	FEED_FAMILY("feedd_feed_truncated_tokens_total", "counter",
		    "Tokens dropped by packing = pad (document tails past seq_len); 0 in the other modes.",
		    f->counters.packed.truncated);
	FEED_FAMILY("feedd_feed_packed_documents_total", "counter", "Documents starting in the batches packed.",
		    f->counters.packed.docs);
	FEED_FAMILY("feedd_feed_cut_documents_total", "counter",
		    "Documents of the batches packed that are spread over more than one row.", f->counters.packed.cut_docs);
	{
		/* Work ahead (issue #22): windows shuffled ahead of the readers, index validation after load. */
		struct feed_windows_stats wa[in->n_feeds ? in->n_feeds : 1];
		uint32_t pend[in->n_feeds ? in->n_feeds : 1];
		for (size_t i = 0; i < in->n_feeds; i++)
			feed_work_ahead(in->feeds[i], &wa[i], &pend[i]);
		FEED_FAMILY("feedd_feed_windows_ahead", "gauge",
			    "Shuffle windows built ahead of the readers and not walked yet.", wa[i].ahead);
		FEED_FAMILY("feedd_feed_window_bytes", "gauge", "Bytes of the shuffle windows held (walked or ahead).",
			    wa[i].bytes);
		FEED_FAMILY("feedd_feed_windows_built_total", "counter", "Shuffle windows built.", wa[i].builds);
		FEED_FAMILY("feedd_feed_windows_built_on_demand_total", "counter",
			    "Shuffle windows built by the walk that needed them, not ahead (a reader waited for it).",
			    wa[i].built_on_demand);
		FEED_FAMILY("feedd_feed_windows_not_ready_total", "counter",
			    "Times a walk on the main loop found its shuffle window not built and its session asked the pool for it.",
			    wa[i].not_ready);
		FEED_FAMILY("feedd_feed_index_shards_pending", "gauge",
			    "Shards whose index is still being validated after load.", pend[i]);
		/* Text (issue #22): shards are indexed when their window first comes up. */
		uint64_t tix[in->n_feeds ? in->n_feeds : 1], tpend[in->n_feeds ? in->n_feeds : 1];
		for (size_t i = 0; i < in->n_feeds; i++)
			feed_text_shards(in->feeds[i], &tix[i], &tpend[i]);
		FEED_FAMILY("feedd_feed_text_shards_indexed", "gauge",
			    "Text shards whose document count is known (indexed once, or read from cache_dir).", tix[i]);
		FEED_FAMILY("feedd_feed_text_shards_pending", "gauge",
			    "Text shards not indexed yet: they are when their shuffle window first comes up.", tpend[i]);
	}
	family(o, "feedd_feed_source_documents_total", "counter",
	       "A mixture's documents packed, per source (docs/sample-order.md, 14); their shares follow the weights.");
	for (size_t i = 0; i < in->n_feeds; i++) {
		const struct feed *f = in->feeds[i];
		for (uint32_t k = 0; f->conf.mix && k < f->conf.mix->n; k++)
			put(o, "feedd_feed_source_documents_total{%s,source=\"%s\"} %" PRIu64 "\n", fl[i],
			    f->conf.mix->names[k], f->counters.source_docs[k]);
	}

	family(o, "feedd_feed_stage_busy_seconds_total", "counter",
	       "Worker thread time spent in each stage of the feed's pipeline (docs/telemetry.md); job is a whole batch.");
	for (size_t i = 0; i < in->n_feeds; i++) {
		const struct telemetry_stages_view *v = &in->feed_info[i].stages;
		for (unsigned s = 0; v->has_total && s < _STAGE_MAX; s++)
			put(o, "feedd_feed_stage_busy_seconds_total{%s,stage=\"%s\"} %s\n", fl[i], stage_name(s),
			    secs(v->total.s[s].busy_ns, a));
	}
	family(o, "feedd_feed_stage_bytes_total", "counter",
	       "Bytes through each stage of the feed's pipeline (read: from shards; pack: int32 tokens into rings).");
	for (size_t i = 0; i < in->n_feeds; i++) {
		const struct telemetry_stages_view *v = &in->feed_info[i].stages;
		for (unsigned s = 0; v->has_total && s < _STAGE_MAX; s++)
			put(o, "feedd_feed_stage_bytes_total{%s,stage=\"%s\"} %" PRIu64 "\n", fl[i], stage_name(s),
			    v->total.s[s].bytes);
	}
}

/* A per-client family; `value` formats the sample's value for client c. */
#define CLIENT_FAMILY(name, type, help, fmt, value)                                    \
	do {                                                                           \
		family(o, name, type, help);                                           \
		for (size_t i = 0; i < in->n_clients; i++) {                           \
			const struct status_client *c = &in->clients[i];               \
			put(o, name "{%s} " fmt "\n", cl[i], value);                   \
		}                                                                      \
	} while (0)

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

/* The "le" of 2^k ns in seconds, exactly, without trailing zeros: "0.000001024". */
static const char *le_text(unsigned k, char buf[static 32])
{
	secs(UINT64_C(1) << k, buf);
	size_t n = strlen(buf);
	while (buf[n - 1] == '0')
		buf[--n] = 0;
	if (buf[n - 1] == '.')
		buf[--n] = 0;
	return buf;
}

/* Every kind a client's diagnosis can have (diagnosis.c). */
static const char *const client_kinds[] = { "failed",  "stopped",        "slow-release",  "warming-up", "idle",
					    "starved", "transfer-bound", "compute-bound", "straggler" };

/*
 * A client histogram in Prometheus' native text form: the consumer page's
 * log-linear buckets folded into one per power of two (exact: each `le` is a
 * boundary of the page's buckets), then _sum and _count.
 */
static void histogram(struct out *o, const struct status_input *in, char (*cl)[LABELS_MAX], const char *name,
		      const char *help, bool step)
{
	char a[32];
	family(o, name, "histogram", help);
	for (size_t i = 0; i < in->n_clients; i++) {
		const struct status_client *c = &in->clients[i];
		/* Since attach as of the last tick, as status has it: sums of clamped readings, never absurd. */
		const struct telemetry_period *p = &c->tv.since_attach;
		const uint64_t *h = step ? p->hist_step : p->hist_wait;
		if (!c->tv.tracked || !h)
			continue;
		uint64_t acc = 0;
		unsigned b = 0;
		for (unsigned k = HIST_FIRST_POW; k <= HIST_LAST_POW; k++) {
			/* Ring bucket 4(k-1) is the first at or above 2^k ns. */
			for (; b < 4 * (k - 1); b++)
				acc = sat_add(acc, h[b]);
			put(o, "%s_bucket{%s,le=\"%s\"} %" PRIu64 "\n", name, cl[i], le_text(k, a), acc);
		}
		for (; b < FEED_HIST_BUCKETS; b++)
			acc = sat_add(acc, h[b]);
		put(o, "%s_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", name, cl[i], acc);
		put(o, "%s_sum{%s} %s\n", name, cl[i], secs(step ? p->step_ns : p->wait_ns, a));
		put(o, "%s_count{%s} %" PRIu64 "\n", name, cl[i], acc);
	}
}

static void render_clients(struct out *o, const struct status_input *in, char (*cl)[LABELS_MAX])
{
	char a[32];
	CLIENT_FAMILY("feedd_client_batches_total", "counter", "Batches the client's next() returned.", "%" PRIu64,
		      c->delivered);
	CLIENT_FAMILY("feedd_client_batches_published_total", "counter", "Batches published into the client's ring.",
		      "%" PRIu64, c->published);
	CLIENT_FAMILY("feedd_client_wait_seconds_total", "counter",
		      "Time the client spent blocked in next() waiting for a batch (measured by libfeed).", "%s",
		      secs(c->wait_ns, a));
	CLIENT_FAMILY("feedd_client_step_seconds_total", "counter",
		      "Time the client spent between batches, computing (measured by libfeed).", "%s", secs(c->step_ns, a));
	CLIENT_FAMILY("feedd_client_stall_ratio", "gauge",
		      "Share of the client's time spent waiting for data since attach: wait / (wait + step).", "%s",
		      num(c->stall_pct / 100.0, a));
	CLIENT_FAMILY("feedd_client_ring_fill", "gauge", "Batches published to the client and not yet released.", "%" PRIu64,
		      c->fill);
	CLIENT_FAMILY("feedd_client_ring_slots", "gauge", "Slots of the client's ring.", "%u",
		      c->ring_slots);
	CLIENT_FAMILY("feedd_client_ring_full_seconds_total", "counter",
		      "Time the client's ring spent full (feedd waiting for the client to release a batch).", "%s",
		      secs(c->full_ns, a));
	CLIENT_FAMILY("feedd_client_epoch", "gauge", "The epoch the client's stream is planned in (0 = the first pass).",
		      "%" PRIu64, c->epoch);
	CLIENT_FAMILY("feedd_client_stuck", "gauge", "1 while the client is reported for releasing no batch.", "%d",
		      c->stuck ? 1 : 0);
	CLIENT_FAMILY("feedd_client_reconnects_total", "counter",
		      "Times libfeed reconnected the client to a restarted feedd (counted by the client, across daemons).",
		      "%" PRIu64, c->reconnects);
	CLIENT_FAMILY("feedd_client_reconnect_seconds_total", "counter",
		      "Time the client's next() spent waiting for feedd to come back (counted by the client).", "%s",
		      secs(c->reconnect_ns, a));

	histogram(o, in, cl, "feedd_client_batch_wait_seconds",
		  "How long each next() call of the client waited for a batch (libfeed's histogram, exact at powers of two; "
		  "reported by the client).", false);
	histogram(o, in, cl, "feedd_client_batch_step_seconds",
		  "Time between a next() return and the client's following call: its step (libfeed's histogram, exact at "
		  "powers of two; reported by the client).", true);

	/*
	 * The verdict for alerting: one series per kind, 1 for the client's
	 * current one and 0 for the others, so every series exists from attach
	 * on and `feedd_client_verdict{kind="stopped"} == 1` is a plain alert.
	 */
	family(o, "feedd_client_verdict", "gauge",
	       "1 for the kind of the client's current diagnosis (docs/telemetry.md), 0 for the other kinds.");
	for (size_t i = 0; i < in->n_clients; i++) {
		const struct status_client *c = &in->clients[i];
		const char *kind = c->tv.tracked && c->tv.diag && c->tv.diag->kind ? c->tv.diag->kind : "warming-up";
		for (size_t k = 0; k < ARRAY_SIZE(client_kinds); k++)
			put(o, "feedd_client_verdict{%s,kind=\"%s\"} %d\n", cl[i], client_kinds[k],
			    strcmp(kind, client_kinds[k]) == 0);
	}
	CLIENT_FAMILY("feedd_client_verdict_severity", "gauge",
		      "Severity of the client's diagnosis: 0 fine, 1 notice, 2 warning, 3 error.", "%d",
		      c->tv.tracked && c->tv.diag ? (int)c->tv.diag->severity : 0);
}

int metrics_render(const struct status_input *in, const struct metrics_self *self, struct evbuffer *out)
{
	char(*fl)[LABELS_MAX] = calloc(MAX(in->n_feeds, 1u), LABELS_MAX);
	char(*cl)[LABELS_MAX] = calloc(MAX(in->n_clients, 1u), LABELS_MAX);
	if (!fl || !cl) {
		free(fl);
		free(cl);
		return -ENOMEM;
	}
	for (size_t i = 0; i < in->n_feeds; i++)
		feed_labels(in->feeds[i], fl[i], LABELS_MAX);
	for (size_t i = 0; i < in->n_clients; i++) {
		const struct status_client *c = &in->clients[i];
		unsigned dup = 1;
		for (size_t j = 0; j < i; j++)
			dup += in->clients[j].feed == c->feed && in->clients[j].rank == c->rank && in->clients[j].world == c->world;
		client_labels(c, dup, cl[i], LABELS_MAX);
	}
	struct out o = { .b = out };
	render_daemon(&o, in, self);
	render_feeds(&o, in, fl);
	render_clients(&o, in, cl);
	free(fl);
	free(cl);
	return o.failed ? -ENOMEM : 0;
}

static void reply_text(struct evhttp_request *req, int code, const char *reason, const char *text)
{
	struct evbuffer *body = evbuffer_new();
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; charset=utf-8");
	if (body)
		evbuffer_add(body, text, strlen(text));
	evhttp_send_reply(req, code, reason, body);
	if (body)
		evbuffer_free(body);
}

static void on_request(struct evhttp_request *req, void *userdata)
{
	struct metrics *m = userdata;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
	if (!path || strcmp(path, "/metrics") != 0) {
		reply_text(req, HTTP_NOTFOUND, "Not Found", "feedd serves Prometheus metrics at /metrics only\n");
		return;
	}
	uint64_t t0 = now_ns();
	struct status_input in;
	struct evbuffer *body = evbuffer_new();
	if (!body || server_snapshot(m->srv, &in) < 0) {
		if (body)
			evbuffer_free(body);
		reply_text(req, HTTP_INTERNAL, "Internal Server Error", "feedd is out of memory\n");
		return;
	}
	int r = metrics_render(&in, &m->self, body);
	status_input_clear(&in);
	if (r < 0) {
		evbuffer_free(body);
		reply_text(req, HTTP_INTERNAL, "Internal Server Error", "feedd is out of memory\n");
		return;
	}
	m->self.scrape_ns = now_ns() - t0;
	m->self.scrapes++;
	/*
	 * A reply of several segments would wait for the scraper's delayed ACK
	 * (40 ms) before its last one under Nagle's algorithm: send at once.
	 */
	struct bufferevent *bev = evhttp_connection_get_bufferevent(evhttp_request_get_connection(req));
	if (bev)
		(void)setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	evhttp_send_reply(req, HTTP_OK, "OK", body);
	evbuffer_free(body);
}

/* "127.0.0.1:9464" or "[::1]:9464" of a bound socket. */
static void format_address(const struct sockaddr_storage *ss, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(a->sin6_port));
	} else {
		const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(a->sin_port));
	}
}

int metrics_new(struct event_base *base, const struct sockaddr *addr, socklen_t addrlen, struct server *srv,
		struct metrics **ret, char *err, size_t errlen)
{
	struct sockaddr_storage ss = { 0 };
	memcpy(&ss, addr, MIN((size_t)addrlen, sizeof(ss)));
	char want[sizeof(((struct metrics *)0)->address)];
	format_address(&ss, want, sizeof(want));

	_cleanup_close_ int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int one = 1;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 || bind(fd, addr, addrlen) < 0 ||
	    listen(fd, 64) < 0) {
		int e = -errno;
		snprintf(err, errlen, "metrics_listen %s: cannot listen: %s", want, strerror(-e));
		return e;
	}
	socklen_t l = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &l) < 0) {
		int e = -errno;
		snprintf(err, errlen, "metrics_listen %s: getsockname: %s", want, strerror(-e));
		return e;
	}
	struct metrics *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->srv = srv;
	format_address(&ss, m->address, sizeof(m->address));
	m->http = evhttp_new(base);
	struct evconnlistener *lev = m->http ? evconnlistener_new(base, NULL, NULL, LEV_OPT_CLOSE_ON_FREE |
								  LEV_OPT_CLOSE_ON_EXEC, 0, fd) : NULL;
	if (lev)
		TAKE_FD(fd); /* the listener closes it */
	if (!lev || !evhttp_bind_listener(m->http, lev)) {
		if (lev)
			evconnlistener_free(lev);
		snprintf(err, errlen, "metrics_listen %s: cannot start the HTTP server", want);
		metrics_free(m);
		return -ENOMEM;
	}
	/* A scraper sends a GET and reads the answer: bound everything else. */
	evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_max_headers_size(m->http, 8192);
	evhttp_set_max_body_size(m->http, 1024);
	evhttp_set_timeout(m->http, 5);
	evhttp_set_gencb(m->http, on_request, m);
	*ret = m;
	return 0;
}

struct metrics *metrics_free(struct metrics *m)
{
	if (!m)
		return NULL;
	if (m->http)
		evhttp_free(m->http);
	free(m);
	return NULL;
}

const char *metrics_address(const struct metrics *m)
{
	return m->address;
}
