/* SPDX-License-Identifier: MIT */
/*
 * Packing modes "bestfit" and "pad" (daemon/pack/bestfit.h, pad.h;
 * docs/sample-order.md sections 11 to 13).
 *
 * What a trainer relies on: bestfit never cuts a document that fits a row,
 * rows never exceed L, every token of every document reaches the rank exactly
 * once per epoch (through the packer, batches, buffers and epochs included),
 * padding is masked and a segment of its own, the counters add up, pad mode's
 * efficiency is the analytic value, and resuming from (buffer start, row)
 * gives the same batches as never stopping.
 *
 * With --driver, reads cases from stdin and prints the batches (see
 * driver()); tests/unit/test-packing-ref.py compares them with the Python
 * reference on randomized cases.
 */
#include "daemon/order/mix.h"
#include "daemon/order/order.h"
#include "daemon/pack/bestfit.h"
#include "daemon/pack/pad.h"
#include "order-ref.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"
#include "unit.h"

#define IGN FEED_LABEL_IGNORE

/* ---- a document source for the tests: cyclic lists of lengths, optionally mixed ---- */

struct cyc {
	uint32_t n_sources;
	const uint64_t *lens[MIX_MAX_SOURCES];
	size_t n_lens[MIX_MAX_SOURCES];
	uint64_t taken[MIX_MAX_SOURCES]; /* documents taken from each source */
	struct mix mix;
	uint64_t k;      /* documents taken in all */
	uint64_t marked; /* k at the last mark */
	unsigned marks;
};

/* Token at position o of document idx of source i: shared with test-packing-ref.py. */
static int32_t cyc_token(uint32_t i, uint64_t idx, uint64_t o)
{
	return (int32_t)(((i * UINT64_C(131071) + idx) * 8191 + o) % 999983);
}

static int cyc_next(void *userdata, struct pack_doc *ret)
{
	struct cyc *c = userdata;
	uint32_t i = c->n_sources > 1 ? mix_source(&c->mix, c->k) : 0;
	uint64_t idx = c->taken[i]++;
	c->k++;
	*ret = (struct pack_doc){
		.id = (uint64_t)i << 48 | idx,
		.length = c->lens[i][idx % c->n_lens[i]],
		.epoch = idx / c->n_lens[i],
		.source = i,
	};
	return 0;
}

static void cyc_mark(void *userdata)
{
	struct cyc *c = userdata;
	c->marked = c->k;
	c->marks++;
}

/* Puts a fresh source at document k of the mixed stream (what a cursor restores). */
static void cyc_seek(struct cyc *c, uint64_t k)
{
	memset(c->taken, 0, sizeof(c->taken));
	for (uint64_t j = 0; j < k; j++)
		c->taken[c->n_sources > 1 ? mix_source(&c->mix, j) : 0]++;
	c->k = k;
}

/* Reads each piece's tokens into input_ids, as the worker does. */
static void read_pieces(const struct pad_batch *b, int32_t *input_ids)
{
	for (size_t j = 0; j < b->n_pieces; j++) {
		const struct row_piece *p = &b->pieces[j];
		uint64_t idx = p->doc.id & ((UINT64_C(1) << 48) - 1);
		for (uint32_t t = 0; t < p->count; t++)
			input_ids[(size_t)p->row * b->seq_len + p->column + t] = cyc_token(p->doc.source, idx, p->offset + t);
	}
}

/* ---- bestfit_pack ---- */

