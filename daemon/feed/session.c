/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/feed/session.h"
#include "daemon/feed/worker.h"
#include "daemon/log/log.h"
#include "proto/macro.h"

struct producer {
	struct pool *pool;
	struct event_base *base;
	int done_efd;
	struct event *done_ev;
	pthread_mutex_t lock;
	struct session_job *done; /* finished jobs, pushed by workers */
	struct text_chunk *chunks_done; /* tokenized chunks, pushed by workers */
	enum io_engine engine;
	unsigned io_depth;
};

static void session_unref(struct session *s);
static void pump(struct session *s);

static void *worker_ctx_new(unsigned i, void *arg)
{
	struct producer *p = arg;
	return worker_new(p->engine, p->io_depth);
}

static void worker_ctx_free(void *ctx)
{
	worker_free(ctx);
}

static void job_run(struct pool_job *pj, void *ctx)
{
	struct session_job *j = (struct session_job *)((char *)pj - offsetof(struct session_job, job));
	struct session *s = j->session;
	struct producer *p = s->producer;

	if (__atomic_load_n(&s->closed, __ATOMIC_RELAXED)) {
		j->result = -ECANCELED;
	} else {
		uint64_t seq = (s->by_docs ? j->rows.batch_index : j->plan.batch_index) - s->first_batch;
		uint8_t *slot = ring_slot(s->ring, seq);
		((struct feed_slot_header *)slot)->seq = seq;
		if (s->by_docs)
			j->result = worker_produce_rows(ctx, s->feed, &j->rows, s->rank, s->world, j->cursor,
							s->ring->hdr, slot, j->error, sizeof(j->error));
		else
			j->result = worker_produce(ctx, s->feed, &j->plan, s->rank, s->world, j->cursor, s->ring->hdr,
						   slot, j->error, sizeof(j->error));
	}

	pthread_mutex_lock(&p->lock);
	j->next_done = p->done;
	p->done = j;
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	ssize_t _unused_ n = write(p->done_efd, &one, sizeof(one));
}

static void chunk_run(struct pool_job *pj, void *ctx)
{
	struct text_chunk *c = (struct text_chunk *)((char *)pj - offsetof(struct text_chunk, job));
	struct session *s = c->session;
	struct producer *p = s->producer;

	if (__atomic_load_n(&s->closed, __ATOMIC_RELAXED))
		c->result = -ECANCELED;
	else
		c->result = worker_tokenize(ctx, c->src->feed, c);

	pthread_mutex_lock(&p->lock);
	c->next_done = p->chunks_done;
	p->chunks_done = c;
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	ssize_t _unused_ n = write(p->done_efd, &one, sizeof(one));
}

static struct text_chunk *chunk_free(struct text_chunk *c)
{
	if (!c)
		return NULL;
	free(c->docs);
	free(c->start);
	free(c->ids);
	for (uint32_t i = 0; c->bad && i < c->n; i++)
		free(c->bad[i]);
	free(c->bad);
	free(c);
	return NULL;
}

/*
 * The chunk holding visit `seq`, moving chunk_cur forward. Chunks passed are
 * used by plans up to the batch being planned now at the latest.
 */
static struct text_chunk *chunk_at(struct session_src *x, uint64_t seq)
{
	struct session *s = x->session;
	struct text_chunk *c = x->chunk_cur ? x->chunk_cur : x->chunk_head;
	while (c && seq >= c->first_seq + c->n) {
		c->last_batch = s->first_batch + s->planned;
		c = c->next;
	}
	if (c)
		x->chunk_cur = c;
	return c && seq >= c->first_seq ? c : NULL;
}

/* The stream's source for text feeds: counts and tokens from finished chunks. */
static int text_doc(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids)
{
	struct text_chunk *c = chunk_at(userdata, seq);
	if (!c || !c->done)
		return -EAGAIN;
	uint32_t i = (uint32_t)(seq - c->first_seq);
	*ret_tokens = c->start[i + 1] - c->start[i];
	*ret_ids = c->ids + c->start[i];
	return 0;
}

/*
 * Stream positions known from the stream's position on, through finished
 * chunks in order, counting up to `need`.
 */
static uint64_t text_ready(struct session_src *x, uint64_t need)
{
	const struct stream *st = x->stream;
	uint64_t seq = st->seq, have = 0;
	struct text_chunk *c = chunk_at(x, seq);
	for (; c && c->done && have < need + st->offset; c = c->next) {
		for (uint32_t i = seq > c->first_seq ? (uint32_t)(seq - c->first_seq) : 0;
		     i < c->n && have < need + st->offset; i++)
			have += stream_doc_length(st, c->start[i + 1] - c->start[i]);
	}
	return have > st->offset ? have - st->offset : 0;
}

/* Average text bytes per token so far (4 before anything was tokenized). */
static double bytes_per_token(const struct feed *f)
{
	uint64_t tokens = __atomic_load_n(&f->tok_tokens, __ATOMIC_RELAXED);
	uint64_t bytes = __atomic_load_n(&f->stages->tokenize.bytes, __ATOMIC_RELAXED);
	return tokens > 4096 && bytes ? (double)bytes / (double)tokens : 4.0;
}

