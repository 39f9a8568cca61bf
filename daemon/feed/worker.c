/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/feed/worker.h"
#include "daemon/log/log.h"
#include "daemon/tok/tok.h"
#include "daemon/tokenize/tokenize.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"

/*
 * Tokens read raw to w->raw + pos * 8 (packed, itemsize bytes each, so runs
 * never overlap whatever the dtype), to be widened from the shard's dtype.
 */
struct widen_run {
	size_t pos;
	size_t n;
	const struct feed *feed;            /* whose shard (a mixture's source) */
	const struct shard *shard;
	uint64_t byte_offset; /* in the source, for messages */
};

struct worker *worker_new(enum io_engine engine, unsigned depth)
{
	struct worker *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	if (source_reader_new(engine, depth, &w->io) < 0) {
		free(w);
		return NULL;
	}
	return w;
}

struct worker *worker_free(struct worker *w)
{
	if (!w)
		return NULL;
	source_reader_free(w->io);
	free(w->raw);
	free(w->is_start);
	free(w->reqs);
	free(w->runs);
	free(w->rows_tok);
	free(w->rows_cu);
	tokenize_scratch_done(&w->tk);
	free(w);
	return NULL;
}

static int reserve(struct worker *w, size_t positions, size_t pieces)
{
	if (positions > w->positions) {
		void *raw = realloc(w->raw, positions * 8);
		if (raw)
			w->raw = raw;
		void *st = realloc(w->is_start, positions);
		if (st)
			w->is_start = st;
		if (!raw || !st)
			return -ENOMEM;
		w->positions = positions;
	}
	/* A piece may span several sequences of a document; grow on demand below. */
	if (pieces > w->cap_reqs) {
		void *q = realloc(w->reqs, pieces * sizeof(*w->reqs));
		if (q)
			w->reqs = q;
		void *r = realloc(w->runs, pieces * sizeof(*w->runs));
		if (r)
			w->runs = r;
		if (!q || !r)
			return -ENOMEM;
		w->cap_reqs = pieces;
	}
	return 0;
}

struct emit_ctx {
	struct worker *w;
	const struct feed *feed;
	const struct shard *shard;
	size_t n;
	size_t pos; /* stream position of the next token */
};

static int emit_range(void *userdata, struct source *src, uint64_t byte_offset, uint64_t n_tokens)
{
	struct emit_ctx *c = userdata;
	struct worker *w = c->w;
	if (c->n == w->cap_reqs) {
		int r = reserve(w, w->positions, w->cap_reqs * 2);
		if (r < 0)
			return r;
	}
	w->reqs[c->n] = (struct source_read){
		.src = src,
		.offset = byte_offset,
		.len = n_tokens * c->shard->itemsize,
		.dst = w->raw + c->pos * 8,
	};
	w->runs[c->n] = (struct widen_run){ .pos = c->pos, .n = n_tokens, .feed = c->feed, .shard = c->shard,
					    .byte_offset = byte_offset };
	c->n++;
	c->pos += n_tokens;
	return 0;
}

/* How text feed f's documents become tokens; a huge document's ids are not held (tokenize.h). */
static struct tokenize_params text_params(const struct feed *f)
{
	return (struct tokenize_params){
		.shards = f->shards,
		.tok = f->tok,
		.tok_generation = f->tok_generation,
		.max_doc_bytes = f->conf.max_document_bytes,
		.encode_specials = f->conf.encode_special_tokens,
		.skip_bad_records = f->conf.skip_bad_records,
		.lazy_tokens = TOKENIZE_LAZY_TOKENS,
	};
}

/* Ids [from, from + count) of text feed sf's document doc, whose chunk kept only its count, into dst. */
static int lay_huge(struct worker *w, const struct feed *sf, uint64_t doc, uint64_t from, size_t count, int32_t *dst,
		    char *err, size_t errlen)
{
	const struct tokenize_params p = text_params(sf);
	struct tok_state *st = tokenize_scratch_state(&w->tk, &p);
	char why[256] = "out of memory";
	int r = -ENOMEM;
	if (st && sf->huge)
		r = tokenize_pool_get(sf->huge, &p, w->io, st, doc, from, count, dst, why, sizeof(why));
	else if (st)
		r = -EINVAL; /* not a feed that tokenizes its own shards */
	if (r == -ENOMEM)
		snprintf(why, sizeof(why), "out of memory");
	else if (r == -EINVAL && !sf->huge)
		snprintf(why, sizeof(why), "no cursors for huge documents");
	if (r < 0)
		snprintf(err, errlen, "%s: document %" PRIu32 ": tokens %" PRIu64 "..%" PRIu64 ": %s",
			 sf->shards[ORDER_DOC_SHARD(doc)]->name, ORDER_DOC_INDEX(doc), from, from + count, why);
	return r;
}