static void test_pack_example(void)
{
	/*
	 * L = 8; lengths 5 3 9 2 4 1. Items (length, buffer order): 5, 3, 8 and 1
	 * (document 2 cut at 8), 2, 4, 1. Decreasing: 8 | 5 | 4 | 3 | 2 | 1 (doc 2) | 1 (doc 5).
	 * 8 opens row 0 (full); 5 opens row 1 (room 3); 4 does not fit 3: row 2
	 * (room 4); 3 fits row 1 exactly (best fit beats row 2's 4); 2 -> row 2
	 * (room 2); 1 -> row 2 (room 1); 1 -> row 2 (full).
	 */
	static const uint64_t lens[] = { 5, 3, 9, 2, 4, 1 };
	struct bestfit_packing p = { 0 };
	/* Scaled by 25000 (L = 200000) the packing is the same; it takes the comparison sort, not the counting sort. */
	for (uint64_t scale = 1; scale <= 25000; scale += 24999) {
		uint64_t scaled[6];
		for (int i = 0; i < 6; i++)
			scaled[i] = lens[i] * scale;
		CHECK_INT(bestfit_pack(scaled, 6, (uint32_t)(8 * scale), &p), 0);
		CHECK_INT(p.n_rows, 3);
		CHECK_INT(p.n_items, 7);
		static const struct bestfit_item want[] = {
			{ .doc = 2, .length = 8, .offset = 0 },
			{ .doc = 0, .length = 5, .offset = 0 }, { .doc = 1, .length = 3, .offset = 0 },
			{ .doc = 4, .length = 4, .offset = 0 }, { .doc = 3, .length = 2, .offset = 0 },
			{ .doc = 2, .length = 1, .offset = 8 }, { .doc = 5, .length = 1, .offset = 0 },
		};
		static const uint32_t first[] = { 0, 1, 3 }, count[] = { 1, 2, 4 }, used[] = { 8, 8, 8 };
		for (size_t r = 0; r < 3 && r < p.n_rows; r++) {
			CHECK_INT(p.rows[r].first, first[r]);
			CHECK_INT(p.rows[r].n_items, count[r]);
			CHECK_INT(p.rows[r].used, used[r] * scale);
	}
	for (size_t i = 0; i < 7 && i < p.n_items; i++)
		CHECK(p.items[i].doc == want[i].doc && p.items[i].length == want[i].length * scale &&
			      p.items[i].offset == want[i].offset * scale,
		      "scale %" PRIu64 ": item %zu: doc %u length %u offset %" PRIu64 ", expected doc %u length %u offset %" PRIu64,
		      scale, i, p.items[i].doc, p.items[i].length, p.items[i].offset, want[i].doc, want[i].length, want[i].offset);
	}

	/* Ties: equal rooms go to the oldest row; equal lengths keep buffer order. */
	static const uint64_t ties[] = { 6, 6, 2, 2 };
	CHECK_INT(bestfit_pack(ties, 4, 8, &p), 0);
	CHECK_INT(p.n_rows, 2);
	if (p.n_rows == 2) {
		CHECK(p.items[0].doc == 0 && p.items[1].doc == 2, "row 0 holds docs %u, %u; expected 0 then 2",
		      p.items[0].doc, p.items[1].doc);
		CHECK(p.items[2].doc == 1 && p.items[3].doc == 3, "row 1 holds docs %u, %u; expected 1 then 3",
		      p.items[2].doc, p.items[3].doc);
	}

	static const uint64_t bad[] = { 3, 0 };
	CHECK_INT(bestfit_pack(bad, 2, 8, &p), -EINVAL);
	CHECK_INT(bestfit_pack(lens, 6, 0, &p), -EINVAL);
	bestfit_packing_clear(&p);
}

static uint64_t rnd(uint64_t *s)
{
	*s += UINT64_C(0x9E3779B97F4A7C15);
	return order_mix(*s);
}

