/* SPDX-License-Identifier: MIT */
/*
 * Unicode character properties of the version the reference encoders use
 * (Unicode 16.0, see docs/tokenizers.md), from a table generated from the
 * Unicode Character Database by daemon/tok/gen/gen-unicode.mjs.  Used by the
 * hand-written pre-tokenizers (Digits, Punctuation, WhitespaceSplit, ...)
 * and by added-token word checks, in place of PCRE2's own Unicode 14 tables.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOK_UNICODE_VERSION "16.0.0"

/* Generated tables (tok-unicode-table.c, daemon/tok/gen/gen-unicode.mjs).
 * tok_uni_stage2[tok_uni_stage1[cp >> 8] * 256 + (cp & 255)]: the general
 * category (enum tok_gc) | TOK_UNI_* bits. */
extern const uint16_t tok_uni_stage1[4352];
extern const uint8_t tok_uni_stage2[];

/* Lower-case mapping (unconditional, per character), sorted by cp. */
struct tok_uni_lower {
	uint32_t cp;
	uint32_t to[3];
};
extern const struct tok_uni_lower tok_uni_lower_map[];
extern const size_t tok_uni_lower_n;

/* Characters whose category Unicode 16 gives differently from PCRE2's
 * Unicode 14 (all at or above U+0800), sorted, each with a stand-in of the
 * same category in both and the same UTF-8 length; tok_uni_changed_blocks:
 * bit (cp >> 8) set where a 256-block holds one. */
struct tok_uni_standin {
	uint32_t cp, to;
};
extern const struct tok_uni_standin tok_uni_standins[];
extern const size_t tok_uni_n_standins;
extern const uint8_t tok_uni_changed_blocks[];

struct tok_buf;
/* s[0..n) (valid UTF-8) as PCRE2 must see it to classify characters as
 * Unicode 16 does: s itself when it holds no changed character, else a copy
 * in b with stand-ins, of the same length (offsets carry over). */
const uint8_t *tok_uni_map(struct tok_buf *b, const uint8_t *s, size_t n);

enum tok_gc {
	TOK_GC_CN, TOK_GC_LU, TOK_GC_LL, TOK_GC_LT, TOK_GC_LM, TOK_GC_LO, TOK_GC_MN, TOK_GC_MC, TOK_GC_ME,
	TOK_GC_ND, TOK_GC_NL, TOK_GC_NO, TOK_GC_PC, TOK_GC_PD, TOK_GC_PS, TOK_GC_PE, TOK_GC_PI, TOK_GC_PF,
	TOK_GC_PO, TOK_GC_SM, TOK_GC_SC, TOK_GC_SK, TOK_GC_SO, TOK_GC_ZS, TOK_GC_ZL, TOK_GC_ZP, TOK_GC_CC,
	TOK_GC_CF, TOK_GC_CS, TOK_GC_CO,
};

#define TOK_UNI_WHITE_SPACE 0x20
#define TOK_UNI_ALPHABETIC 0x40
#define TOK_UNI_PUNCT8 0x80     /* P* in Unicode 8.0 */

static inline uint8_t tok_uni_props(uint32_t cp) {
	if (cp >= 0x110000)
		return 0;
	return tok_uni_stage2[(size_t) tok_uni_stage1[cp >> 8] * 256 + (cp & 255)];
}

static inline enum tok_gc tok_uni_gc(uint32_t cp) {
	return (enum tok_gc) (tok_uni_props(cp) & 0x1f);
}

/* Rust's char::is_whitespace: White_Space. */
static inline bool tok_uni_is_space(uint32_t cp) {
	return tok_uni_props(cp) & TOK_UNI_WHITE_SPACE;
}

/* Rust's char::is_numeric: Nd, Nl, No. */
static inline bool tok_uni_is_numeric(uint32_t cp) {
	enum tok_gc g = tok_uni_gc(cp);
	return g == TOK_GC_ND || g == TOK_GC_NL || g == TOK_GC_NO;
}

/* HF's is_punc: ASCII punctuation, or P* as the unicode_categories crate
 * has it, which is Unicode 8.0 (measured on every code point). */
static inline bool tok_uni_is_punct(uint32_t cp) {
	if (cp < 0x80)
		return (cp >= 0x21 && cp <= 0x2f) || (cp >= 0x3a && cp <= 0x40) || (cp >= 0x5b && cp <= 0x60) ||
		       (cp >= 0x7b && cp <= 0x7e);
	return tok_uni_props(cp) & TOK_UNI_PUNCT8;
}

/* Rust's char::is_alphanumeric: Alphabetic or Numeric. */
static inline bool tok_uni_is_alnum(uint32_t cp) {
	return (tok_uni_props(cp) & TOK_UNI_ALPHABETIC) || tok_uni_is_numeric(cp);
}

/* Decodes the valid UTF-8 character at s (n >= 1 bytes left); returns its
 * length and the code point in *ret. */
static inline size_t tok_utf8_next(const uint8_t *s, size_t n, uint32_t *ret) {
	uint8_t c = s[0];
	if (c < 0x80 || n < 2) {
		*ret = c;
		return 1;
	}
	if (c < 0xe0) {
		*ret = (uint32_t) (c & 0x1f) << 6 | (s[1] & 0x3f);
		return 2;
	}
	if (c < 0xf0 || n < 4) {
		*ret = (uint32_t) (c & 0x0f) << 12 | (uint32_t) (s[1] & 0x3f) << 6 | (s[2] & 0x3f);
		return n < 3 ? n : 3;
	}
	*ret = (uint32_t) (c & 0x07) << 18 | (uint32_t) (s[1] & 0x3f) << 12 | (uint32_t) (s[2] & 0x3f) << 6 |
	       (s[3] & 0x3f);
	return 4;
}

/* Start of the character that ends at s[n) (n >= 1). */
static inline size_t tok_utf8_prev(const uint8_t *s, size_t n) {
	size_t i = n - 1;
	while (i > 0 && (s[i] & 0xc0) == 0x80)
		i--;
	return i;
}

/* Encodes cp as UTF-8 into out (4 bytes room); returns the length. */
static inline size_t tok_utf8_put(uint32_t cp, uint8_t *out) {
	if (cp < 0x80) {
		out[0] = (uint8_t) cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (uint8_t) (0xc0 | cp >> 6);
		out[1] = (uint8_t) (0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (uint8_t) (0xe0 | cp >> 12);
		out[1] = (uint8_t) (0x80 | ((cp >> 6) & 0x3f));
		out[2] = (uint8_t) (0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (uint8_t) (0xf0 | cp >> 18);
	out[1] = (uint8_t) (0x80 | ((cp >> 12) & 0x3f));
	out[2] = (uint8_t) (0x80 | ((cp >> 6) & 0x3f));
	out[3] = (uint8_t) (0x80 | (cp & 0x3f));
	return 4;
}
