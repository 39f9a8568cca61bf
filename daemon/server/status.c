/* SPDX-License-Identifier: MIT */
/*
 * The status snapshot (server_snapshot), and the status document and the
 * STATUS= line made of it (status.h). The snapshot borrows the server's
 * feeds and sessions; it owns only its arrays.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "daemon/feed/worker.h"
#include "daemon/gpu/gpu.h"
#include "daemon/server/server-internal.h"
#include "daemon/server/status.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/macro.h"

static json_t *token_json(int64_t t)
{
	return t == CONF_TOKEN_NONE ? json_null() : json_integer(t);
}

static json_t *feed_json(const struct feed *f)
{
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
			      token_json(f->eos_id), "clients", (int)f->clients, "batches", (json_int_t)f->batches,
			      "tokens_served", (json_int_t)f->tokens_served, "draining", f->draining);
	if (!o)
		return NULL;
	json_object_set_new(o, "fingerprint", f->state == FEED_READY ? json_string(fp) : json_null());
	json_object_set_new(o, "error", f->state == FEED_READY ? json_null() : json_string(f->error));
	json_object_set_new(o, "io_engine", json_string(f->io_engine));
	if (f->kind == FEED_TEXT) {
		/* Text tokenized on the way: what went in, what came out, what was skipped. */
		json_t *t = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "tokenizer", f->conf.tokenizer,
				      "text_bytes", (json_int_t)f->n_bytes, "cached_indexes", (json_int_t)f->n_cached,
				      "documents_tokenized", (json_int_t)__atomic_load_n(&f->tok_docs, __ATOMIC_RELAXED),
				      "tokens_tokenized", (json_int_t)__atomic_load_n(&f->tok_tokens, __ATOMIC_RELAXED),
				      "utf8_replaced", (json_int_t)__atomic_load_n(&f->utf8_replaced, __ATOMIC_RELAXED),
				      "bad_records", (json_int_t)f->bad_records, "max_bad_fraction", f->conf.max_bad_fraction);
		if (t) {
			json_object_set_new(t, "last_bad_record", f->last_bad[0] ? json_string(f->last_bad) : json_null());
			json_object_set_new(t, "on_bad_record", json_string(f->conf.skip_bad_records ? "skip" : "fail"));
			json_object_set_new(o, "text", t);
		}
	}
	/* What the feed is bound by, and where its workers' time goes (docs/telemetry.md). */
	json_object_set_new(o, "diagnosis", telemetry_feed_diagnosis_json(f));
	json_object_set_new(o, "stages", telemetry_feed_stages_json(f));
	/* Packing efficiency, truncation and a mixture's realised proportions (docs/telemetry.md). */
	json_object_set_new(o, "packing", feed_packing_json(f));
	return o;
}