/* Random buffers: no document that fits is cut, rows stay within L, every position is placed once. */
static void test_pack_invariants(void)
{
	uint64_t seed = 7;
	for (int round = 0; round < 300; round++) {
		uint32_t L = 1 + (uint32_t)(rnd(&seed) % 300);
		size_t n = 1 + (size_t)(rnd(&seed) % 200);
		uint64_t lens[200];
		for (size_t i = 0; i < n; i++) {
			/* Mostly short, some longer than L (cut into chunks), some exactly L. */
			uint64_t x = rnd(&seed) % 10;
			lens[i] = x < 7 ? 1 + rnd(&seed) % L : x < 9 ? 1 + rnd(&seed) % (3 * (uint64_t)L) : L;
		}
		struct bestfit_packing p = { 0 };
		int r = bestfit_pack(lens, n, L, &p);
		CHECK_INT(r, 0);
		if (r < 0)
			continue;
		uint64_t covered[200] = { 0 }, sum = 0;
		size_t pieces[200] = { 0 };
		for (size_t row = 0; row < p.n_rows; row++) {
			const struct bestfit_row *rw = &p.rows[row];
			uint64_t used = 0;
			CHECK(rw->n_items > 0, "round %d: row %zu is empty", round, row);
			for (uint32_t i = 0; i < rw->n_items; i++) {
				const struct bestfit_item *it = &p.items[rw->first + i];
				used += it->length;
				CHECK(it->offset % L == 0, "round %d: chunk offset %" PRIu64 " not a multiple of L %u", round,
				      it->offset, L);
				CHECK(it->offset + it->length <= lens[it->doc], "round %d: item past its document's end", round);
				CHECK(it->length == MIN((uint64_t)L, lens[it->doc] - it->offset),
				      "round %d: doc %u chunk at %" PRIu64 " has %u positions", round, it->doc, it->offset,
				      it->length);
				covered[it->doc] += it->length;
				pieces[it->doc]++;
			}
			CHECK(used <= L, "round %d: row %zu holds %" PRIu64 " positions, more than L = %u", round, row, used, L);
			CHECK_INT(rw->used, used);
			sum += used;
		}
		for (size_t d = 0; d < n; d++) {
			CHECK(covered[d] == lens[d], "round %d: doc %zu: %" PRIu64 " of %" PRIu64 " positions placed", round,
			      d, covered[d], lens[d]);
			uint64_t chunks = (lens[d] + L - 1) / L;
			CHECK(pieces[d] == chunks, "round %d: doc %zu (length %" PRIu64 ", L %u) in %zu pieces, expected %" PRIu64,
			      round, d, lens[d], L, pieces[d], chunks);
		}
		/* Every row but one is more than half full: two half-empty rows would have been merged. */
		size_t half = 0;
		for (size_t row = 0; row < p.n_rows; row++)
			half += 2 * (uint64_t)p.rows[row].used <= L;
		CHECK(half <= 1, "round %d: %zu rows at most half full", round, half);
		(void)sum;
		bestfit_packing_clear(&p);
	}
}

/* ---- padded rows ---- */

static void test_fill(void)
{
	/*
	 * B = 2, L = 6, pad 0. Row 0: document A (offset 0, 3 positions) then B's
	 * first chunk is not here; row 0 = A(3) + C(2) + padding(1).
	 * Row 1: a chunk of D starting at offset 6 (not a document start), 6 positions.
	 */
	struct pad_batch b = { 0 };
	pad_batch_reset(&b, 2, 6, 5);
	struct pack_doc A = { .id = 1, .length = 3, .epoch = 4 }, C = { .id = 2, .length = 2 }, D = { .id = 3, .length = 14 };
	CHECK_INT(pad_batch_push(&b, &A, 0, 3, 0), 0);
	CHECK_INT(pad_batch_push(&b, &C, 0, 2, 0), 0);
	CHECK_INT(pad_batch_push(&b, &C, 0, 2, 0), -EINVAL); /* would overflow the row */
	CHECK_INT(pad_batch_push(&b, &D, 6, 6, 2), -EINVAL); /* skips row 1 */
	CHECK_INT(pad_batch_push(&b, &D, 6, 6, 1), 0);
	CHECK_INT(b.counts.tokens, 11);
	CHECK_INT(b.counts.docs, 2);
	CHECK_INT(b.counts.positions, 12);
	CHECK_INT(b.epoch, 4);

	int32_t ids[12] = { 10, 11, 12, 20, 21, -5, /**/ 36, 37, 38, 39, 40, 41 };
	int32_t labels[12], pos[12], cu[13];
	for (int i = 0; i < 13; i++)
		cu[i] = -7;
	uint32_t docs = 99;
	uint32_t n_cu = pad_fill(&b, 0, ids, labels, pos, cu, &docs);
	static const int32_t want_ids[] = { 10, 11, 12, 20, 21, 0, 36, 37, 38, 39, 40, 41 };
	static const int32_t want_labels[] = { 11, 12, IGN, 21, IGN, IGN, 37, 38, 39, 40, 41, IGN };
	static const int32_t want_pos[] = { 0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5 };
	static const int32_t want_cu[] = { 0, 3, 5, 6, 12 };
	for (int i = 0; i < 12; i++) {
		CHECK(ids[i] == want_ids[i], "input_ids[%d] = %d, expected %d", i, ids[i], want_ids[i]);
		CHECK(labels[i] == want_labels[i], "labels[%d] = %d, expected %d", i, labels[i], want_labels[i]);
		CHECK(pos[i] == want_pos[i], "position_ids[%d] = %d, expected %d", i, pos[i], want_pos[i]);
	}
	CHECK_INT(n_cu, 5);
	for (uint32_t i = 0; i < 5 && i < n_cu; i++)
		CHECK(cu[i] == want_cu[i], "cu_seqlens[%u] = %d, expected %d", i, cu[i], want_cu[i]);
	CHECK(cu[n_cu] == -7, "pad_fill wrote past its cu_seqlens count");
	CHECK_INT(docs, 2); /* A and C; D's chunk starts at offset 6 */
	pad_batch_clear(&b);
}

