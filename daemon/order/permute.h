/* SPDX-License-Identifier: MIT */
/*
 * The contract's keyed bijection of [0, n) (docs/sample-order.md, section
 * 3.1): the order of a shuffle window too large to hold as a list. A
 * balanced Feistel network of ORDER_PERM_ROUNDS rounds over the smallest
 * power of 4 that holds n, cycle-walked back into [0, n). Evaluated per
 * index in O(1) time and memory: nothing per document is held.
 */
#pragma once

#include <stdint.h>

#include "daemon/order/rng.h"

#define ORDER_PERM_ROUNDS 8

struct order_perm {
	uint64_t n;
	uint32_t half;  /* bits per Feistel half: 4^half >= n, the least such */
	uint64_t mask;  /* (1 << half) - 1 */
	uint64_t key[ORDER_PERM_ROUNDS]; /* round keys: the first draws of RNG(window key) */
};

/* The bijection of [0, n) keyed by `key` (the window's generator key). */
void order_perm_init(struct order_perm *p, uint64_t n, uint64_t key);

/* One pass of the network over [0, 4^half). */
static inline uint64_t order_perm_feistel(const struct order_perm *p, uint64_t x)
{
	uint64_t l = x >> p->half, r = x & p->mask;
	for (int k = 0; k < ORDER_PERM_ROUNDS; k++) {
		uint64_t t = l ^ (order_mix(r ^ p->key[k]) & p->mask);
		l = r;
		r = t;
	}
	return (l << p->half) | r;
}

/*
 * Entry i (< n) of the permuted list: which entry of the unshuffled list
 * stands at position i. ORDER_PERM_ROUNDS mixes per pass, fewer than 4
 * passes expected (4^half < 4 n).
 */
static inline uint64_t order_perm_at(const struct order_perm *p, uint64_t i)
{
	uint64_t x = i;
	do
		x = order_perm_feistel(p, x);
	while (x >= p->n);
	return x;
}
