/* SPDX-License-Identifier: MIT */
/*
 * Unicode 16 categories for PCRE2 10.42's Unicode 14 engine: a pattern runs
 * on a copy of the text in which every character whose category changed
 * (mostly characters new in 15.0-16.0) is replaced by a stand-in of that
 * category (the same in both versions) and of the same UTF-8 length.  So
 * \\p{L}, \\p{N}, [^\\s\\p{L}\\p{N}] ... match as Unicode 16 says, match offsets
 * are offsets in the real text, and text without such characters (nearly
 * all) is matched in place.
 */
#include "tok-pipe.h"
#include "tok-unicode.h"

static uint32_t tok_uni_standin(uint32_t cp) {
	if (!(tok_uni_changed_blocks[cp >> 11] >> ((cp >> 8) & 7) & 1))
		return 0;
	size_t lo = 0, hi = tok_uni_n_standins;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (tok_uni_standins[mid].cp < cp)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < tok_uni_n_standins && tok_uni_standins[lo].cp == cp ? tok_uni_standins[lo].to : 0;
}

/* Offset of the first changed character at or after i, or n. */
static size_t tok_uni_next_changed(const uint8_t *s, size_t n, size_t i, uint32_t *ret_to, size_t *ret_len) {
	while (i < n) {
		uint8_t c = s[i];
		if (c < 0xe0) {         /* ASCII, 2-byte leads, continuations: nothing below U+0800 changed */
			i++;
			continue;
		}
		uint32_t cp;
		size_t k = tok_utf8_next(s + i, n - i, &cp);
		uint32_t to = tok_uni_standin(cp);
		if (to) {
			*ret_to = to;
			*ret_len = k;
			return i;
		}
		i += k;
	}
	return n;
}

const uint8_t *tok_uni_map(struct tok_buf *b, const uint8_t *s, size_t n) {
	uint32_t to;
	size_t k, i = tok_uni_next_changed(s, n, 0, &to, &k);

	if (i == n)
		return s;
	b->n = 0;
	if (tok_buf_append(b, s, n) < 0)
		return NULL;
	while (i < n) {
		tok_utf8_put(to, b->p + i);     /* same length as the character it replaces */
		i = tok_uni_next_changed(s, n, i + k, &to, &k);
	}
	return b->p;
}