/* pad mode on lengths 1 .. 2L, each once: efficiency (3L + 1) / 4L, truncated L(L+1)/2. */
static void test_pad_analytic(void)
{
	enum { L = 64, B = 16 };
	uint64_t lens[2 * L];
	for (int i = 0; i < 2 * L; i++)
		lens[i] = (uint64_t)i + 1;
	struct cyc c = { .n_sources = 1, .lens = { lens }, .n_lens = { 2 * L } };
	struct pack_source src = { .next = cyc_next, .userdata = &c };
	struct pad_batch b = { 0 };
	struct pack_counters sum = { 0 };
	int32_t ids[B * L], labels[B * L], pos[B * L], cu[B * L + 1];
	for (uint64_t batch = 0; batch < 2 * L / B; batch++) {
		CHECK_INT(pad_plan(&src, B, L, batch, &b), 0);
		CHECK_INT(b.n_pieces, B);
		read_pieces(&b, ids);
		uint32_t docs;
		uint32_t n_cu = pad_fill(&b, -1, ids, labels, pos, cu, &docs);
		CHECK_INT(docs, B);
		/* Every row: the document's first min(C, L) positions, then padding. */
		for (uint32_t r = 0; r < B; r++) {
			uint64_t C = lens[batch * B + r], keep = MIN(C, (uint64_t)L);
			for (uint32_t t = 0; t < L; t++) {
				int32_t want = t < keep ? cyc_token(0, batch * B + r, t) : -1;
				CHECK(ids[r * L + t] == want, "batch %" PRIu64 " row %u col %u: %d, expected %d", batch, r, t,
				      ids[r * L + t], want);
			}
		}
		CHECK(n_cu >= B + 1 && cu[n_cu - 1] == B * L, "cu_seqlens ends at %d", cu[n_cu - 1]);
		pack_counters_add(&sum, &b.counts);
	}
	CHECK_INT(sum.positions, 2 * L * L);
	CHECK_INT(sum.tokens, L * (3 * L + 1) / 2);
	CHECK_INT(sum.truncated, L * (L + 1) / 2);
	CHECK_INT(sum.docs, 2 * L);
	CHECK_INT(sum.cut_docs, 0);
	double eff = pack_counters_efficiency(&sum), want = (3.0 * L + 1) / (4.0 * L);
	CHECK(eff == want, "pad efficiency %.9f, expected (3L+1)/4L = %.9f", eff, want);
	pad_batch_clear(&b);
}

/* ---- bestfit through the packer ---- */

