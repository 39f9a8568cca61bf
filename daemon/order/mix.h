/* SPDX-License-Identifier: MIT */
/*
 * Mixtures of sources (docs/sample-order.md, section 14): which source the
 * k-th document of a rank's mixed stream comes from.
 *
 * A golden-ratio Weyl sequence over the unit interval cut in proportion to
 * the weights: x_k = u0 + k * G (mod 2^64), and document k comes from the
 * source whose share of [0, 2^64) holds x_k. It is a pure function of the
 * seed, the weights and k (O(1) for any k, so a cursor only needs k); the
 * count of any source among the first k documents stays within a few
 * documents of k * weight (bounded discrepancy, section 14.2), where an
 * independent random draw drifts by about sqrt(k).
 *
 * Weights are exact decimal fixed-point numbers (units of 1e-9), so the
 * shares are computed with integers only and any implementation gets the
 * same bounds. A struct mix is a plain value: no allocation, any number of
 * threads may read it.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define MIX_MAX_SOURCES 8
#define MIX_NAME_MAX 63                         /* characters in a source name */
#define MIX_UNITS_PER_WEIGHT UINT64_C(1000000000) /* a weight of 1 */
#define MIX_WEIGHT_MAX_UNITS (UINT64_C(1000000) * MIX_UNITS_PER_WEIGHT)
#define MIX_TAG UINT64_C(0x6D69787475726531)    /* "mixture1": u0 = mix(seed ^ MIX_TAG) */
#define MIX_STEP UINT64_C(0x9E3779B97F4A7C15)   /* G = floor(2^64 / golden ratio), odd */

/* A parsed `sources` value. */
struct mix_spec {
	uint32_t n;
	char names[MIX_MAX_SOURCES][MIX_NAME_MAX + 1];
	uint64_t units[MIX_MAX_SOURCES]; /* weight in units of 1e-9, 1 .. MIX_WEIGHT_MAX_UNITS */
};

struct mix {
	uint32_t n;
	uint64_t u0;                      /* x_0 */
	uint64_t bound[MIX_MAX_SOURCES];  /* source i holds [bound[i-1], bound[i]); bound[n-1] stands for 2^64 */
	uint64_t units[MIX_MAX_SOURCES];
};

/*
 * Parses a weight: a decimal number with at most 9 digits after the point
 * ("0.7", "3", "12.5"), above 0 and at most 1000000. Returns 0 and the
 * weight in units of 1e-9, or -EINVAL.
 */
int mix_parse_weight(const char *text, uint64_t *ret_units);

/*
 * Parses `name:weight, name:weight, ...` (1 to MIX_MAX_SOURCES entries;
 * spaces around entries, names and weights are ignored; names are 1 to 63
 * characters from A-Z a-z 0-9 _ - . and distinct). Returns 0, or -EINVAL
 * with one line in err naming the entry (1-based) and what is wrong with it.
 */
int mix_parse(const char *text, struct mix_spec *ret, char *err, size_t errlen);

/* Sets *ret up for `seed` and weights units[0 .. n-1]. Returns 0, or -EINVAL (n outside 1 .. MIX_MAX_SOURCES, a weight outside its range). */
int mix_init(uint64_t seed, const uint64_t *units, uint32_t n, struct mix *ret);

/* The source of the k-th document (k from 0) of the mixed stream. */
static inline uint32_t mix_source(const struct mix *m, uint64_t k)
{
	uint64_t x = m->u0 + k * MIX_STEP;
	uint32_t i = 0;
	while (i + 1 < m->n && x >= m->bound[i])
		i++;
	return i;
}
