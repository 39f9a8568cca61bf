/* SPDX-License-Identifier: MIT */
/*
 * An epoch's length in batches (daemon/order/epoch-len.h,
 * docs/sample-order.md section 16) against the independent reference in
 * order-ref.h: lay out the rank's stream position by position, cut it into
 * batches of U positions (or U documents, for packing "pad"), and count the
 * batches whose first position is in each epoch. Measuring from any batch
 * boundary must give that count and the epoch's first batch, for many seeds,
 * windows, worlds and batch sizes, with and without shuffle.
 */
#include <errno.h>

#include "daemon/order/epoch-len.h"
#include "order-ref.h"
#include "proto/macro.h"
#include "unit.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_EPOCHS 5 /* laid out; epochs 0 .. MAX_EPOCHS - 2 are checked (their batches are all known) */

static const uint32_t shard_docs[] = { 6, 0, 9, 4, 7 };
static const uint32_t tok0[] = { 3, 0, 9, 1, 4, 2 }, tok2[] = { 0, 5, 1, 7, 2, 0, 3, 11, 1 }, tok3[] = { 2, 6, 0, 1 },
		      tok4[] = { 8, 1, 1, 0, 4, 2, 3 };
static const uint32_t *const doc_tokens[] = { tok0, NULL, tok2, tok3, tok4 };

static const uint64_t seeds[] = { 0, 7, UINT64_C(0x243F6A8885A308D3) };
static const uint32_t windows[] = { 1, 2, 5 };
static const uint32_t worlds[] = { 1, 2, 3 };
static const uint64_t units[] = { 1, 2, 3, 8, 16, 64 };

/* Units of the reference stream: every position, or (per_doc) each document's first position. */
static size_t layout(const struct ref_pos *all, size_t n, bool per_doc, const struct ref_pos **ret)
{
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (!per_doc || all[i].offset == 0)
			ret[m++] = &all[i];
	return m;
}

static void check_one(const struct order_params *p, uint32_t rank, uint32_t world, bool bos, bool eos, bool per_doc,
		      const struct ref_pos *const *seq, size_t n, uint64_t u)
{
	uint64_t last_epoch = MAX_EPOCHS - 2;
	for (uint64_t b = 0; b * u < n && seq[b * u]->epoch <= last_epoch; b++) {
		const struct ref_pos *at = seq[b * u];
		uint64_t count = 0, first = UINT64_MAX;
		for (uint64_t c = 0; c * u < n; c++)
			if (seq[c * u]->epoch == at->epoch) {
				count++;
				first = MIN(first, c);
			}
		struct stream_pos pos = { .epoch = at->epoch, .window = at->window, .index = at->index,
					  .offset = at->offset };
		struct epoch_units m;
		int r = epoch_units_measure(p, doc_tokens, rank, world, bos, eos, per_doc, &pos, &m);
		CHECK_INT(r, 0);
		if (r < 0)
			return;
		CHECK_U64(m.epoch, at->epoch);
		CHECK_U64(epoch_units_batches(&m, u), count);
		CHECK_U64(b - m.before / u, first);
		if (b == 0) {
			struct epoch_units s;
			CHECK_INT(epoch_units_measure(p, doc_tokens, rank, world, bos, eos, per_doc, NULL, &s), 0);
			CHECK_U64(s.epoch, m.epoch);
			CHECK_U64(s.before, 0);
			CHECK_U64(s.total, m.total);
		}
	}
}

static void test_against_reference(void)
{
	for (size_t si = 0; si < ARRAY_LEN(seeds); si++)
		for (int shuffle = 0; shuffle <= 1; shuffle++)
			for (size_t wi = 0; wi < ARRAY_LEN(windows); wi++)
				for (size_t gi = 0; gi < ARRAY_LEN(worlds); gi++)
					for (uint32_t rank = 0; rank < worlds[gi]; rank++)
						for (int be = 0; be < 3; be++) {
							bool bos = be == 1, eos = be >= 1;
							struct order_params p = { .seed = seeds[si], .shuffle = shuffle,
										  .window = windows[wi], .n_shards = 5,
										  .shard_docs = shard_docs };
							struct ref_pos *all;
							size_t n = ref_stream(seeds[si], shuffle, windows[wi], 5, shard_docs,
									      doc_tokens, rank, worlds[gi], bos, eos,
									      100000, MAX_EPOCHS, &all);
							REQUIRE(n > 0 && n < 100000, "a short stream");
							const struct ref_pos **seq = malloc(n * sizeof(*seq));
							REQUIRE(seq, "out of memory");
							for (int per_doc = 0; per_doc <= 1; per_doc++) {
								size_t m = layout(all, n, per_doc, seq);
								for (size_t ui = 0; ui < ARRAY_LEN(units); ui++)
									check_one(&p, rank, worlds[gi], bos, eos, per_doc,
										  seq, m, units[ui]);
							}
							free(seq);
							free(all);
						}
}

/* Positions that are not the rank's are refused, whatever the units. */
static void test_not_a_position(void)
{
	struct order_params p = { .seed = 1, .shuffle = false, .window = 5, .n_shards = 5, .shard_docs = shard_docs };
	struct epoch_units m;
	/* Unshuffled, world 1: shard 0's document 1 is index 1 of window 0, and empty. */
	struct stream_pos empty = { .epoch = 0, .window = 0, .index = 1, .offset = 0 };
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 0, 1, false, true, false, &empty, &m), -EINVAL);
	/* Document 0 has 3 tokens + eos: offsets 0 .. 3, and only 0 with per_doc. */
	struct stream_pos past = { .epoch = 0, .window = 0, .index = 0, .offset = 4 };
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 0, 1, false, true, false, &past, &m), -EINVAL);
	past.offset = 3;
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 0, 1, false, true, false, &past, &m), 0);
	CHECK_U64(m.before, 3);
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 0, 1, false, true, true, &past, &m), -EINVAL);
	/* Index 1 of world 2 belongs to rank 1, not rank 0; window 1 does not exist (one window of 5 shards). */
	struct stream_pos other = { .epoch = 0, .window = 0, .index = 2, .offset = 0 };
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 1, 2, false, true, false, &other, &m), -EINVAL);
	struct stream_pos nowin = { .epoch = 0, .window = 1, .index = 0, .offset = 0 };
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 0, 1, false, true, false, &nowin, &m), -EINVAL);
	CHECK_INT(epoch_units_measure(&p, doc_tokens, 2, 2, false, true, false, NULL, &m), -EINVAL);
}

int main(void)
{
	test_against_reference();
	test_not_a_position();
	return unit_exit("test-epoch-len");
}
