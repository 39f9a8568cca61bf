/* SPDX-License-Identifier: MIT */
/*
 * The sample-order contract (daemon/order/order.h, stream.h) against the
 * independent reference in order-ref.h: the same epochs, windows and
 * rank assignment for many seeds and shapes; the same token stream position
 * by position; and resuming from any stream_tell() lands exactly where the
 * stream was. A trainer relies on all of this for reproducible data order
 * across restarts and world sizes.
 */
#include "daemon/order/order.h"
#include "daemon/order/stream.h"
#include "order-ref.h"
#include "unit.h"

#define N_EPOCHS 4

static const uint64_t seeds[] = { 0, 1, UINT64_C(0x243F6A8885A308D3), UINT64_MAX };
static const uint32_t windows[] = { 1, 2, 3, 7 };
static const uint32_t worlds[] = { 1, 2, 3, 5 };

/* Shard shapes: uneven, with shards of 0 documents. */
static const uint32_t docs_s1[] = { 9 };
static const uint32_t docs_s3[] = { 4, 0, 7 };
static const uint32_t docs_s5[] = { 3, 0, 6, 1, 5 };
static const struct {
	uint32_t n;
	const uint32_t *docs;
} shapes[] = { { 1, docs_s1 }, { 3, docs_s3 }, { 5, docs_s5 } };

/*
 * Tokens per document, empty ones included. Shard s, document d. Every rank of
 * every world above gets at least one non-empty document in each epoch
 * except where a test wants otherwise (checked by the reference run).
 */
static const uint32_t tok_s1[] = { 3, 0, 1, 4, 2, 0, 5, 1, 2 };
static const uint32_t tok_s3_0[] = { 2, 0, 3, 1 }, tok_s3_2[] = { 1, 4, 0, 2, 3, 0, 1 };
static const uint32_t tok_s5_0[] = { 2, 0, 1 }, tok_s5_2[] = { 0, 3, 1, 2, 0, 4 }, tok_s5_3[] = { 2 },
		      tok_s5_4[] = { 1, 1, 0, 3, 2 };
static const uint32_t *const toks_s1[] = { tok_s1 };
static const uint32_t *const toks_s3[] = { tok_s3_0, NULL, tok_s3_2 };
static const uint32_t *const toks_s5[] = { tok_s5_0, NULL, tok_s5_2, tok_s5_3, tok_s5_4 };
static const uint32_t *const *const shape_tokens[] = { toks_s1, toks_s3, toks_s5 };

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void test_mix(void)
{
	/*
	 * splitmix64 (Vigna, https://prng.di.unimi.it/splitmix64.c) from state 0
	 * starts 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f: the
	 * published seed-0 outputs that also seed xoshiro. RNG(0) is exactly that
	 * generator, so the reference formula must reproduce them.
	 */
	static const uint64_t want[] = { UINT64_C(0xe220a8397b1dcdaf), UINT64_C(0x6e789e6aa1b965f4),
					 UINT64_C(0x06c45d188009454f) };
	struct ref_rng ref = { .key = 0 };
	struct order_rng rng = order_rng_init(0);
	for (size_t i = 0; i < ARRAY_LEN(want); i++) {
		CHECK_U64(ref_next(&ref), want[i]);
		CHECK_U64(order_rng_next(&rng), want[i]);
	}
	CHECK_U64(order_mix(0), 0);
	struct ref_rng vals = { .key = 12345 };
	for (int i = 0; i < 64; i++) {
		uint64_t x = ref_next(&vals);
		CHECK_U64(order_mix(x), ref_mix(x));
	}
	CHECK_U64(order_mix(UINT64_MAX), ref_mix(UINT64_MAX));

	/* The daemon's shuffle is the contract's, on both element widths. */
	for (size_t n = 0; n < 40; n += 7) {
		uint32_t a32[40], r32[40];
		uint64_t a64[40];
		for (size_t i = 0; i < n; i++)
			a32[i] = r32[i] = (uint32_t)i, a64[i] = i;
		struct order_rng g = order_rng_init(n), h = order_rng_init(n);
		order_shuffle_u32(a32, n, &g);
		order_shuffle_u64(a64, n, &h);
		struct ref_rng rr = { .key = n };
		for (size_t i = n; i-- > 1;) {
			size_t j = (size_t)ref_below(&rr, i + 1);
			uint32_t t = r32[i];
			r32[i] = r32[j];
			r32[j] = t;
		}
		for (size_t i = 0; i < n; i++) {
			CHECK(a32[i] == r32[i], "shuffle_u32 of %zu: [%zu] = %u, expected %u", n, i, a32[i], r32[i]);
			CHECK(a64[i] == r32[i], "shuffle_u64 of %zu: [%zu] = %" PRIu64 ", expected %u", n, i, a64[i],
			      r32[i]);
		}
	}
}

