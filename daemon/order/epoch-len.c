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

/*
 * Window w's documents for rank of world, one at a time (order_window_doc):
 * built here, never taken from the feed's shared windows (this runs on the
 * pool), and nothing per document held for a window of the bijection or
 * without shuffle; a shuffled window's list is the contract's (section 3).
 */
static int window_open(const struct order_params *p, const struct order_epoch *ep, uint32_t w, uint32_t rank,
		       uint32_t world, struct order_window *ret)
{
	struct order_params own = *p;
	own.windows = NULL;
	return order_window_build(&own, ep, w, rank, world, ret);
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
		struct order_window win;
		r = window_open(p, &ep, w, rank, world, &win);
		if (r < 0)
			break;
		for (size_t i = 0; i < win.mine && r == 0; i++) {
			uint64_t u;
			if ((r = units_of(doc_tokens, order_window_doc(&win, i), bos, eos, per_doc, &u)) < 0)
				break;
			uint64_t index = win.first + (uint64_t)i * world;
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
		order_window_clear(&win);
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

/* Virtual ranks (section 17.10). */

struct vwalk {
	uint32_t m;
	const struct epoch_vstream *s;
	uint64_t *units;  /* per served stream: the walked epoch's units */
	uint64_t *before; /* per served stream positioned in the walked epoch: its units before the position */
	bool *found;
};

/* One walk over epoch `epoch`'s documents gives every served stream's units (entry k is stream k mod vranks). */
static int vwalk_epoch(const struct order_params *p, const struct epoch_counts *counts, uint32_t vranks,
		       uint32_t rank, uint32_t world, bool bos, bool eos, bool per_doc, uint64_t epoch, struct vwalk *x)
{
	struct order_epoch ep = { 0 };
	int r = order_epoch_build(p, epoch, &ep);
	if (r < 0)
		return r;
	for (uint32_t i = 0; i < x->m; i++)
		x->units[i] = 0;
	for (uint32_t w = 0; w < ep.n_windows && r == 0; w++) {
		struct order_window win;
		r = window_open(p, &ep, w, 0, 1, &win);
		if (r < 0)
			break;
		const uint64_t k0 = ep.win_start[w];
		for (size_t i = 0; i < win.mine && r == 0; i++) {
			const uint32_t v = (uint32_t)((k0 + i) % vranks);
			if (v % world != rank)
				continue;
			const uint32_t si = v / world;
			uint64_t u;
			if ((r = units_of(counts, order_window_doc(&win, i), bos, eos, per_doc, &u)) < 0)
				break;
			const struct epoch_vstream *st = &x->s[si];
			if (st->live && st->has_pos && st->pos.epoch == epoch) {
				if (w == st->pos.window && i == st->pos.index) {
					if (u && st->pos.offset < (per_doc ? 1 : u))
						x->found[si] = true;
					x->before[si] = x->units[si] + st->pos.offset;
				} else if (w < st->pos.window || (w == st->pos.window && i < st->pos.index)) {
					x->before[si] = x->units[si] + u;
				}
			}
			x->units[si] += u;
		}
		order_window_clear(&win);
	}
	order_epoch_clear(&ep);
	return r;
}

/* The rank's rows as (j, stream) pairs: those before the state (j < rows), then those after it, each sorted. */
struct vseq {
	uint32_t m;
	const struct epoch_vstream *s;
	uint64_t B, P0, pmin, b0; /* batch starts: positions p >= pmin with p = P0 (mod B); P0 is batch b0's */
};

/* The first batch (from the first the state allows) whose row 0 is row j >= lo[i] of its stream i. */
static uint64_t vseq_first(const struct vseq *q, const uint64_t *lo)
{
	uint64_t j0 = UINT64_MAX, maxs = 0, mins = UINT64_MAX;
	for (uint32_t i = 0; i < q->m; i++) {
		if (!q->s[i].live)
			continue;
		j0 = MIN(j0, lo[i]);
		maxs = MAX(maxs, q->s[i].rows);
		mins = MIN(mins, q->s[i].rows);
	}
	/* Before the state: level j holds row j of every stream with rows > j, at sum_i min(j, rows_i). */
	uint64_t at = 0;
	for (uint32_t i = 0; i < q->m; i++)
		if (q->s[i].live)
			at += MIN(j0, q->s[i].rows);
	for (uint64_t j = j0; j < maxs; j++) {
		for (uint32_t i = 0; i < q->m; i++) {
			if (!q->s[i].live || q->s[i].rows <= j)
				continue;
			if (at >= q->pmin && (q->P0 - at) % q->B == 0 && j >= lo[i])
				return q->b0 - (q->P0 - at) / q->B;
			at++;
		}
	}
	/* From the state on: level j holds row j of every stream with rows <= j, at P0 + sum_i max(0, j - rows_i). */
	uint64_t j = MAX(j0, mins);
	at = q->P0;
	for (uint32_t i = 0; i < q->m; i++)
		if (q->s[i].live && j > q->s[i].rows)
			at += j - q->s[i].rows;
	for (;; j++) {
		for (uint32_t i = 0; i < q->m; i++) {
			if (!q->s[i].live || q->s[i].rows > j)
				continue;
			if ((at - q->P0) % q->B == 0 && j >= lo[i])
				return q->b0 + (at - q->P0) / q->B;
			at++;
		}
	}
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

int epoch_vranks_measure(const struct order_params *p, const struct epoch_counts *counts, uint32_t vranks,
			 uint32_t rank, uint32_t world, bool bos, bool eos, bool per_doc, uint64_t unit,
			 uint32_t batch_size, const struct epoch_vstream *s, uint64_t next_batch,
			 struct epoch_vinfo *ret)
{
	if (world == 0 || rank >= world || world > vranks || !unit || !batch_size)
		return -EINVAL;
	const uint32_t m = (vranks - rank + world - 1) / world;
	/* The epochs to walk: from the earliest stream's to the latest's (streams at their start: their first with a token). */
	uint64_t e_lo = UINT64_MAX, e_hi = 0;
	bool starts = false, any = false;
	for (uint32_t i = 0; i < m; i++) {
		if (!s[i].live)
			continue;
		any = true;
		if (s[i].has_pos) {
			e_lo = MIN(e_lo, s[i].pos.epoch);
			e_hi = MAX(e_hi, s[i].pos.epoch);
		} else {
			starts = true;
		}
	}
	if (!any)
		return -ENODATA;
	if (starts)
		e_lo = 0;
	const uint64_t bound = p->shuffle ? EMPTY_EPOCHS_SHUFFLED : 1;
	_cleanup_free_ uint64_t *units = NULL;   /* (e - e_lo) * m + i */
	_cleanup_free_ uint64_t *before = calloc(m, sizeof(*before));
	_cleanup_free_ bool *found = calloc(m, sizeof(*found));
	_cleanup_free_ uint64_t *start = malloc(m * sizeof(*start)); /* the epoch of each stream's position */
	_cleanup_free_ uint64_t *lo = malloc(m * sizeof(*lo));
	_cleanup_free_ uint64_t *base = malloc(m * sizeof(*base));
	if (!before || !found || !start || !lo || !base)
		return -ENOMEM;
	for (uint32_t i = 0; i < m; i++)
		start[i] = s[i].has_pos ? s[i].pos.epoch : UINT64_MAX;
	uint64_t n_ep = 0;
	for (uint64_t e = e_lo;; e++) {
		bool waiting = false;
		for (uint32_t i = 0; i < m; i++)
			waiting |= s[i].live && start[i] == UINT64_MAX;
		if (e > e_hi && !waiting)
			break;
		if (waiting && e >= bound)
			return -ENODATA;
		uint64_t *grown = realloc(units, (n_ep + 1) * m * sizeof(*units));
		if (!grown)
			return -ENOMEM;
		units = grown;
		struct vwalk x = { .m = m, .s = s, .units = units + n_ep * m, .before = before, .found = found };
		int r = vwalk_epoch(p, counts, vranks, rank, world, bos, eos, per_doc, e, &x);
		if (r < 0)
			return r;
		n_ep++;
		for (uint32_t i = 0; i < m; i++)
			if (s[i].live && start[i] == UINT64_MAX && x.units[i]) {
				start[i] = e;
				e_hi = MAX(e_hi, e);
			}
	}
	/* Each stream's units before its position's epoch: rows * unit - before (section 16's E_{e-1}). */
	uint64_t P0 = 0;
	for (uint32_t i = 0; i < m; i++) {
		if (!s[i].live)
			continue;
		if (s[i].has_pos && !found[i])
			return -EINVAL;
		uint64_t a = s[i].has_pos ? before[i] : 0;
		if (s[i].rows > UINT64_MAX / unit || s[i].rows * unit < a)
			return -EINVAL;
		base[i] = s[i].rows * unit - a;
		P0 += s[i].rows;
	}
	const uint64_t B = batch_size;
	const uint64_t b0 = next_batch;
	const struct vseq q = { .m = m, .s = s, .B = B, .P0 = P0, .b0 = b0,
				.pmin = P0 > b0 * B ? P0 - b0 * B : P0 % B };
	/* lo[i] for epoch e: ceil(E_{e-1} / unit), E_{e-1} moved from the stream's anchor by the walked epochs. */
	uint64_t first_next = 0;
	for (uint64_t e = e_hi + 1;; e--) {
		for (uint32_t i = 0; i < m; i++) {
			if (!s[i].live)
				continue;
			uint64_t E = base[i];
			for (uint64_t x = start[i]; x < e; x++)
				E += units[(x - e_lo) * m + i];
			for (uint64_t x = e; x < start[i]; x++)
				E -= units[(x - e_lo) * m + i];
			lo[i] = ceil_div(E, unit);
		}
		uint64_t f = vseq_first(&q, lo);
		if (e <= e_hi && (f <= b0 || e == e_lo)) {
			uint64_t total = 0;
			for (uint32_t i = 0; i < m; i++)
				if (s[i].live)
					total += units[(e - e_lo) * m + i];
			*ret = (struct epoch_vinfo){ .epoch = e, .first_batch = f, .batches = first_next - f,
						     .units = total };
			return 0;
		}
		first_next = f;
	}
}
