/* SPDX-License-Identifier: MIT */
/*
 * Cursor text (daemon/order/cursor.h): what a trainer stores in its
 * checkpoint and hands back to resume. It must round-trip exactly, stay
 * shell-safe, and never parse when it was mistyped or malformed, since a
 * wrongly accepted cursor silently resumes from the wrong data.
 */
#include "daemon/order/cursor.h"
#include "daemon/order/order.h"
#include "proto/ring_abi.h"
#include "unit.h"

static bool cursor_equal(const struct cursor *a, const struct cursor *b)
{
	return a->fingerprint == b->fingerprint && a->world == b->world && a->rank == b->rank &&
	       a->batch == b->batch && a->pos.epoch == b->pos.epoch && a->pos.window == b->pos.window &&
	       a->pos.index == b->pos.index && a->pos.offset == b->pos.offset && a->has_data == b->has_data &&
	       (!a->has_data || a->data == b->data);
}

static void round_trip(const struct cursor *c)
{
	char text[FEED_CURSOR_MAX];
	int n = cursor_format(c, text, sizeof(text));
	CHECK(n > 0 && (size_t)n == strlen(text), "cursor_format returned %d for \"%s\"", n, text);
	if (n <= 0)
		return;
	CHECK(strncmp(text, "fc1-", 4) == 0, "cursor \"%s\" does not start with fc1-", text);
	CHECK(strspn(text + 3, "0123456789abcdef-") == strlen(text + 3),
	      "cursor \"%s\" holds characters outside [0-9a-f-]", text);
	/* fc1, 8 fields, the data identity if any, the check: 9 or 10 dashes; fingerprint and data 16 digits, check 8. */
	size_t dashes = 0;
	for (const char *p = text; *p; p++)
		dashes += *p == '-';
	CHECK(dashes == 9u + c->has_data, "cursor \"%s\" has %zu fields after fc1, expected %u", text, dashes,
	      9u + c->has_data);
	CHECK(strchr(text + 4, '-') - (text + 4) == 16, "fingerprint in \"%s\" is not 16 digits", text);
	CHECK(strlen(strrchr(text, '-') + 1) == 8, "check in \"%s\" is not 8 digits", text);

	struct cursor d;
	memset(&d, 0x5a, sizeof(d));
	int r = cursor_parse(text, &d);
	CHECK(r == 0, "cursor_parse(\"%s\") returned %d", text, r);
	CHECK(r < 0 || cursor_equal(&d, c), "cursor \"%s\" parsed back to different values", text);

	/* Every cap too small for text + NUL is refused. */
	char small[FEED_CURSOR_MAX];
	for (size_t cap = 0; cap <= (size_t)n; cap++) {
		int e = cursor_format(c, small, cap);
		CHECK(e == -ENOBUFS, "cursor_format with cap %zu for a %d-character cursor returned %d", cap, n, e);
	}
	CHECK_INT(cursor_format(c, small, (size_t)n + 1), n);
}

/* The check as cursor.c defines it: FNV-1a 64 over the text, splitmix64's finaliser, low 32 bits. */
static uint32_t check_of(const char *s)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * UINT64_C(0x100000001b3);
	return (uint32_t)order_mix(h);
}

/* body + "-" + its check. */
static void with_check(const char *body, char *out, size_t cap)
{
	snprintf(out, cap, "%s-%08" PRIx32, body, check_of(body));
}

static void test_round_trips(void)
{
	struct cursor c = {
		.fingerprint = UINT64_C(0x0123456789abcdef),
		.world = 8,
		.rank = 3,
		.batch = 1000,
		.pos = { .epoch = 2, .window = 5, .index = 77, .offset = 12 },
	};
	round_trip(&c);
	c = (struct cursor){ .world = 1 };
	round_trip(&c);
	c = (struct cursor){
		.fingerprint = UINT64_MAX,
		.world = UINT32_MAX,
		.rank = UINT32_MAX - 1,
		.batch = UINT64_MAX,
		.pos = { .epoch = UINT64_MAX, .window = UINT32_MAX, .index = UINT64_MAX, .offset = UINT64_MAX },
	};
	round_trip(&c);
	c.has_data = true;
	c.data = UINT64_MAX;
	round_trip(&c);
	c.data = 0;
	round_trip(&c);
}

static void rejected(const char *why, const char *text)
{
	struct cursor d;
	int r = cursor_parse(text, &d);
	CHECK(r == -EINVAL, "cursor with %s (\"%s\"): cursor_parse returned %d, expected -EINVAL", why, text, r);
}

