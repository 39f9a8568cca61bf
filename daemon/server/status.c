/* SPDX-License-Identifier: MIT */
/*
 * The status document and the STATUS= line, rendered from a snapshot
 * (status.h; server_snapshot() in server.c takes it). Only formats: every
 * figure is read once by the snapshot or by the module that owns it.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "daemon/gpu/gpu.h"
#include "daemon/server/status.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/macro.h"
#include "proto/wire.h"

/* Telemetry (docs/telemetry.md): the views telemetry fills, rendered. */

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

/* A feed's "diagnosis"; with its stragglers once telemetry tracks it. */
static json_t *feed_diagnosis_json(const struct status_input *in, const struct feed *f,
				   const struct telemetry_feed_view *v)
{
	json_t *o = diag_json(&v->diag);
	if (!v->tracked)
		return o;
	json_t *a = json_array();
	for (const struct telemetry_client *c = telemetry_next_straggler(in->tm, f, NULL); c;
	     c = telemetry_next_straggler(in->tm, f, c))
		json_array_append_new(a, json_pack("{s:i, s:i, s:s}", "rank", (int)c->rank, "world", (int)c->world, "text",
						   c->straggler));
	json_object_set_new(o, "stragglers", a);
	return o;
}

/* A feed's "stages": rates over the window, per stage, and totals since load. */
static json_t *stages_json(const struct telemetry_stages_view *v)
{
	json_t *o = json_object();
	double span = v->span_s;
	json_object_set_new(o, "window_s", json_real(span));
	json_object_set_new(o, "threads", json_integer(v->threads));
	/* All the feed's worker time (batch jobs, and a text feed's read-and-tokenize jobs), per batch produced. */
	uint64_t wns = v->worker_ns, batches = v->win.s[STAGE_JOB].items;
	json_object_set_new(o, "workers", json_pack("{s:f, s:o}", "busy_threads", span > 0 ? (double)wns / 1e9 / span : 0.0,
						    "ms_per_batch", batches ? json_real((double)wns / 1e6 / (double)batches) : json_null()));
	for (unsigned i = 0; i < _STAGE_MAX; i++) {
		const struct stage *w = &v->win.s[i];
		json_t *s = json_object();
		json_object_set_new(s, "items_per_s", json_real(span > 0 ? (double)w->items / span : 0.0));
		json_object_set_new(s, "mb_per_s", json_real(span > 0 ? (double)w->bytes / 1e6 / span : 0.0));
		/* Thread-seconds per second: 1.0 = one thread busy all the time. */
		json_object_set_new(s, "busy_threads", json_real(span > 0 ? (double)w->busy_ns / 1e9 / span : 0.0));
		json_object_set_new(s, "busy_ms_per_item",
				    w->items ? json_real((double)w->busy_ns / 1e6 / (double)w->items) : json_null());
		json_object_set_new(s, "offcpu_pct", json_real(telemetry_pct(w->offcpu_ns, w->busy_ns)));
		if (i == STAGE_READ)
			json_object_set_new(s, "queue_depth",
					    json_real(w->depth_n ? (double)w->depth_sum / (double)w->depth_n : 0.0));
		if (v->has_total) {
			json_object_set_new(s, "total_bytes", json_integer((json_int_t)v->total.s[i].bytes));
			json_object_set_new(s, "total_items", json_integer((json_int_t)v->total.s[i].items));
		}
		json_object_set_new(o, stage_name(i), s);
	}
	return o;
}

