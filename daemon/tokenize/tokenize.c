/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/format/text.h"
#include "daemon/order/order.h"
#include "daemon/tok/tok.h"
#include "daemon/tokenize/tokenize.h"
#include "proto/macro.h"

void tokenize_scratch_done(struct tokenize_scratch *t)
{
	free(t->text);
	free(t->reqs);
	free(t->seg);
	free(t->seg_text);
	tok_part_free(t->part);
	free(t->held);
	format_state_done(&t->fmt);
	for (size_t i = 0; i < ARRAY_SIZE(t->toks); i++)
		tok_state_free(t->toks[i].st);
	*t = (struct tokenize_scratch){ 0 };
}

void tokenize_chunk_done(struct tokenize_chunk *c)
{
	for (uint32_t i = 0; c->bad && i < c->n; i++)
		free(c->bad[i]);
	free(c->bad);
	free(c->start);
	free(c->ids);
	free(c->lazy);
	c->lazy = NULL;
	c->bad = NULL;
	c->start = NULL;
	c->ids = NULL;
}

bool tokenize_tok_is_hf(const char *path)
{
	size_t n = strlen(path);
	return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

int tokenize_tok_load(const char *path, const char *preset, struct tok **ret, char **ret_error)
{
	/*
	 * Opened through the source layer first: a missing file is named as such
	 * (not as a JSON error at line -1), and a FIFO or device is refused
	 * instead of blocking the loader in open() or read().
	 */
	char why[512];
	struct source *src;
	int r = source_open(path, &src, why, sizeof(why));
	if (r < 0) {
		*ret_error = strdup(why);
		return r;
	}
	source_close(src);
	return tokenize_tok_is_hf(path) ? tok_load_hf(path, ret, ret_error) : tok_load_rankfile(path, preset, ret, ret_error);
}

/* Text buffers above this are freed after use rather than kept for the next chunk. */
#define TOKENIZE_KEEP_BYTES (64u << 20)

static int grow(void **p, size_t *cap, size_t want, size_t size)
{
	if (want <= *cap)
		return 0;
	size_t n = MAX(want, *cap * 2);
	void *q = realloc(*p, n * size);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

struct tok_state *tokenize_scratch_state(struct tokenize_scratch *t, const struct tokenize_params *p)
{
	for (size_t i = 0; i < ARRAY_SIZE(t->toks); i++)
		if (t->toks[i].st && t->toks[i].generation == p->tok_generation)
			return t->toks[i].st;
	__typeof__(t->toks[0]) *slot = &t->toks[t->toks_next++ % ARRAY_SIZE(t->toks)];
	slot->st = tok_state_free(slot->st);
	if (tok_state_new(p->tok, &slot->st) < 0)
		return NULL;
	slot->generation = p->tok_generation;
	return slot->st;
}

static int oom(struct tokenize_chunk *c)
{
	snprintf(c->error, sizeof(c->error), "out of memory tokenizing %" PRIu32 " documents (%" PRIu64 " bytes)", c->n,
		 c->bytes);
	return -ENOMEM;
}

/* Whether document d is read and tokenized a segment at a time (TOKENIZE_STREAM_BYTES). */
static bool streamed(const struct tokenize_params *p, const struct shard *s, uint32_t d)
{
	const uint64_t bytes = format_doc_bytes(s, d);
	return bytes > TOKENIZE_STREAM_BYTES && bytes <= p->max_doc_bytes &&
	       (s->format == &format_jsonl || s->format == &format_text) && tok_part_supported(p->tok);
}

static int read_docs(struct tokenize_scratch *t, struct source_reader *r, const struct tokenize_params *p,
		     struct tokenize_chunk *c);

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

static void release_held(struct tokenize_scratch *t, const struct tokenize_params *p)
{
	for (size_t i = 0; i < t->n_held; i++)
		format_release(p->shards[t->held[i]]);
	t->n_held = 0;
}

/*
 * Makes the chunk's shards readable (format_acquire: a text copy in the
 * cache opened, made first when evicted) for as long as tokenize_read()
 * reads them; each distinct shard once.
 */
static int acquire_shards(struct tokenize_scratch *t, struct source_reader *r, const struct tokenize_params *p,
			  struct tokenize_chunk *c)
{
	size_t n = 0;
	t->n_held = 0;
	for (uint32_t i = 0; i < c->n; i++) {
		uint32_t s = ORDER_DOC_SHARD(c->docs[i]);
		if (!(p->shards[s]->lazy || p->shards[s]->deferred) || (n && t->held[n - 1] == s))
			continue;
		if (grow((void **)&t->held, &t->held_cap, n + 1, sizeof(*t->held)) < 0)
			return oom(c);
		t->held[n++] = s;
	}
	if (n > 1)
		qsort(t->held, n, sizeof(*t->held), cmp_u32);
	size_t u = 0;
	for (size_t i = 0; i < n; i++)
		if (!u || t->held[u - 1] != t->held[i])
			t->held[u++] = t->held[i];
	for (size_t i = 0; i < u; i++) {
		int e = format_acquire(p->shards[t->held[i]], r, c->note, sizeof(c->note), c->error, sizeof(c->error));
		if (e < 0) {
			release_held(t, p);
			return e;
		}
		t->n_held = i + 1;
	}
	return 0;
}

int tokenize_read(struct tokenize_scratch *t, struct source_reader *r, const struct tokenize_params *p,
		  struct tokenize_chunk *c)
{
	t->reader = r;
	c->note[0] = 0;
	int e = acquire_shards(t, r, p, c);
	if (e < 0)
		return e;
	e = read_docs(t, r, p, c);
	if (e < 0)
		release_held(t, p);
	/* Otherwise held until tokenize_encode() is done: a streamed document is read there. */
	return e;
}

static int read_docs(struct tokenize_scratch *t, struct source_reader *r, const struct tokenize_params *p,
		     struct tokenize_chunk *c)
{
	/* Every document of the chunk in one batch of reads, all in flight at once. */
	size_t bytes = 0, n = 0;
	t->n_reqs = 0;
	if (grow((void **)&t->reqs, &t->reqs_cap, c->n, sizeof(*t->reqs)) < 0)
		return oom(c);
	for (uint32_t i = 0; i < c->n; i++) {
		const struct shard *s = p->shards[ORDER_DOC_SHARD(c->docs[i])];
		const uint32_t d = ORDER_DOC_INDEX(c->docs[i]);
		struct source_read *q = &t->reqs[n];
		format_doc_read(s, d, q);
		if (format_doc_bytes(s, d) > p->max_doc_bytes || q->len == 0 || streamed(p, s, d))
			continue;
		q->dst = (void *)(uintptr_t)bytes;
		bytes += q->len;
		n++;
	}
	if (grow((void **)&t->text, &t->text_cap, MAX(bytes, (size_t)1), 1) < 0)
		return oom(c);
	for (size_t i = 0; i < n; i++)
		t->reqs[i].dst = t->text + (uintptr_t)t->reqs[i].dst;
	t->n_reqs = n;
	size_t failed = 0;
	int e = source_read(r, t->reqs, n, &failed);
	if (e == -ENOMEM)
		return oom(c);
	if (e < 0) {
		const struct source_read *q = &t->reqs[failed];
		if (e == -EUCLEAN)
			snprintf(c->error, sizeof(c->error), "%s", source_reader_error(r));
		else
			source_read_error(c->error, sizeof(c->error), e, source_name(q->src), "index", q->offset, q->len);
		return e;
	}
	return 0;
}

/* A streamed document's ids: appended to out, or only counted past lazy_tokens. */
struct stream_out {
	struct tok_ids *out;
	size_t before;    /* out->n when the document began */
	uint64_t limit;   /* lazy_tokens, or 0 */
	uint64_t counted; /* when lazy: the document's tokens so far */
	bool lazy;
};

static int stream_append(const int32_t *ids, size_t n, void *userdata)
{
	struct stream_out *o = userdata;
	struct tok_ids *v = o->out;
	if (!o->lazy && o->limit && v->n - o->before + n > o->limit) {
		/* Past the limit: the ids so far are dropped, the count goes on. */
		o->lazy = true;
		o->counted = v->n - o->before;
		v->n = o->before;
	}
	if (o->lazy) {
		o->counted += n;
		return 0;
	}
	if (tok_ids_reserve(v, n) < 0)
		return -ENOMEM;
	memcpy(v->ids + v->n, ids, n * sizeof(*ids));
	v->n += n;
	return 0;
}

/*
 * Reads, JSON-decodes and tokenizes a big document TOKENIZE_SEGMENT bytes at a
 * time (tokenize_stream_*), appending its ids to o's (or counting them): what
 * the whole document would give, in memory bounded by the segment. Returns 0
 * (a tokenizer failure in why); 1 when the record must be read whole (the
 * caller drops the ids appended); -ENOMEM; another negative errno for a read
 * failure, with c->error set.
 */
static int encode_streamed(struct tokenize_scratch *t, const struct tokenize_params *p, struct tokenize_chunk *c,
			   uint64_t doc, struct tok_state *st, unsigned flags, struct stream_out *o,
			   size_t *ret_replaced, char *why, size_t whylen)
{
	if (t->seg_cap < TOKENIZE_SEGMENT) {
		free(t->seg);
		free(t->seg_text);
		t->seg = malloc(TOKENIZE_SEGMENT);
		t->seg_text = malloc(TOKENIZE_SEGMENT);
		t->seg_cap = t->seg && t->seg_text ? TOKENIZE_SEGMENT : 0;
		if (!t->seg_cap)
			return -ENOMEM;
	}
	struct tokenize_stream z;
	int r = tokenize_stream_begin(&z, p, doc, flags, t->seg, t->seg_text);
	if (r != 0)
		return r < 0 ? r : 1;
	do
		r = tokenize_stream_step(&z, t->reader, st, stream_append, o, c->error, sizeof(c->error));
	while (r == 0);
	if (r == TOKENIZE_STREAM_END) {
		*ret_replaced = tok_part_replaced(z.part);
		r = 0;
	} else if (r == TOKENIZE_STREAM_BAD) {
		snprintf(why, whylen, "the tokenizer failed: %s", strerror(z.tok_error));
		r = 0;
	} else if (r == TOKENIZE_STREAM_WHOLE) {
		r = 1;
	}
	tokenize_stream_done(&z);
	return r;
}

/* Finds document d's text in bytes[0..len) and appends its ids to out; a bad record in why. */
static int encode_text(struct tokenize_scratch *t, const struct tokenize_params *p, const struct shard *s, uint32_t d,
		       struct tok_state *st, unsigned flags, const uint8_t *doc, size_t len, struct tok_ids *out,
		       size_t *ret_replaced, char *why, size_t whylen)
{
	const size_t before = out->n;
	struct format_text text;
	int r = format_doc_text(s, d, doc, len, &t->fmt, &text, why, whylen);
	if (r == -ENOMEM)
		return r;
	if (r < 0 && !why[0])
		snprintf(why, whylen, "%s", strerror(-r));
	if (why[0])
		return 0;
	size_t rep = 0;
	r = tok_encode(p->tok, st, text.text, text.len, flags | (text.utf8_valid ? TOK_ENCODE_UTF8_VALID : 0), out, &rep);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		out->n = before;
		snprintf(why, whylen, "the tokenizer failed: %s", strerror(-r));
	}
	*ret_replaced = text.replaced + rep;
	return 0;
}

static int encode_chunk(struct tokenize_scratch *t, const struct tokenize_params *p, struct tokenize_chunk *c)
{
	const uint64_t max = p->max_doc_bytes;
	int r;
	struct tok_state *st = tokenize_scratch_state(t, p);
	c->start = malloc(((size_t)c->n + 1) * sizeof(*c->start));
	if (!st || !c->start)
		return oom(c);
	struct tok_ids out = { 0 };
	const unsigned flags = p->encode_specials ? TOK_ENCODE_SPECIALS : 0;
	size_t at = 0, replaced_total = 0, streamed_bytes = 0;
	uint64_t tokens_lazy = 0;
	char why[384];
	/*
	 * Room for the ids up front (a token per 3 bytes; this corpus has ~4),
	 * so that they are not copied again and again while the array grows.
	 */
	size_t bytes = 0;
	for (size_t i = 0; i < t->n_reqs; i++)
		bytes += t->reqs[i].len;
	if (tok_ids_reserve(&out, bytes / 3 + 256) < 0)
		return oom(c);
	for (uint32_t i = 0; i < c->n; i++) {
		const struct shard *s = p->shards[ORDER_DOC_SHARD(c->docs[i])];
		uint32_t d = ORDER_DOC_INDEX(c->docs[i]);
		const uint8_t *doc = t->text + at;
		struct source_read q;
		format_doc_read(s, d, &q);
		size_t len = q.len, replaced = 0;
		size_t before = out.n;
		c->start[i] = out.n;
		why[0] = 0;
		if (format_doc_bytes(s, d) > max) {
			snprintf(why, sizeof(why), "the document is longer than max_document_bytes (%" PRIu64 " bytes)", max);
		} else if (streamed(p, s, d)) {
			struct stream_out o = { .out = &out, .before = before, .limit = p->lazy_tokens };
			r = encode_streamed(t, p, c, c->docs[i], st, flags, &o, &replaced, why, sizeof(why));
			if (r == 0 && o.lazy && !why[0]) {
				if (!c->lazy && !(c->lazy = calloc(c->n, sizeof(*c->lazy))))
					goto oom_ids;
				c->lazy[i] = o.counted;
				tokens_lazy += o.counted;
			}
			if (r == 1) {
				/* Read whole after all: what the scanner leaves to jansson. */
				out.n = before;
				uint8_t *whole = malloc(MAX(len, (size_t)1));
				if (!whole)
					goto oom_ids;
				r = tokenize_stream_read(t->reader, &q, 0, len, whole, c->error, sizeof(c->error));
				if (r == 0)
					r = encode_text(t, p, s, d, st, flags, whole, len, &out, &replaced, why, sizeof(why));
				free(whole);
			}
			if (r == -ENOMEM)
				goto oom_ids;
			if (r < 0) {
				tok_ids_done(&out);
				return r;
			}
			streamed_bytes += len;
		} else {
			at += len;
			r = encode_text(t, p, s, d, st, flags, doc, len, &out, &replaced, why, sizeof(why));
			if (r == -ENOMEM)
				goto oom_ids;
		}
		if (why[0]) {
			/* A bad record: fatal, or an empty document that still counts in k mod R. */
			out.n = before;
			char where[64];
			format_doc_where(s, d, where, sizeof(where));
			if (!p->skip_bad_records) {
				snprintf(c->error, sizeof(c->error), "%s%s: %s (on_bad_record = fail)", s->name, where, why);
				tok_ids_done(&out);
				return -EBADMSG;
			}
			if ((!c->bad && !(c->bad = calloc(c->n, sizeof(*c->bad)))) ||
			    asprintf(&c->bad[i], "%s%s: %s", s->name, where, why) < 0) {
				if (c->bad)
					c->bad[i] = NULL;
				tok_ids_done(&out);
				return oom(c);
			}
			if (c->skipped++ == 0)
				snprintf(c->error, sizeof(c->error), "%s", c->bad[i]);
		}
		replaced_total += replaced;
	}
	c->start[c->n] = out.n;
	c->ids = out.ids ? out.ids : malloc(sizeof(int32_t));
	if (!c->ids)
		return oom(c);
	c->read_bytes = at + streamed_bytes;
	c->tokens = out.n + tokens_lazy;
	c->replaced = replaced_total;
	/* One huge document must not keep its text buffer for the worker's lifetime. */
	if (t->text_cap > TOKENIZE_KEEP_BYTES) {
		free(t->text);
		t->text = NULL;
		t->text_cap = 0;
	}
	return 0;

oom_ids:
	tok_ids_done(&out);
	return oom(c);
}

int tokenize_encode(struct tokenize_scratch *t, const struct tokenize_params *p, struct tokenize_chunk *c)
{
	/* The shards tokenize_read() acquired stay readable while documents are streamed from them. */
	int r = encode_chunk(t, p, c);
	release_held(t, p);
	return r;
}
