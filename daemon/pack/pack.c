/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "daemon/pack/pack.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"

static int push(struct batch_plan *plan, const struct stream_piece *p)
{
	if (plan->n_pieces == plan->cap) {
		size_t cap = MAX(plan->cap * 2, (size_t)64);
		struct stream_piece *n = realloc(plan->pieces, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		plan->pieces = n;
		plan->cap = cap;
	}
	plan->pieces[plan->n_pieces++] = *p;
	return 0;
}

int pack_plan(struct stream *s, uint32_t batch_size, uint32_t seq_len, uint64_t batch_index,
	      struct batch_plan *plan)
{
	plan->n_pieces = 0;
	plan->batch_index = batch_index;
	plan->batch_size = batch_size;
	plan->seq_len = seq_len;
	plan->epoch = s->ep.epoch;

	uint64_t left = (uint64_t)batch_size * seq_len;
	while (left > 0) {
		struct stream_piece p;
		int r = stream_take(s, left, &p);
		if (r < 0)
			return r;
		r = push(plan, &p);
		if (r < 0)
			return r;
		left -= p.count;
	}
	struct stream_piece peek = stream_peek(s);
	plan->next = stream_tell(s);
	return push(plan, &peek);
}

void pack_plan_clear(struct batch_plan *plan)
{
	free(plan->pieces);
	*plan = (struct batch_plan){ 0 };
}

uint32_t pack_fill(const int32_t *tok, const uint8_t *is_start, uint32_t batch_size, uint32_t seq_len,
		   int32_t *input_ids, int32_t *labels, int32_t *position_ids, int32_t *cu_seqlens,
		   uint32_t *ret_docs)
{
	size_t n = (size_t)batch_size * seq_len;
	uint32_t n_cu = 0, docs = 0;
	int32_t pos = 0;
	for (size_t i = 0, col = 0; i < n; i++, col++) {
		if (col == seq_len)
			col = 0;
		input_ids[i] = tok[i];
		labels[i] = is_start[i + 1] ? FEED_LABEL_IGNORE : tok[i + 1];
		docs += is_start[i] != 0;
		if (col == 0 || is_start[i]) {
			pos = 0;
			cu_seqlens[n_cu++] = (int32_t)i;
		}
		position_ids[i] = pos++;
	}
	cu_seqlens[n_cu++] = (int32_t)n;
	*ret_docs = docs;
	return n_cu;
}