/*
 * Lays out positions offset .. offset + count - 1 of a document's contribution
 * (document `doc` of feed sf, `length` positions) at batch positions pos ..:
 * bos/eos written inline, tokens copied from memory (tokenized text) or
 * queued as reads into w->raw. Position n is the look-ahead, kept aside.
 */
static int lay_piece(struct worker *w, struct emit_ctx *c, const struct feed *sf, uint64_t doc, const int32_t *tokens,
		     uint64_t offset, uint64_t count, uint64_t length, size_t pos, int32_t *ids, size_t n,
		     int32_t *lookahead, char *err, size_t errlen)
{
#define AT(p) ((p) < n ? ids + (p) : lookahead)
	const bool bos = sf->bos_id >= 0, eos = sf->eos_id >= 0;
	uint32_t s = ORDER_DOC_SHARD(doc), d = ORDER_DOC_INDEX(doc);
	/* Plans only lay out non-empty contributions, which hold their bos and eos. */
	assert(length >= (uint64_t)bos + eos);
	uint64_t n_tokens = length - bos - eos;
	uint64_t lo = MAX(offset, (uint64_t)bos), hi = MIN(offset + count, bos + n_tokens);

	if (bos && offset == 0)
		*AT(pos) = sf->bos_id;
	if (eos && offset + count == length)
		*AT(pos + count - 1) = sf->eos_id;
	if (lo < hi && tokens) {
		/* Tokenized text: the tokens are in memory already. */
		if (pos >= n)
			*lookahead = tokens[lo - bos];
		else
			memcpy(ids + pos + (lo - offset), tokens + (lo - bos), (hi - lo) * sizeof(int32_t));
	} else if (lo < hi && sf->kind == FEED_TEXT) {
		/* A huge document whose chunk kept only its count: its ids made again. */
		int32_t one;
		int r = lay_huge(w, sf, doc, lo - bos, pos >= n ? 1 : (size_t)(hi - lo),
				 pos >= n ? &one : ids + pos + (lo - offset), err, errlen);
		if (r < 0)
			return r;
		if (pos >= n)
			*lookahead = one;
	} else if (lo < hi) {
		c->feed = sf;
		c->shard = sf->shards[s];
		c->pos = pos + (lo - offset);
		int r = format_doc_ranges(c->shard, d, lo - bos, hi - lo, emit_range, c);
		if (r == -ESTALE) {
			snprintf(err, errlen, "%s: changed while serving (document %" PRIu32 "'s index entries no longer hold)",
				 c->shard->name, d);
			return r;
		}
		if (r < 0) {
			snprintf(err, errlen, "%s: document %" PRIu32 ": cannot map tokens %" PRIu64 "..%" PRIu64,
				 c->shard->name, d, lo - bos, hi - bos);
			return r;
		}
	}
	return 0;
#undef AT
}

/*
 * Runs the reads lay_piece() queued and widens their tokens into place,
 * checking each against its feed's vocabulary when it names a tokenizer.
 */
