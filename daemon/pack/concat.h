/* SPDX-License-Identifier: MIT */
/*
 * "concat" packing over a sequence of whole documents (docs/sample-order.md,
 * sections 5 and 14.3): the mixture's contributions concatenated and cut at
 * row boundaries, exactly as section 5 packs one rank's stream. A plain feed
 * packs its stream with pack.h (positions straight from the stream); a
 * mixture draws whole documents from several streams, so it packs them here.
 *
 * The plan is a pad_batch whose pieces are cut at row ends, so no piece
 * crosses a row, and whose `lookahead` is the position after the batch (its
 * token is the last label; whether it starts a document decides the mask).
 * The worker fills it with pack_fill() as section 5 says, never with
 * pad_fill(): "concat" has no padding.
 *
 * The packer holds the document in progress: after a plan it is the
 * look-ahead's document, so the cursor after a batch names that document and
 * the offset inside it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/pack/pad.h"

struct concat {
	uint32_t seq_len;
	struct pack_doc cur; /* the document in progress (valid when have) */
	uint64_t offset;     /* its next position */
	bool have;
	uint64_t skip;       /* resuming: positions of the first document taken that were delivered before */
};

/* Sets up a packer that starts `skip` positions into the first document it takes (0: at its start). */
void concat_init(struct concat *c, uint32_t seq_len, uint64_t skip);

/*
 * Plans the next batch of B rows of L positions, and its look-ahead. Resets
 * and fills *plan. Returns 0, src's error, -ENOMEM, or -EINVAL when the
 * resumed document is not longer than `skip` (the cursor names no position
 * of this stream). After an error the packer is unusable.
 */
int concat_plan(struct concat *c, const struct pack_source *src, uint32_t batch_size, uint64_t batch_index,
		struct pad_batch *plan);
