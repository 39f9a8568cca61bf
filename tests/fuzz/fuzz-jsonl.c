/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: JSONL record extraction (jsonl_extract in
 * daemon/format/jsonl.c), run on every line of a jsonl shard.
 *
 * Input: the first byte picks the key ("text" or "content"), the rest is
 * the line. One jsonl_record is reused across inputs, as a reader reuses it
 * across lines. Promises checked: an accepted record's text is valid UTF-8
 * (invalid input was replaced) of exactly r.len bytes; a refused one says
 * why in err; and the hand-written scanner agrees with jansson alone
 * (jsonl_extract_with, scan = false) on the return code, the text, the
 * replacement count and the error message.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/format/jsonl.h"
#include "tests/fuzz/fuzz.h"

unsigned long fuzz_accepted;
static struct jsonl_record rec, ref;

static void done(void)
{
	jsonl_record_done(&rec);
	jsonl_record_done(&ref);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	atexit(done);
	return 0;
}

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF); NUL allowed. */
static int valid_utf8(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint8_t c = s[i];
		size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
		if (k == 0 || i + k > n)
			return 0;
		for (size_t j = 1; j < k; j++)
			if ((s[i + j] & 0xc0) != 0x80)
				return 0;
		if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f) || (c == 0xf0 && s[i + 1] < 0x90) ||
		    (c == 0xf4 && s[i + 1] > 0x8f))
			return 0;
		i += k;
	}
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *key = data[0] & 1 ? "content" : "text";
	char err[256] = "", ref_err[256] = "";
	int r = jsonl_extract(&rec, data + 1, size - 1, key, err, sizeof(err));
	int r_ref = jsonl_extract_with(&ref, data + 1, size - 1, key, false, ref_err, sizeof(ref_err));
	assert(r == r_ref);
	assert(r < 0 ? strcmp(err, ref_err) == 0
		     : rec.len == ref.len && rec.replaced == ref.replaced && memcmp(rec.text, ref.text, rec.len) == 0);
	if (r < 0) {
		assert(r == -EBADMSG || r == -EINVAL || r == -ENOMEM);
		assert(err[0] != 0);
		return 0;
	}
	assert(rec.text != NULL);
	assert(valid_utf8((const uint8_t *)rec.text, rec.len));
	fuzz_accepted++;
	return 0;
}
