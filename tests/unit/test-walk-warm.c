/* SPDX-License-Identifier: MIT */
/*
 * A walk's warming (daemon/order/stream.c): which documents a stream tells
 * its source to prefetch, and when. An elastic session opens 1,024 virtual
 * streams and makes its first batch from a few of them; a stream opened
 * cold (stream_source.unsettled) must ask for its first document only until
 * its rows come up, and warming must never change the documents the stream
 * delivers (the contract, docs/sample-order.md).
 */
#include "daemon/order/order.h"
#include "daemon/order/stream.h"
#include "proto/macro.h"
#include "unit.h"

/* Permuted windows (list_max 1): the bijection's order, whose index reads are random. */
static const uint32_t docs[] = { 300, 250, 77 };
static uint32_t tok0[300], tok1[250], tok2[77];
static const uint32_t *const toks[] = { tok0, tok1, tok2 };

struct calls {
	unsigned n[2];      /* calls per stage */
	uint64_t last[2];   /* the last document asked for, per stage */
	uint64_t first[2];  /* the first one since the last reset */
};

static void reset(struct calls *c)
{
	*c = (struct calls){ .first = { UINT64_MAX, UINT64_MAX } };
}

static void record(void *userdata, uint64_t doc, unsigned stage)
{
	struct calls *c = userdata;
	if (c->first[stage] == UINT64_MAX)
		c->first[stage] = doc;
	c->last[stage] = doc;
	c->n[stage]++;
}

static int doc_count(void *userdata, uint64_t seq, uint64_t doc, uint64_t *ret_tokens, const int32_t **ret_ids)
{
	(void)userdata;
	(void)seq;
	*ret_tokens = toks[ORDER_DOC_SHARD(doc)][ORDER_DOC_INDEX(doc)];
	*ret_ids = NULL;
	return 0;
}

static int open_stream(struct stream *s, const struct order_params *p, struct calls *c, bool unsettled,
		       uint32_t rank, uint32_t world)
{
	struct stream_source src = { .doc = doc_count, .prefetch = record, .userdata = c, .unsettled = unsettled };
	reset(c);
	return stream_init_source(s, p, &src, rank, world, false, true, NULL);
}

