/* SPDX-License-Identifier: MIT */
/*
 * Packing (daemon/pack/pack.h). pack_fill is checked against batches worked
 * out by hand: what the trainer's loss and attention see (labels masked at
 * document boundaries, position ids restarting, cu_seqlens boundaries).
 * pack_plan is checked against the reference stream of order-ref.h: each
 * batch is exactly the next B*L positions plus a one-position look-ahead, and
 * the plan's `next` is where the stream (and a resumed stream) stands.
 */
#include "daemon/order/stream.h"
#include "daemon/pack/pack.h"
#include "order-ref.h"
#include "proto/ring_abi.h"
#include "unit.h"

#define IGN FEED_LABEL_IGNORE

static void check_array(const char *what, const int32_t *got, const int32_t *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i]) {
			char g[256] = "", w[256] = "";
			for (size_t j = 0; j < n; j++) {
				snprintf(g + strlen(g), sizeof(g) - strlen(g), "%d ", got[j]);
				snprintf(w + strlen(w), sizeof(w) - strlen(w), "%d ", want[j]);
			}
			unit_fail(__FILE__, __LINE__, "%s differs at [%zu]: got [ %s], expected [ %s]", what, i, g, w);
			return;
		}
}

struct fill_case {
	const char *what;
	uint32_t B, L;
	const int32_t *tok;      /* B*L + 1 */
	const uint8_t *is_start; /* B*L + 1 */
	const int32_t *input_ids, *labels, *position_ids, *cu_seqlens;
	uint32_t n_cu, docs;
};

static void check_fill(const struct fill_case *c)
{
	size_t n = (size_t)c->B * c->L;
	int32_t input_ids[64], labels[64], position_ids[64], cu[65];
	uint32_t docs = 12345;
	for (size_t i = 0; i < 65; i++)
		cu[i] = -7;
	uint32_t n_cu = pack_fill(c->tok, c->tok[(size_t)c->B * c->L], c->is_start, c->B, c->L, input_ids, labels, position_ids, cu, &docs);
	char what[128];
	snprintf(what, sizeof(what), "%s: input_ids", c->what);
	check_array(what, input_ids, c->input_ids, n);
	snprintf(what, sizeof(what), "%s: labels", c->what);
	check_array(what, labels, c->labels, n);
	snprintf(what, sizeof(what), "%s: position_ids", c->what);
	check_array(what, position_ids, c->position_ids, n);
	CHECK(n_cu == c->n_cu, "%s: %u cu_seqlens entries, expected %u", c->what, n_cu, c->n_cu);
	snprintf(what, sizeof(what), "%s: cu_seqlens", c->what);
	if (n_cu == c->n_cu)
		check_array(what, cu, c->cu_seqlens, n_cu);
	CHECK(n_cu > c->n_cu || cu[n_cu] == -7, "%s: pack_fill wrote past its cu_seqlens count", c->what);
	CHECK(docs == c->docs, "%s: %u documents start in the batch, expected %u", c->what, docs, c->docs);
}

