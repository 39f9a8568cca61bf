/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/feed/session-internal.h"
#include "daemon/feed/session-text.h"
#include "proto/macro.h"

struct session_chunk *session_chunk_free(struct session_chunk *c)
{
	if (!c)
		return NULL;
	tokenize_chunk_done(&c->t);
	free(c->docs);
	free(c);
	return NULL;
}

/*
 * The chunk holding visit `seq`, moving chunk_cur forward. Chunks passed are
 * used by plans up to the batch being planned now at the latest.
 */
static struct session_chunk *chunk_at(struct session_src *x, uint64_t seq)
{
	struct session *s = x->session;
	struct session_chunk *c = x->chunk_cur ? x->chunk_cur : x->chunk_head;
	while (c && seq >= c->first_seq + c->t.n) {
		c->last_batch = s->first_batch + s->planned;
		c = c->next;
	}
	if (c)
		x->chunk_cur = c;
	return c && seq >= c->first_seq ? c : NULL;
}

/* The stream's source for text feeds: counts and tokens from finished chunks. */
int session_text_doc(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids)
{
	struct session_chunk *c = chunk_at(userdata, seq);
	if (!c || !c->done)
		return -EAGAIN;
	uint32_t i = (uint32_t)(seq - c->first_seq);
	*ret_tokens = tokenize_chunk_tokens(&c->t, i);
	*ret_ids = tokenize_chunk_ids(&c->t, i); /* NULL for a huge document: the worker makes them (lay_piece()) */
	return 0;
}

/*
 * Stream positions known from the stream's position on, through finished
 * chunks in order, counting up to `need`.
 */
uint64_t session_text_ready(struct session_src *x, uint64_t need)
{
	const struct stream *st = x->stream;
	/* A stream moving to its next document (its window's count awaited, issue #22) stands at that one's start. */
	uint64_t seq = st->advancing ? st->seq + 1 : st->seq, have = 0, offset = st->advancing ? 0 : st->offset;
	struct session_chunk *c = chunk_at(x, seq);
	for (; c && c->done && have < need + offset; c = c->next) {
		for (uint32_t i = seq > c->first_seq ? (uint32_t)(seq - c->first_seq) : 0;
		     i < c->t.n && have < need + offset; i++)
			have += stream_doc_length(st, tokenize_chunk_tokens(&c->t, i));
	}
	return have > offset ? have - offset : 0;
}

/*
 * Average text bytes per token of stream x so far (4 before enough was
 * tokenized): this session's own count of its own source, so a mixture's
 * sources each size their own chunks, and telemetry switches do not matter.
 */
static double bytes_per_token(const struct session_src *x)
{
	if (x->tok_tokens > 4096 && x->tok_bytes)
		return (double)x->tok_bytes / (double)x->tok_tokens;
	/* A virtual stream tokenizes a row now and then: its rank's streams together of this source. */
	const struct session *p = x->session->parent;
	if (p && x->index < MIX_MAX_SOURCES && p->sub_tok_tokens[x->index] > 4096 && p->sub_tok_bytes[x->index])
		return (double)p->sub_tok_bytes[x->index] / (double)p->sub_tok_tokens[x->index];
	return 4.0;
}

/*
 * Copies made on use (compressed text, format_prefetch: text_cache.c's copy
 * maker) are asked for from where tokenizing stands, which runs batches
 * ahead of the plan (whose own read-ahead, session-plan.c, names windows
 * the workers have mostly read already): the window of the next document
 * to tokenize, the one after, and more while they hold under AHEAD_SHARDS
 * shards and AHEAD_BYTES bytes (below the copy maker's idle list, 64
 * shards and 64 MiB, so copies made ahead are not closed before they are
 * read). A window of small shards is tokenized in well under the time one
 * copy took when copies were files; a maker one window ahead left the
 * workers making them on their read path.
 */
#define AHEAD_SHARDS 32
#define AHEAD_BYTES (UINT64_C(32) << 20)

