/* SPDX-License-Identifier: MIT */
/*
 * The sample-order contract (docs/sample-order.md): which documents an epoch
 * visits, in what order, and which rank owns each. Pure functions of the
 * feed's shard list, seed, shuffle flag and shuffle window; no I/O.
 *
 * Documents are named by packed 64-bit ids: shard << 32 | document.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORDER_DOC(s, d) (((uint64_t)(s) << 32) | (uint64_t)(d))
#define ORDER_DOC_SHARD(id) ((uint32_t)((id) >> 32))
#define ORDER_DOC_INDEX(id) ((uint32_t)(id))

/* splitmix64's finaliser: the contract's mix(). */
static inline uint64_t order_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= UINT64_C(0xBF58476D1CE4E5B9);
	x ^= x >> 27;
	x *= UINT64_C(0x94D049BB133111EB);
	x ^= x >> 31;
	return x;
}

struct order_rng {
	uint64_t key;
	uint64_t counter;
};

static inline struct order_rng order_rng_init(uint64_t key)
{
	return (struct order_rng){ .key = key, .counter = 0 };
}

static inline uint64_t order_rng_next(struct order_rng *r)
{
	r->counter++;
	return order_mix(r->key + r->counter * UINT64_C(0x9E3779B97F4A7C15));
}

/* The contract's shuffle (Fisher-Yates from the top, j = below(i + 1)). */
void order_shuffle_u32(uint32_t *a, size_t n, struct order_rng *rng);
void order_shuffle_u64(uint64_t *a, size_t n, struct order_rng *rng);

/*
 * Shuffled windows kept for reuse by the many streams of one owner (the
 * virtual streams a rank serves, docs/sample-order.md section 17, each deal
 * their share of the same window): without it each would shuffle the whole
 * window itself. Used from one thread only.
 */
#define ORDER_WINDOW_CACHE 4
struct order_window_cache {
	struct {
		uint64_t key;  /* the epoch's key */
		uint32_t w;
		uint64_t *all; /* the window's shuffled list, NULL: empty entry */
		uint64_t n, used;
	} e[ORDER_WINDOW_CACHE];
	uint64_t tick;
};
void order_window_cache_clear(struct order_window_cache *c);

/* What the order depends on. shard_docs[s] = documents in shard s. */
struct order_params {
	uint64_t seed;
	bool shuffle;
	uint32_t window; /* shards per shuffle window, >= 1 */
	uint32_t n_shards;
	const uint32_t *shard_docs;
	struct order_window_cache *cache; /* NULL, or shuffled windows shared by streams of one thread */
};

/* One epoch's shard permutation and where each window starts in the epoch's order. */
struct order_epoch {
	uint64_t epoch;
	uint64_t key;        /* K = mix(seed ^ mix(e + 1)) */
	uint32_t n_windows;
	uint32_t *perm;      /* n_shards entries: P */
	uint64_t *win_start; /* n_windows + 1 entries: k of each window's first document */
};

/* Fills *ep for epoch e (freeing what it held). Returns 0 or -ENOMEM. */
int order_epoch_build(const struct order_params *p, uint64_t e, struct order_epoch *ep);
void order_epoch_clear(struct order_epoch *ep);

/*
 * The documents of window w that belong to `rank` of `world`, in epoch order:
 * window index i_first, i_first + world, ... Returns 0 and a malloc'd array
 * (caller frees) with its length, the window index of its first entry, and
 * the window's total document count; -ENOMEM.
 */
int order_window_rank_docs(const struct order_params *p, const struct order_epoch *ep, uint32_t w,
			   uint32_t rank, uint32_t world, uint64_t **ret_docs, size_t *ret_n,
			   uint64_t *ret_first_index, uint64_t *ret_window_docs);
