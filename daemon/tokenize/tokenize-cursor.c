/* SPDX-License-Identifier: MIT */
/*
 * A huge document read, JSON-decoded and tokenized a segment at a time
 * (tokenize_stream_*), and the cursors that make a huge document's ids again
 * when rows need them (tokenize_cursor_*, tokenize_pool_*): the chunk that
 * counted such a document keeps its token count, not its ids.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/format/jsonl.h"
#include "daemon/format/text.h"
#include "daemon/order/order.h"
#include "daemon/tok/tok.h"
#include "daemon/tokenize/tokenize.h"
#include "proto/macro.h"

int tokenize_stream_read(struct source_reader *r, const struct source_read *doc, uint64_t at, size_t len,
			 uint8_t *dst, char *err, size_t errlen)
{
	struct source_read q = { .src = doc->src, .offset = doc->offset + at, .len = len, .dst = dst };
	size_t failed = 0;
	int e = source_read(r, &q, 1, &failed);
	if (e == -EUCLEAN)
		snprintf(err, errlen, "%s", source_reader_error(r));
	else if (e < 0 && e != -ENOMEM)
		source_read_error(err, errlen, e, source_name(q.src), "index", q.offset, q.len);
	return e;
}

int tokenize_stream_begin(struct tokenize_stream *z, const struct tokenize_params *p, uint64_t doc, unsigned flags,
			  uint8_t *seg, uint8_t *seg_text)
{
	const struct shard *s = p->shards[ORDER_DOC_SHARD(doc)];
	const struct text_shard *ts = s->impl;
	*z = (struct tokenize_stream){ .seg = seg, .seg_text = seg_text };
	format_doc_read(s, ORDER_DOC_INDEX(doc), &z->q);
	z->json = s->format == &format_jsonl;
	z->key = ts->text_key ? ts->text_key : "text";
	z->in_text = !z->json;
	int r = tok_part_new(p->tok, flags, &z->part);
	if (r < 0)
		return r == -ENOMEM ? r : TOKENIZE_STREAM_WHOLE;
	return 0;
}

void tokenize_stream_done(struct tokenize_stream *z)
{
	z->part = tok_part_free(z->part);
}

int tokenize_stream_step(struct tokenize_stream *z, struct source_reader *rd, struct tok_state *st, tok_sink_fn sink,
			 void *userdata, char *err, size_t errlen)
{
	const size_t want = (size_t)MIN((uint64_t)(TOKENIZE_SEGMENT - z->have), z->q.len - z->at);
	int r;
	if (want) {
		r = tokenize_stream_read(rd, &z->q, z->at, want, z->seg + z->have, err, errlen);
		if (r < 0)
			return r;
		z->at += want;
		z->have += want;
	}
	const bool last = z->at == z->q.len;
	size_t used = 0, tn, tused;
	if (!z->in_text) {
		if (jsonl_stream_begin(z->seg, z->have, z->key, &used) != 1)
			return TOKENIZE_STREAM_WHOLE;
		z->in_text = true;
	}
	const uint8_t *text = z->seg + used;
	bool done;
	if (z->json) {
		if (jsonl_stream_text(z->seg + used, z->have - used, last, z->seg_text, &tn, &tused, &done) < 0)
			return TOKENIZE_STREAM_WHOLE;
		text = z->seg_text;
	} else {
		tn = tused = z->have - used;
		done = last;
	}
	r = tok_part_feed(z->part, st, (const char *)text, tn, done, sink, userdata);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		z->tok_error = -r;
		return TOKENIZE_STREAM_BAD;
	}
	used += tused;
	memmove(z->seg, z->seg + used, z->have - used);
	z->have -= used;
	if (!done)
		return 0;
	if (z->json) {
		/* The members after the text: in what is left of one segment, or the record is read whole. */
		if (z->q.len - z->at > TOKENIZE_SEGMENT - z->have)
			return TOKENIZE_STREAM_WHOLE;
		r = tokenize_stream_read(rd, &z->q, z->at, (size_t)(z->q.len - z->at), z->seg + z->have, err, errlen);
		if (r < 0)
			return r;
		z->have += (size_t)(z->q.len - z->at);
		z->at = z->q.len;
		if (jsonl_stream_end(z->seg, z->have, z->key) != 1)
			return TOKENIZE_STREAM_WHOLE;
	}
	return TOKENIZE_STREAM_END;
}