/*
 * A rank's documents straight from the contract (order-ref.h), token
 * (s, d, o) = s << 20 | d << 8 | o (fits: o < 256), so every position of every
 * document is recognisable in a batch.
 */
struct rank_src {
	uint64_t seed;
	uint32_t n_shards, world, rank;
	const uint32_t *shard_docs;
	const uint32_t *const *doc_tokens;
	struct ref_epoch ep;
	uint64_t epoch;
	size_t k;
};

static int rank_next(void *userdata, struct pack_doc *ret)
{
	struct rank_src *s = userdata;
	for (;;) {
		if (s->k >= s->ep.n_docs) {
			ref_epoch_free(&s->ep);
			ref_epoch_build(s->seed, true, 2, s->n_shards, s->shard_docs, ++s->epoch, &s->ep);
			s->k = s->rank;
			continue;
		}
		struct ref_doc d = s->ep.docs[s->k];
		s->k += s->world;
		uint32_t t = s->doc_tokens[d.shard][d.doc];
		if (t == 0)
			continue;
		*ret = (struct pack_doc){ .id = ORDER_DOC(d.shard, d.doc), .length = t, .epoch = s->epoch };
		return 0;
	}
}

static void test_every_token_once(void)
{
	/* 5 shards, lengths 0 .. 200 (some empty, some longer than L = 64). */
	enum { S = 5, D = 40, L = 64, B = 4, R = 3 };
	static uint32_t tokens[S][D];
	const uint32_t *rows[S];
	uint32_t docs[S];
	uint64_t seed = 99;
	for (int s = 0; s < S; s++) {
		docs[s] = D - (uint32_t)s * 3;
		for (uint32_t d = 0; d < docs[s]; d++)
			tokens[s][d] = (uint32_t)(rnd(&seed) % 10 == 0 ? 0 : 1 + rnd(&seed) % 200);
		rows[s] = tokens[s];
	}
	for (uint32_t rank = 0; rank < R; rank++) {
		struct rank_src rs = { .seed = 42, .n_shards = S, .world = R, .rank = rank, .shard_docs = docs, .doc_tokens = rows, .k = rank };
		ref_epoch_build(rs.seed, true, 2, S, docs, 0, &rs.ep);
		struct pack_source src = { .next = rank_next, .userdata = &rs };
		struct bestfit bf;
		CHECK_INT(bestfit_init(&bf, L, 300), 0);
		struct pad_batch b = { 0 };
		/* seen[e][s][d][o]: times position o of document (s, d) of epoch e arrived. */
		static uint8_t seen[2][S][D][200];
		memset(seen, 0, sizeof(seen));
		int32_t ids[B * L], labels[B * L], pos[B * L], cu[B * L + 1];
		for (uint64_t batch = 0;; batch++) {
			/* Stop once the current buffer starts in epoch 2: epochs 0 and 1 have been handed out. */
			if (bestfit_rows_left(&bf) == 0 && rs.epoch >= 2)
				break;
			int r = bestfit_plan(&bf, &src, B, batch, &b);
			CHECK_INT(r, 0);
			if (r < 0 || batch > 10000)
				break;
			for (size_t j = 0; j < b.n_pieces; j++) {
				const struct row_piece *p = &b.pieces[j];
				CHECK(p->count <= L && p->column + p->count <= L, "piece past the row end");
				/* No cut unless the document is longer than L, and then at multiples of L. */
				CHECK(p->doc.length > L ? p->offset % L == 0 : p->offset == 0 && p->count == p->doc.length,
				      "document of %" PRIu64 " positions cut at %" PRIu64 "+%u", p->doc.length, p->offset, p->count);
				for (uint32_t t = 0; t < p->count; t++) {
					ids[(size_t)p->row * L + p->column + t] = (int32_t)(ORDER_DOC_SHARD(p->doc.id) << 20 |
						ORDER_DOC_INDEX(p->doc.id) << 8 | (uint32_t)(p->offset + t));
					if (p->doc.epoch < 2)
						seen[p->doc.epoch][ORDER_DOC_SHARD(p->doc.id)][ORDER_DOC_INDEX(p->doc.id)][p->offset + t]++;
				}
			}
			uint32_t nd;
			uint32_t n_cu = pad_fill(&b, -1, ids, labels, pos, cu, &nd);
			/* Labels never cross a segment: each label is its position's next token in the same document. */
			for (uint32_t i = 0; i + 1 < n_cu; i++)
				for (int32_t q = cu[i]; q < cu[i + 1]; q++) {
					int32_t want = q + 1 < cu[i + 1] && ids[q] >= 0 ? ids[q + 1] : IGN;
					CHECK(labels[q] == want, "batch %" PRIu64 " position %d: label %d, expected %d", batch, q,
					      labels[q], want);
					CHECK(pos[q] == q - cu[i], "position_ids[%d] = %d, expected %d", q, pos[q], q - cu[i]);
				}
		}
		for (int e = 0; e < 2; e++) {
			/* The rank's documents of epoch e, from the contract. */
			struct ref_epoch ep;
			ref_epoch_build(42, true, 2, S, docs, (uint64_t)e, &ep);
			uint8_t owned[S][D] = { { 0 } };
			for (size_t k = rank; k < ep.n_docs; k += R)
				owned[ep.docs[k].shard][ep.docs[k].doc] = 1;
			ref_epoch_free(&ep);
			for (int s = 0; s < S; s++)
				for (uint32_t d = 0; d < docs[s]; d++)
					for (uint32_t o = 0; o < 200; o++) {
						unsigned want = owned[s][d] && o < tokens[s][d];
						CHECK(seen[e][s][d][o] == want,
						      "rank %u epoch %d doc (%d, %u) position %u arrived %u times, expected %u", rank,
						      e, s, d, o, seen[e][s][d][o], want);
					}
		}
		pad_batch_clear(&b);
		bestfit_clear(&bf);
		ref_epoch_free(&rs.ep);
	}
}