static void check_epoch(const struct order_params *p, uint64_t e)
{
	char what[160];
	snprintf(what, sizeof(what), "seed %#" PRIx64 " shuffle %d W %u S %u epoch %" PRIu64, p->seed, p->shuffle,
		 p->window, p->n_shards, e);

	struct ref_epoch ref;
	ref_epoch_build(p->seed, p->shuffle, p->window, p->n_shards, p->shard_docs, e, &ref);
	struct order_epoch ep = { 0 };
	int r = order_epoch_build(p, e, &ep);
	CHECK(r == 0, "%s: order_epoch_build returned %d", what, r);
	if (r < 0)
		goto out;
	CHECK(ep.epoch == e, "%s: epoch %" PRIu64, what, ep.epoch);
	CHECK(ep.key == ref.key, "%s: key %#" PRIx64 ", expected %#" PRIx64, what, ep.key, ref.key);
	CHECK(ep.n_windows == ref.n_windows, "%s: %u windows, expected %u", what, ep.n_windows, ref.n_windows);
	if (ep.n_windows != ref.n_windows)
		goto out;
	for (uint32_t i = 0; i < p->n_shards; i++)
		CHECK(ep.perm[i] == ref.perm[i], "%s: perm[%u] = %u, expected %u", what, i, ep.perm[i], ref.perm[i]);
	for (uint32_t w = 0; w <= ref.n_windows; w++)
		CHECK(ep.win_start[w] == ref.win_start[w], "%s: win_start[%u] = %" PRIu64 ", expected %zu", what, w,
		      ep.win_start[w], ref.win_start[w]);

	for (size_t wi = 0; wi < ARRAY_LEN(worlds); wi++) {
		uint32_t world = worlds[wi];
		for (uint32_t rank = 0; rank < world; rank++) {
			for (uint32_t w = 0; w < ref.n_windows; w++) {
				uint64_t *docs = NULL, first = UINT64_MAX, total = UINT64_MAX;
				size_t n = SIZE_MAX;
				r = order_window_rank_docs(p, &ep, w, rank, world, &docs, &n, &first, &total);
				CHECK(r == 0, "%s: order_window_rank_docs(w %u, rank %u/%u) returned %d", what, w, rank,
				      world, r);
				if (r < 0)
					continue;
				size_t k0 = ref.win_start[w], k1 = ref.win_start[w + 1];
				CHECK(total == k1 - k0, "%s w %u: window has %" PRIu64 " documents, expected %zu", what,
				      w, total, k1 - k0);
				size_t m = 0;
				for (size_t k = k0; k < k1; k++) {
					if (k % world != rank)
						continue;
					if (m == 0)
						CHECK(first == k - k0,
						      "%s w %u rank %u/%u: first index %" PRIu64 ", expected %zu", what, w,
						      rank, world, first, k - k0);
					uint64_t want = ORDER_DOC(ref.docs[k].shard, ref.docs[k].doc);
					if (m < n)
						CHECK(docs[m] == want,
						      "%s w %u rank %u/%u: doc %zu = (%u,%u), expected (%u,%u) (epoch k=%zu)",
						      what, w, rank, world, m, ORDER_DOC_SHARD(docs[m]),
						      ORDER_DOC_INDEX(docs[m]), ref.docs[k].shard, ref.docs[k].doc, k);
					m++;
				}
				CHECK(n == m, "%s w %u rank %u/%u: %zu documents, expected %zu", what, w, rank, world, n,
				      m);
				/* The compact window the walk holds (issue #22) names the same documents. */
				struct order_window win = { 0 };
				CHECK_INT(order_window_build(p, &ep, w, rank, world, &win), 0);
				CHECK(win.mine == n && win.first == first && win.n == total,
				      "%s w %u rank %u/%u: compact window (%zu, %" PRIu64 ", %" PRIu64 ")", what, w, rank,
				      world, win.mine, win.first, win.n);
				for (size_t i = 0; i < n && i < win.mine; i++)
					CHECK(order_window_doc(&win, i) == docs[i], "%s w %u rank %u/%u: compact doc %zu",
					      what, w, rank, world, i);
				/* A window with none of the rank's documents holds nothing (a virtual stream passing through). */
				CHECK(!p->shuffle || win.mine == 0 || win.list32, "%s: shuffled window not held as u32", what);
				CHECK(p->shuffle || (!win.list32 && !win.list64), "%s: unshuffled window materialised", what);
				order_window_clear(&win);
				free(docs);
			}
		}
	}
out:
	order_epoch_clear(&ep);
	ref_epoch_free(&ref);
}

