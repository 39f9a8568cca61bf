/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "daemon/order/epoch-len.h"
#include "proto/macro.h"

/* The contract's give-up rule for a rank without tokens (section 6). */
#define EMPTY_EPOCHS_SHUFFLED 1000

static int units_of(const struct epoch_counts *c, uint64_t doc, bool bos, bool eos, bool per_doc, uint64_t *ret)
{
	uint64_t t;
	int r = c->tokens(c->ctx, doc, &t);
	if (r < 0)
		return r;
	*ret = !t ? 0 : per_doc ? 1 : t + bos + eos;
	return 0;
}

/* One epoch: *ret_total, and *ret_before (units before pos, checking that pos exists) when pos is set. */
static int walk_epoch(const struct order_params *p, const struct epoch_counts *doc_tokens, uint32_t rank,
		      uint32_t world, bool bos, bool eos, bool per_doc, uint64_t epoch, const struct stream_pos *pos,
		      uint64_t *ret_before, uint64_t *ret_total)
{
	struct order_epoch ep = { 0 };
	int r = order_epoch_build(p, epoch, &ep);
	if (r < 0)
		return r;
	if (pos && pos->window >= ep.n_windows) {
		order_epoch_clear(&ep);
		return -EINVAL;
	}
	uint64_t before = 0, total = 0;
	bool found = !pos;
	for (uint32_t w = 0; w < ep.n_windows && r == 0; w++) {
		uint64_t *docs, first, window_docs;
		size_t n;
		r = order_window_rank_docs(p, &ep, w, rank, world, &docs, &n, &first, &window_docs);
		if (r < 0)
			break;
		for (size_t i = 0; i < n && r == 0; i++) {
			uint64_t u;
			if ((r = units_of(doc_tokens, docs[i], bos, eos, per_doc, &u)) < 0)
				break;
			uint64_t index = first + (uint64_t)i * world;
			if (pos && w == pos->window && index == pos->index) {
				/* The position's document: non-empty, and the offset inside it. */
				if (u && pos->offset < (per_doc ? 1 : u))
					found = true;
				before = total + pos->offset;
			} else if (pos && (w < pos->window || (w == pos->window && index < pos->index))) {
				before = total + u;
			}
			total += u;
		}
		free(docs);
	}
	order_epoch_clear(&ep);
	if (r < 0)
		return r;
	if (!found)
		return -EINVAL;
	*ret_before = before;
	*ret_total = total;
	return 0;
}

static int array_tokens(void *ctx, uint64_t doc, uint64_t *ret)
{
	const uint32_t *const *doc_tokens = ctx;
	*ret = doc_tokens[ORDER_DOC_SHARD(doc)][ORDER_DOC_INDEX(doc)];
	return 0;
}

int epoch_units_measure(const struct order_params *p, const uint32_t *const *doc_tokens, uint32_t rank,
			uint32_t world, bool bos, bool eos, bool per_doc, const struct stream_pos *pos,
			struct epoch_units *ret)
{
	const struct epoch_counts c = { .tokens = array_tokens, .ctx = (void *)doc_tokens };
	return epoch_units_measure_counts(p, &c, rank, world, bos, eos, per_doc, pos, ret);
}

int epoch_units_measure_counts(const struct order_params *p, const struct epoch_counts *doc_tokens, uint32_t rank,
			       uint32_t world, bool bos, bool eos, bool per_doc, const struct stream_pos *pos,
			       struct epoch_units *ret)
{
	if (world == 0 || rank >= world)
		return -EINVAL;
	uint64_t before, total;
	if (pos) {
		int r = walk_epoch(p, doc_tokens, rank, world, bos, eos, per_doc, pos->epoch, pos, &before, &total);
		if (r < 0)
			return r;
		*ret = (struct epoch_units){ .epoch = pos->epoch, .before = before, .total = total };
		return 0;
	}
	/* The stream's start: the first epoch that gives the rank a token (without shuffle, all are alike). */
	unsigned bound = p->shuffle ? EMPTY_EPOCHS_SHUFFLED : 1;
	for (uint64_t e = 0; e < bound; e++) {
		int r = walk_epoch(p, doc_tokens, rank, world, bos, eos, per_doc, e, NULL, &before, &total);
		if (r < 0)
			return r;
		if (total) {
			*ret = (struct epoch_units){ .epoch = e, .before = 0, .total = total };
			return 0;
		}
	}
	return -ENODATA;
}
