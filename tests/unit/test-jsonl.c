/* SPDX-License-Identifier: MIT */
/*
 * JSONL records (daemon/format/jsonl.c): the fast scanner must give exactly
 * what jansson gives, on every line. Each input goes through
 * jsonl_extract() (scanner first, jansson where it gives up) and through
 * jsonl_extract_with(scan = false) (jansson alone); the return codes and
 * the texts must be equal, and an error must keep jansson's message.
 * Inputs: hand-made records for every case the scanner has a rule for,
 * then a few hundred thousand random mutations of them (fixed seed).
 */
#include "daemon/format/jsonl.h"
#include "tests/unit/unit.h"

static struct jsonl_record fast, slow;
static unsigned long n_checked, n_accepted;

static void check_line(const uint8_t *line, size_t len, const char *key)
{
	char ef[256] = "", es[256] = "";
	int rf = jsonl_extract(&fast, line, len, key, ef, sizeof(ef));
	int rs = jsonl_extract_with(&slow, line, len, key, false, es, sizeof(es));
	n_checked++;
	if (rf != rs || (rf == 0 && (fast.len != slow.len || memcmp(fast.text, slow.text, fast.len) != 0)) ||
	    fast.replaced != slow.replaced || (rf < 0 && strcmp(ef, es) != 0)) {
		unit_fail(__FILE__, __LINE__, "line %.*s (key %s): scanner %d (%zu bytes) %s, jansson %d (%zu bytes) %s\n",
			  (int)(len < 200 ? len : 200), (const char *)line, key, rf, fast.len, ef, rs, slow.len, es);
		return;
	}
	n_accepted += rf == 0;
}

static void check(const char *s)
{
	check_line((const uint8_t *)s, strlen(s), "text");
}

static const char *const seeds[] = {
	"{\"text\": \"hello world\"}",
	"{\"text\":\"a\\nb\\tc\\\"d\\\\e\\/f\\bg\\fh\\ri\"}",
	"  {\"id\": 7, \"text\": \"x\", \"score\": -0.25, \"ok\": true, \"bad\": false, \"n\": null}  \r",
	"{\"meta\": {\"a\": [1, 2, {\"b\": []}], \"c\": {}}, \"text\": \"nested before\"}",
	"{\"text\": \"caf\\u00e9 \\u4e2d\\u6587 \\ud83d\\ude00\"}",
	"{\"text\": \"\\u0000nul\"}",
	"{\"text\": \"first\", \"text\": \"second\"}",
	"{\"text\": \"first\", \"text\": 3}",
	"{\"text\": 3, \"text\": \"second\"}",
	"{\"t\\u0065xt\": \"escaped key\"}",
	"{\"text\": \"lone \\udc00\"}",
	"{\"text\": \"high \\ud800 alone\"}",
	"{\"text\": \"high \\ud800\\u0041\"}",
	"{\"text\": \"bad \\x escape\"}",
	"{\"text\": \"raw\ttab\"}",
	"{\"text\": \"ok\", \"n\": 1e5}",
	"{\"text\": \"ok\", \"n\": 123456789012345678901234567890}",
	"{\"text\": \"ok\", \"n\": 1.5}",
	"{\"text\": \"ok\", \"n\": 01}",
	"{\"text\": \"ok\", \"n\": -}",
	"{\"text\": \"ok\", \"n\": 1.}",
	"{\"text\": \"ok\",}",
	"{\"text\": \"ok\"} x",
	"{\"text\": \"ok\"",
	"{\"text\" \"ok\"}",
	"{}",
	"[]",
	"\"text\"",
	"{\"other\": \"no text\"}",
	"{\"text\": [\"array\"]}",
	"{\"text\": {\"o\": 1}}",
	"{\"text\": \"\"}",
	"{\"text\": \"trailing\"}\n",
	"{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
	"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]], \"text\": \"deep\"}",
	"{\"text\": tru}",
	"{\"text\": \"ok\", \"f\": fals, \"g\": nul}",
	"{\"text\": \"\xc3\xa9t\xc3\xa9 \xe2\x82\xac\"}",
	"{\"text\": \"bad utf8 \xff\xfe here\"}",
	"{\"text\": \"over\xc0\xaflong\"}",
	"{\"\xff\": 1, \"text\": \"bad key byte\"}",
	"{\"text\": \"del \x7f ok\"}",
	"{\"text\": \"a\", \"b\": \"\\u12\"}",
	"{\"text\": \"a\", \"b\": \"\\uD834\\uDD1E\"}",
	"{\"text\": \"\\uDBFF\\uDFFF max\"}",
	"{\"text\": \"a\", \"b\": 9223372036854775807}",
	"{\"text\": \"a\", \"b\": -922337203685477580}",
	"{\"text\": \"a\", \"b\": 0.000000000000001}",
	"\t{ \"text\" : \"spaces\" , \"x\" : [ ] }",
	"{\"text\": \"a\"}}",
	"{\"text\": \"a\"]",
	"{\"text\": \"a\" ,\"b\":{\"c\":\"d\"}}",
};