static int read_tokens(struct worker *w, const struct feed *f, const struct emit_ctx *c, int32_t *ids, size_t n,
		       int32_t *lookahead, char *err, size_t errlen)
{
#define AT(p) ((p) < n ? ids + (p) : lookahead)
	struct stage_clock stage_clock;
	size_t failed = 0;
	const struct io_stats *io = source_reader_stats(w->io);
	uint64_t io_bytes = io->bytes, io_depth_sum = io->depth_sum, io_depth_n = io->depth_n;
	stage_begin(&stage_clock, true);
	int r = source_read(w->io, w->reqs, c->n, &failed);
	if (r < 0) {
		if (r == -ENOMEM)
			snprintf(err, errlen, "out of memory queueing %zu reads", c->n);
		else if (r == -EUCLEAN)
			snprintf(err, errlen, "%s", source_reader_error(w->io));
		else if (r == -ESTALE && source_reader_stale(w->io))
			snprintf(err, errlen, "%s", source_reader_stale(w->io));
		else
			source_read_error(err, errlen, r, source_name(w->reqs[failed].src), ".idx", w->runs[failed].byte_offset,
					  w->reqs[failed].len);
		return r;
	}
	/* pread has no queue: one request at a time. */
	stage_end_io(&f->stages->read, &stage_clock, io->bytes - io_bytes,
		     io->depth_n > io_depth_n ? io->depth_sum - io_depth_sum : (c->n > 0),
		     io->depth_n > io_depth_n ? io->depth_n - io_depth_n : (c->n > 0));
	for (size_t i = 0; i < c->n; i++) {
		const struct widen_run *run = &w->runs[i];
		const struct shard *sh = run->shard;
		size_t bad;
		r = format_widen(sh, w->raw + run->pos * 8, run->n, AT(run->pos), &bad);
		if (r < 0) {
			snprintf(err, errlen, "%s: token at byte %" PRIu64 " is outside 0..2147483647",
				 source_name(w->reqs[i].src), run->byte_offset + bad * sh->itemsize);
			return r;
		}
		const uint64_t vocab = run->feed->tok ? tok_vocab_size(run->feed->tok) : 0;
		if (vocab) {
			/* A feed that names its tokenizer knows its vocabulary: an id past it is a corrupt shard. */
			const int32_t *t = AT(run->pos);
			int32_t max = 0;
			for (size_t k = 0; k < run->n; k++)
				max = t[k] > max ? t[k] : max;
			if ((uint64_t)max >= vocab) {
				size_t k = 0;
				while ((uint64_t)t[k] < vocab)
					k++;
				snprintf(err, errlen, "%s: token at byte %" PRIu64 " is %" PRId32 ", beyond the tokenizer's vocabulary of %" PRIu64 " ids",
					 source_name(w->reqs[i].src), run->byte_offset + k * sh->itemsize, t[k], vocab);
				return -ERANGE;
			}
		}
	}
	return 0;
#undef AT
}

static void write_header(uint8_t *slot, uint64_t batch_index, uint64_t epoch, uint32_t rank, uint32_t world,
			 uint32_t batch_size, uint32_t seq_len, uint32_t n_cu, uint32_t docs, const char *cursor)
{
	struct feed_slot_header *h = (struct feed_slot_header *)slot;
	h->batch_index = batch_index;
	h->epoch = epoch;
	h->rank = rank;
	h->world = world;
	h->batch_size = batch_size;
	h->seq_len = seq_len;
	h->n_cu_seqlens = n_cu;
	h->n_docs = docs;
	snprintf(h->cursor, sizeof(h->cursor), "%s", cursor);
}

int worker_produce(struct worker *w, const struct feed *f, const struct batch_plan *plan, uint32_t rank,
		   uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
		   char *err, size_t errlen)
{
	size_t n_pos = (size_t)plan->batch_size * plan->seq_len + 1;
	struct stage_clock job_clock, stage_clock;
	stage_begin(&job_clock, false);
	int r = reserve(w, n_pos, MAX(plan->n_pieces, (size_t)16));
	if (r < 0) {
		snprintf(err, errlen, "out of memory for a batch of %zu positions", n_pos);
		return r;
	}

	/*
	 * Tokens land straight in the slot's input_ids (positions 0 .. BL-1);
	 * the look-ahead position BL is a piece of its own, kept aside.
	 */
	const size_t n = n_pos - 1;
	int32_t *ids = (int32_t *)(slot + geom->off_input_ids), lookahead = 0;

	/* Lay out the positions: bos/eos inline, token ranges as reads. */
	struct emit_ctx c = { .w = w };
	size_t pos = 0;
	for (size_t i = 0; i < plan->n_pieces; i++) {
		const struct stream_piece *p = &plan->pieces[i];
		memset(w->is_start + pos, 0, p->count);
		w->is_start[pos] = p->offset == 0;
		r = lay_piece(w, &c, f, p->doc, p->ids, p->offset, p->count, p->length, pos, ids, n, &lookahead, err,
			      errlen);
		if (r < 0)
			return r;
		pos += p->count;
	}
	r = read_tokens(w, f, &c, ids, n, &lookahead, err, errlen);
	if (r < 0)
		return r;

	stage_begin(&stage_clock, false);
	uint32_t docs;
	uint32_t n_cu = pack_fill(ids, lookahead, w->is_start, plan->batch_size, plan->seq_len, ids,
				  (int32_t *)(slot + geom->off_labels),
				  (int32_t *)(slot + geom->off_position_ids), (int32_t *)(slot + geom->off_cu_seqlens),
				  &docs);
	stage_end(&f->stages->pack, &stage_clock, n * sizeof(int32_t));
	write_header(slot, plan->batch_index, plan->epoch, rank, world, plan->batch_size, plan->seq_len, n_cu, docs,
		     cursor);
	stage_end(&f->stages->job, &job_clock, n * sizeof(int32_t));
	return 0;
}