static void ahead_prefetch(struct session_src *x)
{
	const struct doc_walk *w = &x->ahead;
	const struct order_params *p = w->params;
	if (!p || !w->ep.perm || (x->ahead_pf_epoch == w->ep.epoch && x->ahead_pf_window == (uint64_t)w->window + 1))
		return;
	x->ahead_pf_epoch = w->ep.epoch;
	x->ahead_pf_window = (uint64_t)w->window + 1;
	const struct feed *f = x->feed;
	uint64_t shards = 0, bytes = 0;
	for (uint64_t win = w->window; win < w->ep.n_windows; win++) {
		if (win > (uint64_t)w->window + 1 && (shards >= AHEAD_SHARDS || bytes >= AHEAD_BYTES))
			break;
		for (uint64_t i = win * p->window; i < MIN((win + 1) * p->window, (uint64_t)p->n_shards); i++) {
			const struct shard *sh = w->ep.perm[i] < f->n_shards ? f->shards[w->ep.perm[i]] : NULL;
			if (sh && (sh->lazy || sh->deferred)) { /* deferred: indexed ahead too (issue #22) */
				format_prefetch(sh);
				shards++;
				bytes += sh->bytes;
			}
		}
	}
}

/*
 * Stream positions tokenized or being tokenized from the stream's position
 * on, counting up to `need`: finished chunks by their tokens, chunks still
 * out with a worker by their bytes (bpt). Unlike session_text_ready(), a
 * chunk not back yet does not hide the finished ones after it: a walk that
 * waits for each window's count (issue #22) hands out a chunk per window,
 * and while the first of them was held up on a loaded machine, the ones
 * after it came back and were counted nowhere, so tokenizing ran on window
 * after window, counting and copying a whole epoch ahead of a resume.
 */
static uint64_t text_ahead(struct session_src *x, uint64_t need, double bpt)
{
	const struct stream *st = x->stream;
	uint64_t seq = st->advancing ? st->seq + 1 : st->seq, have = 0, offset = st->advancing ? 0 : st->offset;
	for (struct session_chunk *c = chunk_at(x, seq); c && have < need + offset; c = c->next) {
		if (!c->done) {
			have += (uint64_t)((double)c->t.bytes / bpt);
			continue;
		}
		for (uint32_t i = seq > c->first_seq ? (uint32_t)(seq - c->first_seq) : 0;
		     i < c->t.n && have < need + offset; i++)
			have += stream_doc_length(st, tokenize_chunk_tokens(&c->t, i));
	}
	return have > offset ? have - offset : 0;
}

/*
 * Hands the next documents of a text stream to the workers to tokenize,
 * until the finished and in-flight chunks cover the free slots plus one batch
 * (its share of them in a mixture, plus a bestfit buffer), and always when
 * the next plan waits for this stream with nothing in flight.
 */