/*
 * Hands the next documents of a text stream to the workers to tokenize,
 * until the finished and in-flight chunks cover the free slots plus one batch
 * (its share of them in a mixture, plus a bestfit buffer), and always when
 * the next plan waits for this stream with nothing in flight.
 */
static int text_submit(struct session *s, struct session_src *x)
{
	const struct feed *f = x->feed, *top = s->feed;
	const uint64_t bl = (uint64_t)top->conf.batch_size * top->conf.seq_len;
	const unsigned threads = pool_threads(s->producer->pool);
	const uint64_t free_slots = s->ring->slot_count - (s->planned - s->ring->tail);
	uint64_t target = (free_slots + 1) * bl + 1;
	if (top->conf.packing == CONF_PACKING_BESTFIT)
		target += top->conf.pack_buffer;
	if (top->conf.mix) {
		uint64_t units = 0;
		for (uint32_t i = 0; i < top->conf.mix->n; i++)
			units += top->conf.mix->units[i];
		target = (uint64_t)((double)target * (double)top->conf.mix->units[x->index] / (double)units) + 1;
	}
	const double bpt = bytes_per_token(f);
	/* Chunks small enough to spread one batch over every thread, large enough to amortise a job. */
	const uint64_t chunk_bytes = MIN(MAX((uint64_t)((double)bl * bpt) / MAX(threads, 1u), UINT64_C(16) << 10),
					 UINT64_C(1) << 20);

	while (!x->ahead_end && x->chunks_inflight < 2 * threads + 1) {
		uint64_t have = x->q_positions + text_ready(x, target) + (uint64_t)((double)x->inflight_bytes / bpt);
		if (have >= target && !(s->starved == x->index && x->chunks_inflight == 0))
			break;
		struct text_chunk *c = calloc(1, sizeof(*c));
		uint32_t cap = 64;
		if (c)
			c->docs = malloc(cap * sizeof(*c->docs));
		if (!c || !c->docs) {
			chunk_free(c);
			return -ENOMEM;
		}
		c->first_seq = x->ahead_seq;
		c->session = s;
		c->src = x;
		c->job.run = chunk_run;
		while (c->n < 65536 && c->bytes < chunk_bytes) {
			if (c->n == cap) {
				uint64_t *d = realloc(c->docs, 2 * cap * sizeof(*d));
				if (!d) {
					chunk_free(c);
					return -ENOMEM;
				}
				c->docs = d;
				cap *= 2;
			}
			uint64_t doc = doc_walk_doc(&x->ahead);
			c->docs[c->n++] = doc;
			c->bytes += format_doc_bytes(f->shards[ORDER_DOC_SHARD(doc)], ORDER_DOC_INDEX(doc));
			x->ahead_seq++;
			unsigned crossed;
			int r = doc_walk_next(&x->ahead, &crossed);
			if (r == -ENODATA) {
				x->ahead_end = true;
				break;
			}
			if (r < 0) {
				chunk_free(c);
				return r;
			}
		}
		if (x->chunk_tail)
			x->chunk_tail->next = c;
		else
			x->chunk_head = c;
		x->chunk_tail = c;
		if (!x->chunk_cur)
			x->chunk_cur = c;
		x->chunks_inflight++;
		x->inflight_bytes += c->bytes;
		s->refs++;
		pool_submit(s->producer->pool, &c->job);
	}
	return 0;
}

/*
 * The oldest visit of stream x whose tokens something still reads: a plan
 * not yet published, the bestfit buffer, the document in progress, the
 * queue, or the stream itself (by_docs sessions).
 */
static uint64_t text_hold(struct session *s, struct session_src *x)
{
	uint64_t hold = x->stream->seq;
	if (x->q_n)
		hold = MIN(hold, x->queue[x->q_head].seq);
	for (uint32_t i = 0; i < s->ring->slot_count; i++)
		if (s->jobs[i].state != JOB_IDLE)
			hold = MIN(hold, s->jobs[i].hold[x->index]);
	for (size_t i = 0; i < s->bestfit.n_docs && bestfit_rows_left(&s->bestfit) > 0; i++)
		if (s->bestfit.docs[i].source == x->index)
			hold = MIN(hold, s->bestfit.docs[i].seq);
	if (s->concat.have && s->concat.cur.source == x->index)
		hold = MIN(hold, s->concat.cur.seq);
	return hold;
}

/* Frees the chunks no plan in flight or to come uses any more. */
static void text_retire(struct session *s, struct session_src *x)
{
	const uint64_t hold = s->by_docs ? text_hold(s, x) : 0;
	while (x->chunk_head && x->chunk_head != x->chunk_cur && x->chunk_head->done &&
	       (s->by_docs ? x->chunk_head->first_seq + x->chunk_head->n <= hold
			   : x->chunk_head->last_batch < s->first_batch + s->published)) {
		struct text_chunk *c = x->chunk_head;
		x->chunk_head = c->next;
		if (!x->chunk_head)
			x->chunk_tail = NULL;
		chunk_free(c);
	}
}