static void test_epochs(void)
{
	for (size_t si = 0; si < ARRAY_LEN(seeds); si++)
		for (int shuffle = 0; shuffle <= 1; shuffle++)
			for (size_t wi = 0; wi < ARRAY_LEN(windows); wi++)
				for (size_t hi = 0; hi < ARRAY_LEN(shapes); hi++) {
					struct order_params p = {
						.seed = seeds[si],
						.shuffle = shuffle,
						.window = windows[wi],
						.n_shards = shapes[hi].n,
						.shard_docs = shapes[hi].docs,
					};
					for (uint64_t e = 0; e < N_EPOCHS; e++)
						check_epoch(&p, e);
				}

	/* Shuffling must actually reorder: different epochs and seeds give different orders. */
	struct order_params p = { .seed = 7, .shuffle = true, .window = 7, .n_shards = 5, .shard_docs = docs_s5 };
	struct order_epoch a = { 0 }, b = { 0 };
	uint64_t *da, *db, fa, fb, ta, tb;
	size_t na, nb;
	CHECK_INT(order_epoch_build(&p, 0, &a), 0);
	CHECK_INT(order_epoch_build(&p, 1, &b), 0);
	CHECK_INT(order_window_rank_docs(&p, &a, 0, 0, 1, &da, &na, &fa, &ta), 0);
	CHECK_INT(order_window_rank_docs(&p, &b, 0, 0, 1, &db, &nb, &fb, &tb), 0);
	CHECK(na == 15 && nb == 15 && memcmp(da, db, 15 * sizeof(*da)) != 0,
	      "epochs 0 and 1 of a shuffled feed visit documents in the same order");
	free(da);
	free(db);
	order_epoch_clear(&a);
	order_epoch_clear(&b);
}

/* ---- streams ---- */

struct stream_case {
	char what[160];
	struct order_params p;
	const uint32_t *const *tokens;
	uint32_t rank, world;
	bool bos, eos;
};

static bool pos_equal(struct stream_pos a, const struct ref_pos *b)
{
	return a.epoch == b->epoch && a.window == b->window && a.index == b->index && a.offset == b->offset;
}

/*
 * Walks the stream from `s`'s current place, which must be ref[at], for up
 * to `limit` positions, in pieces of varying sizes, checking each piece and
 * each stream_tell() against the reference.
 */
static void walk(const struct stream_case *c, struct stream *s, const struct ref_pos *ref, size_t n_ref, size_t at,
		 size_t limit, unsigned step_seed)
{
	static const uint64_t steps[] = { 1, 2, 3, 5, 8, 13, 1000 };
	size_t end = at + limit < n_ref ? at + limit : n_ref;
	unsigned step = step_seed;
	while (at < end) {
		struct stream_pos t = stream_tell(s);
		if (!pos_equal(t, &ref[at])) {
			unit_fail(__FILE__, __LINE__,
				  "%s: at position %zu stream_tell = (epoch %" PRIu64 ", window %u, index %" PRIu64
				  ", offset %" PRIu64 "), expected (%" PRIu64 ", %u, %" PRIu64 ", %" PRIu64 ")",
				  c->what, at, t.epoch, t.window, t.index, t.offset, ref[at].epoch, ref[at].window,
				  ref[at].index, ref[at].offset);
			return;
		}
		struct stream_piece peek = stream_peek(s);
		CHECK(peek.doc == ORDER_DOC(ref[at].shard, ref[at].doc) && peek.offset == ref[at].offset,
		      "%s: stream_peek at %zu names another place", c->what, at);

		uint64_t max = steps[step++ % ARRAY_LEN(steps)];
		struct stream_piece pc;
		int r = stream_take(s, max, &pc);
		if (r < 0) {
			unit_fail(__FILE__, __LINE__, "%s: stream_take at position %zu returned %d", c->what, at, r);
			return;
		}
		if (pc.count == 0 || pc.count > max) {
			unit_fail(__FILE__, __LINE__, "%s: stream_take(max %" PRIu64 ") at %zu gave %" PRIu64
				  " positions", c->what, max, at, pc.count);
			return;
		}
		for (uint64_t j = 0; j < pc.count && at < end; j++, at++) {
			const struct ref_pos *w = &ref[at];
			if (pc.doc != ORDER_DOC(w->shard, w->doc) || pc.offset + j != w->offset || pc.length != w->length) {
				unit_fail(__FILE__, __LINE__,
					  "%s: position %zu is (shard %u, doc %u, offset %" PRIu64 ", length %" PRIu64
					  "), expected (shard %u, doc %u, offset %" PRIu64 ", length %" PRIu64 ")",
					  c->what, at, ORDER_DOC_SHARD(pc.doc), ORDER_DOC_INDEX(pc.doc), pc.offset + j,
					  pc.length, w->shard, w->doc, w->offset, w->length);
				return;
			}
		}
	}
}

