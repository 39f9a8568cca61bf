/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/pack/pad.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"

void pad_batch_clear(struct pad_batch *b)
{
	free(b->pieces);
	*b = (struct pad_batch){ 0 };
}

int pad_batch_push(struct pad_batch *b, const struct pack_doc *doc, uint64_t offset, uint32_t count, uint32_t row)
{
	const struct row_piece *last = b->n_pieces ? &b->pieces[b->n_pieces - 1] : NULL;
	uint32_t column;
	if (last && last->row == row)
		column = last->column + last->count;
	else if (last ? row == last->row + 1 : row == 0)
		column = 0;
	else
		return -EINVAL;
	if (count == 0 || row >= b->batch_size || count > b->seq_len - column || offset + count > doc->length)
		return -EINVAL;

	if (b->n_pieces == b->cap) {
		size_t cap = MAX(b->cap * 2, (size_t)64);
		struct row_piece *n = realloc(b->pieces, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		b->pieces = n;
		b->cap = cap;
	}
	if (b->n_pieces == 0)
		b->epoch = doc->epoch;
	b->pieces[b->n_pieces++] = (struct row_piece){
		.doc = *doc, .offset = offset, .count = count, .row = row, .column = column,
	};
	b->counts.tokens += count;
	b->counts.docs += offset == 0;
	return 0;
}

void pad_batch_reset(struct pad_batch *b, uint32_t batch_size, uint32_t seq_len, uint64_t batch_index)
{
	b->n_pieces = 0;
	b->batch_index = batch_index;
	b->batch_size = batch_size;
	b->seq_len = seq_len;
	b->epoch = 0;
	b->counts = (struct pack_counters){ .positions = (uint64_t)batch_size * seq_len };
}

int pad_plan(const struct pack_source *src, uint32_t batch_size, uint32_t seq_len, uint64_t batch_index,
	     struct pad_batch *plan)
{
	pad_batch_reset(plan, batch_size, seq_len, batch_index);
	for (uint32_t row = 0; row < batch_size; row++) {
		struct pack_doc doc;
		int r = src->next(src->userdata, &doc);
		if (r < 0)
			return r;
		uint32_t keep = (uint32_t)MIN(doc.length, (uint64_t)seq_len);
		r = pad_batch_push(plan, &doc, 0, keep, row);
		if (r < 0)
			return r;
		plan->counts.truncated += doc.length - keep;
	}
	return 0;
}

uint32_t pad_fill(const struct pad_batch *plan, int32_t pad_id, int32_t *input_ids, int32_t *labels,
		  int32_t *position_ids, int32_t *cu_seqlens, uint32_t *ret_docs)
{
	uint32_t L = plan->seq_len, n_cu = 0, docs = 0;
	size_t j = 0;

	for (uint32_t row = 0; row < plan->batch_size; row++) {
		size_t base = (size_t)row * L;
		uint32_t col = 0;
		for (; j < plan->n_pieces && plan->pieces[j].row == row; j++) {
			const struct row_piece *p = &plan->pieces[j];
			size_t a = base + p->column;
			/* Labels stay inside the piece: its last position predicts nothing. */
			memcpy(labels + a, input_ids + a + 1, (p->count - 1) * sizeof(int32_t));
			labels[a + p->count - 1] = FEED_LABEL_IGNORE;
			for (uint32_t t = 0; t < p->count; t++)
				position_ids[a + t] = (int32_t)t;
			cu_seqlens[n_cu++] = (int32_t)a;
			docs += p->offset == 0;
			col = p->column + p->count;
		}
		if (col < L) {
			/* The row's padding is a segment of its own. */
			size_t a = base + col;
			cu_seqlens[n_cu++] = (int32_t)a;
			for (uint32_t t = 0; t < L - col; t++) {
				input_ids[a + t] = pad_id;
				labels[a + t] = FEED_LABEL_IGNORE;
				position_ids[a + t] = (int32_t)t;
			}
		}
	}
	cu_seqlens[n_cu++] = (int32_t)((size_t)plan->batch_size * L);
	*ret_docs = docs;
	return n_cu;
}