/* The daemon-wide "telemetry": window, thresholds, pool, host, the worst line. */
static json_t *daemon_telemetry_json(const struct telemetry_daemon_view *v)
{
	const struct conf_diagnosis *d = v->conf;
	json_t *th = json_pack("{s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "min_batches", (int)d->min_batches,
			       "starved_pct", d->starved_pct, "busy_pct", d->busy_pct, "storage_pct", d->storage_pct,
			       "host_pct", d->host_pct, "full_pct", d->full_pct, "held_pct", d->held_pct, "h2d_pct",
			       d->h2d_pct, "straggler_pct", d->straggler_pct, "straggler_min_ms", d->straggler_min_ms);
	json_t *host = json_pack("{s:i, s:f, s:i, s:o, s:o}", "cpus", (int)v->cpus, "load_avg", v->load_avg, "runnable",
				 (int)v->runnable, "workers_cpu_per_s",
				 !v->host_known || isnan(v->workers_cpu_per_s) ? json_null() : json_real(v->workers_cpu_per_s),
				 "runqueue_pct", v->host_known ? json_real(v->runqueue_pct) : json_null());
	return json_pack("{s:i, s:i, s:o, s:f, s:o, s:{s:i, s:s}}", "window_s", (int)d->window_s, "history_s",
			 (int)d->history_s, "thresholds", th, "pool_busy_pct", v->pool_busy_pct, "host", host, "worst",
			 "severity", v->worst_severity, "text", v->worst);
}

static json_t *token_json(int64_t t)
{
	return t == CONF_TOKEN_NONE ? json_null() : json_integer(t);
}

static json_t *feed_json(const struct status_input *in, size_t i)
{
	const struct feed *f = in->feeds[i];
	const struct status_feed *sv = &in->feed_info[i];
	char fp[17], seed[24];
	snprintf(fp, sizeof(fp), "%016llx", (unsigned long long)f->fingerprint);
	/* u64 seeds do not fit JSON's integers everywhere: a decimal string is exact. */
	snprintf(seed, sizeof(seed), "%llu", (unsigned long long)f->conf.seed);
	json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:s, s:b, s:i, s:o, s:o, s:i, s:I, s:I, s:b}",
			      "name", f->name, "state", f->state == FEED_READY ? "ready" : "failed", "format",
			      f->conf.format, "shards", (json_int_t)f->n_shards, "documents", (json_int_t)f->n_docs,
			      "nonempty_documents", (json_int_t)f->n_nonempty, "tokens", (json_int_t)f->n_tokens,
			      "token_bytes", (json_int_t)f->n_bytes, "seq_len", (int)f->conf.seq_len, "batch_size",
			      (int)f->conf.batch_size, "seed", seed, "shuffle", f->conf.shuffle,
			      "shuffle_window", (int)f->conf.shuffle_window, "bos", token_json(f->bos_id), "eos",
			      token_json(f->eos_id), "clients", (int)sv->clients, "batches", (json_int_t)f->counters.batches,
			      "tokens_served", (json_int_t)f->counters.tokens_served, "draining", sv->draining);
	if (!o)
		return NULL;
	json_object_set_new(o, "fingerprint", f->state == FEED_READY ? json_string(fp) : json_null());
	json_object_set_new(o, "error", f->state == FEED_READY ? json_null() : json_string(f->error));
	json_object_set_new(o, "io_engine", json_string(f->io_engine));
	if (f->kind == FEED_TEXT) {
		/* Text tokenized on the way: what went in, what came out, what was skipped. */
		json_t *t = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "tokenizer", f->conf.tokenizer,
				      "text_bytes", (json_int_t)f->n_bytes, "cached_indexes",
				      (json_int_t)(f->n_cached + feed_text_cached(f, NULL)),
				      "documents_tokenized", (json_int_t)__atomic_load_n(&f->tok_docs, __ATOMIC_RELAXED),
				      "tokens_tokenized", (json_int_t)__atomic_load_n(&f->tok_tokens, __ATOMIC_RELAXED),
				      "utf8_replaced", (json_int_t)__atomic_load_n(&f->utf8_replaced, __ATOMIC_RELAXED),
				      "bad_records", (json_int_t)f->counters.bad_records, "max_bad_fraction", f->conf.max_bad_fraction);
		if (t) {
			json_object_set_new(t, "last_bad_record", f->counters.last_bad[0] ? json_string(f->counters.last_bad) : json_null());
			json_object_set_new(t, "on_bad_record", json_string(f->conf.skip_bad_records ? "skip" : "fail"));
			json_object_set_new(o, "text", t);
		}
	}
	/* What the feed is bound by, and where its workers' time goes (docs/telemetry.md). */
	json_object_set_new(o, "diagnosis", feed_diagnosis_json(in, f, &sv->verdict));
	json_object_set_new(o, "stages", stages_json(&sv->stages));
	/* Packing efficiency, truncation and a mixture's realised proportions (docs/telemetry.md). */
	json_object_set_new(o, "packing", feed_packing_json(f));
	/* Work proportional to the corpus or a window, done after load and ahead of the readers (issue #22). */
	json_object_set_new(o, "work_ahead", feed_work_ahead_json(f));
	return o;
}