/* A chunk came back from a worker (main thread). */
static void chunk_done(struct session *s, struct text_chunk *c)
{
	struct feed *f = c->src->feed;
	c->done = true;
	c->src->chunks_inflight--;
	c->src->inflight_bytes -= c->bytes;
	if (s->failed || s->closed)
		return;
	if (c->result < 0) {
		if (c->result == -ENODATA)
			feed_check(f);
		session_fail(s, c->result, c->error);
		return;
	}
	if (c->skipped) {
		for (uint32_t i = 0; i < c->n; i++) {
			if (!c->bad[i])
				continue;
			int r = feed_mark_bad(f, c->docs[i]);
			if (r < 0) {
				session_fail(s, -ENOMEM, "out of memory counting bad records");
				return;
			}
			if (r == 0)
				continue; /* met before, in another epoch or by another rank */
			snprintf(f->last_bad, sizeof(f->last_bad), "%s", c->bad[i]);
			/* Logged, but not a line per record for a feed full of them. */
			if (f->bad_records <= 10)
				log_warning("feed %s: skipped a bad record: %s%s", f->name, c->bad[i],
					    f->bad_records == 10 ? " (further ones are only counted)" : "");
		}
		/* Every document bad fails too (max_bad_fraction = 1): nothing is left to serve, however many epochs are walked. */
		bool all = f->bad_records >= f->n_docs;
		if (all || (double)f->bad_records > f->conf.max_bad_fraction * (double)f->n_docs) {
			char msg[1024];
			if (all)
				snprintf(msg, sizeof(msg), "feed %s: every one of its %" PRIu64 " documents is a bad record; the latest: %s",
					 f->name, f->n_docs, f->last_bad);
			else
				snprintf(msg, sizeof(msg),
					 "%" PRIu64 " bad records skipped, more than max_bad_fraction %g of the feed's %" PRIu64
					 " documents; the latest: %s",
					 f->bad_records, f->conf.max_bad_fraction, f->n_docs, f->last_bad);
			if (f->state == FEED_READY) {
				f->state = FEED_FAILED;
				f->error_code = -EBADMSG;
				snprintf(f->error, sizeof(f->error), "%.*s", (int)sizeof(f->error) - 1, msg);
			}
			session_fail(s, -EBADMSG, msg);
		}
	}
}

void session_fail(struct session *s, int code, const char *msg)
{
	if (s->failed || s->closed)
		return;
	s->failed = true;
	log_error("feed %s rank %u/%u: %s", s->feed->name, s->rank, s->world, msg);
	ring_set_state(s->ring, FEED_RING_FAILED, code);
	if (s->on_fail)
		s->on_fail(s, code, msg, s->userdata);
}

/*
 * Publishes finished slots, strictly in order. A failed batch stops the
 * session there: the client still receives every batch before it.
 */
static void advance(struct session *s)
{
	uint64_t before = s->published;
	struct session_job *failed = NULL;
	int staged = 0;
	while (s->published < s->planned) {
		struct session_job *j = &s->jobs[s->published % s->ring->slot_count];
		if (j->state != JOB_DONE)
			break;
		if (j->result < 0) {
			failed = j;
			break;
		}
		struct feed_slot_header *h = (struct feed_slot_header *)ring_slot(s->ring, s->published);
		h->produced_ns = now_ns();
		/* GPU staging: H2D queued and `ready` recorded before head moves (daemon/gpu/staging.h). */
		if (s->staging && (staged = staging_publish(s->staging, s->published, s->ring->tail)) < 0)
			break;
		j->state = JOB_IDLE;
		s->published++;
		struct feed *f = s->feed;
		f->tokens_served += (uint64_t)f->conf.batch_size * f->conf.seq_len;
		f->batches++;
		pack_counters_add(&f->packed, &j->counts);
		for (uint32_t i = 0; f->n_sources && i < f->n_sources; i++)
			f->source_docs[i] += j->src_docs[i];
	}
	if (s->published != before)
		ring_publish(s->ring, s->published);
	for (uint32_t i = 0; s->has_text && i < s->n_srcs; i++)
		if (s->srcs[i].feed->kind == FEED_TEXT)
			text_retire(s, &s->srcs[i]);
	if (staged < 0)
		session_fail(s, staged, s->staging->backend->error);
	if (failed) {
		/* A short read means a shard changed: mark the feed now, not at the next periodic check. */
		if (failed->result == -ENODATA)
			feed_check(s->feed);
		session_fail(s, failed->result, failed->error);
	}
}

static void on_done(evutil_socket_t fd, short what, void *userdata)
{
	struct producer *p = userdata;
	uint64_t v;
	ssize_t _unused_ n = read(fd, &v, sizeof(v));

	pthread_mutex_lock(&p->lock);
	struct session_job *list = p->done;
	p->done = NULL;
	struct text_chunk *chunks = p->chunks_done;
	p->chunks_done = NULL;
	pthread_mutex_unlock(&p->lock);

	while (chunks) {
		struct text_chunk *c = chunks;
		chunks = c->next_done;
		struct session *s = c->session;
		chunk_done(s, c);
		if (!s->failed && !s->closed)
			pump(s);
		session_unref(s);
	}

	while (list) {
		struct session_job *j = list;
		list = j->next_done;
		struct session *s = j->session;
		j->state = JOB_DONE;
		if (!s->failed && !s->closed) {
			advance(s);
			pump(s);
		}
		session_unref(s);
	}
}