/*
 * The data identity (issue #16): one more 16-digit field before the check.
 * A cursor without it still parses (has_data false); a data field of other
 * than 16 digits, or damaged, is refused.
 */
static void test_data_identity(void)
{
	char text[FEED_CURSOR_MAX];
	struct cursor d;
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c", text, sizeof(text));
	CHECK(cursor_parse(text, &d) == 0 && !d.has_data && d.fingerprint == UINT64_C(0x0123456789abcdef),
	      "a cursor without data identity (\"%s\") does not parse as one", text);
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c-00000000000000ff", text, sizeof(text));
	CHECK(cursor_parse(text, &d) == 0 && d.has_data && d.data == 0xff && d.pos.offset == 0xc,
	      "a cursor with data identity (\"%s\") does not parse", text);
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c-ff", text, sizeof(text));
	rejected("a 2-digit data identity", text);
	/* k_w (issue #22): one more field after the data identity; nothing after it. */
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c-00000000000000ff-1f", text, sizeof(text));
	CHECK(cursor_parse(text, &d) == 0 && d.has_data && d.data == 0xff && d.pos.has_k && d.pos.k == 0x1f,
	      "a cursor with k_w (\"%s\") does not parse", text);
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c-00000000000000ff-1f-1", text, sizeof(text));
	rejected("a field after k_w", text);
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c-1f-00000000000000ff", text, sizeof(text));
	rejected("k_w without the data identity", text);
	struct cursor kc = { .fingerprint = 7, .world = 3, .rank = 2, .batch = 9, .has_data = true, .data = 5,
			     .pos = { .epoch = 1, .window = 4, .index = 2, .offset = 0, .k = UINT64_MAX, .has_k = true } };
	int kn = cursor_format(&kc, text, sizeof(text));
	CHECK(kn > 0 && cursor_parse(text, &d) == 0 && d.pos.has_k && d.pos.k == UINT64_MAX && d.pos.window == 4,
	      "fc1 with k_w \"%s\" does not round-trip", text);
	struct cursor m = { .fingerprint = 1, .world = 2, .rank = 1, .batch = 5, .n_sources = 2, .k = 9, .row = 3,
			    .has_data = true, .data = UINT64_C(0xabcdef0123456789) };
	int n = cursor_format(&m, text, sizeof(text));
	CHECK(n > 0 && cursor_parse(text, &d) == 0 && d.has_data && d.data == m.data && d.n_sources == 2 &&
	      !d.src[0].has_k && !d.src[1].has_k,
	      "fc2 with data identity \"%s\" does not round-trip", text);
	/* fc2's k_w (issue #22): one per source after the data identity, every source's when one has it. */
	m.src[0] = (struct stream_pos){ .epoch = 1, .window = 2, .index = 3, .k = 0x77 };
	m.src[1] = (struct stream_pos){ .epoch = 4, .window = 5, .index = 6, .k = UINT64_MAX, .has_k = true };
	n = cursor_format(&m, text, sizeof(text));
	CHECK(n > 0 && cursor_parse(text, &d) == 0 && d.has_data && d.data == m.data && d.n_sources == 2 &&
	      d.src[0].has_k && d.src[0].k == 0x77 && d.src[1].has_k && d.src[1].k == UINT64_MAX && d.src[1].window == 5,
	      "fc2 with k_w \"%s\" does not round-trip", text);
	with_check("fc2-0123456789abcdef-8-3-3e8-9-0-0-2-1-2-3-4-5-6-00000000000000ff-1f-20", text, sizeof(text));
	CHECK(cursor_parse(text, &d) == 0 && d.src[0].k == 0x1f && d.src[1].k == 0x20 && d.src[1].has_k,
	      "fc2 with k_w (\"%s\") does not parse", text);
	with_check("fc2-0123456789abcdef-8-3-3e8-9-0-0-2-1-2-3-4-5-6-00000000000000ff-1f", text, sizeof(text));
	rejected("fc2 with k_w of one source of two", text);
	with_check("fc2-0123456789abcdef-8-3-3e8-9-0-0-2-1-2-3-4-5-6-00000000000000ff-1f-20-21", text, sizeof(text));
	rejected("fc2 with three k_w for two sources", text);
	with_check("fc2-0123456789abcdef-8-3-3e8-9-0-0-2-1-2-3-4-5-6-1f-20", text, sizeof(text));
	rejected("fc2 with k_w and no data identity", text);
	with_check("fc1-0123456789abcdef-8-3-3e8-2-5-4d-c-00000000000000ff-1f-20", text, sizeof(text));
	rejected("fc1 with two k_w", text);
}

