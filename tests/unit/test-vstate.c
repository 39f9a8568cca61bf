/* SPDX-License-Identifier: MIT */
/*
 * Elastic states (proto/vstate.h, docs/sample-order.md section 17.5): what
 * a job checkpoints to resume with another world. A state must round-trip
 * exactly, the piecewise writer must write the same text, a damaged or
 * inconsistent state must never parse, and merging must take every rank
 * once and nothing else.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/vstate.h"
#include "unit.h"

static struct vstate_stream entry(uint32_t v, uint32_t ns, uint64_t seed)
{
	struct vstate_stream e = { .v = v, .n_sources = ns };
	for (unsigned k = 0; k < vstate_fields(ns); k++)
		e.f[k] = seed * (k + 1) + (k == 0 ? 1 : 0) + (seed % 3 == 0 ? UINT64_MAX - k : 0);
	return e;
}

static char *format(const struct vstate *st)
{
	char *text = NULL;
	int n = vstate_format(st, &text);
	CHECK(n > 0 && text && (size_t)n == strlen(text), "vstate_format returned %d", n);
	return text;
}

static void test_round_trip(uint32_t ns)
{
	struct vstate_stream s[5] = { entry(1, ns, 7), entry(4, ns, 9), entry(7, ns, 3), entry(10, ns, 0),
				      entry(13, ns, 123456789) };
	struct vstate st = { .fingerprint = 0x0123456789abcdefULL, .vranks = 16, .world = 3, .rank = 1, .batch = 42,
			     .n = 5, .s = s };
	char *text = format(&st);
	REQUIRE(text, "no text");
	CHECK(strncmp(text, "fv1-0123456789abcdef-10-3-1-2a-5-", 33) == 0, "head of \"%.60s\"", text);
	CHECK(strspn(text + 3, "0123456789abcdef-") == strlen(text + 3), "\"%s\" holds other characters", text);

	struct vstate back;
	CHECK_INT(vstate_parse(text, &back), 0);
	CHECK(back.fingerprint == st.fingerprint && back.vranks == 16 && back.world == 3 && back.rank == 1 &&
	      back.batch == 42 && back.n == 5, "header differs");
	for (size_t i = 0; i < back.n && i < 5; i++) {
		CHECK(back.s[i].v == s[i].v && back.s[i].n_sources == ns, "entry %zu", i);
		CHECK(memcmp(back.s[i].f, s[i].f, vstate_fields(ns) * sizeof(uint64_t)) == 0, "entry %zu fields", i);
	}

	/* The piecewise writer (a session keeps each stream's entry) writes the same text. */
	char buf[4096];
	int n = vstate_format_head(&st, buf, sizeof(buf));
	for (size_t i = 0; n > 0 && i < 5; i++) {
		int k = vstate_format_entry(&s[i], buf + n, sizeof(buf) - (size_t)n);
		n = k < 0 ? k : n + k;
	}
	if (n > 0)
		n = vstate_format_check(buf, (size_t)n, sizeof(buf));
	CHECK(n > 0 && strcmp(buf, text) == 0, "piecewise \"%s\" differs from \"%s\"", buf, text);
	CHECK_INT(vstate_format_head(&st, buf, 10), -ENOBUFS);

	/* Every single character changed: never parses. */
	size_t len = strlen(text);
	for (size_t i = 0; i < len; i++) {
		char *bad = strdup(text);
		bad[i] = bad[i] == '0' ? '1' : bad[i] == '-' ? '0' : '0';
		struct vstate d;
		int r = vstate_parse(bad, &d);
		CHECK(r == -EINVAL, "\"%s\" (character %zu changed) parsed", bad, i);
		if (r == 0)
			vstate_clear(&d);
		free(bad);
	}
	/* Truncated anywhere: never parses. */
	for (size_t i = 0; i < len; i++) {
		char *bad = strndup(text, i);
		struct vstate d;
		int r = vstate_parse(bad, &d);
		CHECK(r == -EINVAL, "\"%s\" (truncated) parsed", bad);
		if (r == 0)
			vstate_clear(&d);
		free(bad);
	}
	vstate_clear(&back);
	free(text);
}