static void on_space(evutil_socket_t fd, short what, void *userdata)
{
	struct session *s = userdata;
	ring_space_ack(s->ring);
	pump(s);
}

/* ---- Packing whole documents: "pad", "bestfit", and mixtures (docs/sample-order.md, sections 11 to 14) ---- */

static struct pack_doc *queue_at(struct session_src *x, size_t i)
{
	return &x->queue[(x->q_head + i) & (x->q_cap - 1)];
}

/*
 * Takes documents from stream x into its queue until it holds `want`.
 * Returns 0; -EAGAIN when a count is not known yet (tokenized text);
 * -ENODATA (the rank gets no tokens); -ENOMEM.
 */
static int queue_fill(struct session_src *x, size_t want)
{
	struct stream *st = x->stream;
	while (x->q_n < want) {
		int r = stream_settle(st);
		if (r < 0)
			return r;
		if (x->q_n == x->q_cap) {
			size_t cap = MAX(x->q_cap * 2, (size_t)64);
			struct pack_doc *q = malloc(cap * sizeof(*q));
			if (!q)
				return -ENOMEM;
			for (size_t i = 0; i < x->q_n; i++)
				q[i] = *queue_at(x, i);
			free(x->queue);
			x->queue = q;
			x->q_cap = cap;
			x->q_head = 0;
		}
		struct pack_doc d = {
			.length = st->length, .epoch = st->walk.ep.epoch, .source = x->index, .seq = st->seq,
			.pos = stream_tell(st), .ids = st->ids,
		};
		struct stream_piece piece;
		r = stream_take(st, UINT64_MAX, &piece);
		if (r < 0)
			return r;
		d.id = piece.doc;
		*queue_at(x, x->q_n++) = d;
		x->q_positions += d.length;
	}
	return 0;
}

/* The position of stream x's next undrawn document (what a cursor names for it). */
static int queue_head_pos(struct session_src *x, struct stream_pos *ret)
{
	int r = queue_fill(x, 1);
	if (r < 0)
		return r;
	*ret = queue_at(x, 0)->pos;
	return 0;
}

static uint32_t source_of(const struct session *s, uint64_t k)
{
	return s->feed->n_sources ? mix_source(&s->feed->mix, k) : 0;
}

/* pack_source.next: the next document of the (mixed) sequence. */
static int docs_next(void *userdata, struct pack_doc *ret)
{
	struct session *s = userdata;
	struct session_src *x = &s->srcs[source_of(s, s->mix_k)];
	int r = queue_fill(x, 1);
	if (r < 0)
		return r == -EAGAIN ? -EDEADLK : r; /* plan_ready() said every count was known */
	*ret = *queue_at(x, 0);
	x->q_head = (x->q_head + 1) & (x->q_cap - 1);
	x->q_n--;
	x->q_positions -= ret->length;
	s->mix_k++;
	return 0;
}

/* pack_source.mark: a bestfit buffer starts here; cursors inside it name this place. */
static void docs_mark(void *userdata)
{
	struct session *s = userdata;
	s->mark.k = s->mix_k;
	for (uint32_t i = 0; i < s->n_srcs && !s->mark.error; i++) {
		int r = queue_head_pos(&s->srcs[i], &s->mark.pos[i]);
		if (r < 0)
			s->mark.error = r == -EAGAIN ? -EDEADLK : r;
	}
}

/* Draws the next document's length in plan_ready()'s dry run, without drawing it. */
static int dry_take(struct session *s, size_t *used, uint64_t *k, uint64_t *ret_len)
{
	uint32_t i = source_of(s, *k);
	struct session_src *x = &s->srcs[i];
	int r = queue_fill(x, used[i] + 1);
	if (r == -EAGAIN || r == -ENODATA)
		s->starved = i; /* to tokenize further, or the stream that ran dry */
	if (r < 0)
		return r;
	*ret_len = queue_at(x, used[i])->length;
	used[i]++;
	(*k)++;
	return 0;
}

/*
 * Whether the next plan (and the cursor after it) only needs documents whose
 * counts are known: a dry run of the packer over the queues, filling them
 * from the streams. Bestfit counts a buffer's rows from below (its positions
 * / L), so it may ask for more documents than the plan takes, never fewer.
 * Returns 0; -EAGAIN with s->starved naming the stream to tokenize further;
 * -ENODATA, -ENOMEM.
 */