static void check_stream(const struct stream_case *c)
{
	struct ref_pos *ref;
	/* Four whole epochs of this rank's stream. */
	size_t n = ref_stream(c->p.seed, c->p.shuffle, c->p.window, c->p.n_shards, c->p.shard_docs, c->tokens,
			      c->rank, c->world, c->bos, c->eos, 100000, N_EPOCHS, &ref);
	REQUIRE(n < 100000, "%s: the test's shapes give this rank %zu positions", c->what, n);

	struct stream s;
	int r = stream_init(&s, &c->p, c->tokens, c->rank, c->world, c->bos, c->eos, NULL);
	if (n == 0) {
		/* Only empty documents for this rank in every epoch: there is nothing to serve. */
		CHECK(r == -ENODATA, "%s: stream_init(NULL) for a rank without tokens returned %d, expected -ENODATA",
		      c->what, r);
		if (r == 0)
			stream_clear(&s);
		goto out;
	}
	CHECK(r == 0, "%s: stream_init(NULL) returned %d", c->what, r);
	if (r < 0)
		goto out;
	walk(c, &s, ref, n, 0, n, 0);
	stream_clear(&s);

	/* Resume from a told position: every 3rd one, and every window and epoch boundary. */
	for (size_t i = 0; i < n; i++) {
		bool boundary = i == 0 || ref[i].window != ref[i - 1].window || ref[i].epoch != ref[i - 1].epoch;
		if (i % 3 != 0 && !boundary)
			continue;
		struct stream_pos pos = { .epoch = ref[i].epoch, .window = ref[i].window, .index = ref[i].index, .offset = ref[i].offset };
		r = stream_init(&s, &c->p, c->tokens, c->rank, c->world, c->bos, c->eos, &pos);
		if (r < 0) {
			unit_fail(__FILE__, __LINE__, "%s: stream_init at position %zu (epoch %" PRIu64 ", window %u, index %" PRIu64
				  ", offset %" PRIu64 ") returned %d", c->what, i, pos.epoch, pos.window, pos.index,
				  pos.offset, r);
			continue;
		}
		walk(c, &s, ref, n, i, 40, (unsigned)i);
		stream_clear(&s);
	}

	/* Positions that are not this rank's, or not inside a document, are refused. */
	for (size_t i = 0; i < n; i += 11) {
		struct stream_pos good = { .epoch = ref[i].epoch, .window = ref[i].window, .index = ref[i].index,
					    .offset = ref[i].offset }, bad;
		struct ref_epoch ep;
		ref_epoch_build(c->p.seed, c->p.shuffle, c->p.window, c->p.n_shards, c->p.shard_docs, good.epoch, &ep);
		uint64_t window_docs = ep.win_start[good.window + 1] - ep.win_start[good.window];
		uint32_t n_windows = ep.n_windows;
		ref_epoch_free(&ep);

		if (c->world > 1) {
			bad = good;
			bad.index = good.index + 1; /* the next rank's document */
			bad.offset = 0;
			r = stream_init(&s, &c->p, c->tokens, c->rank, c->world, c->bos, c->eos, &bad);
			CHECK(r == -EINVAL, "%s: stream_init at index %" PRIu64 " (another rank's) returned %d", c->what,
			      bad.index, r);
			if (r == 0)
				stream_clear(&s);
		}
		bad = good;
		bad.index = good.index + ((window_docs - good.index + c->world - 1) / c->world) * c->world;
		bad.offset = 0; /* this rank's residue, past the window's end */
		r = stream_init(&s, &c->p, c->tokens, c->rank, c->world, c->bos, c->eos, &bad);
		CHECK(r == -EINVAL, "%s: stream_init at index %" PRIu64 " of a %" PRIu64 "-document window returned %d",
		      c->what, bad.index, window_docs, r);
		if (r == 0)
			stream_clear(&s);
		bad = good;
		bad.offset = ref[i].length;
		r = stream_init(&s, &c->p, c->tokens, c->rank, c->world, c->bos, c->eos, &bad);
		CHECK(r == -EINVAL, "%s: stream_init at offset %" PRIu64 " of a %" PRIu64 "-position document returned %d",
		      c->what, bad.offset, ref[i].length, r);
		if (r == 0)
			stream_clear(&s);
		bad = good;
		bad.window = n_windows;
		r = stream_init(&s, &c->p, c->tokens, c->rank, c->world, c->bos, c->eos, &bad);
		CHECK(r == -EINVAL, "%s: stream_init in window %u of %u returned %d", c->what, bad.window, n_windows, r);
		if (r == 0)
			stream_clear(&s);
	}
out:
	free(ref);
}

static void test_streams(void)
{
	static const uint64_t stream_seeds[] = { 0, UINT64_C(0x243F6A8885A308D3), UINT64_MAX };
	for (size_t si = 0; si < ARRAY_LEN(stream_seeds); si++)
		for (int shuffle = 0; shuffle <= 1; shuffle++)
			for (size_t wi = 0; wi < ARRAY_LEN(windows); wi++)
				for (size_t hi = 0; hi < ARRAY_LEN(shapes); hi++)
					for (size_t ri = 0; ri < ARRAY_LEN(worlds); ri++)
						for (uint32_t rank = 0; rank < worlds[ri]; rank++)
							for (int be = 0; be < 4; be++) {
								struct stream_case c = {
									.p = { .seed = stream_seeds[si],
									       .shuffle = shuffle,
									       .window = windows[wi],
									       .n_shards = shapes[hi].n,
									       .shard_docs = shapes[hi].docs },
									.tokens = shape_tokens[hi],
									.rank = rank,
									.world = worlds[ri],
									.bos = be & 1,
									.eos = be & 2,
								};
								/* Skip the heavy half of bos/eos combinations off the corners. */
								if ((be == 1 || be == 2) && (si != 1 || wi % 2))
									continue;
								snprintf(c.what, sizeof(c.what),
									 "seed %#" PRIx64 " shuffle %d W %u S %u rank %u/%u bos %d eos %d",
									 c.p.seed, shuffle, c.p.window, c.p.n_shards, rank,
									 c.world, c.bos, c.eos);
								check_stream(&c);
							}
}

