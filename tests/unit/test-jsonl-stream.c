/* SPDX-License-Identifier: MIT */
/*
 * A record's text member decoded a segment at a time (jsonl_stream_*, for
 * huge documents): wherever the scanner takes a record, the text decoded in
 * parts cut at every offset (escapes, \u escapes and surrogate pairs cut in
 * two) is jsonl_extract()'s text byte for byte; where the stream gives up,
 * the caller reads the record whole, so only acceptance of a record
 * jsonl_extract() refuses would be a bug.
 */
#include <stdlib.h>

#include "daemon/format/jsonl.h"
#include "tests/unit/unit.h"

static struct jsonl_record whole;

/* Decodes line in parts of `part` bytes; 1 with the text, 0 when the stream gives up. */
static int stream(const uint8_t *line, size_t len, size_t part, uint8_t *out, size_t *ret_len)
{
	size_t used;
	if (jsonl_stream_begin(line, len, "text", &used) != 1)
		return 0;
	uint8_t *buf = malloc(len + 1), *o = out;
	size_t have = 0, at = used;
	bool closed = false;
	while (!closed) {
		size_t want = part < len - at ? part : len - at;
		memcpy(buf + have, line + at, want);
		at += want;
		have += want;
		size_t tn, tused;
		if (jsonl_stream_text(buf, have, at == len, o, &tn, &tused, &closed) < 0) {
			free(buf);
			return 0;
		}
		o += tn;
		memmove(buf, buf + tused, have - tused);
		have -= tused;
	}
	memcpy(buf + have, line + at, len - at);
	int r = jsonl_stream_end(buf, have + len - at, "text");
	free(buf);
	*ret_len = (size_t)(o - out);
	return r;
}

static void check(const char *s, bool must_stream)
{
	const uint8_t *line = (const uint8_t *)s;
	size_t len = strlen(s);
	char err[256];
	int rw = jsonl_extract(&whole, line, len, "text", err, sizeof(err));
	uint8_t *out = malloc(len + 1);
	for (size_t part = 1; part <= len; part++) {
		size_t n = 0;
		int rs = stream(line, len, part, out, &n);
		if (rs == 1 && (rw != 0 || n != whole.len || memcmp(out, whole.text, n) != 0))
			unit_fail(__FILE__, __LINE__, "%s in parts of %zu: streamed %zu bytes, whole %d (%zu bytes)", s, part,
				  n, rw, whole.len);
		if (rs != 1 && must_stream)
			unit_fail(__FILE__, __LINE__, "%s in parts of %zu: not streamed", s, part);
	}
	free(out);
}

int main(void)
{
	check("{\"text\": \"hello world\"}", true);
	check("{\"text\":\"a\\nb\\tc\\\"d\\\\e\\/f\\bg\\fh\\ri\"}", true);
	check("  {\"id\": 7, \"text\": \"x\\u00e9y\\u65e5\\ud83d\\ude00z\", \"score\": -0.25, \"m\": {\"a\": [1, null]}}  \r",
	      true);
	check("{\"text\": \"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80\"}", true);
	check("{\"text\": \"\\ud83d\\ude00\\ud83d\\ude00\\ud83d\\ude00\"}", true);
	/* Jansson decides these: the stream must give up (or agree). */
	check("{\"text\": \"lone \\ud83d here\"}", false);
	check("{\"text\": \"lone \\ude00 here\"}", false);
	check("{\"text\": \"bad \\x escape\"}", false);
	check("{\"text\": \"ctrl \x01\"}", false);
	check("{\"text\": \"a\", \"text\": \"b\"}", false);
	check("{\"text\": \"unterminated", false);
	check("{\"text\": \"a\"} trailing", false);
	check("{\"text\": \"a\",}", false);
	check("{\"text\": 5}", false);
	check("[\"text\"]", false);
	check("{\"t\\u0065xt\": \"escaped key\"}", false);
	check("{\"text\": \"a\"", false);
	/* Invalid UTF-8 in the text: passed through, the tokenizer repairs it as the whole-line repair. */
	size_t n = 0;
	uint8_t out[64];
	const char *inv = "{\"text\": \"a\xff\xe2\x82 b\"}";
	CHECK(stream((const uint8_t *)inv, strlen(inv), 3, out, &n) == 1, "invalid UTF-8 not streamed");
	CHECK(n == 6 && memcmp(out, "a\xff\xe2\x82 b", 6) == 0, "invalid UTF-8 changed");
	jsonl_record_done(&whole);
	return unit_failures ? 1 : 0;
}