/*
 * A cursor: one huge document tokenized again from its start, keeping the
 * ids around the last request (ids [lo, pos): keep before it, the rest of
 * the last segment after it) for the rows that ask for them next.
 */
struct tokenize_cursor {
	uint64_t doc;
	const struct tok *tok;
	struct tokenize_stream z;
	bool open, end;
	uint8_t *seg, *seg_text;
	int32_t *ids;    /* ids [lo, pos) */
	size_t n, cap;
	uint64_t lo, pos;
	size_t keep;     /* ids kept at least: TOKENIZE_CURSOR_KEEP, or twice the largest request */
	uint64_t used;   /* the pool's clock when last handed out */
	uint64_t used_ns; /* when last given back (now_ns()), for tokenize_pool_trim */
	bool busy;
	/* the request being served */
	int32_t *dst;
	uint64_t from, to;
};

static void cursor_free(struct tokenize_cursor *k)
{
	if (!k)
		return;
	if (k->open)
		tokenize_stream_done(&k->z);
	free(k->seg);
	free(k->seg_text);
	free(k->ids);
	free(k);
}

/*
 * The ids kept: those from TOKENIZE_CURSOR_KEEP (2 MiB of them), or twice
 * the largest request (rows of a batch: a worker laying the batch before
 * still finds its ids), before the request's start, to the last segment's
 * end; so at most keep + the request + one segment's ids.
 */
#define TOKENIZE_CURSOR_KEEP (512u << 10)

static int cursor_sink(const int32_t *ids, size_t n, void *userdata)
{
	struct tokenize_cursor *k = userdata;
	const uint64_t at = k->pos;
	/* Straight into the request's rows, as far as they overlap. */
	const uint64_t a = MAX(at, k->from), b = MIN(at + n, k->to);
	if (a < b)
		memcpy(k->dst + (a - k->from), ids + (a - at), (size_t)(b - a) * sizeof(*ids));
	if (k->n + n > k->cap) {
		/* Ids more than keep before the request's start go; the rest stay (a segment's ids at most past it). */
		const uint64_t floor = k->from > k->keep ? k->from - k->keep : 0;
		if (floor > k->lo) {
			const size_t drop = (size_t)MIN(floor - k->lo, (uint64_t)k->n);
			memmove(k->ids, k->ids + drop, (k->n - drop) * sizeof(*k->ids));
			k->n -= drop;
			k->lo += drop;
		}
		if (k->n + n > k->cap) {
			size_t cap = MAX(MAX(k->n + n, k->cap + k->cap / 2), k->keep + k->keep / 4);
			int32_t *q = realloc(k->ids, cap * sizeof(*q));
			if (!q)
				return -ENOMEM;
			k->ids = q;
			k->cap = cap;
		}
	}
	memcpy(k->ids + k->n, ids, n * sizeof(*ids));
	k->n += n;
	k->pos += n;
	return 0;
}

static int cursor_rewind(struct tokenize_cursor *k, const struct tokenize_params *p)
{
	if (k->open)
		tokenize_stream_done(&k->z);
	k->open = k->end = false;
	k->n = 0;
	k->lo = k->pos = 0;
	int r = tokenize_stream_begin(&k->z, p, k->doc, p->encode_specials ? TOK_ENCODE_SPECIALS : 0, k->seg,
				      k->seg_text);
	if (r != 0)
		return r < 0 ? r : -EIO;
	k->open = true;
	return 0;
}