static void test_stream_args(void)
{
	struct order_params p = { .seed = 1, .shuffle = false, .window = 1, .n_shards = 1, .shard_docs = docs_s1 };
	struct stream s;
	CHECK_INT(stream_init(&s, &p, toks_s1, 0, 0, false, false, NULL), -EINVAL);
	CHECK_INT(stream_init(&s, &p, toks_s1, 2, 2, false, false, NULL), -EINVAL);

	/* A rank whose documents are all empty gets no tokens: -ENODATA, not a spin. */
	static const uint32_t docs[] = { 4 }, tok[] = { 5, 0, 5, 0 };
	static const uint32_t *const toks[] = { tok };
	struct order_params q = { .seed = 1, .shuffle = false, .window = 1, .n_shards = 1, .shard_docs = docs };
	CHECK_INT(stream_init(&s, &q, toks, 1, 2, true, true, NULL), -ENODATA);
	CHECK_INT(stream_init(&s, &q, toks, 0, 2, true, true, NULL), 0);
	stream_clear(&s);
}

/*
 * With shuffling, a rank may be dealt only empty documents for many epochs
 * in a row and still get tokens later. Its stream must then start at those
 * tokens: the rank does receive tokens, so -ENODATA would be wrong. The seed
 * is the first one for which the reference deals rank 0 nothing but empty
 * documents for at least 12 epochs (more than two epochs' worth of documents
 * of the feed, 2 * 5 + 1, in a row).
 */
static void test_stream_late_tokens(void)
{
	static const uint32_t docs[] = { 5 }, tok[] = { 3, 0, 0, 0, 0 };
	static const uint32_t *const toks[] = { tok };
	struct order_params q = { .shuffle = true, .window = 1, .n_shards = 1, .shard_docs = docs };
	struct ref_pos *ref = NULL;
	size_t n = 0;
	for (q.seed = 0; q.seed < 10000; q.seed++) {
		free(ref);
		n = ref_stream(q.seed, true, 1, 1, docs, toks, 0, 5, false, false, 1, 200, &ref);
		if (n == 1 && ref[0].epoch >= 12)
			break;
	}
	REQUIRE(n == 1 && ref[0].epoch >= 12, "no seed below 10000 delays rank 0's first token to epoch 12");

	struct stream s;
	int r = stream_init(&s, &q, toks, 0, 5, false, false, NULL);
	CHECK(r == 0, "seed %" PRIu64 ": rank 0/5 first gets tokens in epoch %" PRIu64
	      " (document %u), but stream_init(NULL) returned %d", q.seed, ref[0].epoch, ref[0].doc, r);
	if (r == 0) {
		struct stream_pos t = stream_tell(&s);
		CHECK(pos_equal(t, &ref[0]), "seed %" PRIu64 ": stream starts in epoch %" PRIu64 ", expected %" PRIu64,
		      q.seed, t.epoch, ref[0].epoch);
		stream_clear(&s);
	}
	free(ref);
}

/*
 * A walk whose windows are counted off its thread (issue #22: the main
 * loop's walks): order_params.count says -EAGAIN once for each shard not
 * counted yet, and the walk, asked again, goes on from where it stopped,
 * across windows and epochs: the same documents, pieces and positions as a
 * walk whose counts were all known.
 */
static const uint32_t wait_truth[7] = { 3, 0, 5, 1, 0, 4, 2 };
static bool wait_on, wait_armed;
static unsigned wait_refused;
static int wait_count(void *ctx, uint32_t s, uint32_t *ret)
{
	uint32_t *docs = ctx;
	if (docs[s] == ORDER_DOCS_UNKNOWN && wait_on && wait_armed) {
		wait_armed = false; /* the next call finds it counted (the pool did) */
		wait_refused++;
		return -EAGAIN;
	}
	wait_armed = true;
	docs[s] = wait_truth[s];
	*ret = docs[s];
	return 0;
}

static void test_stream_waits_for_counts(void)
{
	static const uint32_t tok[] = { 2, 3, 1, 4, 2 };
	static const uint32_t *const toks[7] = { tok, tok, tok, tok, tok, tok, tok };
	uint32_t docs[7];
	for (uint32_t i = 0; i < 7; i++)
		docs[i] = i < 2 ? wait_truth[i] : ORDER_DOCS_UNKNOWN;
	for (uint32_t rank = 0; rank < 2; rank++) {
		struct order_params known = { .seed = 4, .shuffle = true, .window = 2, .n_shards = 7, .shard_docs = wait_truth };
		struct order_params lazy = known;
		lazy.shard_docs = docs;
		lazy.count = wait_count;
		lazy.count_ctx = docs;
		struct stream a, b;
		wait_on = false; /* the attach's window counted at once */
		CHECK_INT(stream_init(&a, &known, toks, rank, 2, true, false, NULL), 0);
		CHECK_INT(stream_init(&b, &lazy, toks, rank, 2, true, false, NULL), 0);
		wait_on = wait_armed = true;
		for (unsigned i = 0; i < 60; i++) {
			struct stream_piece x, y;
			CHECK_INT(stream_take(&a, 2, &x), 0);
			int r;
			while ((r = stream_take(&b, 2, &y)) == -EAGAIN)
				;
			CHECK_INT(r, 0);
			CHECK(x.doc == y.doc && x.offset == y.offset && x.count == y.count && x.length == y.length,
			      "rank %u piece %u: doc %#" PRIx64 "+%" PRIu64 ", expected %#" PRIx64 "+%" PRIu64, rank, i, y.doc,
			      y.offset, x.doc, x.offset);
			CHECK_INT(stream_settle(&a), 0);
			while ((r = stream_settle(&b)) == -EAGAIN)
				;
			struct stream_pos p = stream_tell(&a), q = stream_tell(&b);
			CHECK(p.epoch == q.epoch && p.window == q.window && p.index == q.index && p.offset == q.offset,
			      "rank %u piece %u: positions differ", rank, i);
		}
		stream_clear(&a);
		stream_clear(&b);
	}
	CHECK(wait_refused > 0, "no count was refused: the test tested nothing");
}