static int plan_ready(struct session *s)
{
	const struct feed *f = s->feed;
	const uint64_t B = f->conf.batch_size, L = f->conf.seq_len;
	size_t used[MIX_MAX_SOURCES] = { 0 };
	uint64_t k = s->mix_k, len;
	int r = 0;
	s->starved = UINT32_MAX;
	if (f->conf.packing == CONF_PACKING_PAD) {
		for (uint64_t i = 0; i < B && r == 0; i++)
			r = dry_take(s, used, &k, &len);
	} else if (f->conf.packing == CONF_PACKING_CONCAT) {
		const struct concat *c = &s->concat;
		uint64_t need = B * L + 1, have = c->have ? c->cur.length - c->offset : 0;
		need = c->have ? (need > have ? need - have : 0) : need + c->skip;
		while (need > 0 && r == 0) {
			r = dry_take(s, used, &k, &len);
			need -= MIN(need, len);
		}
	} else {
		uint64_t rows = s->resume_row ? 0 : bestfit_rows_left(&s->bestfit), want = B + s->resume_row;
		while (rows < want && r == 0) {
			uint64_t total = 0;
			while (total < f->conf.pack_buffer && r == 0) {
				r = dry_take(s, used, &k, &len);
				total += len;
			}
			rows += (total + L - 1) / L;
		}
	}
	/* The cursor after the plan names every stream's next document. */
	for (uint32_t i = 0; i < s->n_srcs && r == 0; i++) {
		r = queue_fill(&s->srcs[i], used[i] + 1);
		if (r == -EAGAIN)
			s->starved = i;
	}
	return r;
}

/* Why a plan found no tokens: a mixture names the source that ran dry. */
static const char *no_tokens_why(const struct session *s, char *buf, size_t len)
{
	if (s->n_srcs < 2 || s->starved >= s->n_srcs)
		return "this rank receives no tokens";
	snprintf(buf, len, "source %s gives this rank no tokens (every document it reached was empty or skipped as bad)",
		 s->srcs[s->starved].feed->name);
	return buf;
}

/* Plans batch `batch` into j (by_docs sessions). Returns 0 or a negative errno with a message in msg. */
static int plan_docs(struct session *s, struct session_job *j, uint64_t batch, char *msg, size_t msglen)
{
	const struct feed *f = s->feed;
	const struct pack_source src = { .next = docs_next, .mark = docs_mark, .userdata = s };
	int r;
	if (s->resume_row) {
		r = bestfit_resume(&s->bestfit, &src, s->resume_row);
		if (r == -EINVAL) {
			snprintf(msg, msglen, "cursor names row %" PRIu64 " of a packed buffer of %zu rows: it is not a position of this stream",
				 s->resume_row, s->bestfit.packing.n_rows);
			return r;
		}
		if (r < 0)
			goto fail;
		s->resume_row = 0;
	}
	if (f->conf.packing == CONF_PACKING_PAD)
		r = pad_plan(&src, f->conf.batch_size, f->conf.seq_len, batch, &j->rows);
	else if (f->conf.packing == CONF_PACKING_BESTFIT)
		r = bestfit_plan(&s->bestfit, &src, f->conf.batch_size, batch, &j->rows);
	else
		r = concat_plan(&s->concat, &src, f->conf.batch_size, batch, &j->rows);
	if (r == 0)
		r = s->mark.error;
	if (r < 0)
		goto fail;

	j->counts = j->rows.counts;
	for (uint32_t i = 0; i < MIX_MAX_SOURCES; i++) {
		j->src_docs[i] = 0;
		j->hold[i] = UINT64_MAX;
	}
	for (size_t i = 0; i < j->rows.n_pieces; i++) {
		const struct row_piece *p = &j->rows.pieces[i];
		j->src_docs[p->doc.source] += p->offset == 0;
		j->hold[p->doc.source] = MIN(j->hold[p->doc.source], p->doc.seq);
	}
	if (f->conf.packing == CONF_PACKING_CONCAT) {
		const struct row_piece *p = &j->rows.lookahead;
		j->hold[p->doc.source] = MIN(j->hold[p->doc.source], p->doc.seq);
	}
	return 0;
fail:;
	char why[160];
	snprintf(msg, msglen, "cannot plan batch %" PRIu64 ": %s", batch,
		 r == -ENODATA ? no_tokens_why(s, why, sizeof(why))
		 : r == -EINVAL ? "the cursor's offset lies past the end of its document"
		 : r == -EDEADLK ? "internal error: planned past the tokenized text"
				 : strerror(-r));
	return r;
}

/* The cursor after the batch just planned (by_docs sessions): sections 12.5 and 14.4. */
static int cursor_docs(struct session *s, struct cursor *c)
{
	const struct feed *f = s->feed;
	const bool in_buffer = f->conf.packing == CONF_PACKING_BESTFIT && bestfit_rows_left(&s->bestfit) > 0;
	const uint64_t row = in_buffer ? s->bestfit.row : 0;
	if (!f->n_sources) {
		if (in_buffer) {
			c->pos = s->mark.pos[0];
		} else {
			int r = queue_head_pos(&s->srcs[0], &c->pos);
			if (r < 0)
				return r;
		}
		c->pos.offset = row; /* fc1's <offset> carries the row: a buffer starts at a document's start */
		return 0;
	}
	c->n_sources = f->n_sources;
	c->row = row;
	c->k = in_buffer ? s->mark.k : s->mix_k;
	for (uint32_t i = 0; i < f->n_sources; i++) {
		if (in_buffer) {
			c->src[i] = s->mark.pos[i];
		} else {
			int r = queue_head_pos(&s->srcs[i], &c->src[i]);
			if (r < 0)
				return r;
		}
		c->src[i].offset = 0;
	}
	if (f->conf.packing == CONF_PACKING_CONCAT) {
		/* The look-ahead's document is in progress: the position is inside it. */
		c->k = s->mix_k - 1;
		c->offset = s->concat.offset;
		c->src[s->concat.cur.source] = s->concat.cur.pos;
		c->src[s->concat.cur.source].offset = 0;
	}
	return 0;
}

