/* SPDX-License-Identifier: MIT */
/*
 * cl100k_base's hand-written ASCII pre-tokenizer (tok.c) against PCRE2 with
 * the same pattern: the same rank file loaded twice, one copy with the hand
 * split turned off, must give the same ids on every input.  Inputs are
 * random strings over an alphabet built from the pattern's edges:
 * apostrophes and the contraction letters in both cases, digits, every
 * ASCII white space, punctuation, NUL, and the non-ASCII characters where
 * the hand split must hand over to PCRE2 (letters, digits and white space
 * outside ASCII, U+017F that (?i)s matches, combining marks, emoji).
 * The fixed seed makes a failure reproducible; tok-tiktoken-cl100k_base
 * checks the same code against tiktoken itself on the corpus.
 */
#include "tok-test.h"

static const char *const atoms[] = {
	"'", "'", "s", "S", "t", "d", "m", "l", "L", "v", "V", "e", "E", "r", "R", "x", "a", "Z",
	"0", "7", "9", " ", " ", " ", "\t", "\n", "\n", "\r", "\v", "\f", ".", ",", "!", "(", "-", "_",
	"/", "\"", "#", "\x01", "\x7f", "\0",
	"\xc3\xa9",             /* é, a letter */
	"\xc5\xbf",             /* ſ U+017F: (?i)s */
	"\xc2\xa0",             /* no-break space: white space */
	"\xe3\x80\x80",         /* ideographic space */
	"\xc2\xb2",             /* ² : \p{N} */
	"\xd9\xa3",             /* Arabic-Indic three */
	"\xe4\xb8\xad",         /* 中 */
	"\xcc\x81",             /* combining acute */
	"\xf0\x9f\x98\x80",     /* emoji */
	"\xc2\x85",             /* NEL */
	"\xe2\x80\x94",         /* em dash: punctuation */
	"hello", " world", "123456", "   ", "\r\n", "'ll", "'VE", "\n\n  ",
};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 0x2545f4914f6cdd1dull;
}

int main(void) {
	_tok_cleanup_free_ char *rpath = test_data_path("ranks/cl100k_base.tiktoken");
	struct tok *fast = NULL, *slow = NULL;
	struct tok_state *sf = NULL, *ss = NULL;
	struct tok_ids a = { 0 }, b = { 0 };
	char *error = NULL, buf[512];
	unsigned failed = 0, n_cases = 200000;

	if (tok_load_rankfile(rpath, "cl100k_base", &fast, &error) < 0 ||
	    tok_load_rankfile(rpath, "cl100k_base", &slow, &error) < 0) {
		fprintf(stderr, "%s\n", error);
		return 1;
	}
	if (!fast->split_cl100k) {
		fprintf(stderr, "cl100k_base did not get the hand split\n");
		return 1;
	}
	slow->split_cl100k = false;
	if (tok_state_new(fast, &sf) < 0 || tok_state_new(slow, &ss) < 0)
		return 1;
	for (unsigned c = 0; c < n_cases; c++) {
		size_t len = 0, n_atoms = 1 + rnd() % 24;
		for (size_t i = 0; i < n_atoms; i++) {
			const char *at = atoms[rnd() % TOK_ELEMENTSOF(atoms)];
			size_t k = *at ? strlen(at) : 1;
			memcpy(buf + len, at, k);
			len += k;
		}
		a.n = b.n = 0;
		if (tok_encode(fast, sf, buf, len, 0, &a, NULL) < 0 || tok_encode(slow, ss, buf, len, 0, &b, NULL) < 0)
			return 1;
		if (a.n != b.n || memcmp(a.ids, b.ids, a.n * sizeof(*a.ids)) != 0) {
			if (failed++ < 10) {
				fprintf(stderr, "differ on \"");
				for (size_t i = 0; i < len; i++)
					fprintf(stderr, (unsigned char) buf[i] < 0x20 || buf[i] == '"' ? "\\x%02x" : "%c",
						(unsigned char) buf[i]);
				fprintf(stderr, "\": %zu ids by hand, %zu by PCRE2\n", a.n, b.n);
			}
		}
	}
	printf("%u random strings, %u differ\n", n_cases, failed);
	tok_ids_done(&a);
	tok_ids_done(&b);
	tok_state_free(sf);
	tok_state_free(ss);
	tok_free(fast);
	tok_free(slow);
	free(error);
	return failed ? 1 : 0;
}