static int cursor_new(const struct tokenize_params *p, uint64_t doc, struct tokenize_cursor **ret)
{
	struct tokenize_cursor *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	k->doc = doc;
	k->tok = p->tok;
	k->keep = TOKENIZE_CURSOR_KEEP;
	k->seg = malloc(TOKENIZE_SEGMENT);
	k->seg_text = malloc(TOKENIZE_SEGMENT);
	int r = k->seg && k->seg_text ? cursor_rewind(k, p) : -ENOMEM;
	if (r < 0) {
		cursor_free(k);
		return r;
	}
	*ret = k;
	return 0;
}

static int cursor_get(struct tokenize_cursor *k, const struct tokenize_params *p, struct source_reader *rd,
		      struct tok_state *st, uint64_t from, size_t count, int32_t *dst, char *err, size_t errlen)
{
	int r;
	if (from < k->lo && (r = cursor_rewind(k, p)) < 0) {
		snprintf(err, errlen, "cannot tokenize a huge document again: %s", strerror(-r));
		return r;
	}
	const uint64_t to = from + count;
	k->keep = MAX(k->keep, 2 * count);
	/* What the kept ids hold already. */
	if (from < k->pos) {
		const uint64_t b = MIN(to, k->pos);
		memcpy(dst, k->ids + (from - k->lo), (size_t)(b - from) * sizeof(*dst));
	}
	k->dst = dst;
	k->from = from;
	k->to = to;
	while (k->pos < to) {
		if (k->end) {
			snprintf(err, errlen, "a huge document gave fewer tokens (%llu) than counted (at least %llu)",
				 (unsigned long long)k->pos, (unsigned long long)to);
			return -EIO;
		}
		r = tokenize_stream_step(&k->z, rd, st, cursor_sink, k, err, errlen);
		if (r == TOKENIZE_STREAM_END)
			k->end = true;
		else if (r == TOKENIZE_STREAM_WHOLE || r == TOKENIZE_STREAM_BAD) {
			snprintf(err, errlen, "a huge document no longer tokenizes as counted");
			return -EIO;
		} else if (r < 0) {
			if (r == -ENOMEM)
				snprintf(err, errlen, "out of memory tokenizing a huge document again");
			return r;
		}
	}
	k->dst = NULL;
	k->from = k->to = 0;
	return 0;
}

/* Cursors a pool keeps between requests (idle ones beyond are freed). */
#define TOKENIZE_POOL_MAX 4

struct tokenize_pool {
	pthread_mutex_t lock;
	pthread_cond_t idle; /* a cursor was given back */
	struct tokenize_cursor *c[TOKENIZE_POOL_MAX];
	uint64_t clock;
};

int tokenize_pool_new(struct tokenize_pool **ret)
{
	struct tokenize_pool *pl = calloc(1, sizeof(*pl));
	if (!pl)
		return -ENOMEM;
	pthread_mutex_init(&pl->lock, NULL);
	pthread_cond_init(&pl->idle, NULL);
	*ret = pl;
	return 0;
}

struct tokenize_pool *tokenize_pool_free(struct tokenize_pool *pl)
{
	if (!pl)
		return NULL;
	for (size_t i = 0; i < TOKENIZE_POOL_MAX; i++)
		cursor_free(pl->c[i]);
	pthread_cond_destroy(&pl->idle);
	pthread_mutex_destroy(&pl->lock);
	free(pl);
	return NULL;
}

/*
 * The cursor of doc that serves from without starting again (ids kept from
 * before it), the one closest behind it, marked busy; when that one is busy,
 * waits for it (its holder only reads and tokenizes, never waits in turn):
 * workers laying consecutive batches take turns on one cursor instead of
 * each tokenizing the document from its start. NULL when none serves from:
 * the caller makes a new one (which replaces the least recently used idle
 * cursor when it is given back), so that two readers of one document (a
 * session and a resumed one) do not restart each other's. Under the lock.
 */