static void test_rejects(void)
{
	struct cursor c = {
		.fingerprint = UINT64_C(0xfeedfacecafebeef),
		.world = 16,
		.rank = 9,
		.batch = 0x1234,
		.pos = { .epoch = 3, .window = 2, .index = 41, .offset = 7 },
	};
	char text[FEED_CURSOR_MAX], bad[FEED_CURSOR_MAX + 8];
	int n = cursor_format(&c, text, sizeof(text));
	REQUIRE(n > 0, "cursor_format failed: %d", n);

	/* Every single-digit typo is caught, in the body and in the check itself. */
	for (int i = 3; i < n; i++) {
		if (text[i] == '-')
			continue;
		for (const char *h = "0123456789abcdef"; *h; h++) {
			if (*h == text[i])
				continue;
			strcpy(bad, text);
			bad[i] = *h;
			struct cursor d;
			int r = cursor_parse(bad, &d);
			CHECK(r == -EINVAL, "cursor with digit %d changed to '%c' (\"%s\") parsed (%d)", i, *h, bad, r);
		}
	}

	rejected("an empty string", "");
	rejected("only the prefix", "fc1");
	rejected("another version", "fc2-feedfacecafebeef-10-9-1234-3-2-29-7-00000000");
	strcpy(bad, text);
	strcat(bad, "x");
	rejected("trailing garbage", bad);
	strcpy(bad, text);
	strcat(bad, "-0");
	rejected("an extra trailing field", bad);
	strcpy(bad, text);
	strcat(bad, " ");
	rejected("a trailing space", bad);
	strcpy(bad, text);
	bad[n - 1] = 0;
	rejected("a 7-digit check", bad);

	/*
	 * Structural faults with a valid check, so the parser's structure checks
	 * are what must catch them. First make sure this test computes the check
	 * the way cursor.c does.
	 */
	char body[FEED_CURSOR_MAX], good[FEED_CURSOR_MAX];
	memcpy(body, text, (size_t)n - 9);
	body[n - 9] = 0;
	with_check(body, good, sizeof(good));
	CHECK(strcmp(good, text) == 0, "test's check computation disagrees with cursor_format: \"%s\" vs \"%s\"", good,
	      text);
	if (strcmp(good, text) != 0)
		return;
	struct cursor d;
	CHECK_INT(cursor_parse(good, &d), 0);

	static const struct {
		const char *why, *body;
	} cases[] = {
		{ "7 fields", "fc1-feedfacecafebeef-10-9-1234-3-2-29" },
		{ "9 fields", "fc1-feedfacecafebeef-10-9-1234-3-2-29-7-1" },
		{ "an empty field", "fc1-feedfacecafebeef-10--1234-3-2-29-7" },
		{ "upper-case hex", "fc1-FEEDFACECAFEBEEF-10-9-1234-3-2-29-7" },
		{ "an upper-case digit in a short field", "fc1-feedfacecafebeef-10-9-123A-3-2-29-7" },
		{ "a 17-digit fingerprint", "fc1-0feedfacecafebeef-10-9-1234-3-2-29-7" },
		{ "a 17-digit offset", "fc1-feedfacecafebeef-10-9-1234-3-2-29-10000000000000000" },
		{ "a 17-digit batch", "fc1-feedfacecafebeef-10-9-00000000000001234-3-2-29-7" },
		{ "rank == world", "fc1-feedfacecafebeef-10-10-1234-3-2-29-7" },
		{ "rank > world", "fc1-feedfacecafebeef-10-11-1234-3-2-29-7" },
		{ "world 0", "fc1-feedfacecafebeef-0-0-1234-3-2-29-7" },
		{ "world over 32 bits", "fc1-feedfacecafebeef-100000000-9-1234-3-2-29-7" },
		{ "window over 32 bits", "fc1-feedfacecafebeef-10-9-1234-3-100000000-29-7" },
		{ "a '+' sign", "fc1-feedfacecafebeef-10-+9-1234-3-2-29-7" },
		{ "'_' separators", "fc1_feedfacecafebeef_10_9_1234_3_2_29_7" },
		{ "a leading space", " fc1-feedfacecafebeef-10-9-1234-3-2-29-7" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		with_check(cases[i].body, bad, sizeof(bad));
		rejected(cases[i].why, bad);
	}
	/* A check in upper case is a malformed check too. */
	strcpy(bad, "fc1-feedfacecafebeef-10-9-1234-3-2-29-7");
	with_check(bad, good, sizeof(good));
	for (char *p = strrchr(good, '-'); *p; p++)
		if (*p >= 'a' && *p <= 'f')
			*p = (char)(*p - 'a' + 'A');
	if (strpbrk(strrchr(good, '-'), "ABCDEF"))
		rejected("an upper-case check", good);
}

/*
 * cursor.h: "<fingerprint> 16 digits". A shorter fingerprint is not a cursor
 * feedd wrote, even when its check matches; accepting it would give one place
 * two spellings.
 */
static void test_short_fingerprint(void)
{
	char text[FEED_CURSOR_MAX];
	with_check("fc1-feedfacecafebee-10-9-1234-3-2-29-7", text, sizeof(text));
	rejected("a 15-digit fingerprint", text);
	with_check("fc1-0-1-0-0-0-0-0-0", text, sizeof(text));
	rejected("a 1-digit fingerprint", text);
}

/* fc2, a mixture's cursor (docs/sample-order.md, section 14.4): round trip, the longest fits the ABI, damage is refused. */
static void test_mixture_cursors(void)
{
	struct cursor c = { .fingerprint = UINT64_MAX, .world = UINT32_MAX, .rank = UINT32_MAX - 1, .batch = UINT64_MAX,
			    .n_sources = MIX_MAX_SOURCES, .k = UINT64_MAX, .offset = UINT64_MAX, .row = UINT64_MAX,
			    .has_data = true, .data = UINT64_MAX };
	for (uint32_t i = 0; i < MIX_MAX_SOURCES; i++)
		c.src[i] = (struct stream_pos){ .epoch = UINT64_MAX - i, .window = UINT32_MAX, .index = UINT64_MAX / (i + 1) };
	char text[FEED_CURSOR_MAX], bad[FEED_CURSOR_MAX];
	int n = cursor_format(&c, text, sizeof(text));
	CHECK(n > 0 && n < FEED_CURSOR_MAX, "the longest fc2 cursor does not fit the ABI's %d bytes (%d)", FEED_CURSOR_MAX, n);
	CHECK(strncmp(text, "fc2-", 4) == 0, "a mixture's cursor \"%s\" does not start with fc2-", text);
	struct cursor d;
	CHECK_INT(cursor_parse(text, &d), 0);
	bool same = d.n_sources == c.n_sources && d.k == c.k && d.offset == c.offset && d.row == c.row &&
		    d.fingerprint == c.fingerprint && d.world == c.world && d.rank == c.rank && d.batch == c.batch;
	for (uint32_t i = 0; same && i < MIX_MAX_SOURCES; i++)
		same = d.src[i].epoch == c.src[i].epoch && d.src[i].window == c.src[i].window &&
		       d.src[i].index == c.src[i].index;
	CHECK(same, "fc2 cursor \"%s\" parsed back to different values", text);

	struct cursor two = { .fingerprint = 0x1234, .world = 2, .rank = 1, .batch = 5, .n_sources = 2, .k = 9, .row = 3,
			      .src = { { .epoch = 1, .window = 0, .index = 7 }, { .epoch = 0, .window = 2, .index = 4 } } };
	n = cursor_format(&two, text, sizeof(text));
	CHECK(n > 0 && strncmp(text, "fc2-0000000000001234-2-1-5-9-0-3-2-1-0-7-0-2-4-", 47) == 0, "fc2 text \"%s\"", text);
	/* Any damage to any digit is caught by the check. */
	for (int i = 4; i < n; i++) {
		if (text[i] == '-')
			continue;
		memcpy(bad, text, (size_t)n + 1);
		bad[i] = bad[i] == '0' ? '1' : '0';
		CHECK(cursor_parse(bad, &d) == -EINVAL, "fc2 cursor with digit %d changed (\"%s\") parsed", i, bad);
	}
	/* A source count that disagrees with the triples, or 0 sources, is malformed. */
	with_check("fc2-0000000000001234-2-1-5-9-0-3-3-1-0-7-0-2-4", bad, sizeof(bad));
	rejected("3 sources and 2 triples", bad);
	with_check("fc2-0000000000001234-2-1-5-9-0-3-0", bad, sizeof(bad));
	rejected("0 sources", bad);
	with_check("fc2-0000000000001234-2-1-5-9-0-3-1-1-100000000-7", bad, sizeof(bad));
	rejected("a window past 2^32 - 1", bad);
}

int main(void)
{
	test_round_trips();
	test_rejects();
	test_short_fingerprint();
	test_mixture_cursors();
	test_data_identity();
	return unit_exit("test-cursor");
}