static void test_cold_open(void)
{
	struct order_params p = { .seed = 7, .shuffle = true, .window = 2, .n_shards = 3, .shard_docs = docs,
				  .list_max = 1 };
	for (uint32_t world = 1; world <= 8; world *= 2) {
		/* A warm open (a rank's one stream): DOC_WALK_AHEAD documents ahead, half of them at stage 1 too. */
		struct stream warm;
		struct calls cw;
		struct stream_source src = { .doc = doc_count, .prefetch = record, .userdata = &cw };
		reset(&cw);
		CHECK_INT(stream_init_source(&warm, &p, &src, 0, world, false, true, NULL), 0);
		CHECK(warm.walk.win.permuted, "world %u: window not permuted", world);
		CHECK(!warm.walk.cold, "world %u: a warm open left the walk cold", world);
		CHECK_INT(cw.n[0], MIN((size_t)DOC_WALK_AHEAD, warm.walk.n_docs));
		CHECK_INT(cw.n[1], MIN((size_t)DOC_WALK_AHEAD / 2 + 1, warm.walk.n_docs));
		CHECK(warm.known, "world %u: a warm open settles its first document", world);

		/* A cold one: its first document alone, unsettled until the caller settles it. */
		struct stream cold;
		struct calls cc;
		reset(&cc);
		src = (struct stream_source){ .doc = doc_count, .prefetch = record, .userdata = &cc, .unsettled = true };
		CHECK_INT(stream_init_source(&cold, &p, &src, 0, world, false, true, NULL), 0);
		uint64_t first = doc_walk_doc(&cold.walk);
		CHECK(cold.walk.cold, "world %u: not cold", world);
		CHECK(!cold.known, "world %u: settled though unsettled was asked", world);
		CHECK_INT(cc.n[0], 1);
		CHECK_INT(cc.n[1], 0);
		CHECK_U64(cc.last[0], first);
		doc_walk_warm(&cold.walk, WALK_WARM_FIRST);
		CHECK_INT(cc.n[1], 1);
		CHECK_U64(cc.last[1], first);
		CHECK_INT(stream_settle(&cold), 0);
		CHECK_INT(cc.n[0] + cc.n[1], 2); /* settling the first document asks for nothing more */

		/* Ahead: stage 0 of every document computed, still cold; all: both stages, warm from then on. */
		doc_walk_warm(&cold.walk, WALK_WARM_AHEAD);
		CHECK_INT(cc.n[0], 1 + MIN((size_t)DOC_WALK_AHEAD, cold.walk.n_docs));
		CHECK(cold.walk.cold, "world %u: ahead made the walk warm", world);
		reset(&cc);
		doc_walk_warm(&cold.walk, WALK_WARM_ALL);
		CHECK(!cold.walk.cold, "world %u: still cold after all", world);
		CHECK_INT(cc.n[0], cw.n[0]);
		CHECK_INT(cc.n[1], cw.n[1]);
		CHECK_U64(cc.first[0], first);
		doc_walk_warm(&cold.walk, WALK_WARM_ALL);
		CHECK_INT(cc.n[0], cw.n[0]); /* a warm walk: nothing */

		/* The same documents, in the same order, whatever the warming. */
		for (int i = 0; i < 400; i++) {
			struct stream_piece a, b;
			int ra = stream_take(&warm, 5, &a), rb = stream_take(&cold, 5, &b);
			CHECK_INT(rb, ra);
			if (ra < 0 || rb < 0)
				break;
			CHECK(a.doc == b.doc && a.offset == b.offset && a.count == b.count,
			      "world %u, piece %d: doc %" PRIx64 "+%" PRIu64 " against %" PRIx64 "+%" PRIu64, world, i, b.doc,
			      b.offset, a.doc, a.offset);
		}
		stream_clear(&warm);
		stream_clear(&cold);
	}
}

/* A cold stream that moves without being warmed (its rows came first): its first step warms it whole. */
static void test_cold_step(void)
{
	struct order_params p = { .seed = 3, .shuffle = true, .window = 3, .n_shards = 3, .shard_docs = docs,
				  .list_max = 1 };
	struct stream s, ref;
	struct calls c, cr;
	CHECK_INT(open_stream(&s, &p, &c, true, 1, 4), 0);
	CHECK_INT(open_stream(&ref, &p, &cr, false, 1, 4), 0);
	CHECK_INT(stream_settle(&s), 0);
	reset(&c);
	struct stream_piece a, b;
	uint64_t len = s.length;
	CHECK_INT(stream_take(&s, len, &a), 0); /* the whole first document: the walk steps */
	CHECK(!s.walk.cold, "a step left the walk cold");
	CHECK(c.n[0] + 1 >= MIN((size_t)DOC_WALK_AHEAD, s.walk.n_docs), "the first step asked for %u documents", c.n[0]);
	CHECK(c.n[1] + 1 >= MIN((size_t)DOC_WALK_AHEAD / 2, s.walk.n_docs), "the first step warmed %u documents", c.n[1]);
	CHECK_INT(stream_take(&ref, len, &b), 0);
	CHECK_U64(a.doc, b.doc);
	for (int i = 0; i < 300; i++) {
		int ra = stream_take(&ref, 3, &b), rs = stream_take(&s, 3, &a);
		CHECK_INT(rs, ra);
		if (ra < 0 || rs < 0)
			break;
		CHECK(a.doc == b.doc && a.offset == b.offset, "piece %d differs", i);
	}
	stream_clear(&s);
	stream_clear(&ref);
}

int main(void)
{
	for (uint32_t i = 0; i < 300; i++)
		tok0[i] = 1 + i % 7;
	for (uint32_t i = 0; i < 250; i++)
		tok1[i] = i % 5; /* empty documents too */
	for (uint32_t i = 0; i < 77; i++)
		tok2[i] = 2 + i % 3;
	test_cold_open();
	test_cold_step();
	return unit_exit("test-walk-warm");
}