/* A state with a valid check that breaks a rule. */
static void rejected(const char *why, struct vstate *st)
{
	char *text = NULL;
	if (vstate_format(st, &text) < 0)
		return; /* not even writable: fine */
	struct vstate d;
	int r = vstate_parse(text, &d);
	CHECK(r == -EINVAL, "%s: \"%s\" parsed", why, text);
	if (r == 0)
		vstate_clear(&d);
	free(text);
}

/*
 * The <kw> list (issue #22): round-trips, written piecewise the same, all
 * or nothing (an entry without k_w drops the list), and merged with the
 * entries it belongs to.
 */
static void test_kw(uint32_t ns)
{
	struct vstate_stream s[3] = { entry(2, ns, 5), entry(5, ns, 8), entry(8, ns, 13) };
	for (unsigned i = 0; i < 3; i++) {
		s[i].has_kw = true;
		for (unsigned k = 0; k < vstate_kws(ns); k++)
			s[i].kw[k] = i == 2 ? UINT64_MAX - k : 1000 * i + k;
	}
	struct vstate st = { .fingerprint = 9, .vranks = 12, .world = 3, .rank = 2, .batch = 7, .n = 3, .s = s };
	char *text = format(&st);
	REQUIRE(text, "no text");
	struct vstate back;
	CHECK_INT(vstate_parse(text, &back), 0);
	for (size_t i = 0; i < back.n && i < 3; i++) {
		CHECK(back.s[i].has_kw && memcmp(back.s[i].kw, s[i].kw, vstate_kws(ns) * sizeof(uint64_t)) == 0 &&
		      memcmp(back.s[i].f, s[i].f, vstate_fields(ns) * sizeof(uint64_t)) == 0,
		      "entry %zu of \"%s\" with k_w", i, text);
	}
	vstate_clear(&back);

	char buf[4096];
	int n = vstate_format_head(&st, buf, sizeof(buf));
	for (size_t i = 0; n > 0 && i < 3; i++) {
		int k = vstate_format_entry(&s[i], buf + n, sizeof(buf) - (size_t)n);
		n = k < 0 ? k : n + k;
	}
	for (size_t i = 0; n > 0 && i < 3; i++) {
		int k = vstate_format_kw(&s[i], buf + n, sizeof(buf) - (size_t)n);
		n = k < 0 ? k : n + k;
	}
	if (n > 0)
		n = vstate_format_check(buf, (size_t)n, sizeof(buf));
	CHECK(n > 0 && strcmp(buf, text) == 0, "piecewise \"%s\" differs from \"%s\"", buf, text);
	CHECK(strlen(text) < vstate_max_len(3, ns), "\"%s\" is longer than vstate_max_len", text);

	/* Truncated anywhere (a k_w short): never parses. */
	for (size_t i = 0; i < strlen(text); i++) {
		char *bad = strndup(text, i);
		struct vstate d;
		int r = vstate_parse(bad, &d);
		CHECK(r == -EINVAL, "\"%s\" (truncated) parsed", bad);
		if (r == 0)
			vstate_clear(&d);
		free(bad);
	}
	free(text);

	/* One entry without k_w: no list at all (the resume counts), the entries unchanged. */
	s[1].has_kw = false;
	text = format(&st);
	CHECK_INT(vstate_parse(text, &back), 0);
	for (size_t i = 0; i < back.n; i++)
		CHECK(!back.s[i].has_kw, "entry %zu of \"%s\" has k_w", i, text);
	vstate_clear(&back);
	free(text);
	s[1].has_kw = true;

	/* Merged with its entries: rank 2's with k_w, ranks 0 and 1 likewise. */
	struct vstate_stream a[1] = { entry(0, ns, 1) }, b[1] = { entry(1, ns, 2) };
	a[0].has_kw = b[0].has_kw = true;
	a[0].kw[0] = 11;
	b[0].kw[0] = 22;
	struct vstate parts[3] = { st, st, st };
	parts[0].rank = 0, parts[0].n = 1, parts[0].s = a;
	parts[1].rank = 1, parts[1].n = 1, parts[1].s = b;
	struct vstate g;
	char err[256];
	CHECK_INT(vstate_merge(parts, 3, &g, err, sizeof(err)), 0);
	text = format(&g);
	CHECK_INT(vstate_parse(text, &back), 0);
	CHECK(back.n == 5 && back.s[0].has_kw && back.s[0].kw[0] == 11 && back.s[1].kw[0] == 22 &&
	      back.s[4].v == 8 && back.s[4].kw[0] == s[2].kw[0], "merged \"%s\"", text);
	vstate_clear(&back);
	vstate_clear(&g);
	free(text);
}