/* xorshift64*: a fixed sequence, so a failure reproduces. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

/* Bytes a mutation inserts: JSON's own punctuation and escapes mostly. */
static const char alphabet[] = "{}[]\":,\\ntu0123456789abcdefABCDEF.-+eE \t\r\n/\x01\x7f\xc3\xa9\xed\xa0\x80\xff";

static void mutate_and_check(const char *seed)
{
	uint8_t buf[512];
	size_t n = strlen(seed);
	if (n > sizeof(buf) / 2)
		n = sizeof(buf) / 2;
	memcpy(buf, seed, n);
	unsigned k = 1 + (unsigned)(rnd() % 4);
	for (unsigned i = 0; i < k; i++) {
		size_t at = n ? (size_t)(rnd() % n) : 0;
		switch (rnd() % 4) {
		case 0: /* replace a byte */
			if (n)
				buf[at] = (uint8_t)alphabet[rnd() % (sizeof(alphabet) - 1)];
			break;
		case 1: /* insert a byte */
			if (n < sizeof(buf)) {
				memmove(buf + at + 1, buf + at, n - at);
				buf[at] = (uint8_t)alphabet[rnd() % (sizeof(alphabet) - 1)];
				n++;
			}
			break;
		case 2: /* delete a byte */
			if (n) {
				memmove(buf + at, buf + at + 1, n - at - 1);
				n--;
			}
			break;
		default: /* cut the line */
			n = at;
			break;
		}
	}
	check_line(buf, n, rnd() % 8 ? "text" : "b");
}

/*
 * The scanner reads the text 16 bytes at a time: put two of every kind of
 * escape, special byte and invalid UTF-8 at every offset around those
 * blocks, in whole and in cut lines, and compare with jansson.
 */
static void check_block_edges(void)
{
	static const char *const ins[] = { "\\n", "\\\"", "\\\\", "\\u00e9", "\\ud83d\\ude00", "\\u0000", "\"",
					   "\x01", "\\x", "\\ud800", "\xc3\xa9", "\xff", "\\/", "\\t\\r" };
	uint8_t buf[512];
	for (size_t pre = 0; pre < 36; pre++)
		for (size_t post = 0; post < 36; post += 5)
			for (size_t a = 0; a < sizeof(ins) / sizeof(ins[0]); a++)
				for (size_t b = 0; b < sizeof(ins) / sizeof(ins[0]); b++)
					for (size_t mid = 0; mid < 20; mid += 3) {
						size_t k = (size_t)sprintf((char *)buf, "{\"text\": \"");
						for (size_t i = 0; i < pre; i++)
							buf[k++] = (uint8_t)('a' + i % 26);
						k += (size_t)sprintf((char *)buf + k, "%s", ins[a]);
						memset(buf + k, 'M', mid);
						k += mid;
						k += (size_t)sprintf((char *)buf + k, "%s", ins[b]);
						memset(buf + k, 'z', post);
						k += post;
						k += (size_t)sprintf((char *)buf + k, "\", \"id\": 3}");
						check_line(buf, k, "text");
						check_line(buf, k - 11, "text"); /* cut inside the text */
					}
}

int main(void)
{
	for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
		check(seeds[i]);
	/* The scanner must take the common records itself: their text may point into the line. */
	const char *plain = "{\"text\": \"no escapes\", \"id\": 1}";
	char err[256];
	CHECK_INT(jsonl_extract(&fast, (const uint8_t *)plain, strlen(plain), "text", err, sizeof(err)), 0);
	CHECK(fast.root == NULL && fast.text == plain + 10, "a plain record was not read in place");
	const char *esc = "{\"text\": \"two\\nlines \\u00e9\"}";
	CHECK_INT(jsonl_extract(&fast, (const uint8_t *)esc, strlen(esc), "text", err, sizeof(err)), 0);
	CHECK(fast.root == NULL, "a record with escapes went to jansson");
	CHECK(fast.len == 12 && memcmp(fast.text, "two\nlines \xc3\xa9", 12) == 0, "escapes decoded wrong");
	/* Errors keep jansson's words, naming what is wrong. */
	const char *num = "{\"text\": 5}";
	CHECK_INT(jsonl_extract(&fast, (const uint8_t *)num, strlen(num), "text", err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "not a string");

	check_block_edges();
	for (int round = 0; round < 4000; round++)
		for (size_t i = 0; i < sizeof(seeds) / sizeof(seeds[0]); i++)
			mutate_and_check(seeds[i]);
	printf("%lu lines compared, %lu accepted\n", n_checked, n_accepted);
	CHECK(n_accepted > n_checked / 50, "the mutations hardly ever made a valid record");
	jsonl_record_done(&fast);
	jsonl_record_done(&slow);
	return unit_exit("jsonl");
}
