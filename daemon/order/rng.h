/* SPDX-License-Identifier: MIT */
/* The contract's mix() and generator RNG(key) (docs/sample-order.md, section 2). */
#pragma once

#include <stdint.h>

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