/* Refusals, dropped connections and the other counters of the daemon object. */
static void counters_json(json_t *d, const struct status_input *in)
{
	const struct server_counters *n = &in->counters;
	json_object_set_new(d, "connections", json_integer((json_int_t)in->connections));
	json_object_set_new(d, "ring_memory_bytes", json_integer((json_int_t)in->ring_memory));
	json_object_set_new(d, "refused", json_pack("{s:I, s:I, s:I, s:I}", "credentials", (json_int_t)n->refused_credentials,
						    "limit", (json_int_t)n->refused_limit, "memory",
						    (json_int_t)n->refused_memory, "admin", (json_int_t)n->refused_admin));
	json_object_set_new(d, "dropped",
			    json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "bad_magic", (json_int_t)n->bad_magic,
				      "bad_version", (json_int_t)n->bad_version, "unknown_type", (json_int_t)n->unknown_type,
				      "oversized", (json_int_t)n->oversized, "bad_message", (json_int_t)n->bad_message,
				      "passed_fds", (json_int_t)n->passed_fds, "unread_output", (json_int_t)n->unread_output,
				      "ring_protocol", (json_int_t)n->ring_protocol));
	json_object_set_new(d, "clients_reaped", json_integer((json_int_t)n->clients_reaped));
	json_object_set_new(d, "stuck_clients", json_integer((json_int_t)n->stuck_clients));
	json_object_set_new(d, "metrics", json_pack("{s:o, s:o}", "listen",
						    in->metrics_listen ? json_string(in->metrics_listen) : json_null(),
						    "error", in->metrics_error ? json_string(in->metrics_error) : json_null()));
}

/* The object-storage fetcher: one per node, shared by every feed (docs/storage.md). */
static json_t *fetch_json(const struct remote_stats *f)
{
	json_t *o = json_object();
	json_object_set_new(o, "bytes", json_integer((json_int_t)f->bytes));
	json_object_set_new(o, "requests", json_integer((json_int_t)f->requests));
	json_object_set_new(o, "in_flight", json_integer((json_int_t)f->inflight));
	json_object_set_new(o, "retries", json_integer((json_int_t)f->retries));
	json_object_set_new(o, "throttled", json_integer((json_int_t)f->throttled));
	json_object_set_new(o, "errors", json_integer((json_int_t)f->errors));
	json_object_set_new(o, "block_hits", json_integer((json_int_t)f->hits));
	json_object_set_new(o, "block_misses", json_integer((json_int_t)f->misses));
	json_object_set_new(o, "disk_hits", json_integer((json_int_t)f->disk_hits));
	json_object_set_new(o, "memory_bytes", json_integer((json_int_t)f->memory_bytes));
	json_object_set_new(o, "disk_bytes", json_integer((json_int_t)f->disk_bytes));
	json_object_set_new(o, "readahead_bytes", json_integer((json_int_t)f->readahead_bytes));
	json_object_set_new(o, "bandwidth_bytes_per_s", json_real(f->bandwidth));
	json_object_set_new(o, "latency_s", json_real(f->latency_s));
	return o;
}

/*
 * The document without its clients: {daemon, feeds} and {telemetry, fetch}
 * dumped by jansson once, the clients written between them by
 * status-clients.c as often as status_json_fit() needs.
 */
struct frame {
	char *head, *tail;
	size_t head_len, tail_len; /* less the head's closing '}' and the tail's opening '{' */
};

static void frame_done(struct frame *f)
{
	free(f->head);
	free(f->tail);
	*f = (struct frame){ 0 };
}

