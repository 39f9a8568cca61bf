/* SPDX-License-Identifier: MIT */
/*
 * A cursor's k_w (issue #22) seeding a walk whose counts are not known yet
 * (text shards counted lazily, order_params.count): the resume counts
 * nothing before its window; the stream is the uninterrupted one; and a
 * k_w that is wrong is refused when the counts are known, or checked later,
 * once the shards before the window are counted (by another walk): off by a
 * multiple of the world (the same stream) it is corrected, otherwise the
 * walk fails with -ERANGE (docs/sample-order.md, section 7.3).
 */
#include <errno.h>
#include <string.h>

#include "daemon/order/order.h"
#include "daemon/order/stream.h"
#include "unit.h"

#define S 12
#define W 2
#define R 3
#define RANK 1

static const uint32_t truth[S] = { 3, 5, 2, 4, 6, 1, 3, 2, 5, 4, 3, 2 };
static const uint32_t tok[6] = { 2, 3, 1, 4, 2, 5 };
static const uint32_t *const toks[S] = { tok, tok, tok, tok, tok, tok, tok, tok, tok, tok, tok, tok };

static uint32_t lazy[S];
static unsigned counted[S];

static int count(void *ctx, uint32_t shard, uint32_t *ret)
{
	(void)ctx;
	__atomic_store_n(&lazy[shard], truth[shard], __ATOMIC_RELEASE);
	counted[shard]++;
	*ret = truth[shard];
	return 0;
}

static void reset_lazy(void)
{
	for (unsigned i = 0; i < S; i++) {
		lazy[i] = ORDER_DOCS_UNKNOWN;
		counted[i] = 0;
	}
}

static struct order_params known(bool shuffle)
{
	return (struct order_params){ .seed = 5, .shuffle = shuffle, .window = W, .n_shards = S, .shard_docs = truth };
}

static struct order_params unknown(bool shuffle)
{
	struct order_params p = known(shuffle);
	p.shard_docs = lazy;
	p.count = count;
	return p;
}

#define N_DOCS 12

/* The rank's stream from its start to the first position in window `w` of epoch 0, and the documents after it. */
static void reference(const struct order_params *p, uint32_t w, struct stream_pos *ret_pos, uint64_t *docs)
{
	struct stream s;
	REQUIRE(stream_init(&s, p, toks, RANK, R, false, false, NULL) == 0, "reference stream");
	struct stream_piece piece;
	while (stream_tell(&s).window < w)
		REQUIRE(stream_take(&s, UINT64_MAX, &piece) == 0, "reference take");
	*ret_pos = stream_tell(&s);
	REQUIRE(ret_pos->epoch == 0 && ret_pos->window == w, "rank %u has no document in window %u", RANK, w);
	for (int i = 0; i < N_DOCS; i++) {
		REQUIRE(stream_take(&s, UINT64_MAX, &piece) == 0, "reference take");
		docs[i] = piece.doc;
	}
	stream_clear(&s);
}

/* reference() with the position's k_w set from epoch 0 (built into *ep, which the caller clears). */
static void at_window(const struct order_params *p, uint32_t w, struct stream_pos *ret_pos, uint64_t *docs,
		      struct order_epoch *ep)
{
	reference(p, w, ret_pos, docs);
	REQUIRE(order_epoch_build(p, 0, ep) == 0, "epoch");
	ret_pos->k = ep->win_start[w];
	ret_pos->has_k = true;
}

/*
 * Takes N_DOCS documents; returns 0 or the first error. *ret_checked: whether
 * the walk was in a window of epoch 0 after `w` (where the seeded start is
 * checked) with its seed checked and every start right.
 */
static int take(struct stream *s, const struct order_epoch *ep, uint32_t w, uint64_t *docs, bool *ret_checked)
{
	*ret_checked = false;
	for (int i = 0; i < N_DOCS; i++) {
		struct stream_piece piece;
		int r = stream_take(s, UINT64_MAX, &piece);
		if (r < 0)
			return r;
		docs[i] = piece.doc;
		struct stream_pos at = stream_tell(s);
		if (at.epoch == 0 && at.window > w && !*ret_checked)
			*ret_checked = !s->walk.ep.own_start && at.k == ep->win_start[at.window];
	}
	return 0;
}

/* Every shard counted, as other walks would. */
static void count_all(void)
{
	for (uint32_t i = 0; i < S; i++) {
		uint32_t n;
		count(NULL, i, &n);
	}
}

