/* SPDX-License-Identifier: MIT */
/*
 * How long one epoch of a rank's stream is, from document lengths alone
 * (docs/sample-order.md, section 16): the units this rank's documents of
 * epoch e contribute (stream positions for "concat", rows = non-empty
 * documents for "pad"), and how many of them lie before a given position.
 * From those two, the number of the rank's batches whose epoch is e.
 *
 * A pure walk over the epoch's order (O(documents of the epoch), one
 * window's list in memory at a time); no I/O. Callers with large corpora
 * run it off their main loop.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/order/order.h"
#include "daemon/order/stream.h"

struct epoch_units {
	uint64_t epoch;  /* the epoch measured */
	uint64_t before; /* its units before the position */
	uint64_t total;  /* its units */
};

/*
 * Measures epoch pos->epoch of rank's stream, counting each non-empty
 * document as its contribution length (T + bos + eos) or, with per_doc, as
 * 1. pos must be one of the rank's normalised positions (section 7.2: a
 * non-empty document of the rank, offset inside its contribution; offset 0
 * with per_doc); pos NULL means the very start of the stream (its epoch is
 * the first in which the rank has a token). Returns 0; -EINVAL (pos is not
 * such a position); -ENODATA (no epoch within the contract's empty-epoch
 * bound gives the rank a token); -ENOMEM.
 */
int epoch_units_measure(const struct order_params *p, const uint32_t *const *doc_tokens, uint32_t rank,
			uint32_t world, bool bos, bool eos, bool per_doc, const struct stream_pos *pos,
			struct epoch_units *ret);

/* Where token counts come from: tokens(ctx, doc) gives document doc's (an ORDER_DOC id); 0 or a negative errno. */
struct epoch_counts {
	int (*tokens)(void *ctx, uint64_t doc, uint64_t *ret);
	void *ctx;
};
/* epoch_units_measure() with counts asked per document (a mapped index); also returns tokens()'s errors. */
int epoch_units_measure_counts(const struct order_params *p, const struct epoch_counts *doc_tokens, uint32_t rank,
			       uint32_t world, bool bos, bool eos, bool per_doc, const struct stream_pos *pos,
			       struct epoch_units *ret);

/*
 * Batches of `unit_per_batch` units (B*L positions, or B rows) whose epoch is
 * the measured one, given that a batch starts at the measured position:
 * floor(before / u) + ceil((total - before) / u).
 */
static inline uint64_t epoch_units_batches(const struct epoch_units *m, uint64_t unit_per_batch)
{
	return m->before / unit_per_batch + (m->total - m->before + unit_per_batch - 1) / unit_per_batch;
}

/*
 * Virtual ranks (docs/sample-order.md, section 17.10): the epoch of the next
 * batch of rank `rank` of `world` serving virtual streams rank, rank + world,
 * ... of `vranks` (V'), each a one-row stream of rank v of world V'.
 */
struct epoch_vstream {
	uint64_t rows;          /* n_v: rows it has delivered */
	bool live;              /* false: dead (section 17.4), left out */
	bool has_pos;           /* rows > 0: pos is where its row `rows` starts (its fc1 position) */
	struct stream_pos pos;
};

struct epoch_vinfo {
	uint64_t epoch, first_batch, batches, units;
};

/*
 * s: the m = ceil((vranks - rank) / world) served streams, by ascending v;
 * unit: units per row (L for "concat", 1 for "pad", per_doc); next_batch: the
 * batch the rows of s start. One walk over each epoch between the streams'
 * (O(documents of an epoch) each), then arithmetic over the rows of the
 * epoch. Returns 0; -EINVAL (a position that is not one of its stream's);
 * -ENODATA (no live stream, or a stream without a token within the
 * contract's bound); -ENOMEM; tokens()'s errors.
 */
int epoch_vranks_measure(const struct order_params *p, const struct epoch_counts *counts, uint32_t vranks,
			 uint32_t rank, uint32_t world, bool bos, bool eos, bool per_doc, uint64_t unit,
			 uint32_t batch_size, const struct epoch_vstream *s, uint64_t next_batch,
			 struct epoch_vinfo *ret);