/* Resuming from (buffer start, row) gives exactly the batches of a stream that never stopped. */
static void test_resume(void)
{
	enum { L = 32, B = 3, N = 40 };
	static const uint64_t a[] = { 5, 40, 17, 3, 32, 9, 70, 1, 12, 28, 6 };
	struct cyc c = { .n_sources = 1, .lens = { a }, .n_lens = { ARRAY_SIZE(a) } };
	struct pack_source src = { .next = cyc_next, .mark = cyc_mark, .userdata = &c };
	struct bestfit bf;
	CHECK_INT(bestfit_init(&bf, L, 100), 0);
	struct pad_batch b = { 0 };
	static int32_t want[N][B * L];
	uint64_t cur_k[N], cur_row[N];
	for (int i = 0; i < N; i++) {
		CHECK_INT(bestfit_plan(&bf, &src, B, (uint64_t)i, &b), 0);
		read_pieces(&b, want[i]);
		int32_t labels[B * L], pos[B * L], cu[B * L + 1];
		uint32_t nd;
		pad_fill(&b, -3, want[i], labels, pos, cu, &nd);
		/* The cursor after batch i (section 12.5). */
		cur_k[i] = bestfit_rows_left(&bf) ? c.marked : c.k;
		cur_row[i] = bestfit_rows_left(&bf) ? bf.row : 0;
	}
	CHECK(bf.buffers > 5, "only %" PRIu64 " buffers: the test does not cross buffers", bf.buffers);
	bestfit_clear(&bf);

	for (int i = 0; i + 1 < N; i++) {
		struct cyc c2 = c;
		cyc_seek(&c2, cur_k[i]);
		struct pack_source src2 = { .next = cyc_next, .mark = cyc_mark, .userdata = &c2 };
		struct bestfit bf2;
		CHECK_INT(bestfit_init(&bf2, L, 100), 0);
		CHECK_INT(bestfit_resume(&bf2, &src2, cur_row[i]), 0);
		for (int j = i + 1; j < N && j < i + 4; j++) {
			int32_t ids[B * L], labels[B * L], pos[B * L], cu[B * L + 1];
			uint32_t nd;
			CHECK_INT(bestfit_plan(&bf2, &src2, B, (uint64_t)j, &b), 0);
			read_pieces(&b, ids);
			pad_fill(&b, -3, ids, labels, pos, cu, &nd);
			CHECK(memcmp(ids, want[j], sizeof(ids)) == 0, "resumed after batch %d: batch %d differs", i, j);
		}
		bestfit_clear(&bf2);
	}

	/* A row the buffer does not have is refused. */
	struct cyc c3 = c;
	cyc_seek(&c3, 0);
	struct pack_source src3 = { .next = cyc_next, .userdata = &c3 };
	CHECK_INT(bestfit_init(&bf, L, 100), 0);
	CHECK_INT(bestfit_resume(&bf, &src3, 1000), -EINVAL);
	bestfit_clear(&bf);
	CHECK_INT(bestfit_init(&bf, 0, 100), -EINVAL);
	CHECK_INT(bestfit_init(&bf, L, 0), -EINVAL);
	pad_batch_clear(&b);
}