static void test_seed(bool shuffle)
{
	const struct order_params pk = known(shuffle);
	struct order_params pl = unknown(shuffle);
	const uint32_t w = 3;
	struct stream_pos pos;
	uint64_t want[N_DOCS], got[N_DOCS];
	struct order_epoch ep = { 0 };
	at_window(&pk, w, &pos, want, &ep);
	const uint64_t k = pos.k;
	order_epoch_clear(&ep);

	/* The right k_w: nothing before window w counted, the same documents; checked once they are. */
	reset_lazy();
	struct stream s;
	CHECK_INT(stream_init(&s, &pl, toks, RANK, R, false, false, &pos), 0);
	REQUIRE(order_epoch_build(&pk, 0, &ep) == 0, "epoch");
	for (uint32_t i = 0; i < w * W; i++)
		CHECK(!counted[ep.perm[i]], "shuffle %d: shard %u, before the cursor's window, was counted", shuffle,
		      ep.perm[i]);
	count_all();
	bool checked;
	CHECK_INT(take(&s, &ep, w, got, &checked), 0);
	CHECK(memcmp(got, want, sizeof(got)) == 0, "shuffle %d: the stream resumed with k_w differs", shuffle);
	CHECK(checked, "shuffle %d: the seeded start was not checked in the windows after it", shuffle);
	stream_clear(&s);

	/* Off by the world: the same stream, and the start corrected once the counts are known. */
	reset_lazy();
	struct stream_pos off = pos;
	off.k = k + R;
	CHECK_INT(stream_init(&s, &pl, toks, RANK, R, false, false, &off), 0);
	count_all();
	CHECK_INT(take(&s, &ep, w, got, &checked), 0);
	CHECK(memcmp(got, want, sizeof(got)) == 0, "shuffle %d: k_w off by the world changed the stream", shuffle);
	CHECK(checked, "shuffle %d: k_w off by the world not corrected in the windows after it", shuffle);
	stream_clear(&s);

	/* Off by one, the index unchanged: not a position of the rank, refused at once. */
	reset_lazy();
	off.k = k + 1;
	CHECK_INT(stream_init(&s, &pl, toks, RANK, R, false, false, &off), -EINVAL);

	/* Off by one with the index moved along: accepted (nothing tells yet), caught once the counts are known. */
	reset_lazy();
	off.index = pos.index >= 1 ? pos.index - 1 : pos.index + R - 1;
	CHECK_INT(stream_init(&s, &pl, toks, RANK, R, false, false, &off), 0);
	count_all();
	CHECK_INT(take(&s, &ep, w, got, &checked), -ERANGE);
	stream_clear(&s);

	/* Known counts: a wrong k_w is refused at once; one past any count the shards could hold too. */
	off = pos;
	off.k = k + R;
	CHECK_INT(stream_init(&s, &pk, toks, RANK, R, false, false, &off), -ERANGE);
	reset_lazy();
	off.k = (uint64_t)w * W * UINT32_MAX;
	CHECK_INT(stream_init(&s, &pl, toks, RANK, R, false, false, &off), -ERANGE);
	order_epoch_clear(&ep);
}

/*
 * A thread that must not count (the main loop's walks, issue #22): count()
 * says -EAGAIN for a shard not counted yet, and the walk asks for every
 * shard its window needs before it gives up, so that the pool counts them
 * all in one round: a resume's window (with k_w), or every window up to it
 * (without), nothing after it.
 */
static uint32_t lazy_wait[S];
static unsigned asked[S];
static bool may_count;

static int wait_count(void *ctx, uint32_t shard, uint32_t *ret)
{
	(void)ctx;
	asked[shard]++;
	if (!may_count && __atomic_load_n(&lazy_wait[shard], __ATOMIC_ACQUIRE) == ORDER_DOCS_UNKNOWN)
		return -EAGAIN;
	__atomic_store_n(&lazy_wait[shard], truth[shard], __ATOMIC_RELEASE);
	*ret = truth[shard];
	return 0;
}

static void test_wait_asks_every_shard(bool shuffle, bool with_k)
{
	const struct order_params pk = known(shuffle);
	struct order_params pw = pk;
	pw.shard_docs = lazy_wait;
	pw.count = wait_count;
	const uint32_t w = 3;
	struct stream_pos pos;
	uint64_t want[N_DOCS], got[N_DOCS];
	struct order_epoch ep = { 0 };
	at_window(&pk, w, &pos, want, &ep);
	pos.has_k = with_k;
	for (uint32_t i = 0; i < S; i++) {
		lazy_wait[i] = ORDER_DOCS_UNKNOWN;
		asked[i] = 0;
	}
	may_count = false;
	struct stream s;
	CHECK_INT(stream_init(&s, &pw, toks, RANK, R, false, false, &pos), -EAGAIN);
	const uint32_t lo = with_k ? w * W : 0, hi = (w + 1) * W;
	for (uint32_t i = 0; i < S; i++)
		CHECK((asked[ep.perm[i]] > 0) == (lo <= i && i < hi),
		      "shuffle %d, k_w %d: shard %u (place %u of the epoch) asked %u times, windows %u..%u wanted", shuffle,
		      with_k, ep.perm[i], i, asked[ep.perm[i]], lo / W, w);
	/* The pool counts what was asked; the open then goes on, and the stream is the uninterrupted one. */
	may_count = true;
	for (uint32_t i = lo; i < hi; i++) {
		uint32_t n;
		wait_count(NULL, ep.perm[i], &n);
	}
	may_count = false;
	CHECK_INT(stream_init(&s, &pw, toks, RANK, R, false, false, &pos), 0);
	may_count = true;
	bool checked;
	CHECK_INT(take(&s, &ep, w, got, &checked), 0);
	CHECK(memcmp(got, want, sizeof(got)) == 0, "shuffle %d, k_w %d: the stream opened after waiting differs", shuffle,
	      with_k);
	stream_clear(&s);
	order_epoch_clear(&ep);
}

int main(void)
{
	test_seed(false);
	test_seed(true);
	for (int k = 0; k < 2; k++) {
		test_wait_asks_every_shard(false, k);
		test_wait_asks_every_shard(true, k);
	}
	return unit_exit("test-order-seed");
}
