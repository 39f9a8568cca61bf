/* SPDX-License-Identifier: MIT */
/*
 * Mixtures (daemon/order/mix.h, docs/sample-order.md section 14): the
 * `sources` syntax and its errors, exact shares from decimal weights, and
 * what a user relies on: the realised proportions follow the weights at every
 * point of the stream (within 1 + log2(k + 1) documents after k documents),
 * the seed changes the interleaving but not the proportions, and the choice
 * for document k needs nothing but k.
 *
 * With --driver, reads "SEED N UNITS... K" lines and prints the sources of
 * documents 0 .. K-1, and "weight TEXT" lines and prints the units or
 * "invalid" (tests/unit/test-packing-ref.py compares both with the Python
 * reference).
 */
#include <math.h>

#include "daemon/order/mix.h"
#include "order-ref.h"
#include "proto/macro.h"
#include "unit.h"

static void test_weights(void)
{
	static const struct {
		const char *text;
		uint64_t units; /* 0: invalid */
	} cases[] = {
		{ "0.7", 700000000 },     { "1", 1000000000 },   { "12.5", 12500000000 }, { "0.000000001", 1 },
		{ "1000000", UINT64_C(1000000000000000) },   { "007", 7000000000 },     { "0.1234567890", 0 },
		{ "0", 0 },               { "0.0", 0 },          { "1000000.000000001", 0 }, { "1e3", 0 },
		{ "-1", 0 },              { ".5", 0 },           { "5.", 0 },             { "", 0 },
		{ "0x10", 0 },            { "1 2", 0 },          { "99999999999999999999", 0 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		uint64_t u = 12345;
		int r = mix_parse_weight(cases[i].text, &u);
		if (cases[i].units) {
			CHECK(r == 0 && u == cases[i].units, "weight '%s': r = %d, units %" PRIu64 ", expected %" PRIu64,
			      cases[i].text, r, u, cases[i].units);
		} else {
			CHECK(r == -EINVAL, "weight '%s' accepted (%" PRIu64 " units)", cases[i].text, u);
			CHECK_U64(u, 12345); /* outputs are written only on success */
		}
	}
}

static void test_parse(void)
{
	struct mix_spec s;
	char err[256] = "";
	CHECK_INT(mix_parse("web:0.7, code:0.2,books : 0.1 ", &s, err, sizeof(err)), 0);
	CHECK_INT(s.n, 3);
	CHECK_STR(s.names[0], "web");
	CHECK_STR(s.names[2], "books");
	CHECK_U64(s.units[0], 700000000);
	CHECK_U64(s.units[1], 200000000);
	CHECK_U64(s.units[2], 100000000);

	static const struct {
		const char *text, *msg;
	} bad[] = {
		{ "web:0.7, code", "entry 2 ('code') is not name:weight" },
		{ "web:0.7,, code:1", "entry 2 ('') is not name:weight" },
		{ "web:0.7, code:0", "entry 2 ('code:0'): weight '0' is not a decimal number" },
		{ "web:0.7, :1", "entry 2 (':1'): the name must be 1 to 63 characters" },
		{ "web:1, we b:1", "entry 2 ('we b:1'): ' ' is not allowed in a source name" },
		{ "web:1, web:2", "entry 2: source 'web' is named twice" },
		{ "a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1", "more than 8 sources" },
		{ "", "entry 1 ('') is not name:weight" },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		err[0] = 0;
		CHECK_INT(mix_parse(bad[i].text, &s, err, sizeof(err)), -EINVAL);
		CHECK_CONTAINS(err, bad[i].msg);
	}
}

static void test_bounds(void)
{
	struct mix m;
	uint64_t half[] = { 1, 1 };
	CHECK_INT(mix_init(0, half, 2, &m), 0);
	CHECK_U64(m.bound[0], UINT64_C(1) << 63);
	uint64_t thirds[] = { 1, 1, 1 };
	CHECK_INT(mix_init(0, thirds, 3, &m), 0);
	CHECK_U64(m.bound[0], UINT64_C(0x5555555555555555));
	CHECK_U64(m.bound[1], UINT64_C(0xAAAAAAAAAAAAAAAA));
	/* x_0 = mix(seed ^ "mixture1"), each next one G further. */
	CHECK_U64(m.u0, ref_mix(0 ^ MIX_TAG));

	uint64_t one[] = { 5 };
	CHECK_INT(mix_init(1, one, 1, &m), 0);
	for (uint64_t k = 0; k < 1000; k++)
		CHECK_INT(mix_source(&m, k), 0);
	CHECK_INT(mix_init(1, one, 0, &m), -EINVAL);
	uint64_t zero[] = { 1, 0 };
	CHECK_INT(mix_init(1, zero, 2, &m), -EINVAL);
	uint64_t nine[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	CHECK_INT(mix_init(1, nine, 9, &m), -EINVAL);
}

/* Counts of each source after every k stay within 1 + log2(k + 1) of k * weight. */
static void check_convergence(uint64_t seed, const uint64_t *units, uint32_t n, uint64_t K)
{
	struct mix m;
	CHECK_INT(mix_init(seed, units, n, &m), 0);
	uint64_t count[MIX_MAX_SOURCES] = { 0 }, total = 0;
	for (uint32_t i = 0; i < n; i++)
		total += units[i];
	double worst = 0;
	for (uint64_t k = 1; k <= K; k++) {
		count[mix_source(&m, k - 1)]++;
		double bound = 1 + log2((double)k + 1);
		for (uint32_t i = 0; i < n; i++) {
			double dev = fabs((double)count[i] - (double)k * (double)units[i] / (double)total);
			worst = fmax(worst, dev);
			if (dev > bound) {
				unit_fail(__FILE__, __LINE__,
					  "seed %" PRIu64 ": after %" PRIu64 " documents source %u has %" PRIu64
					  ", expected %.1f +- %.1f",
					  seed, k, i, count[i], (double)k * (double)units[i] / (double)total, bound);
				return;
			}
		}
	}
	/* The measured worst case is a few documents; log2 bound is loose on purpose. */
	printf("seed %" PRIu64 ", %u sources: worst deviation %.2f documents over %" PRIu64 "\n", seed, n, worst, K);
}

static void test_convergence(void)
{
	uint64_t web[] = { 700000000, 200000000, 100000000 };
	check_convergence(0, web, 3, 1000000);
	check_convergence(UINT64_MAX, web, 3, 200000);
	uint64_t skew[] = { 1, 1000000 };
	check_convergence(5, skew, 2, 200000);
	uint64_t eight[] = { 3, 1, 4, 1, 5, 9, 2, 6 };
	check_convergence(77, eight, 8, 200000);
	uint64_t odd[] = { 333333333, 1, 123456789012 };
	check_convergence(12, odd, 3, 200000);
}

static void test_seed(void)
{
	uint64_t w[] = { 1, 1, 1 };
	struct mix a, b, a2;
	CHECK_INT(mix_init(1, w, 3, &a), 0);
	CHECK_INT(mix_init(2, w, 3, &b), 0);
	CHECK_INT(mix_init(1, w, 3, &a2), 0);
	unsigned differ = 0;
	for (uint64_t k = 0; k < 1000; k++) {
		differ += mix_source(&a, k) != mix_source(&b, k);
		CHECK(mix_source(&a, k) == mix_source(&a2, k), "same seed, different source at k = %" PRIu64, k);
	}
	CHECK(differ > 100, "seeds 1 and 2 pick the same source for %u of 1000 documents", 1000 - differ);
	/* k far out costs the same as k = 0: a cursor needs only k. */
	uint64_t k = UINT64_C(1) << 62;
	uint64_t x = a.u0 + k * MIX_STEP;
	uint32_t want = x < a.bound[0] ? 0 : x < a.bound[1] ? 1 : 2;
	CHECK_INT(mix_source(&a, k), want);
}

static int driver(void)
{
	char word[64];
	while (scanf("%63s", word) == 1) {
		if (strcmp(word, "weight") == 0) {
			char text[64];
			uint64_t u;
			if (scanf("%63s", text) != 1)
				return 2;
			if (mix_parse_weight(text, &u) == 0)
				printf("%" PRIu64 "\n", u);
			else
				puts("invalid");
			continue;
		}
		uint64_t seed = strtoull(word, NULL, 10), units[MIX_MAX_SOURCES], K;
		uint32_t n;
		if (scanf("%u", &n) != 1 || n < 1 || n > MIX_MAX_SOURCES)
			return 2;
		for (uint32_t i = 0; i < n; i++)
			if (scanf("%" SCNu64, &units[i]) != 1)
				return 2;
		if (scanf("%" SCNu64, &K) != 1)
			return 2;
		struct mix m;
		if (mix_init(seed, units, n, &m) < 0)
			return 2;
		for (uint64_t k = 0; k < K; k++)
			putchar('0' + (int)mix_source(&m, k));
		putchar('\n');
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--driver") == 0)
		return driver();
	test_weights();
	test_parse();
	test_bounds();
	test_convergence();
	test_seed();
	return unit_exit("test-mix");
}
