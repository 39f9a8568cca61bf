/* SPDX-License-Identifier: MIT */
/*
 * The keyed bijection of a large shuffle window (docs/sample-order.md,
 * section 3.1). Only the setup lives here; evaluation is inline in permute.h.
 */
#include "daemon/order/permute.h"

void order_perm_init(struct order_perm *p, uint64_t n, uint64_t key)
{
	/* The least half with 4^half >= n: twice half covers the bits of n - 1. */
	uint32_t bits = n > 1 ? 64 - (uint32_t)__builtin_clzll(n - 1) : 0;
	*p = (struct order_perm){ .n = n, .half = (bits + 1) / 2 };
	p->mask = (UINT64_C(1) << p->half) - 1;
	struct order_rng rng = order_rng_init(key);
	for (int k = 0; k < ORDER_PERM_ROUNDS; k++)
		p->key[k] = order_rng_next(&rng);
}
