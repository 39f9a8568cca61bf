/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/worker.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"

/*
 * Tokens read raw to w->raw + pos * 8 (packed, itemsize bytes each, so runs
 * never overlap whatever the dtype), to be widened from the shard's dtype.
 */
struct widen_run {
	size_t pos;
	size_t n;
	uint32_t shard;
	uint64_t byte_offset; /* in .bin, for messages */
};

struct worker *worker_new(enum io_engine engine, unsigned depth)
{
	struct worker *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	if (io_reader_new(engine, depth, &w->io) < 0) {
		free(w);
		return NULL;
	}
	return w;
}

struct worker *worker_free(struct worker *w)
{
	if (!w)
		return NULL;
	io_reader_free(w->io);
	free(w->raw);
	free(w->is_start);
	free(w->reqs);
	free(w->runs);
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
	const struct megatron_shard *shard;
	uint32_t shard_index;
	size_t n;
	size_t pos; /* stream position of the next token */
};

static int emit_range(void *userdata, uint64_t byte_offset, uint64_t n_tokens)
{
	struct emit_ctx *c = userdata;
	struct worker *w = c->w;
	if (c->n == w->cap_reqs) {
		int r = reserve(w, w->positions, w->cap_reqs * 2);
		if (r < 0)
			return r;
	}
	w->reqs[c->n] = (struct io_req){
		.fd = c->shard->bin_fd,
		.offset = byte_offset,
		.len = n_tokens * c->shard->itemsize,
		.dst = w->raw + c->pos * 8,
	};
	w->runs[c->n] = (struct widen_run){ .pos = c->pos, .n = n_tokens, .shard = c->shard_index,
					    .byte_offset = byte_offset };
	c->n++;
	c->pos += n_tokens;
	return 0;
}

int worker_produce(struct worker *w, const struct feed *f, const struct batch_plan *plan, uint32_t rank,
		   uint32_t world, const char *cursor, const struct feed_ring_header *geom, uint8_t *slot,
		   char *err, size_t errlen)
{
	size_t n_pos = (size_t)plan->batch_size * plan->seq_len + 1;
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
#define AT(p) ((p) < n ? ids + (p) : &lookahead)

	/* Lay out the positions: bos/eos inline, token ranges as reads. */
	const bool bos = f->conf.bos != CONF_TOKEN_NONE, eos = f->conf.eos != CONF_TOKEN_NONE;
	struct emit_ctx c = { .w = w };
	size_t pos = 0;
	for (size_t i = 0; i < plan->n_pieces; i++) {
		const struct stream_piece *p = &plan->pieces[i];
		uint32_t s = ORDER_DOC_SHARD(p->doc), d = ORDER_DOC_INDEX(p->doc);
		uint64_t tokens = p->length - bos - eos;
		uint64_t lo = MAX(p->offset, (uint64_t)bos), hi = MIN(p->offset + p->count, bos + tokens);

		memset(w->is_start + pos, 0, p->count);
		w->is_start[pos] = p->offset == 0;
		if (bos && p->offset == 0)
			*AT(pos) = (int32_t)f->conf.bos;
		if (eos && p->offset + p->count == p->length)
			*AT(pos + p->count - 1) = (int32_t)f->conf.eos;
		if (lo < hi) {
			c.shard = f->shards[s];
			c.shard_index = s;
			c.pos = pos + (lo - p->offset);
			r = megatron_doc_ranges(c.shard, d, lo - bos, hi - lo, emit_range, &c);
			if (r < 0) {
				snprintf(err, errlen, "%s: document %" PRIu32 ": cannot map tokens %" PRIu64 "..%" PRIu64,
					 f->shards[s]->idx_path, d, lo - bos, hi - bos);
				return r;
			}
		}
		pos += p->count;
	}

	size_t failed = 0;
	r = io_reader_run(w->io, w->reqs, c.n, &failed);
	if (r < 0) {
		const struct megatron_shard *sh = f->shards[w->runs[failed].shard];
		if (r == -ENODATA)
			snprintf(err, errlen, "%s: ends before byte %" PRIu64 " that its .idx points to: the file changed while serving",
				 sh->bin_path, w->runs[failed].byte_offset + w->reqs[failed].len);
		else
			snprintf(err, errlen, "%s: read at byte %" PRIu64 " failed: %s", sh->bin_path,
				 w->runs[failed].byte_offset, strerror(-r));
		return r;
	}
	for (size_t i = 0; i < c.n; i++) {
		const struct widen_run *run = &w->runs[i];
		const struct megatron_shard *sh = f->shards[run->shard];
		size_t bad;
		r = megatron_widen(sh->dtype, w->raw + run->pos * 8, run->n, AT(run->pos), &bad);
		if (r < 0) {
			snprintf(err, errlen, "%s: token at byte %" PRIu64 " is outside 0..2147483647", sh->bin_path,
				 run->byte_offset + bad * sh->itemsize);
			return r;
		}
	}

	struct feed_slot_header *h = (struct feed_slot_header *)slot;
	uint32_t docs;
#undef AT
	uint32_t n_cu = pack_fill(ids, lookahead, w->is_start, plan->batch_size, plan->seq_len, ids,
				  (int32_t *)(slot + geom->off_labels),
				  (int32_t *)(slot + geom->off_position_ids), (int32_t *)(slot + geom->off_cu_seqlens),
				  &docs);
	h->batch_index = plan->batch_index;
	h->epoch = plan->epoch;
	h->rank = rank;
	h->world = world;
	h->batch_size = plan->batch_size;
	h->seq_len = plan->seq_len;
	h->n_cu_seqlens = n_cu;
	h->n_docs = docs;
	snprintf(h->cursor, sizeof(h->cursor), "%s", cursor);
	return 0;
}