static json_t *client_json(const struct status_client *c)
{
	struct session *s = c->session;
	double attached_s = (double)c->attached_ns / 1e9;
	json_t *o = json_pack("{s:I, s:i, s:i, s:s, s:s, s:i, s:i, s:f, s:I, s:I, s:I, s:i, s:I, s:f, s:f, s:f, s:f, s:s}",
			      "id", (json_int_t)c->id, "pid", (int)c->pid, "uid", (int)c->uid, "name", c->name, "feed",
			      s->feed->name, "rank", (int)s->rank, "world", (int)s->world, "attached_s", attached_s,
			      "first_batch", (json_int_t)s->first_batch, "batches_published", (json_int_t)c->published,
			      "batches_delivered", (json_int_t)c->delivered, "ring_slots", (int)s->ring->slot_count,
			      "ring_fill", (json_int_t)c->fill, "ring_full_pct",
			      c->attached_ns ? 100.0 * (double)c->full_ns / (double)c->attached_ns : 0.0, "tokens_per_s",
			      c->tokens_per_s, "wait_s", (double)c->wait_ns / 1e9, "step_s", (double)c->step_ns / 1e9,
			      "state", s->failed ? "failed" : "streaming");
	if (!o)
		return NULL;
	json_object_set_new(o, "stall_pct", json_real(c->stall_pct));
	/* What the trainer measured itself (feed_client_report), when it does. */
	json_object_set_new(o, "reports", json_integer((json_int_t)c->reports));
	json_object_set_new(o, "reported_step_s", json_real((double)c->reported_step_ns / 1e9));
	json_object_set_new(o, "h2d_s", json_real((double)c->h2d_ns / 1e9));
	json_t *d = telemetry_client_diagnosis_json(s), *t = telemetry_client_json(s);
	json_object_set_new(o, "diagnosis", d ? d : json_null());
	json_object_set_new(o, "telemetry", t ? t : json_null());
	/* GPU staging of this client (docs/gpu.md): copies, bytes, H2D time, events waited; null for host batches. */
	json_object_set_new(o, "gpu", s->staging ? gpu_client_json(s->staging) : json_null());
	/* What the server alone knows (fields are only added, never renamed: docs/protocol.md, section 10). */
	json_object_set_new(o, "stuck", json_boolean(c->stuck));
	json_object_set_new(o, "idle_s", json_real((double)c->idle_ns / 1e9));
	json_object_set_new(o, "memory_bytes", json_integer((json_int_t)c->memory));
	json_object_set_new(o, "epoch", json_integer((json_int_t)c->epoch));
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

char *status_json(const struct status_input *in)
{
	const struct worker *w0 = pool_worker_ctx(in->pool, 0);
	int fallback = w0 ? source_reader_fallback(w0->io) : 0;
	char fb[160] = "";
	if (fallback < 0)
		snprintf(fb, sizeof(fb), "io_uring unavailable (%s); using pread", strerror(-fallback));

	json_t *root = json_pack("{s:{s:s, s:i, s:f, s:s, s:i, s:i, s:i, s:s, s:o, s:s, s:I, s:I}}", "daemon",
				 "version", FEEDD_VERSION, "pid", (int)getpid(), "uptime_s", (double)in->uptime_ns / 1e9,
				 "socket", in->socket_path, "threads", (int)pool_threads(in->pool), "threads_busy",
				 (int)pool_busy(in->pool), "jobs_queued", (int)pool_queued(in->pool), "io_engine",
				 w0 ? source_reader_engine(w0->io) : "none", "io_fallback",
				 fallback < 0 ? json_string(fb) : json_null(), "gpu", in->gpu_status, "connections_total",
				 (json_int_t)in->counters.accepted, "protocol_errors", (json_int_t)in->counters.protocol_errors);
	if (!root)
		return NULL;
	counters_json(json_object_get(root, "daemon"), in);
	json_t *feeds = json_array(), *clients = json_array();
	for (size_t i = 0; i < in->n_feeds; i++)
		json_array_append_new(feeds, feed_json(in->feeds[i]));
	for (size_t i = 0; i < in->n_clients; i++)
		json_array_append_new(clients, client_json(&in->clients[i]));
	json_object_set_new(root, "feeds", feeds);
	json_object_set_new(root, "clients", clients);
	json_object_set_new(root, "telemetry", telemetry_daemon_json());
	char *text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	return text;
}

/* Reads what a client's session and consumer page say, once. The page is the client's to write: clamp what matters. */
static void client_read(struct status_client *c, uint64_t now)
{
	struct session *s = c->session;
	const struct feed_consumer_page *cp = s->ring->cons;
	c->attached_ns = now - s->attach_ns;
	c->published = s->published;
	c->delivered = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), s->published);
	c->wait_ns = __atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED);
	c->step_ns = __atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED);
	c->h2d_ns = __atomic_load_n(&cp->h2d_ns_total, __ATOMIC_RELAXED);
	c->reports = __atomic_load_n(&cp->reports, __ATOMIC_RELAXED);
	c->reported_step_ns = __atomic_load_n(&cp->reported_step_ns_total, __ATOMIC_RELAXED);
	c->full_ns = s->full_ns_total + (s->full_since_ns ? now - s->full_since_ns : 0);
	c->fill = session_fill(s);
	c->epoch = s->stream.walk.ep.epoch;
	/* In double: two client-written totals may overflow a u64 sum. */
	double w = (double)c->wait_ns, st = (double)c->step_ns;
	c->stall_pct = w + st > 0 ? 100.0 * w / (w + st) : 0.0;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++)
		c->hist_wait[b] = __atomic_load_n(&cp->hist_wait[b], __ATOMIC_RELAXED);
}