/* A plain "concat" batch's counters (section 13.2): every position a token; documents crossing a row end. */
static void count_concat(const struct batch_plan *plan, struct pack_counters *ret)
{
	uint64_t pos = 0, L = plan->seq_len;
	*ret = (struct pack_counters){ .positions = (uint64_t)plan->batch_size * L };
	ret->tokens = ret->positions;
	for (size_t i = 0; i + 1 < plan->n_pieces; i++) {
		const struct stream_piece *p = &plan->pieces[i];
		if (p->offset == 0) {
			ret->docs++;
			ret->cut_docs += pos % L + p->length > L;
		}
		pos += p->count;
	}
}

/* Plans and submits batches while the client has free slots. */
static void pump(struct session *s)
{
	char msg[512];
	uint32_t n = s->ring->slot_count;
	for (;;) {
		if (s->failed || s->closed)
			return;
		if (ring_refresh_tail(s->ring) < 0) {
			session_fail(s, -EPROTO, "client wrote an invalid consumer position; disconnecting it");
			return;
		}
		uint64_t tail = s->ring->tail;
		if (s->published - tail < n && s->full_since_ns) {
			s->full_ns_total += now_ns() - s->full_since_ns;
			s->full_since_ns = 0;
		}
		const bool text = s->has_text;
		const uint64_t bl = (uint64_t)s->feed->conf.batch_size * s->feed->conf.seq_len;
		while (s->planned - tail < n) {
			struct session_job *j = &s->jobs[s->planned % n];
			uint64_t batch = s->first_batch + s->planned;
			int r = 0;
			/* The slot's last H2D copy may still read it; the space eventfd is kicked when it is done. */
			if (s->staging && (r = staging_host_reusable(s->staging, s->planned)) <= 0) {
				if (r < 0)
					session_fail(s, r, s->staging->backend->error);
				return;
			}
			struct cursor c = {
				.fingerprint = s->feed->fingerprint,
				.world = s->world,
				.rank = s->rank,
				.batch = batch + 1,
			};
			if (s->by_docs) {
				/* Plan only from known counts: every document the packer may draw, and the next of each stream. */
				r = text ? plan_ready(s) : 0;
				if (r == -EAGAIN)
					break;
				char why[160];
				if (r < 0)
					snprintf(msg, sizeof(msg), "cannot plan batch %" PRIu64 ": %s", batch,
						 r == -ENODATA ? no_tokens_why(s, why, sizeof(why)) : strerror(-r));
				else
					r = plan_docs(s, j, batch, msg, sizeof(msg));
				if (r == 0 && (r = cursor_docs(s, &c)) < 0)
					snprintf(msg, sizeof(msg), "cannot name the cursor after batch %" PRIu64 ": %s", batch,
						 strerror(-r));
				if (r < 0) {
					session_fail(s, r, msg);
					return;
				}
			} else {
				if (text) {
					/* Plan only what is tokenized: every position of the batch and the look-ahead. */
					r = stream_settle(&s->stream);
					if (r == -EAGAIN || (r == 0 && text_ready(&s->srcs[0], bl + 1) < bl + 1))
						break;
				}
				if (r == 0)
					r = pack_plan(&s->stream, s->feed->conf.batch_size, s->feed->conf.seq_len, batch,
						      &j->plan);
				if (r < 0) {
					snprintf(msg, sizeof(msg), "cannot plan batch %" PRIu64 ": %s", batch,
						 r == -ENODATA ? "this rank receives no tokens"
						 : r == -EINVAL ? "the cursor's offset lies past the end of its document"
								: strerror(-r));
					session_fail(s, r, msg);
					return;
				}
				c.pos = j->plan.next;
				count_concat(&j->plan, &j->counts);
			}
			if (cursor_format(&c, j->cursor, sizeof(j->cursor)) < 0) {
				session_fail(s, -ENOBUFS, "cursor does not fit");
				return;
			}
			j->state = JOB_RUNNING;
			j->session = s;
			s->refs++;
			s->planned++;
			pool_submit(s->producer->pool, &j->job);
		}
		for (uint32_t i = 0; text && i < s->n_srcs; i++) {
			if (s->srcs[i].feed->kind != FEED_TEXT)
				continue;
			int r = text_submit(s, &s->srcs[i]);
			if (r < 0) {
				session_fail(s, r, "cannot queue documents to tokenize: out of memory");
				return;
			}
		}
		if (s->published - tail == n && !s->full_since_ns)
			s->full_since_ns = now_ns();
		/* Full: ask for a kick on release, unless the client released meanwhile. */
		if (!ring_wait_space(s->ring))
			return;
	}
}