/* bestfit packs far tighter than pad on short documents, and truncates nothing. */
static void test_efficiency_vs_pad(void)
{
	enum { L = 512, B = 8 };
	uint64_t lens[997];
	uint64_t seed = 3;
	for (size_t i = 0; i < ARRAY_SIZE(lens); i++)
		lens[i] = 1 + rnd(&seed) % 300 + (rnd(&seed) % 20 == 0 ? 600 : 0);
	struct cyc c = { .n_sources = 1, .lens = { lens }, .n_lens = { ARRAY_SIZE(lens) } };
	struct pack_source src = { .next = cyc_next, .userdata = &c };
	struct bestfit bf;
	CHECK_INT(bestfit_init(&bf, L, 64 * L), 0);
	struct pad_batch b = { 0 };
	struct pack_counters fit = { 0 }, pad = { 0 };
	for (int i = 0; i < 100; i++) {
		CHECK_INT(bestfit_plan(&bf, &src, B, (uint64_t)i, &b), 0);
		pack_counters_add(&fit, &b.counts);
	}
	struct cyc c2 = { .n_sources = 1, .lens = { lens }, .n_lens = { ARRAY_SIZE(lens) } };
	src.userdata = &c2;
	for (int i = 0; i < 100; i++) {
		CHECK_INT(pad_plan(&src, B, L, (uint64_t)i, &b), 0);
		pack_counters_add(&pad, &b.counts);
	}
	double e_fit = pack_counters_efficiency(&fit), e_pad = pack_counters_efficiency(&pad);
	CHECK(e_fit > 0.95, "bestfit efficiency %.3f on lengths 1..300 in rows of 512 (expected > 0.95)", e_fit);
	CHECK(e_pad < 0.45, "pad efficiency %.3f (expected about 0.32)", e_pad);
	CHECK_INT(fit.truncated, 0);
	CHECK(pad.truncated > 0, "pad truncated nothing, though 1 in 20 documents is longer than L");
	CHECK(fit.cut_docs > 0 && fit.cut_docs < fit.docs / 10, "bestfit cut %" PRIu64 " of %" PRIu64 " documents",
	      fit.cut_docs, fit.docs);
	pad_batch_clear(&b);
	bestfit_clear(&bf);
}

/* ---- driver for tests/unit/test-packing-ref.py ---- */

static void print_array(const char *name, const int32_t *a, size_t n)
{
	printf("%s", name);
	for (size_t i = 0; i < n; i++)
		printf(" %d", a[i]);
	putchar('\n');
}

/*
 * Input, one case per line:
 *   MODE L B BUFFER PAD SEED N_BATCHES RESUME_AT N_SOURCES (UNITS N_LENS LEN...)...
 * MODE is bestfit or pad. Documents come from the cyclic sources (mixed by
 * mix_source when there are several). For bestfit, batches from RESUME_AT on
 * come from a fresh packer resumed at the cursor after batch RESUME_AT - 1.
 * Output per batch: "batch b epoch e tokens t truncated x docs d cut c", then
 * lines input_ids, labels, position_ids, cu_seqlens; "end" after each case.
 */