/* More ranks than documents: the last rank is dealt nothing, ever. */
static void no_documents_for_rank(void *ctx)
{
	static const uint32_t docs[] = { 2 }, tok[] = { 3, 3 };
	static const uint32_t *const toks[] = { tok };
	struct order_params q = { .seed = 1, .shuffle = true, .window = 1, .n_shards = 1, .shard_docs = docs };
	struct stream s;
	CHECK_INT(stream_init(&s, &q, toks, 2, 3, false, false, NULL), -ENODATA);
}


/*
 * Section 3.1's bijection: a permutation of [0, n) for every n around the
 * edges of its power-of-4 domain (1, 2, powers of 2 and 4 plus and minus
 * one), deterministic in (n, key), different for different keys, and equal
 * to tests/ref/feed_ref.py's permute_at (values computed there).
 */
static void test_permute(void)
{
	static uint8_t seen[70000];
	uint64_t ns[64];
	size_t n_ns = 0;
	for (uint64_t n = 1; n <= 20; n++)
		ns[n_ns++] = n;
	for (uint32_t b = 5; b <= 16; b++) {
		ns[n_ns++] = (UINT64_C(1) << b) - 1;
		ns[n_ns++] = (UINT64_C(1) << b) + 1;
	}
	ns[n_ns++] = 1000;
	ns[n_ns++] = 65536;
	static const uint64_t keys[] = { 0, 1, UINT64_C(0x243F6A8885A308D3), UINT64_MAX };
	for (size_t a = 0; a < n_ns; a++)
		for (size_t k = 0; k < ARRAY_LEN(keys); k++) {
			uint64_t n = ns[a];
			struct order_perm p, q;
			order_perm_init(&p, n, keys[k]);
			order_perm_init(&q, n, keys[k]);
			CHECK((UINT64_C(1) << (2 * p.half)) >= n && (p.half == 0 || (UINT64_C(1) << (2 * p.half - 2)) < n),
			      "n %" PRIu64 ": half %u is not the least with 4^half >= n", n, p.half);
			memset(seen, 0, n);
			uint64_t fixed = 0;
			for (uint64_t i = 0; i < n; i++) {
				uint64_t x = order_perm_at(&p, i);
				CHECK(x < n && !seen[x], "n %" PRIu64 " key %zu: perm(%" PRIu64 ") = %" PRIu64 " out of range or repeated",
				      n, k, i, x);
				if (x < n)
					seen[x] = 1;
				CHECK_U64(order_perm_at(&q, i), x);
				fixed += x == i;
			}
			/* A random permutation fixes about one point; an identity-like one fixes many. */
			if (n >= 1000)
				CHECK(fixed < 20, "n %" PRIu64 " key %zu: %" PRIu64 " fixed points", n, k, fixed);
		}
	/* Another key, another order. */
	struct order_perm p, q;
	order_perm_init(&p, 1000, 1);
	order_perm_init(&q, 1000, 2);
	uint64_t same = 0;
	for (uint64_t i = 0; i < 1000; i++)
		same += order_perm_at(&p, i) == order_perm_at(&q, i);
	CHECK(same < 20, "keys 1 and 2 agree on %" PRIu64 " of 1000 positions", same);
	/*
	 * Spread over keys: where entry 0 lands, and where the pair (0, 1)
	 * lands, for 4000 keys (chi-square against uniform; fixed keys, so a
	 * fixed figure). n = 5 is the smallest domain with cycle walking
	 * (16, halves of 2 bits), where rounds matter most: 6 rounds gave a
	 * pair figure of 81 on 19 degrees of freedom, 8 rounds give 15.
	 */
	for (uint64_t n = 5; n <= 10; n += 5) {
		uint32_t one[10] = { 0 }, two[100] = { 0 };
		const uint32_t keys_n = 4000;
		for (uint32_t k = 0; k < keys_n; k++) {
			order_perm_init(&p, n, order_mix(k));
			one[order_perm_at(&p, 0)]++;
			two[order_perm_at(&p, 0) * n + order_perm_at(&p, 1)]++;
		}
		double chi1 = 0, chi2 = 0, e1 = (double)keys_n / (double)n, e2 = (double)keys_n / (double)(n * (n - 1));
		for (uint64_t a = 0; a < n; a++) {
			chi1 += (one[a] - e1) * (one[a] - e1) / e1;
			for (uint64_t b = 0; b < n; b++)
				if (a != b)
					chi2 += (two[a * n + b] - e2) * (two[a * n + b] - e2) / e2;
		}
		CHECK(chi1 < 4 * (double)n, "n %" PRIu64 ": perm(0) over keys, chi-square %.1f", n, chi1);
		CHECK(chi2 < 1.5 * (double)(n * (n - 1)) + 20, "n %" PRIu64 ": (perm(0), perm(1)) over keys, chi-square %.1f", n,
		      chi2);
	}
	/* Known answers from the reference (feed_ref.permute_at). */
	order_perm_init(&p, 1000, 0x1234);
	CHECK_U64(order_perm_at(&p, 0), 865);
	CHECK_U64(order_perm_at(&p, 1), 314);
	CHECK_U64(order_perm_at(&p, 2), 642);
	CHECK_U64(order_perm_at(&p, 999), 871);
	order_perm_init(&p, 100000000, 0xdeadbeef);
	CHECK_U64(order_perm_at(&p, 0), 30557195);
	CHECK_U64(order_perm_at(&p, 1), 35275711);
	CHECK_U64(order_perm_at(&p, 99999999), 45533195);
}