int worker_produce_concat_rows(struct worker *w, const struct feed *f, const struct batch_plan *const *plans,
			       uint32_t batch_size, uint32_t seq_len, const struct feed_ring_header *geom,
			       uint8_t *slot, uint32_t *ret_n_cu, uint32_t *ret_docs, char *err, size_t errlen)
{
	const size_t stride = (size_t)seq_len + 1, n = (size_t)batch_size * stride;
	size_t pieces = 16;
	for (uint32_t i = 0; i < batch_size; i++)
		pieces += plans[i]->n_pieces;
	struct stage_clock job_clock, stage_clock;
	stage_begin(&job_clock, false);
	int r = reserve(w, n, pieces);
	if (r == 0 && n > w->rows_cap) {
		int32_t *t = realloc(w->rows_tok, n * sizeof(*t));
		if (t)
			w->rows_tok = t;
		uint32_t *cu = realloc(w->rows_cu, stride * sizeof(*cu));
		if (cu)
			w->rows_cu = cu;
		if (!t || !cu)
			r = -ENOMEM;
		else
			w->rows_cap = n;
	}
	if (r < 0) {
		snprintf(err, errlen, "out of memory for a batch of %zu positions", n);
		return r;
	}
	/* Row i lays its L + 1 positions (its look-ahead last) at i*(L+1): no position is a batch's look-ahead. */
	int32_t *tok = w->rows_tok, unused = 0;
	struct emit_ctx c = { .w = w };
	for (uint32_t i = 0; i < batch_size; i++) {
		const struct batch_plan *plan = plans[i];
		size_t pos = i * stride;
		for (size_t k = 0; k < plan->n_pieces; k++) {
			const struct stream_piece *p = &plan->pieces[k];
			if (pos + p->count > (i + 1) * stride) {
				snprintf(err, errlen, "internal error: row %u's plan lays more than %zu positions", i, stride);
				return -EIO;
			}
			memset(w->is_start + pos, 0, p->count);
			w->is_start[pos] = p->offset == 0;
			r = lay_piece(w, &c, f, p->doc, p->ids, p->offset, p->count, p->length, pos, tok, n, &unused, err,
				      errlen);
			if (r < 0)
				return r;
			pos += p->count;
		}
	}
	r = read_tokens(w, f, &c, tok, n, &unused, err, errlen);
	if (r < 0)
		return r;

	stage_begin(&stage_clock, false);
	int32_t *ids = (int32_t *)(slot + geom->off_input_ids), *labels = (int32_t *)(slot + geom->off_labels);
	int32_t *pids = (int32_t *)(slot + geom->off_position_ids), *cus = (int32_t *)(slot + geom->off_cu_seqlens);
	uint32_t n_cu = 0, docs = 0;
	for (uint32_t i = 0; i < batch_size; i++) {
		const size_t at = i * stride, row = (size_t)i * seq_len;
		uint32_t d;
		uint32_t m = pack_fill(tok + at, tok[at + seq_len], w->is_start + at, 1, seq_len, ids + row, labels + row,
				       pids + row, (int32_t *)w->rows_cu, &d);
		for (uint32_t q = 0; q + 1 < m; q++)
			cus[n_cu++] = (int32_t)w->rows_cu[q] + (int32_t)row;
		docs += d;
	}
	cus[n_cu++] = (int32_t)((size_t)batch_size * seq_len);
	stage_end(&f->stages->pack, &stage_clock, (size_t)batch_size * seq_len * sizeof(int32_t));
	stage_end(&f->stages->job, &job_clock, (size_t)batch_size * seq_len * sizeof(int32_t));
	*ret_n_cu = n_cu;
	*ret_docs = docs;
	return 0;
}