static struct tokenize_cursor *pool_take(struct tokenize_pool *pl, const struct tok *tok, uint64_t doc,
					 uint64_t from)
{
	for (;;) {
		struct tokenize_cursor *best = NULL;
		for (size_t i = 0; i < TOKENIZE_POOL_MAX; i++) {
			struct tokenize_cursor *k = pl->c[i];
			if (k && k->doc == doc && k->tok == tok && k->lo <= from && (!best || k->lo > best->lo))
				best = k;
		}
		if (!best || !best->busy) {
			if (best)
				best->busy = true;
			return best;
		}
		pthread_cond_wait(&pl->idle, &pl->lock);
	}
}

int tokenize_pool_get(struct tokenize_pool *pl, const struct tokenize_params *p, struct source_reader *rd,
		      struct tok_state *st, uint64_t doc, uint64_t from, size_t count, int32_t *dst, char *err, size_t errlen)
{
	/*
	 * A lazy shard's copy (a compressed shard's, text_cache.c) is held
	 * while this request reads it; between requests it may be closed, or
	 * made again as another source, so the cursor's document is named
	 * again (same bytes: a copy made again is checked to hold them).
	 */
	const struct shard *sh = p->shards[ORDER_DOC_SHARD(doc)];
	char note[384];
	int r = format_acquire(sh, rd, note, sizeof(note), err, errlen);
	if (r < 0)
		return r;
	pthread_mutex_lock(&pl->lock);
	struct tokenize_cursor *k = pool_take(pl, p->tok, doc, from);
	pthread_mutex_unlock(&pl->lock);
	if (k && k->open) {
		struct source_read q;
		format_doc_read(sh, ORDER_DOC_INDEX(doc), &q);
		k->z.q.src = q.src;
	}
	if (!k && (r = cursor_new(p, doc, &k)) < 0) {
		format_release(sh);
		snprintf(err, errlen, "cannot tokenize a huge document again: %s", strerror(-r));
		return r;
	}
	r = cursor_get(k, p, rd, st, from, count, dst, err, errlen);
	format_release(sh);
	/* Back into the pool (in place of the least recently used idle cursor); a failed one is dropped. */
	pthread_mutex_lock(&pl->lock);
	k->busy = false;
	k->used = ++pl->clock;
	k->used_ns = now_ns();
	size_t at = SIZE_MAX, slot = SIZE_MAX;
	for (size_t i = 0; i < TOKENIZE_POOL_MAX; i++) {
		if (pl->c[i] == k)
			at = i;
		else if (!pl->c[i])
			slot = i;
		else if (!pl->c[i]->busy && (slot == SIZE_MAX || (pl->c[slot] && pl->c[i]->used < pl->c[slot]->used)))
			slot = i;
	}
	struct tokenize_cursor *gone = NULL;
	if (r < 0 || (at == SIZE_MAX && slot == SIZE_MAX)) {
		if (at != SIZE_MAX)
			pl->c[at] = NULL;
		gone = k;
	} else if (at == SIZE_MAX) {
		gone = pl->c[slot];
		pl->c[slot] = k;
	}
	pthread_cond_broadcast(&pl->idle);
	pthread_mutex_unlock(&pl->lock);
	cursor_free(gone);
	return r;
}

unsigned tokenize_pool_trim(struct tokenize_pool *pl, uint64_t now, uint64_t idle_ns)
{
	struct tokenize_cursor *gone[TOKENIZE_POOL_MAX];
	unsigned n = 0;
	pthread_mutex_lock(&pl->lock);
	for (size_t i = 0; i < TOKENIZE_POOL_MAX; i++) {
		struct tokenize_cursor *k = pl->c[i];
		if (k && !k->busy && now >= k->used_ns && now - k->used_ns >= idle_ns) {
			gone[n++] = k;
			pl->c[i] = NULL;
		}
	}
	pthread_mutex_unlock(&pl->lock);
	for (unsigned i = 0; i < n; i++)
		cursor_free(gone[i]);
	return n;
}
