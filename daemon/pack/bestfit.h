/* SPDX-License-Identifier: MIT */
/*
 * "bestfit" packing (docs/sample-order.md, section 12): documents gathered in
 * a bounded buffer, in contract order, and packed Best-Fit-Decreasing into
 * rows of L positions (Ding et al. 2024, "Fewer Truncations Improve Language
 * Modeling"). No document is cut unless it is longer than L, and then only
 * into chunks of L. Leftover space in a row is padding (pad.h).
 *
 * Two layers:
 *   - bestfit_pack(): the packing of one buffer, a pure function of its
 *     documents' contribution lengths and L (every tie broken as section
 *     12.3 says). The result owns its arrays.
 *   - struct bestfit: the packer a session drives. It gathers buffers from a
 *     pack_source, packs them, and hands out rows B at a time as pad_batch
 *     plans; rows flow from one buffer into the next without a gap.
 *
 * Resume (section 12.5) needs only where the current buffer started (the
 * source tells the session through pack_source.mark) and the index of the
 * next row inside that buffer's packing: O(buffer) to rebuild.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/pack/pad.h"

/* Buffer sizes accepted, in tokens (pack_buffer). */
#define BESTFIT_BUFFER_MIN UINT64_C(1)
#define BESTFIT_BUFFER_MAX (UINT64_C(1) << 32)

/* A whole document, or one chunk of a document longer than L, as placed in a row. */
struct bestfit_item {
	uint32_t doc;    /* index of the document in the buffer */
	uint32_t length; /* positions, 1 .. L */
	uint64_t offset; /* first position inside the document's contribution (a multiple of L) */
};

/* One row: items[first .. first + n_items - 1], in the order they were placed. */
struct bestfit_row {
	size_t first;
	uint32_t n_items;
	uint32_t used; /* positions holding items; L - used is padding */
};

/* The packing of one buffer. */
struct bestfit_packing {
	uint32_t seq_len;
	struct bestfit_item *items; /* grouped by row, rows in order */
	size_t n_items;
	struct bestfit_row *rows;
	size_t n_rows;
};

/*
 * Packs documents with contribution lengths lengths[0 .. n-1] (each > 0, the
 * buffer in contract order) into rows of seq_len: chunks, Best-Fit-Decreasing,
 * rows numbered by creation (section 12.3). Fills *ret (freeing what it held).
 * Returns 0; -EINVAL (a zero length, seq_len 0); -EOVERFLOW (2^32 or more
 * items); -ENOMEM.
 */
int bestfit_pack(const uint64_t *lengths, size_t n, uint32_t seq_len, struct bestfit_packing *ret);
void bestfit_packing_clear(struct bestfit_packing *p);

/* The packer a session holds, one per rank stream. */
struct bestfit {
	uint32_t seq_len;
	uint64_t buffer_tokens;  /* a buffer closes at the first document that brings it to this many positions */
	struct pack_doc *docs;   /* the current buffer's documents, in contract order */
	uint64_t *lengths;       /* their contribution lengths (bestfit_pack's input) */
	size_t n_docs, cap;
	struct bestfit_packing packing;
	size_t row;              /* next row of the packing to hand out; == n_rows: a new buffer is due */
	uint64_t buffers;        /* buffers gathered so far */
};

/* Sets up an empty packer. Returns 0, or -EINVAL for seq_len 0 or a buffer size outside the bounds above. */
int bestfit_init(struct bestfit *bf, uint32_t seq_len, uint64_t buffer_tokens);
void bestfit_clear(struct bestfit *bf);

/*
 * Plans the next batch: B rows, taken from the current buffer's packing and,
 * when it runs out, from the next buffer gathered from src (src->mark is
 * called before its first document). Resets and fills *plan. Returns 0 or
 * src's error, -EOVERFLOW, -ENOMEM; after an error the packer is unusable
 * (the session fails).
 */
int bestfit_plan(struct bestfit *bf, const struct pack_source *src, uint32_t batch_size, uint64_t batch_index,
		 struct pad_batch *plan);

/*
 * Rows of the current buffer not handed out yet. The cursor after a batch is
 * (where the current buffer started, bf->row) while this is > 0, and (the
 * source's position now, row 0) when it is 0.
 */
static inline size_t bestfit_rows_left(const struct bestfit *bf)
{
	return bf->packing.n_rows - bf->row;
}

/*
 * Resumes at row `row` of the buffer that starts at src's current position
 * (the session has put its source there from a cursor). Row 0 gathers
 * nothing yet; any other row gathers and packs the buffer now. Returns 0;
 * -EINVAL when the buffer has no such row (the cursor names no row of this
 * stream); src's error; -ENOMEM.
 */
int bestfit_resume(struct bestfit *bf, const struct pack_source *src, uint64_t row);