static int driver(void)
{
	char mode[16];
	while (scanf("%15s", mode) == 1) {
		uint32_t L, B, n_src;
		uint64_t buffer, seed, n_batches, resume_at;
		int32_t pad;
		if (scanf("%u %u %" SCNu64 " %d %" SCNu64 " %" SCNu64 " %" SCNu64 " %u", &L, &B, &buffer, &pad, &seed,
			  &n_batches, &resume_at, &n_src) != 8 || n_src < 1 || n_src > MIX_MAX_SOURCES)
			return 2;
		struct cyc c = { .n_sources = n_src };
		uint64_t units[MIX_MAX_SOURCES];
		uint64_t *lens[MIX_MAX_SOURCES] = { 0 };
		for (uint32_t i = 0; i < n_src; i++) {
			size_t n;
			if (scanf("%" SCNu64 " %zu", &units[i], &n) != 2 || n == 0)
				return 2;
			lens[i] = malloc(n * sizeof(uint64_t));
			for (size_t j = 0; j < n; j++)
				if (scanf("%" SCNu64, &lens[i][j]) != 1)
					return 2;
			c.lens[i] = lens[i];
			c.n_lens[i] = n;
		}
		if (mix_init(seed, units, n_src, &c.mix) < 0)
			return 2;
		struct pack_source src = { .next = cyc_next, .mark = cyc_mark, .userdata = &c };
		struct bestfit bf;
		bool fit = strcmp(mode, "bestfit") == 0;
		if (fit && bestfit_init(&bf, L, buffer) < 0)
			return 2;
		struct pad_batch b = { 0 };
		size_t n = (size_t)B * L;
		int32_t *ids = malloc(n * 4), *labels = malloc(n * 4), *pos = malloc(n * 4), *cu = malloc((n + 1) * 4);
		for (uint64_t i = 0; i < n_batches; i++) {
			if (fit && i == resume_at && i > 0) {
				/* The cursor after batch i - 1, then a fresh packer and source from it. */
				uint64_t k = bestfit_rows_left(&bf) ? c.marked : c.k, row = bestfit_rows_left(&bf) ? bf.row : 0;
				bestfit_clear(&bf);
				cyc_seek(&c, k);
				if (bestfit_init(&bf, L, buffer) < 0 || bestfit_resume(&bf, &src, row) < 0)
					return 3;
			}
			int r = fit ? bestfit_plan(&bf, &src, B, i, &b) : pad_plan(&src, B, L, i, &b);
			if (r < 0)
				return 3;
			read_pieces(&b, ids);
			uint32_t docs;
			uint32_t n_cu = pad_fill(&b, pad, ids, labels, pos, cu, &docs);
			printf("batch %" PRIu64 " epoch %" PRIu64 " tokens %" PRIu64 " truncated %" PRIu64 " docs %u cut %" PRIu64
			       "\n",
			       b.batch_index, b.epoch, b.counts.tokens, b.counts.truncated, docs, b.counts.cut_docs);
			print_array("input_ids", ids, n);
			print_array("labels", labels, n);
			print_array("position_ids", pos, n);
			print_array("cu_seqlens", cu, n_cu);
		}
		puts("end");
		fflush(stdout);
		free(ids);
		free(labels);
		free(pos);
		free(cu);
		for (uint32_t i = 0; i < n_src; i++)
			free(lens[i]);
		if (fit)
			bestfit_clear(&bf);
		pad_batch_clear(&b);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--driver") == 0)
		return driver();
	test_pack_example();
	test_pack_invariants();
	test_fill();
	test_pad_analytic();
	test_every_token_once();
	test_resume();
	test_efficiency_vs_pad();
	return unit_exit("test-bestfit");
}
