/* SPDX-License-Identifier: MIT */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "daemon/feed/worker.h"
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
	return o;
}

static json_t *client_json(const struct status_client *c)
{
	struct session *s = c->session;
	const struct feed_consumer_page *cp = s->ring->cons;
	/* The consumer page is the client's to write: read it once, clamp what matters. */
	uint64_t delivered = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), s->published);
	uint64_t wait = __atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED);
	uint64_t step = __atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED);
	double stall = wait + step ? 100.0 * (double)wait / (double)(wait + step) : 0.0;
	uint64_t fill = session_fill(s);
	uint64_t full_ns = s->full_ns_total + (s->full_since_ns ? now_ns() - s->full_since_ns : 0);
	double attached_s = (double)(now_ns() - s->attach_ns) / 1e9;

	json_t *o = json_pack("{s:I, s:i, s:i, s:s, s:s, s:i, s:i, s:f, s:I, s:I, s:I, s:i, s:I, s:f, s:f, s:f, s:f, s:s}",
			      "id", (json_int_t)c->id, "pid", (int)c->pid, "uid", (int)c->uid, "name", c->name, "feed",
			      s->feed->name, "rank", (int)s->rank, "world", (int)s->world, "attached_s", attached_s,
			      "first_batch", (json_int_t)s->first_batch, "batches_published", (json_int_t)s->published,
			      "batches_delivered", (json_int_t)delivered, "ring_slots", (int)s->ring->slot_count,
			      "ring_fill", (json_int_t)fill, "ring_full_pct",
			      attached_s > 0 ? 100.0 * (double)full_ns / 1e9 / attached_s : 0.0, "tokens_per_s",
			      c->tokens_per_s, "wait_s", (double)wait / 1e9, "step_s", (double)step / 1e9, "state",
			      s->failed ? "failed" : "streaming");
	if (o) {
		json_object_set_new(o, "stall_pct", json_real(stall));
		/* What the trainer measured itself (feed_client_report), when it does. */
		json_object_set_new(o, "reports", json_integer((json_int_t)__atomic_load_n(&cp->reports, __ATOMIC_RELAXED)));
		json_object_set_new(o, "reported_step_s",
				    json_real((double)__atomic_load_n(&cp->reported_step_ns_total, __ATOMIC_RELAXED) / 1e9));
		json_object_set_new(o, "h2d_s", json_real((double)__atomic_load_n(&cp->h2d_ns_total, __ATOMIC_RELAXED) / 1e9));
		json_t *d = telemetry_client_diagnosis_json(s), *t = telemetry_client_json(s);
		json_object_set_new(o, "diagnosis", d ? d : json_null());
		json_object_set_new(o, "telemetry", t ? t : json_null());
	}
	return o;
}

char *status_json(const struct status_input *in)
{
	const struct worker *w0 = pool_worker_ctx(in->pool, 0);
	int fallback = w0 ? io_reader_fallback(w0->io) : 0;
	char fb[160] = "";
	if (fallback < 0)
		snprintf(fb, sizeof(fb), "io_uring unavailable (%s); using pread", strerror(-fallback));

	json_t *root = json_pack("{s:{s:s, s:i, s:f, s:s, s:i, s:i, s:i, s:s, s:o, s:s, s:I, s:I}}", "daemon",
				 "version", FEEDD_VERSION, "pid", (int)getpid(), "uptime_s", (double)in->uptime_ns / 1e9,
				 "socket", in->socket_path, "threads", (int)pool_threads(in->pool), "threads_busy",
				 (int)pool_busy(in->pool), "jobs_queued", (int)pool_queued(in->pool), "io_engine",
				 w0 ? io_reader_engine(w0->io) : "none", "io_fallback",
				 fallback < 0 ? json_string(fb) : json_null(), "gpu", in->gpu_status, "connections_total",
				 (json_int_t)in->accepted, "protocol_errors", (json_int_t)in->protocol_errors);
	if (!root)
		return NULL;
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