int session_text_submit(struct session *s, struct session_src *x)
{
	const struct feed *f = x->feed, *top = s->feed;
	const struct session *root = session_root(s);
	/* A virtual stream with no row in the batches ahead, which no plan waits for: nothing to do (most of V'). */
	if (s->parent && !s->text_rows && !(s->starved == x->index && x->chunks_inflight == 0))
		return 0;
	const uint64_t bl = (uint64_t)s->rows_ahead * top->conf.seq_len;
	const unsigned threads = producer_threads(s->producer);
	/* No ring: an explanation (session-explain.c), whose rows_ahead covers every batch it was asked for. */
	const uint64_t free_slots = root->ring ? root->ring->slot_count - (root->planned - root->ring->tail) : 0;
	/*
	 * A virtual stream tokenizes for the rows it gives to those batches
	 * (session_virtual_text: a few of the rank's streams each batch), not
	 * for a rank's share of every one: 1,024 streams each a row ahead per
	 * free slot tokenized the corpus many times over.
	 */
	uint64_t target = (s->parent ? s->text_rows * top->conf.seq_len : (free_slots + 1) * bl) + 1;
	if (top->conf.packing == CONF_PACKING_BESTFIT)
		target += top->conf.pack_buffer;
	if (top->conf.mix) {
		uint64_t units = 0;
		for (uint32_t i = 0; i < top->conf.mix->n; i++)
			units += top->conf.mix->units[i];
		target = (uint64_t)((double)target * (double)top->conf.mix->units[x->index] / (double)units) + 1;
	}
	if (s->parent && !s->text_rows)
		target = 0; /* none of its rows in those batches: tokenized once it has some, or when a plan waits for it */
	const double bpt = bytes_per_token(x);
	/* Chunks small enough to spread one batch over every thread, large enough to amortise a job. */
	uint64_t chunk_bytes = MIN(MAX((uint64_t)((double)bl * bpt) / MAX(threads, 1u), UINT64_C(16) << 10),
				   UINT64_C(1) << 20);
	/*
	 * A virtual stream gives a row every V'/B batches or so: what it needs
	 * now, not 16 KiB (three rows of short documents, tokenized batches
	 * before their turn, for every stream of the rank).
	 */
	if (s->parent)
		chunk_bytes = MIN(chunk_bytes, MAX((uint64_t)((double)target * bpt), UINT64_C(1) << 10));

	bool waiting = false; /* for a shard's count or index (issue #22): nothing more until it is in */
	while (!waiting && !x->ahead_end && x->chunks_inflight < 2 * threads + 1) {
		if (x->ahead.pending || x->ahead_unplaced) {
			/* The walk waited for a window's count (issue #22): on from there, or wait on. */
			unsigned crossed;
			int r = doc_walk_next(&x->ahead, &crossed);
			if (r == -ENODATA) {
				x->ahead_end = true;
				break;
			}
			if (r == -EAGAIN)
				return 0; /* the pump hands the shard to the pool (session_count_ask) */
			if (r < 0)
				return r;
			x->ahead_unplaced = false;
		}
		uint64_t have = x->q_positions + text_ahead(x, target, bpt);
		if (have >= target && !(s->starved == x->index && x->chunks_inflight == 0))
			break;
		struct session_chunk *c = calloc(1, sizeof(*c));
		uint32_t cap = 64;
		if (c)
			c->docs = malloc(cap * sizeof(*c->docs));
		if (!c || !c->docs) {
			session_chunk_free(c);
			return -ENOMEM;
		}
		ahead_prefetch(x);
		c->first_seq = x->ahead_seq;
		c->pj.kind = PRODUCER_CHUNK;
		c->pj.session = s;
		c->src = x;
		while (c->t.n < 65536 && c->t.bytes < chunk_bytes) {
			if (c->t.n == cap) {
				uint64_t *d = realloc(c->docs, 2 * cap * sizeof(*d));
				if (!d) {
					session_chunk_free(c);
					return -ENOMEM;
				}
				c->docs = d;
				cap *= 2;
			}
			uint64_t doc = doc_walk_doc(&x->ahead);
			/* Its shard's index let go (issue #22): built again on the pool, never here (session-count.c). */
			if (!feed_shard_readable(x->feed, ORDER_DOC_SHARD(doc))) {
				waiting = true;
				break;
			}
			c->docs[c->t.n++] = doc;
			c->t.bytes += format_doc_bytes(f->shards[ORDER_DOC_SHARD(doc)], ORDER_DOC_INDEX(doc));
			x->ahead_seq++;
			unsigned crossed;
			int r = doc_walk_next(&x->ahead, &crossed);
			if (r == -ENODATA) {
				x->ahead_end = true;
				break;
			}
			if (r == -EAGAIN) {
				waiting = true; /* a window not counted yet: this chunk goes as it is, the next waits for the count */
				break;
			}
			if (r < 0) {
				session_chunk_free(c);
				return r;
			}
			ahead_prefetch(x); /* a new window: its copies and the next ones' asked for */
		}
		if (c->t.n == 0) {
			session_chunk_free(c);
			return 0; /* the pump hands the shard to the pool (session_count_ask) */
		}
		c->t.docs = c->docs;
		if (x->chunk_tail)
			x->chunk_tail->next = c;
		else
			x->chunk_head = c;
		x->chunk_tail = c;
		if (!x->chunk_cur)
			x->chunk_cur = c;
		x->chunks_inflight++;
		session_ref(s);
		if (s->parent)
			session_ref(s->parent); /* dropped by session_chunk_done(): the rank's ring outlives the chunk */
		producer_submit(s->producer, &c->pj);
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
	uint64_t hold = x->stream->advancing ? x->stream->seq + 1 : x->stream->seq; /* + 1: UINT64_MAX before the first */
	if (x->q_n)
		hold = MIN(hold, x->queue[x->q_head].seq);
	const struct session *root = session_root(s);
	for (uint32_t i = 0; i < root->ring->slot_count; i++) {
		const struct session_job *j = &root->jobs[i];
		if (j->state == JOB_IDLE)
			continue;
		if (!s->parent)
			hold = MIN(hold, j->hold[x->index]);
		for (uint32_t r = 0; s->parent && j->vrows && r < root->batch_size; r++)
			if (j->vrows[r].sub == s)
				hold = MIN(hold, j->vrows[r].job.hold[x->index]);
	}
	for (size_t i = 0; i < s->bestfit.n_docs && bestfit_rows_left(&s->bestfit) > 0; i++)
		if (s->bestfit.docs[i].source == x->index)
			hold = MIN(hold, s->bestfit.docs[i].seq);
	if (s->concat.have && s->concat.cur.source == x->index)
		hold = MIN(hold, s->concat.cur.seq);
	return hold;
}

/*
 * Frees the chunks no plan in flight or to come uses any more. Plain concat
 * knows that from last_batch, which chunk_at() sets as the stream walks past
 * a chunk while planning (so a lookup is also what records the chunk's last
 * user); whole-document plans from text_hold(). A chunk still out with a
 * worker is never freed here: the worker writes into it.
 */
void session_text_retire(struct session *s, struct session_src *x)
{
	const uint64_t hold = s->by_docs ? text_hold(s, x) : 0;
	while (x->chunk_head && x->chunk_head != x->chunk_cur && x->chunk_head->done &&
	       (s->by_docs ? x->chunk_head->first_seq + x->chunk_head->t.n <= hold
			   : x->chunk_head->last_batch < s->first_batch + s->published)) {
		struct session_chunk *c = x->chunk_head;
		assert(c->done && c->src == x);
		x->chunk_head = c->next;
		if (!x->chunk_head)
			x->chunk_tail = NULL;
		session_chunk_free(c);
	}
}

/* Takes in a finished chunk: its failure, its bad records, its bytes per token. */
static void chunk_take(struct session *s, struct session_chunk *c)
{
	struct feed *f = c->src->feed;
	assert(!c->done && c->src->chunks_inflight > 0);
	c->done = true;
	c->src->chunks_inflight--;
	if (session_root(s)->failed || session_root(s)->closed)
		return;
	if (c->result < 0) {
		/* A shard changed: the feed clients attached to (a mixture's, not its source's) too, now. */
		if (c->result == -ENODATA || c->result == -ESTALE)
			producer_recheck(s->producer, session_root(s)->feed);
		if (c->result == -EUCLEAN) /* a damaged block (docs/checksums.md): the feed fails, not only this session */
			feed_fail(f, -EUCLEAN, c->t.error);
		session_fail(s, c->result, c->t.error);
		return;
	}
	c->src->tok_bytes += c->t.bytes;
	c->src->tok_tokens += c->t.tokens;
	if (s->parent && c->src->index < MIX_MAX_SOURCES) {
		s->parent->sub_tok_bytes[c->src->index] += c->t.bytes;
		s->parent->sub_tok_tokens[c->src->index] += c->t.tokens;
	}
	for (uint32_t i = 0; i < c->t.n; i++) {
		if (feed_count_tokens(f, c->t.docs[i], tokenize_chunk_tokens(&c->t, i)) < 0) {
			session_fail(s, -ENOMEM, "out of memory counting tokens");
			return;
		}
	}
	if (c->t.skipped) {
		for (uint32_t i = 0; i < c->t.n; i++) {
			if (c->t.bad[i] && feed_mark_bad(f, c->t.docs[i], c->t.bad[i]) < 0) {
				session_fail(s, -ENOMEM, "out of memory counting bad records");
				return;
			}
		}
		char msg[1024];
		int r = feed_check_bad(f, msg, sizeof(msg));
		if (r < 0)
			session_fail(s, r, msg);
	}
}

void session_chunk_done(struct session *s, struct session_chunk *c)
{
	struct session *root = session_root(s);
	chunk_take(s, c);
	if (!root->failed && !root->closed)
		session_pump(root);
	if (s->parent)
		session_unref(s->parent);
}