/* order_may_permute against sorting: the W largest shards, ties and W over S included. */
static void test_may_permute(void)
{
	static uint32_t docs[300];
	struct order_rng g = order_rng_init(3);
	for (int round = 0; round < 40; round++) {
		uint32_t n = 1 + (uint32_t)(order_rng_next(&g) % 300);
		for (uint32_t i = 0; i < n; i++)
			docs[i] = (uint32_t)(order_rng_next(&g) % (round % 2 ? 5 : 100000)); /* few values: many ties */
		uint32_t sorted[300];
		memcpy(sorted, docs, n * sizeof(*docs));
		for (uint32_t i = 1; i < n; i++) /* descending insertion sort */
			for (uint32_t j = i; j > 0 && sorted[j - 1] < sorted[j]; j--) {
				uint32_t t = sorted[j];
				sorted[j] = sorted[j - 1];
				sorted[j - 1] = t;
			}
		static const uint32_t ws[] = { 1, 2, 4, 65, 100, 400 };
		for (size_t wi = 0; wi < ARRAY_LEN(ws); wi++) {
			uint64_t top = 0;
			for (uint32_t i = 0; i < n && i < ws[wi]; i++)
				top += sorted[i];
			for (int d = -1; d <= 1; d++) {
				if (top == 0 && d < 0)
					continue;
				struct order_params p = { .shuffle = true, .window = ws[wi], .n_shards = n, .shard_docs = docs,
							  .list_max = top + (uint64_t)d };
				CHECK(order_may_permute(&p) == (d < 0), "S %u W %u: top %" PRIu64 ", list_max %+d", n, ws[wi],
				      top, d);
			}
		}
	}
}

/* Counts found on demand (a text feed's, issue #22): from `truth`. */
static const uint32_t starts_truth[20] = { 3, 0, 7, 1, 4, 4, 9, 2, 0, 5, 6, 1, 1, 8, 3, 2, 7, 0, 4, 5 };
static int starts_count(void *ctx, uint32_t s, uint32_t *ret)
{
	uint32_t *docs = ctx;
	__atomic_store_n(&docs[s], starts_truth[s], __ATOMIC_RELEASE);
	*ret = starts_truth[s];
	return 0;
}

/*
 * Window starts are one array per feed's epoch, shared by every walk
 * (issue #22): a later walk finds the starts an earlier one counted; a walk
 * placed by a cursor's k_w holds a copy of its own only until the shared
 * starts reach its window, then goes back to them (a wrong k_w keeps its
 * copy); every start equals the prefix sums.
 */