int server_snapshot(struct server *s, struct status_input *ret)
{
	uint64_t now = now_ns();
	size_t n = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		n += c->session != NULL;
	struct status_input in = {
		.socket_path = s->path,
		.uptime_ns = now - s->start_ns,
		.pool = producer_pool(s->producer),
		.gpu_status = s->cfg.gpu_status,
		.gpu_available = gpu_available(s->cfg.gpu),
		.metrics_listen = s->metrics_listen[0] ? s->metrics_listen : NULL,
		.metrics_error = s->metrics_error[0] ? s->metrics_error : NULL,
		.feeds = calloc(MAX(s->n_feeds, 1u), sizeof(*in.feeds)),
		.n_feeds = s->n_feeds,
		.feed_memory = calloc(MAX(s->n_feeds, 1u), sizeof(*in.feed_memory)),
		.clients = calloc(MAX(n, 1u), sizeof(*in.clients)),
		.connections = s->n_conns,
		.ring_memory = s->memory,
		.counters = s->n,
	};
	if (!in.feeds || !in.feed_memory || !in.clients) {
		status_input_clear(&in);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->n_feeds; i++)
		in.feeds[i] = s->feeds[i].feed;
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		struct status_client *sc = &in.clients[in.n_clients++];
		*sc = (struct status_client){
			.id = c->id,
			.pid = c->pid,
			.uid = c->uid,
			.name = c->name,
			.session = c->session,
			.connected_ns = now - c->connect_ns,
			.tokens_per_s = c->tokens_per_s,
			.stall_pct_tick = c->stall_pct,
			.stuck = c->stuck,
			.idle_ns = now - c->idle_since_ns,
			.memory = c->memory,
		};
		client_read(sc, now);
		for (size_t i = 0; i < s->n_feeds; i++)
			if (in.feeds[i] == c->session->feed)
				in.feed_memory[i] += c->memory;
	}
	*ret = in;
	return 0;
}

void status_input_clear(struct status_input *in)
{
	free(in->feeds);
	free(in->feed_memory);
	free(in->clients);
	*in = (struct status_input){ 0 };
}

char *server_status_json(struct server *s)
{
	struct status_input in;
	if (server_snapshot(s, &in) < 0)
		return NULL;
	char *text = status_json(&in);
	status_input_clear(&in);
	return text;
}

void status_line(const struct status_input *in, char *buf, size_t len)
{
	size_t failed = 0, draining = 0;
	double tps = 0;
	const struct status_client *worst = NULL;
	for (size_t i = 0; i < in->n_feeds; i++) {
		failed += in->feeds[i]->state != FEED_READY;
		draining += in->feeds[i]->draining;
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
			      worst->session->feed->name, worst->session->rank, worst->session->world);
	/* The worst diagnosis says why, when anything is worth saying. */
	char diag[256];
	if (in->n_clients && telemetry_worst(diag, sizeof(diag)) > 0 && k >= 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "; %s", diag);
}

void server_status_line(struct server *s, char *buf, size_t len)
{
	struct status_input in;
	if (server_snapshot(s, &in) < 0) {
		snprintf(buf, len, "out of memory");
		return;
	}
	status_line(&in, buf, len);
	status_input_clear(&in);
}