int producer_new(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
		 struct producer **ret)
{
	struct producer *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->base = base;
	p->engine = engine;
	p->io_depth = io_depth;
	p->done_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int r = p->done_efd < 0 ? -errno : 0;
	if (r == 0) {
		p->done_ev = event_new(base, p->done_efd, EV_READ | EV_PERSIST, on_done, p);
		r = p->done_ev && event_add(p->done_ev, NULL) == 0 ? 0 : -ENOMEM;
	}
	if (r == 0)
		r = pool_new(threads, worker_ctx_new, worker_ctx_free, p, &p->pool);
	if (r < 0) {
		producer_free(p);
		return r;
	}
	*ret = p;
	return 0;
}

struct producer *producer_free(struct producer *p)
{
	if (!p)
		return NULL;
	/* Joining the pool finishes every queued job; their completions are dropped with it. */
	p->pool = pool_free(p->pool);
	if (p->done_ev) {
		/* Deliver what finished, so sessions drop the references their jobs held. */
		on_done(p->done_efd, EV_READ, p);
		event_free(p->done_ev);
	}
	if (p->done_efd >= 0)
		close(p->done_efd);
	pthread_mutex_destroy(&p->lock);
	free(p);
	return NULL;
}

struct pool *producer_pool(struct producer *p)
{
	return p->pool;
}

static void session_unref(struct session *s)
{
	if (--s->refs > 0)
		return;
	if (s->space_ev)
		event_free(s->space_ev);
	bool leaked = false;
	s->staging = staging_free(s->staging, &leaked); /* before the ring: its copies read the ring */
	if (leaked)
		log_warning("feed %s rank %u/%u: GPU copies did not finish; keeping their memory", s->feed->name,
			    s->rank, s->world);
	for (uint32_t i = 0; s->jobs && i < s->ring->slot_count; i++) {
		pack_plan_clear(&s->jobs[i].plan);
		pad_batch_clear(&s->jobs[i].rows);
	}
	free(s->jobs);
	for (uint32_t i = 0; s->srcs && i < s->n_srcs; i++) {
		struct session_src *x = &s->srcs[i];
		if (x->stream)
			stream_clear(x->stream);
		free(x->queue);
		doc_walk_clear(&x->ahead);
		while (x->chunk_head) {
			struct text_chunk *c = x->chunk_head;
			x->chunk_head = c->next;
			chunk_free(c);
		}
	}
	free(s->srcs);
	bestfit_clear(&s->bestfit);
	ring_free(s->ring);
	s->feed->clients--;
	feed_unref(s->feed);
	free(s);
}

/*
 * Opens stream x at pos (NULL: the start). Returns 0 or a negative errno
 * with the attach error in err.
 */
static int src_open(struct session *s, struct session_src *x, const struct stream_pos *pos, char *err, size_t errlen)
{
	const struct feed *f = x->feed;
	int r;
	struct stream_source src = { .doc = text_doc, .userdata = x };
	if (f->kind == FEED_TEXT)
		r = stream_init_source(x->stream, &f->params, &src, s->rank, s->world, f->bos_id >= 0, f->eos_id >= 0,
				       pos);
	else
		r = stream_init(x->stream, &f->params, f->doc_tokens, s->rank, s->world, f->bos_id >= 0, f->eos_id >= 0,
				pos);
	if (r == 0 && f->kind == FEED_TEXT) {
		/* Tokenizing starts at the stream's own document and runs ahead of it. */
		const struct doc_walk *w = &x->stream->walk;
		r = doc_walk_seek(&x->ahead, &f->params, s->rank, s->world, w->ep.epoch, w->window, w->at);
		x->ahead_seq = x->stream->seq;
		if (r < 0) {
			snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
			return r;
		}
	}
	if (r == -EINVAL)
		snprintf(err, errlen, "cursor does not name a position in rank %u's stream of feed %s", s->rank, f->name);
	else if (r == -ENODATA)
		snprintf(err, errlen, "rank %u of world %u receives no tokens from feed %s", s->rank, s->world, f->name);
	else if (r < 0)
		snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
	return r;
}