static int frame_make(const struct status_input *in, struct frame *ret)
{
	int fallback = in->io_fallback;
	char fb[160] = "";
	if (fallback < 0)
		snprintf(fb, sizeof(fb), "io_uring unavailable (%s); using pread", strerror(-fallback));

	json_t *root = json_pack("{s:{s:s, s:i, s:f, s:s, s:i, s:i, s:i, s:s, s:o, s:s, s:I, s:I}}", "daemon",
				 "version", FEEDD_VERSION, "pid", (int)getpid(), "uptime_s", (double)in->uptime_ns / 1e9,
				 "socket", in->socket_path, "threads", (int)in->threads, "threads_busy",
				 (int)in->threads_busy, "jobs_queued", (int)in->jobs_queued, "io_engine", in->io_engine,
				 "io_fallback",
				 fallback < 0 ? json_string(fb) : json_null(), "gpu", in->gpu_status, "connections_total",
				 (json_int_t)in->counters.accepted, "protocol_errors", (json_int_t)in->counters.protocol_errors);
	if (!root)
		return -ENOMEM;
	counters_json(json_object_get(root, "daemon"), in);
	json_t *feeds = json_array();
	for (size_t i = 0; i < in->n_feeds; i++)
		json_array_append_new(feeds, feed_json(in, i));
	json_object_set_new(root, "feeds", feeds);
	json_t *tail = json_object();
	json_object_set_new(tail, "telemetry", daemon_telemetry_json(&in->telemetry));
	json_object_set_new(tail, "fetch", fetch_json(&in->fetch));
	struct frame f = {
		.head = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER),
		.tail = json_dumps(tail, JSON_COMPACT | JSON_PRESERVE_ORDER),
	};
	json_decref(root);
	json_decref(tail);
	if (!f.head || !f.tail) {
		frame_done(&f);
		return -ENOMEM;
	}
	f.head_len = strlen(f.head) - 1;
	f.tail_len = strlen(f.tail) - 1;
	*ret = f;
	return 0;
}

/*
 * The clients are written without a tree (status-clients.c) between the
 * dumps of {daemon, feeds} and {telemetry, fetch}: the document is the same
 * bytes the one tree gave.
 */
static char *frame_render(const struct frame *f, const struct status_input *in, unsigned flags, unsigned history_max,
			  struct status_render *ret_stats, size_t *ret_len)
{
	static const char clients_key[] = ",\"clients\":";
	size_t before = f->head_len + sizeof(clients_key) - 1, len;
	struct status_render st = { 0 };
	char *text = status_clients_json(in, flags, history_max, &st, before, f->tail_len + 1, &len);
	if (!text)
		return NULL;
	memcpy(text, f->head, f->head_len);
	memcpy(text + f->head_len, clients_key, sizeof(clients_key) - 1);
	text[len] = ',';
	memcpy(text + len + 1, f->tail + 1, f->tail_len);
	text[len + 1 + f->tail_len] = '\0';
	*ret_len = len + 1 + f->tail_len;
	if (ret_stats)
		*ret_stats = st;
	return text;
}

char *status_json(const struct status_input *in, unsigned flags, unsigned history_max, struct status_render *ret_stats)
{
	_cleanup_(frame_done) struct frame f = { 0 };
	size_t len;
	if (frame_make(in, &f) < 0)
		return NULL;
	return frame_render(&f, in, flags, history_max, ret_stats, &len);
}

/* Samples in a document that keeps the newest `keep` of each client's history. */
static uint64_t samples_kept(const struct status_input *in, unsigned keep)
{
	uint64_t n = 0;
	for (size_t i = 0; i < in->n_clients; i++)
		if (in->clients[i].tv.tracked)
			n += MIN(in->clients[i].tv.hist_n, keep);
	return n;
}

/*
 * The largest keep (at most `longest`) whose document base + bps * samples
 * is at most `target` bytes: the history's size grows with the samples
 * kept, at about bps bytes each.
 */
static unsigned keep_for(const struct status_input *in, unsigned longest, double base, double bps, double target)
{
	unsigned lo = 0, hi = longest;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo + 1) / 2;
		if (base + bps * (double)samples_kept(in, mid) <= target)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

