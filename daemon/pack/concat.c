/* SPDX-License-Identifier: MIT */
#include <errno.h>

#include "daemon/pack/concat.h"
#include "proto/macro.h"

void concat_init(struct concat *c, uint32_t seq_len, uint64_t skip)
{
	*c = (struct concat){ .seq_len = seq_len, .skip = skip };
}

/* Makes sure the document in progress has a position left, taking the next one if not. */
static int current(struct concat *c, const struct pack_source *src)
{
	if (c->have && c->offset < c->cur.length)
		return 0;
	int r = src->next(src->userdata, &c->cur);
	if (r < 0)
		return r;
	c->have = true;
	c->offset = c->skip;
	c->skip = 0;
	return c->offset < c->cur.length ? 0 : -EINVAL;
}

int concat_plan(struct concat *c, const struct pack_source *src, uint32_t batch_size, uint64_t batch_index,
		struct pad_batch *plan)
{
	const uint32_t L = c->seq_len;
	const uint64_t n = (uint64_t)batch_size * L;
	pad_batch_reset(plan, batch_size, L, batch_index);
	for (uint64_t pos = 0; pos < n;) {
		int r = current(c, src);
		if (r < 0)
			return r;
		uint32_t take = (uint32_t)MIN(c->cur.length - c->offset, (uint64_t)(L - pos % L));
		r = pad_batch_push(plan, &c->cur, c->offset, take, (uint32_t)(pos / L));
		if (r < 0)
			return r;
		/* A document that starts here and does not end in this row crosses a row end. */
		plan->counts.cut_docs += c->offset == 0 && take < c->cur.length;
		c->offset += take;
		pos += take;
	}
	int r = current(c, src);
	if (r < 0)
		return r;
	plan->lookahead = (struct row_piece){ .doc = c->cur, .offset = c->offset, .count = 1, .row = batch_size };
	return 0;
}