static void test_fill(void)
{
	/*
	 * B=2, L=5. Documents: A = 10 11 12 (starts at 0), B = 20 21 22 (starts at 3,
	 * crosses the row boundary), C = 30.. (starts at 6), D starts at the
	 * look-ahead position 10. Labels are the next token, except -100 where the
	 * next position starts a document (2, 5, and 9 by the look-ahead).
	 */
	static const int32_t tok1[] = { 10, 11, 12, 20, 21, /**/ 22, 30, 31, 32, 33, /**/ 40 };
	static const uint8_t st1[] = { 1, 0, 0, 1, 0, /**/ 0, 1, 0, 0, 0, /**/ 1 };
	static const int32_t in1[] = { 10, 11, 12, 20, 21, 22, 30, 31, 32, 33 };
	static const int32_t lab1[] = { 11, 12, IGN, 21, 22, IGN, 31, 32, 33, IGN };
	static const int32_t pos1[] = { 0, 1, 2, 0, 1, /**/ 0, 0, 1, 2, 3 };
	static const int32_t cu1[] = { 0, 3, 5, 6, 10 };

	/* The same batch, but the look-ahead continues document C: the last label is its token. */
	static const uint8_t st2[] = { 1, 0, 0, 1, 0, /**/ 0, 1, 0, 0, 0, /**/ 0 };
	static const int32_t lab2[] = { 11, 12, IGN, 21, 22, IGN, 31, 32, 33, 40 };

	/* A document starting exactly at a row start: one cu_seqlens entry, not two. */
	static const int32_t tok3[] = { 5, 6, 7, /**/ 8, 9, 1, /**/ 2, 3, 4, /**/ 0 };
	static const uint8_t st3[] = { 0, 0, 0, /**/ 1, 0, 0, /**/ 0, 0, 1, /**/ 0 };
	static const int32_t in3[] = { 5, 6, 7, 8, 9, 1, 2, 3, 4 };
	static const int32_t lab3[] = { 6, 7, IGN, 9, 1, 2, 3, IGN, 0 };
	static const int32_t pos3[] = { 0, 1, 2, /**/ 0, 1, 2, /**/ 0, 1, 0 };
	static const int32_t cu3[] = { 0, 3, 6, 8, 9 };

	/* One long document continuing through the whole batch: rows only. */
	static const int32_t tok4[] = { 1, 2, 3, 4, /**/ 5, 6, 7, 8, /**/ 9 };
	static const uint8_t st4[] = { 0, 0, 0, 0, /**/ 0, 0, 0, 0, /**/ 0 };
	static const int32_t lab4[] = { 2, 3, 4, 5, 6, 7, 8, 9 };
	static const int32_t pos4[] = { 0, 1, 2, 3, 0, 1, 2, 3 };
	static const int32_t cu4[] = { 0, 4, 8 };

	/* One-token documents everywhere (bos-only, say): every label masked, every position 0. */
	static const int32_t tok5[] = { 7, 7, 7, /**/ 7 };
	static const uint8_t st5[] = { 1, 1, 1, /**/ 1 };
	static const int32_t lab5[] = { IGN, IGN, IGN };
	static const int32_t pos5[] = { 0, 0, 0 };
	static const int32_t cu5[] = { 0, 1, 2, 3 };

	static const struct fill_case cases[] = {
		{ "two rows, look-ahead starts a document", 2, 5, tok1, st1, in1, lab1, pos1, cu1, 5, 3 },
		{ "two rows, look-ahead continues", 2, 5, tok1, st2, in1, lab2, pos1, cu1, 5, 3 },
		{ "document at a row start", 3, 3, tok3, st3, in3, lab3, pos3, cu3, 5, 2 },
		{ "one continuing document", 2, 4, tok4, st4, tok4, lab4, pos4, cu4, 3, 0 },
		{ "one-token documents", 1, 3, tok5, st5, tok5, lab5, pos5, cu5, 4, 3 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		check_fill(&cases[i]);
}

/* ---- planning ---- */

static const uint32_t shard_docs[] = { 4, 0, 7 };
static const uint32_t tok_0[] = { 3, 0, 9, 1 }, tok_2[] = { 2, 6, 0, 1, 12, 0, 4 };
static const uint32_t *const tokens[] = { tok_0, NULL, tok_2 };

static bool pos_is(struct stream_pos p, const struct ref_pos *r)
{
	return p.epoch == r->epoch && p.window == r->window && p.index == r->index && p.offset == r->offset;
}

static void check_plans(bool shuffle, uint32_t rank, uint32_t world, bool bos, bool eos, uint32_t B, uint32_t L)
{
	struct order_params p = { .seed = 99, .shuffle = shuffle, .window = 2, .n_shards = 3, .shard_docs = shard_docs };
	char what[128];
	snprintf(what, sizeof(what), "shuffle %d rank %u/%u bos %d eos %d B %u L %u", shuffle, rank, world, bos, eos, B,
		 L);
	const size_t n_batches = 12, BL = (size_t)B * L;
	struct ref_pos *ref;
	size_t n = ref_stream(p.seed, shuffle, p.window, p.n_shards, shard_docs, tokens, rank, world, bos, eos,
			      n_batches * BL + 1, 1000, &ref);
	REQUIRE(n == n_batches * BL + 1, "%s: reference stream too short (%zu)", what, n);

	struct stream s, r;
	int e = stream_init(&s, &p, tokens, rank, world, bos, eos, NULL);
	CHECK(e == 0, "%s: stream_init returned %d", what, e);
	if (e < 0)
		goto out;
	struct batch_plan plan = { 0 }, again = { 0 };
	for (size_t b = 0; b < n_batches; b++) {
		e = pack_plan(&s, B, L, b, &plan);
		CHECK(e == 0, "%s: pack_plan of batch %zu returned %d", what, b, e);
		if (e < 0)
			break;
		CHECK(plan.batch_index == b && plan.batch_size == B && plan.seq_len == L,
		      "%s batch %zu: plan header says batch %" PRIu64 " B %u L %u", what, b, plan.batch_index,
		      plan.batch_size, plan.seq_len);
		CHECK(plan.epoch == ref[b * BL].epoch, "%s batch %zu: epoch %" PRIu64 ", expected %" PRIu64, what, b,
		      plan.epoch, ref[b * BL].epoch);
		CHECK(plan.n_pieces >= 2, "%s batch %zu: %zu pieces", what, b, plan.n_pieces);
		if (plan.n_pieces < 2)
			break;

		/* The pieces are positions b*BL .. b*BL + BL - 1, then the look-ahead b*BL + BL. */
		size_t at = b * BL;
		bool same = true;
		for (size_t i = 0; i + 1 < plan.n_pieces && same; i++) {
			const struct stream_piece *pc = &plan.pieces[i];
			CHECK(pc->count > 0, "%s batch %zu: empty piece %zu", what, b, i);
			for (uint64_t j = 0; j < pc->count && same; j++, at++) {
				same = at < (b + 1) * BL && pc->doc == ORDER_DOC(ref[at].shard, ref[at].doc) &&
				       pc->offset + j == ref[at].offset && pc->length == ref[at].length;
				CHECK(same, "%s batch %zu: piece %zu position %" PRIu64 " is not stream position %zu", what,
				      b, i, j, at);
			}
		}
		CHECK(!same || at == (b + 1) * BL, "%s batch %zu: pieces cover %zu positions, expected %zu", what, b,
		      at - b * BL, BL);
		const struct stream_piece *la = &plan.pieces[plan.n_pieces - 1];
		CHECK(la->count == 1, "%s batch %zu: look-ahead piece has %" PRIu64 " positions", what, b, la->count);
		CHECK(la->doc == ORDER_DOC(ref[(b + 1) * BL].shard, ref[(b + 1) * BL].doc) &&
		      la->offset == ref[(b + 1) * BL].offset,
		      "%s batch %zu: look-ahead is not stream position %zu", what, b, (b + 1) * BL);

		struct stream_pos told = stream_tell(&s);
		bool told_same = told.epoch == plan.next.epoch && told.window == plan.next.window &&
				 told.index == plan.next.index && told.offset == plan.next.offset;
		CHECK(told_same && pos_is(plan.next, &ref[(b + 1) * BL]),
		      "%s batch %zu: plan.next (epoch %" PRIu64 " window %u index %" PRIu64 " offset %" PRIu64
		      ") is not stream_tell after planning / the next stream position",
		      what, b, plan.next.epoch, plan.next.window, plan.next.index, plan.next.offset);

		/* Resuming at plan.next plans the same next batch as going on. */
		e = stream_init(&r, &p, tokens, rank, world, bos, eos, &plan.next);
		CHECK(e == 0, "%s batch %zu: stream_init(plan.next) returned %d", what, b, e);
		if (e == 0) {
			if (b + 1 < n_batches) {
				int e2 = pack_plan(&r, B, L, b + 1, &again);
				CHECK(e2 == 0 && again.n_pieces > 0 && again.pieces[0].doc == la->doc &&
				      again.pieces[0].offset == la->offset,
				      "%s batch %zu: the resumed stream's next batch does not start at the look-ahead", what,
				      b);
				CHECK(e2 < 0 || pos_is(again.next, &ref[(b + 2) * BL]),
				      "%s batch %zu: the resumed stream's plan ends elsewhere", what, b + 1);
			}
			stream_clear(&r);
		}
	}
	pack_plan_clear(&plan);
	pack_plan_clear(&again);
	stream_clear(&s);
out:
	free(ref);
}

static void test_plan(void)
{
	static const uint32_t geo[][2] = { { 1, 1 }, { 2, 5 }, { 3, 7 }, { 4, 16 } };
	for (int shuffle = 0; shuffle <= 1; shuffle++)
		for (uint32_t world = 1; world <= 3; world++)
			for (uint32_t rank = 0; rank < world; rank++)
				for (int be = 0; be < 4; be++)
					for (size_t g = 0; g < sizeof(geo) / sizeof(geo[0]); g++)
						check_plans(shuffle, rank, world, be & 1, be & 2, geo[g][0], geo[g][1]);
}

int main(void)
{
	test_fill();
	test_plan();
	return unit_exit("test-pack");
}