/* Clients rendered apart to estimate a document's size: spread over the array. */
#define FIT_PROBES 8

int status_json_fit(const struct status_input *in, unsigned flags, size_t max_len, char **ret)
{
	_cleanup_(frame_done) struct frame f = { 0 };
	if (frame_make(in, &f) < 0)
		return -ENOMEM;
	unsigned longest = 0;
	for (size_t i = 0; i < in->n_clients; i++)
		if (in->clients[i].tv.tracked)
			longest = MAX(longest, in->clients[i].tv.hist_n);
	bool history = !(flags & WIRE_STATUS_NO_HISTORY) && longest > 0;
	unsigned keep = UINT_MAX;
	if (history) {
		/*
		 * A few clients rendered apart give the bytes of a client without
		 * its history and of one sample of history: the whole document is
		 * rendered only when that estimate is not clearly over the limit,
		 * else the history is cut to what the estimate says fits, with
		 * some room, and the render says how far off it was.
		 */
		size_t probes = MIN(in->n_clients, (size_t)FIT_PROBES), bytes = 0, hist = 0;
		uint64_t samples = 0;
		for (size_t k = 0; k < probes; k++) {
			size_t b;
			struct status_render st;
			if (status_client_probe(in, k * in->n_clients / probes, flags, &b, &st) < 0)
				return -ENOMEM;
			bytes += b;
			hist += st.history_bytes;
			samples += st.history_samples;
		}
		double bps = samples ? (double)hist / (double)samples : 0;
		double base = (double)(f.head_len + f.tail_len + 16) +
			      (double)(bytes - hist + probes) / (double)probes * (double)in->n_clients;
		if (base + bps * (double)samples_kept(in, longest) > (double)max_len * 1.25)
			keep = keep_for(in, longest, base, bps, (double)max_len * 15 / 16);
	}
	for (;;) {
		size_t len;
		struct status_render st;
		char *text = frame_render(&f, in, flags, keep, &st, &len);
		if (!text)
			return -ENOMEM;
		if (len <= max_len) {
			*ret = text;
			return 0;
		}
		free(text);
		if (!history || keep == 0)
			return -EMSGSIZE;
		/* What this render wrote: the document without history, and the bytes of a sample. */
		double bps = st.history_samples ? (double)st.history_bytes / (double)st.history_samples : 0;
		unsigned next = keep_for(in, MIN(keep, longest), (double)(len - st.history_bytes), bps,
					 (double)max_len * 31 / 32);
		keep = next < MIN(keep, longest) ? next : MIN(keep, longest) * 3 / 4;
	}
}

void status_line(const struct status_input *in, char *buf, size_t len)
{
	size_t failed = 0, draining = 0;
	double tps = 0;
	const struct status_client *worst = NULL;
	for (size_t i = 0; i < in->n_feeds; i++) {
		failed += in->feeds[i]->state != FEED_READY;
		draining += in->feed_info[i].draining;
	}
	for (size_t i = 0; i < in->n_clients; i++) {
		const struct status_client *c = &in->clients[i];
		tps += c->tokens_per_s;
		if (!worst || c->stall_pct_tick > worst->stall_pct_tick)
			worst = c;
	}
	char rate[32];
	if (tps >= 1e6)
		snprintf(rate, sizeof(rate), "%.1fM", tps / 1e6);
	else if (tps >= 1e3)
		snprintf(rate, sizeof(rate), "%.1fk", tps / 1e3);
	else
		snprintf(rate, sizeof(rate), "%.0f", tps);
	int k = snprintf(buf, len, "%zu feeds (%zu failed, %zu draining), %zu clients, %s tokens/s", in->n_feeds, failed,
			 draining, in->n_clients, rate);
	if (worst && k >= 0 && (size_t)k < len)
		k += snprintf(buf + k, len - (size_t)k, ", worst stall %.1f%% (%s rank %u/%u)", worst->stall_pct_tick,
			      worst->feed->name, worst->rank, worst->world);
	/* The worst diagnosis says why, when anything is worth saying. */
	if (in->n_clients && in->telemetry.worst_severity > 0 && k >= 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "; %s", in->telemetry.worst);
}