int worker_produce_rows(struct worker *w, const struct feed *f, const struct pad_batch *plan, uint32_t rank,
			uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
			char *err, size_t errlen)
{
	const uint32_t L = plan->seq_len;
	const size_t n = (size_t)plan->batch_size * L;
	const bool concat = f->conf.packing == CONF_PACKING_CONCAT;
	struct stage_clock job_clock, stage_clock;
	stage_begin(&job_clock, false);
	int r = reserve(w, n + 1, MAX(plan->n_pieces + 1, (size_t)16));
	if (r < 0) {
		snprintf(err, errlen, "out of memory for a batch of %zu positions", n + 1);
		return r;
	}
	int32_t *ids = (int32_t *)(slot + geom->off_input_ids), lookahead = 0;
	struct emit_ctx c = { .w = w };
	if (concat)
		memset(w->is_start, 0, n + 1);
	/* Each piece at its row and column; a mixture's pieces come from their sources' shards. */
	for (size_t i = 0; i <= plan->n_pieces; i++) {
		if (i == plan->n_pieces && !concat)
			break;
		const struct row_piece *p = i < plan->n_pieces ? &plan->pieces[i] : &plan->lookahead;
		const struct feed *sf = f->n_sources ? f->sources[p->doc.source] : f;
		size_t pos = i < plan->n_pieces ? (size_t)p->row * L + p->column : n;
		if (concat)
			w->is_start[pos] = p->offset == 0;
		r = lay_piece(w, &c, sf, p->doc.id, p->doc.ids, p->offset, p->count, p->doc.length, pos, ids, n,
			      &lookahead, err, errlen);
		if (r < 0)
			return r;
	}
	r = read_tokens(w, f, &c, ids, n, &lookahead, err, errlen);
	if (r < 0)
		return r;

	stage_begin(&stage_clock, false);
	uint32_t docs, n_cu;
	int32_t *labels = (int32_t *)(slot + geom->off_labels), *position_ids = (int32_t *)(slot + geom->off_position_ids);
	int32_t *cu = (int32_t *)(slot + geom->off_cu_seqlens);
	if (concat)
		n_cu = pack_fill(ids, lookahead, w->is_start, plan->batch_size, L, ids, labels, position_ids, cu, &docs);
	else
		n_cu = pad_fill(plan, f->pad_id, ids, labels, position_ids, cu, &docs);
	stage_end(&f->stages->pack, &stage_clock, n * sizeof(int32_t));
	write_header(slot, plan->batch_index, plan->epoch, rank, world, plan->batch_size, L, n_cu, docs, cursor);
	stage_end(&f->stages->job, &job_clock, n * sizeof(int32_t));
	return 0;
}

/*
 * A test hook (tests/integration/test_lazy_text.py): FEEDD_TEXT_SLOW_FIRST_CHUNK
 * = MS makes the first chunk the process tokenizes take MS milliseconds
 * more, standing for a worker held up by a loaded machine while the chunks
 * after it come back first (issue #22). Unset: nothing.
 */
static void slow_first_chunk_hook(void)
{
	static unsigned chunks;
	if (__atomic_fetch_add(&chunks, 1, __ATOMIC_RELAXED) != 0)
		return;
	const char *e = getenv("FEEDD_TEXT_SLOW_FIRST_CHUNK");
	long ms = e ? strtol(e, NULL, 10) : 0;
	if (ms > 0)
		nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 }, NULL);
}

int worker_tokenize(struct worker *w, struct feed *f, struct tokenize_chunk *t)
{
	const struct tokenize_params p = text_params(f);
	struct stage_clock clock;
	const struct io_stats *io = source_reader_stats(w->io);
	uint64_t io_bytes = io->bytes, depth_sum = io->depth_sum, depth_n = io->depth_n;
	slow_first_chunk_hook();
	stage_begin(&clock, true);
	int r = tokenize_read(&w->tk, w->io, &p, t);
	if (t->note[0])
		log_warning("feed %s: %s", f->name, t->note);
	if (r == 0) {
		const size_t n_reqs = w->tk.n_reqs;
		/* pread has no queue: one request at a time. */
		stage_end_io(&f->stages->read, &clock, io->bytes - io_bytes,
			     io->depth_n > depth_n ? io->depth_sum - depth_sum : (n_reqs > 0),
			     io->depth_n > depth_n ? io->depth_n - depth_n : (n_reqs > 0));
		stage_begin(&clock, false);
		r = tokenize_encode(&w->tk, &p, t);
	}
	if (r < 0)
		return r;
	stage_end(&f->stages->tokenize, &clock, t->read_bytes);
	__atomic_fetch_add(&f->tok_docs, t->n, __ATOMIC_RELAXED);
	__atomic_fetch_add(&f->tok_tokens, t->tokens, __ATOMIC_RELAXED);
	__atomic_fetch_add(&f->utf8_replaced, t->replaced, __ATOMIC_RELAXED);
	return 0;
}