int session_new(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		unsigned slots, session_fail_fn on_fail, void *userdata, struct session **ret, char *err,
		size_t errlen)
{
	int r;
	if (f->state != FEED_READY) {
		snprintf(err, errlen, "feed %s is not available: %s", f->name, f->error);
		return f->error_code < 0 ? f->error_code : -EIO;
	}
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		const struct feed *sf = f->n_sources ? f->sources[i] : f;
		if (world > sf->n_nonempty) {
			snprintf(err, errlen,
				 "feed %s has %" PRIu64 " non-empty documents, fewer than the world size %u: some ranks would get no data",
				 sf->name, sf->n_nonempty, world);
			return -EINVAL;
		}
	}
	const bool by_docs = f->n_sources > 0 || f->conf.packing != CONF_PACKING_CONCAT;
	if (c) {
		if (c->fingerprint != f->fingerprint) {
			snprintf(err, errlen,
				 "cursor belongs to another feed or another version of feed %s (fingerprint %016" PRIx64
				 ", the feed's is %016" PRIx64 "): its shards or parameters changed",
				 f->name, c->fingerprint, f->fingerprint);
			return -EINVAL;
		}
		if (c->world != world || c->rank != rank) {
			snprintf(err, errlen, "cursor is for rank %u of world %u, not rank %u of world %u", c->rank,
				 c->world, rank, world);
			return -EINVAL;
		}
		/* Only bestfit has rows inside a buffer, only a mixture's concat an offset inside its document k. */
		uint64_t row = f->n_sources ? c->row : by_docs ? c->pos.offset : 0;
		if (c->n_sources != f->n_sources || (row && f->conf.packing != CONF_PACKING_BESTFIT) ||
		    (c->offset && f->conf.packing != CONF_PACKING_CONCAT)) {
			snprintf(err, errlen, "cursor does not name a position in rank %u's stream of feed %s", rank,
				 f->name);
			return -EINVAL;
		}
	}

	struct session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->refs = 1;
	s->producer = p;
	s->feed = feed_ref(f);
	f->clients++;
	s->rank = rank;
	s->world = world;
	s->first_batch = c ? c->batch : 0;
	s->on_fail = on_fail;
	s->userdata = userdata;
	s->attach_ns = now_ns();
	s->by_docs = by_docs;
	s->starved = UINT32_MAX;

	struct ring_geometry g = { .slot_count = slots, .batch_size = f->conf.batch_size, .seq_len = f->conf.seq_len,
				   .rank = rank, .world = world };
	r = ring_new(&g, &s->ring);
	if (r < 0) {
		snprintf(err, errlen, "cannot reserve a ring of %u slots x %zu bytes: %s", slots,
			 ring_slot_bytes(g.batch_size, g.seq_len), strerror(-r));
		goto fail;
	}
	s->jobs = calloc(slots, sizeof(*s->jobs));
	s->n_srcs = MAX(f->n_sources, 1u);
	s->srcs = calloc(s->n_srcs, sizeof(*s->srcs));
	if (!s->jobs || !s->srcs) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (unsigned i = 0; i < slots; i++)
		s->jobs[i].job.run = job_run;

	for (uint32_t i = 0; i < s->n_srcs; i++) {
		struct session_src *x = &s->srcs[i];
		*x = (struct session_src){ .session = s, .feed = f->n_sources ? f->sources[i] : f, .index = i };
		x->stream = i == 0 ? &s->stream : &x->own;
		s->has_text |= x->feed->kind == FEED_TEXT;
		struct stream_pos at;
		const struct stream_pos *pos = NULL;
		if (c) {
			at = f->n_sources ? c->src[i] : c->pos;
			if (by_docs)
				at.offset = 0; /* by_docs streams stand at a document's start; fc1 carries the row there */
			pos = &at;
		}
		r = src_open(s, x, pos, err, errlen);
		if (r < 0)
			goto fail;
	}

	if (by_docs) {
		s->mix_k = c && f->n_sources ? c->k : 0;
		concat_init(&s->concat, f->conf.seq_len, c ? c->offset : 0);
		if (f->conf.packing == CONF_PACKING_BESTFIT &&
		    (r = bestfit_init(&s->bestfit, f->conf.seq_len, f->conf.pack_buffer)) < 0) {
			snprintf(err, errlen, "pack_buffer %" PRIu64 " is out of range", f->conf.pack_buffer);
			goto fail;
		}
		if (c)
			s->resume_row = f->n_sources ? c->row : c->pos.offset;
		if (!s->has_text) {
			/* Stored tokens: every count is known, so a cursor that names no position is refused now. */
			const struct pack_source src = { .next = docs_next, .mark = docs_mark, .userdata = s };
			if (s->resume_row) {
				r = bestfit_resume(&s->bestfit, &src, s->resume_row);
				s->resume_row = 0;
			} else if (s->concat.skip) {
				struct session_src *x = &s->srcs[source_of(s, s->mix_k)];
				r = queue_fill(x, 1);
				if (r == 0 && s->concat.skip >= queue_at(x, 0)->length)
					r = -EINVAL;
			}
			if (r == 0)
				r = s->mark.error;
			if (r == -EINVAL)
				snprintf(err, errlen, "cursor does not name a position in rank %u's stream of feed %s", rank,
					 f->name);
			else if (r < 0)
				snprintf(err, errlen, "cannot start the stream: %s", strerror(-r));
			if (r < 0)
				goto fail;
		}
	}

	s->space_ev = event_new(p->base, s->ring->space_efd, EV_READ | EV_PERSIST, on_space, s);
	if (!s->space_ev || event_add(s->space_ev, NULL) < 0) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	*ret = s;
	pump(s);
	return 0;
fail:
	session_unref(s);
	return r;
}

struct session *session_close(struct session *s)
{
	if (!s)
		return NULL;
	__atomic_store_n(&s->closed, true, __ATOMIC_RELAXED);
	if (s->space_ev)
		event_del(s->space_ev);
	session_unref(s);
	return NULL;
}

uint64_t session_fill(struct session *s)
{
	ring_refresh_tail(s->ring);
	return s->published - s->ring->tail;
}

void session_stop(struct session *s)
{
	ring_set_state(s->ring, FEED_RING_STOPPING, -ESHUTDOWN);
}