static void test_rules(void)
{
	struct vstate_stream s[2] = { entry(1, 0, 1), entry(4, 0, 2) };
	struct vstate st = { .fingerprint = 1, .vranks = 16, .world = 3, .rank = 1, .batch = 1, .n = 2, .s = s };
	struct vstate t = st;
	t.rank = 3;
	rejected("rank >= world", &t);
	t = st;
	t.world = 17;
	rejected("world > V", &t);
	t = st;
	t.vranks = 0;
	rejected("V = 0", &t);
	t = st;
	t.rank = 2;
	rejected("an entry of another rank (v mod world != rank)", &t);
	t = st;
	t.world = 0;
	t.rank = 1;
	rejected("a global state with rank 1", &t);
	t = st;
	t.vranks = 4;
	rejected("an entry past V", &t);
	struct vstate_stream dup[2] = { entry(4, 0, 1), entry(4, 0, 2) };
	t = st;
	t.s = dup;
	char *text = NULL;
	CHECK_INT(vstate_format(&t, &text), -EINVAL); /* entries out of order or twice */
	free(text);
	struct vstate d;
	CHECK_INT(vstate_parse("fc1-0000000000000001-1-0-0-0-0-0-0-00000000", &d), -EINVAL);
	CHECK_INT(vstate_parse("", &d), -EINVAL);
}

static void test_merge(void)
{
	struct vstate_stream a[2] = { entry(0, 0, 1), entry(2, 0, 2) }, b[1] = { entry(1, 0, 3) };
	struct vstate st[2] = {
		{ .fingerprint = 5, .vranks = 4, .world = 2, .rank = 0, .batch = 7, .n = 2, .s = a },
		{ .fingerprint = 5, .vranks = 4, .world = 2, .rank = 1, .batch = 9, .n = 1, .s = b },
	};
	char err[256];
	struct vstate g;
	CHECK_INT(vstate_merge(st, 2, &g, err, sizeof(err)), 0);
	CHECK(g.world == 0 && g.rank == 0 && g.batch == 9 && g.n == 3 && g.s[0].v == 0 && g.s[1].v == 1 &&
	      g.s[2].v == 2, "merged state");
	/* A global state merged alone is itself; with others it is refused. */
	struct vstate again;
	CHECK_INT(vstate_merge(&g, 1, &again, err, sizeof(err)), 0);
	CHECK(again.n == 3 && again.world == 0, "global state merged again");
	vstate_clear(&again);
	struct vstate mixed[2] = { g, st[1] };
	CHECK_INT(vstate_merge(mixed, 2, &again, err, sizeof(err)), -EINVAL);
	vstate_clear(&g);

	struct vstate one[1] = { st[0] };
	CHECK_INT(vstate_merge(one, 1, &g, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "every rank's state is needed");
	struct vstate twice[2] = { st[0], st[0] };
	CHECK_INT(vstate_merge(twice, 2, &g, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "given twice");
	struct vstate other[2] = { st[0], st[1] };
	other[1].fingerprint = 6;
	CHECK_INT(vstate_merge(other, 2, &g, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "another feed");
	other[1] = st[1];
	other[1].world = 3;
	CHECK_INT(vstate_merge(other, 2, &g, err, sizeof(err)), -EINVAL);
}

int main(void)
{
	test_round_trip(0);
	test_round_trip(3);
	test_round_trip(VSTATE_MAX_SOURCES);
	test_kw(0);
	test_kw(2);
	test_kw(VSTATE_MAX_SOURCES);
	test_rules();
	test_merge();
	return unit_exit("test-vstate");
}
