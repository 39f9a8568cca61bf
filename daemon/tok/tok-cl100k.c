/* SPDX-License-Identifier: MIT */
#include "tok-internal.h"

/*
 * cl100k_base's pattern, by hand, for ASCII text:
 *
 *   '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
 *    ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s
 *
 * PCRE2 JIT spends about 45 ns per piece, most of it in the call, which was
 * 40 % of encoding (bench/tok/RESULTS.md); this takes a few.  Each branch
 * is the pattern's alternative of the same rank, tried in the same order.
 * Where the answer could depend on a non-ASCII character (is it a letter,
 * a digit, white space, or the long s that (?i)s matches?) it returns 0 and
 * PCRE2 matches that piece; so do text windows (partial matching).  The
 * tiktoken peer tests check it id for id on the corpus and the edge cases.
 */
enum { TC_OTHER, TC_LETTER, TC_DIGIT, TC_SPACE, TC_HIGH };

static inline unsigned tok_ascii_class(uint8_t c) {
	if (c >= 0x80)
		return TC_HIGH;
	if ((unsigned) ((c | 0x20) - 'a') < 26)
		return TC_LETTER;
	if ((unsigned) (c - '0') < 10)
		return TC_DIGIT;
	return c == ' ' || (c >= '\t' && c <= '\r') ? TC_SPACE : TC_OTHER;
}

/* Class of s[i], TC_OTHER past the end (no alternative reads past the
 * text except to see that it ends, which the callers check first). */
#define TC(i) ((i) < n ? tok_ascii_class(s[i]) : TC_OTHER)

/* End of the run of class c from i; 0 (unsure) if a non-ASCII byte ends it. */
static inline size_t tok_run(const uint8_t *s, size_t n, size_t i, unsigned c) {
	while (i < n && tok_ascii_class(s[i]) == c)
		i++;
	return i < n && s[i] >= 0x80 ? 0 : i;
}

size_t tok_match_cl100k(const uint8_t *s, size_t n, size_t pos, unsigned digits, bool end_rule) {
	const uint8_t c = s[pos];
	const unsigned k = tok_ascii_class(c);
	size_t i;

	if (k == TC_HIGH)
		return 0;
	/* '(?i:[sdmt]|ll|ve|re) */
	if (c == '\'' && pos + 1 < n) {
		uint8_t a = s[pos + 1] | 0x20, b = pos + 2 < n ? s[pos + 2] | 0x20 : 0;
		if (s[pos + 1] >= 0x80)
			return 0;
		if (a == 's' || a == 'd' || a == 'm' || a == 't')
			return pos + 2;
		if ((a == 'l' || a == 'v' || a == 'r') && pos + 2 < n && s[pos + 2] >= 0x80)
			return 0;
		if ((a == 'l' && b == 'l') || ((a == 'v' || a == 'r') && b == 'e'))
			return pos + 3;
	}
	/* [^\r\n\p{L}\p{N}]?+\p{L}++ */
	if (k == TC_LETTER)
		return tok_run(s, n, pos, TC_LETTER);
	if (k != TC_DIGIT && c != '\r' && c != '\n') {
		unsigned k1 = TC(pos + 1);
		if (k1 == TC_HIGH)
			return 0;
		if (k1 == TC_LETTER)
			return tok_run(s, n, pos + 1, TC_LETTER);
	}
	/* \p{N}{1,3}+ (digits = 3; Qwen2's \p{N}: 1) */
	if (k == TC_DIGIT) {
		for (i = pos + 1; i < pos + digits && TC(i) == TC_DIGIT; i++)
			;
		return i < pos + digits && TC(i) == TC_HIGH ? 0 : i;
	}
	/*  ?[^\s\p{L}\p{N}]++[\r\n]*+ */
	i = c == ' ' ? pos + 1 : pos;
	if (TC(i) == TC_HIGH)
		return 0;
	if (i < n && TC(i) == TC_OTHER) {
		i = tok_run(s, n, i, TC_OTHER);
		if (i == 0)
			return 0;
		while (i < n && (s[i] == '\r' || s[i] == '\n'))
			i++;
		return i;
	}
	/* The rest is white space: \s++$ | \s*[\r\n] | \s+(?!\S) | \s */
	size_t e = tok_run(s, n, pos, TC_SPACE);
	if (e == 0)
		return 0;
	if (e == n && end_rule)
		return n;
	for (i = e; i > pos; i--)
		if (s[i - 1] == '\r' || s[i - 1] == '\n')
			return i;
	/* \s+(?!\S) takes a run that ends the text whole. */
	if (e == n)
		return n;
	return e - pos >= 2 ? e - 1 : pos + 1;
}
#undef TC
