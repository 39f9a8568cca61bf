/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
	int r;
	if (!plan->partial || plan->batch_index != batch_index) {
		plan->n_pieces = 0;
		plan->batch_index = batch_index;
		plan->batch_size = batch_size;
		plan->seq_len = seq_len;
		plan->left = (uint64_t)batch_size * seq_len;
		plan->partial = false;
		r = stream_settle(s);
		if (r < 0)
			return r;
		plan->epoch = s->walk.ep.epoch;
	}
	/* From here on the stream moves: a stop (-EAGAIN) keeps what was taken, for the next call. */
	plan->partial = true;
	while (plan->left > 0) {
		struct stream_piece p;
		r = stream_take(s, plan->left, &p);
		if (r < 0)
			goto out;
		r = push(plan, &p);
		if (r < 0)
			goto out;
		plan->left -= p.count;
	}
	/* The look-ahead position must exist: a caller with counts still to come waits for it. */
	r = stream_settle(s);
	if (r < 0)
		goto out;
	plan->partial = false;
	struct stream_piece peek = stream_peek(s);
	plan->next = stream_tell(s);
	return push(plan, &peek);
out:
	/* Any other failure ends the plan: nothing goes on from it. */
	plan->partial = r == -EAGAIN;
	return r;
}

void pack_plan_clear(struct batch_plan *plan)
{
	free(plan->pieces);
	*plan = (struct batch_plan){ 0 };
}

uint32_t pack_fill(const int32_t *tok, int32_t lookahead, const uint8_t *is_start, uint32_t batch_size,
		   uint32_t seq_len, int32_t *input_ids, int32_t *labels, int32_t *position_ids, int32_t *cu_seqlens,
		   uint32_t *ret_docs)
{
	/*
	 * Bulk copies and per-segment fills: document starts are sparse, so
	 * finding them with memchr and patching around them is several times
	 * faster than deciding every position on its own (bench/spine.py).
	 */
	size_t n = (size_t)batch_size * seq_len;
	if (tok != input_ids)
		memcpy(input_ids, tok, n * sizeof(int32_t));
	memcpy(labels, tok + 1, (n - 1) * sizeof(int32_t));
	labels[n - 1] = lookahead;

	uint32_t docs = 0;
	for (const uint8_t *p = is_start; (p = memchr(p, 1, (size_t)(is_start + n + 1 - p))); p++) {
		size_t i = (size_t)(p - is_start);
		if (i > 0)
			labels[i - 1] = FEED_LABEL_IGNORE;
		docs += i < n;
	}

	uint32_t n_cu = 0;
	for (size_t a = 0; a < n;) {
		/* A segment runs from a to the next document start or row end. */
		size_t row_end = (a / seq_len + 1) * seq_len;
		const uint8_t *next = a + 1 < row_end ? memchr(is_start + a + 1, 1, row_end - a - 1) : NULL;
		size_t b = next ? (size_t)(next - is_start) : row_end;
		cu_seqlens[n_cu++] = (int32_t)a;
		int32_t *pos = position_ids + a;
		for (size_t t = 0; t < b - a; t++)
			pos[t] = (int32_t)t;
		a = b;
	}
	cu_seqlens[n_cu++] = (int32_t)n;
	*ret_docs = docs;
	return n_cu;
}