static void test_shared_starts(void)
{
	uint32_t docs[20];
	for (uint32_t i = 0; i < 20; i++)
		docs[i] = ORDER_DOCS_UNKNOWN;
	struct order_params p = { .seed = 9, .shuffle = true, .window = 2, .n_shards = 20, .shard_docs = docs,
				  .count = starts_count, .count_ctx = docs };
	struct order_epoch a = { 0 }, b = { 0 }, d = { 0 }, e = { 0 };
	CHECK_INT(order_epoch_build(&p, 0, &a), 0);
	uint64_t k[11] = { 0 };
	for (uint32_t w = 0; w < 10; w++)
		k[w + 1] = k[w] + starts_truth[a.perm[2 * w]] + starts_truth[a.perm[2 * w + 1]];
	CHECK_INT(order_epoch_window(&p, &a, 5), 0);
	CHECK_INT(order_epoch_build(&p, 0, &b), 0);
	CHECK(b.win_start == a.win_start && b.win_hi >= 6 && !b.own_start, "a second walk shares the starts (hi %u)", b.win_hi);
	/* Placed at window 8 by a k_w: its own copy (windows 6 and 7 are not counted). */
	CHECK_INT(order_epoch_build(&p, 0, &d), 0);
	CHECK_INT(order_epoch_seed(&d, 8, k[8]), 0);
	CHECK_INT(order_epoch_window(&p, &d, 8), 0);
	CHECK(d.own_start && d.win_start != a.win_start, "a seeded walk ahead of the shared starts has its own");
	CHECK_U64(d.win_start[9], k[9]);
	CHECK_INT(order_epoch_build(&p, 0, &e), 0);
	CHECK_INT(order_epoch_seed(&e, 9, k[9] + 1), 0); /* a cursor not of this order: never shared */
	/* The first walk counts on: the seeded one goes back to the shared starts, the wrong one does not. */
	CHECK_INT(order_epoch_window(&p, &a, 7), 0);
	CHECK_INT(order_epoch_window(&p, &d, 9), 0);
	CHECK(!d.own_start && d.win_start == a.win_start && d.win_lo == 0, "the seeded walk went back to the shared starts");
	CHECK_INT(order_epoch_window(&p, &e, 9), 0);
	CHECK(e.own_start != NULL, "a wrong k_w kept its own copy");
	for (uint32_t w = 0; w <= 10; w++)
		CHECK_U64(d.win_start[w], k[w]);
	CHECK_INT(order_epoch_seed(&b, 3, k[3] + 1), -EINVAL);
	order_epoch_clear(&a);
	order_epoch_clear(&b);
	order_epoch_clear(&d);
	order_epoch_clear(&e);
}

/*
 * A window over list_max: its rank lists (order_window_rank_docs and
 * order_window_build/doc) are the bijection's order dealt by stride, every
 * document once; a window at or under list_max keeps Fisher-Yates.
 */
static void test_permuted_windows(void)
{
	static const uint32_t docs[] = { 300, 0, 250, 77, 1 };
	for (uint64_t list_max = 1; list_max <= 700; list_max += 233) {
		struct order_params p = { .seed = 5, .shuffle = true, .window = 2, .n_shards = 5, .shard_docs = docs,
					  .list_max = list_max };
		struct order_params fy = p;
		fy.list_max = 0;
		CHECK(order_may_permute(&p) == (list_max < 550), "list_max %" PRIu64 ": may_permute", list_max);
		struct order_epoch ep = { 0 };
		CHECK_INT(order_epoch_build(&p, 3, &ep), 0);
		for (uint32_t w = 0; w < ep.n_windows; w++) {
			uint64_t n = ep.win_start[w + 1] - ep.win_start[w];
			uint64_t *all0 = NULL, *all1 = NULL;
			size_t n0, n1;
			uint64_t f0, t0, f1, t1;
			CHECK_INT(order_window_rank_docs(&p, &ep, w, 0, 1, &all0, &n0, &f0, &t0), 0);
			CHECK_INT(order_window_rank_docs(&fy, &ep, w, 0, 1, &all1, &n1, &f1, &t1), 0);
			CHECK_U64(n0, n);
			if (n <= list_max)
				CHECK(memcmp(all0, all1, n * sizeof(*all0)) == 0, "window %u under list_max changed", w);
			/* The unshuffled list, then its bijection. */
			struct order_perm perm;
			order_perm_init(&perm, n, order_mix(ep.key ^ order_mix((uint64_t)w + 1)));
			uint64_t unshuffled[700], k = 0;
			uint32_t lo = w * p.window;
			for (uint32_t i = lo; i < lo + p.window && i < p.n_shards; i++)
				for (uint32_t d = 0; d < docs[ep.perm[i]]; d++)
					unshuffled[k++] = ORDER_DOC(ep.perm[i], d);
			CHECK_U64(k, n);
			if (n > list_max)
				for (uint64_t i = 0; i < n; i++)
					CHECK_U64(all0[i], unshuffled[order_perm_at(&perm, i)]);
			uint32_t *list = NULL;
			uint64_t list_n;
			int r = order_window_shuffle(&p, &ep, w, &list, &list_n);
			CHECK_INT(r == -EOVERFLOW, n > list_max);
			free(r == 0 ? list : NULL);
			for (uint32_t world = 2; world <= 3; world++)
				for (uint32_t rank = 0; rank < world; rank++) {
					struct order_window win;
					CHECK_INT(order_window_build(&p, &ep, w, rank, world, &win), 0);
					CHECK(win.permuted == (n > list_max), "window %u: permuted", w);
					for (size_t m = 0; m < win.mine; m++)
						CHECK_U64(order_window_doc(&win, m), all0[win.first + m * world]);
					order_window_clear(&win);
				}
			free(all0);
			free(all1);
		}
		order_epoch_clear(&ep);
	}
}

int main(void)
{
	test_mix();
	test_epochs();
	test_streams();
	test_stream_args();
	test_stream_late_tokens();
	test_stream_waits_for_counts();
	test_permute();
	test_permuted_windows();
	test_shared_starts();
	test_may_permute();
	unit_in_child("stream_init for a rank of 3 over 2 documents", no_documents_for_rank, NULL, 2);
	return unit_exit("test-order");
}
