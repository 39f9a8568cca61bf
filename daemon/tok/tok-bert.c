/* SPDX-License-Identifier: MIT */
/*
 * BERT's text passes, as HF tokenizers runs them:
 *
 * BertNormalizer, in this order:
 *   clean_text            drop NUL, U+FFFD and "other" characters (Cc, Cf,
 *                         Co as HF's unicode_categories tables have them;
 *                         \t \n \r excepted), white space becomes ' ';
 *   handle_chinese_chars  ' ' before and after each CJK ideograph (the
 *                         ranges of BERT's _is_chinese_char);
 *   strip_accents         (default: = lowercase) NFD, then drop Mn;
 *   lowercase             Rust's char::to_lowercase, character by character
 *                         (no final-sigma rule).
 * BertPreTokenizer: split on white space (removed), then isolate each
 * punctuation character (ASCII punctuation or Unicode P*).
 * StripAccents (ALBERT's normalizer): drop every combining mark (M*, as
 * HF's unicode-normalization crate has them).
 *
 * The character classes are generated from the reference itself
 * (gen-bert-tables.mjs -> tok-bert-tables.h).  NFD is libunistring's
 * (Unicode 14; HF's unicode-normalization is 16: text with characters
 * assigned since then and decomposable may differ).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tok-model.h"
#include "tok-unicode.h"
#include "tok-bert-tables.h"

static bool tok_range_has(const struct tok_range *r, size_t n, uint32_t cp) {
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (cp < r[mid].lo)
			hi = mid;
		else if (cp > r[mid].hi)
			lo = mid + 1;
		else
			return true;
	}
	return false;
}

static bool is_chinese(uint32_t c) {
	return (c >= 0x4e00 && c <= 0x9fff) || (c >= 0x3400 && c <= 0x4dbf) || (c >= 0x20000 && c <= 0x2a6df) ||
	       (c >= 0x2a700 && c <= 0x2b73f) || (c >= 0x2b740 && c <= 0x2b81f) || (c >= 0x2b920 && c <= 0x2ceaf) ||
	       (c >= 0xf900 && c <= 0xfaff) || (c >= 0x2f800 && c <= 0x2fa1f);
}

/* Rust's char::is_whitespace (Unicode White_Space). */
static bool is_white(uint32_t c) {
	return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static const struct tok_lower *find_lower(uint32_t c) {
	size_t lo = 0, hi = TOK_ELEMENTSOF(tok_bert_lower);

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (c < tok_bert_lower[mid].cp)
			hi = mid;
		else if (c > tok_bert_lower[mid].cp)
			lo = mid + 1;
		else
			return &tok_bert_lower[mid];
	}
	return NULL;
}

static int put_lower(struct tok_buf *out, uint32_t c, bool lowercase) {
	uint8_t u[12];
	size_t k = 0;

	if (lowercase) {
		const struct tok_lower *l = c < 0x80 ? NULL : find_lower(c);
		if (c < 0x80)
			c = c >= 'A' && c <= 'Z' ? c + 32 : c;
		else if (l) {
			for (size_t i = 0; i < l->n; i++)
				k += tok_utf8_put(l->to[i], u + k);
			return tok_buf_append(out, u, k);
		}
	}
	k = tok_utf8_put(c, u);
	return tok_buf_append(out, u, k);
}

/* clean_text and handle_chinese_chars; lowercase too when lower (no
 * accents to strip in between). */
static int bert_pass1(const struct tok_bert_norm *b, const uint8_t *s, size_t n, bool lower, struct tok_buf *out) {
	int r = tok_buf_reserve(out, n + 8);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n;) {
		uint32_t c;
		if (s[i] < 0x80) {
			c = s[i++];
			if (b->clean_text) {
				if (c == '\t' || c == '\n' || c == '\r')
					c = ' ';
				else if (c < 0x20 || c == 0x7f)
					continue;
			}
			if (lower && c >= 'A' && c <= 'Z')
				c += 32;
			r = tok_buf_reserve(out, 1);
			if (r < 0)
				return r;
			out->p[out->n++] = (uint8_t) c;
			continue;
		}
		i += tok_utf8_dec(s + i, &c);
		if (b->clean_text) {
			if (tok_range_has(tok_bert_other, TOK_ELEMENTSOF(tok_bert_other), c))
				continue;
			if (tok_range_has(tok_bert_space, TOK_ELEMENTSOF(tok_bert_space), c))
				c = ' ';
		}
		if (b->handle_chinese_chars && is_chinese(c)) {
			uint8_t u[6];
			size_t k = tok_utf8_put(c, u + 1);
			u[0] = ' ';
			u[k + 1] = ' ';
			r = tok_buf_append(out, u, k + 2);
		} else
			r = put_lower(out, c, lower);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Drops Mn (HF's old table) and lowercases if asked. */
static int strip_put(struct tok_buf *out, uint32_t c, bool lowercase) {
	if (c >= 0x300 && tok_range_has(tok_bert_mn, TOK_ELEMENTSOF(tok_bert_mn), c))
		return 0;
	return put_lower(out, c, lowercase);
}

/* NFD of s[0..n) (no inert character inside), then strip_put(). */
static int strip_run(const uint8_t *s, size_t n, bool lowercase, struct tok_buf *out) {
	struct tok_buf nfd = { 0 };
	int r = tok_nf_decompose(false, s, n, &nfd);

	for (size_t i = 0; r == 0 && i < nfd.n;) {
		uint32_t c;
		i += tok_utf8_dec(nfd.p + i, &c);
		r = strip_put(out, c, lowercase);
	}
	free(nfd.p);
	return r;
}

int tok_bert_normalize(const struct tok_bert_norm *b, const uint8_t *s, size_t n, struct tok_buf *out) {
	struct tok_buf tmp = { 0 };
	bool ascii = true;
	size_t run = 0;
	int r;

	for (size_t i = 0; i < n && ascii; i++)
		ascii = s[i] < 0x80;
	if (!b->strip_accents || ascii)
		return bert_pass1(b, s, n, b->lowercase, out);
	r = bert_pass1(b, s, n, false, &tmp);
	if (r == 0)
		r = tok_buf_reserve(out, tmp.n);
	/* Characters NFD leaves alone go straight through; runs of the
	 * others are normalized whole (canonical reordering stays inside
	 * a run: inert characters have combining class 0). */
	for (size_t i = 0; r == 0 && i < tmp.n;) {
		uint32_t c;
		size_t k = tmp.p[i] < 0x80 ? (c = tmp.p[i], 1) : tok_utf8_dec(tmp.p + i, &c);
		if (c < 0x80 || tok_nf_inert(false, c) || tok_nf_hf_keeps(1, c)) {
			if (i > run)
				r = strip_run(tmp.p + run, i - run, b->lowercase, out);
			if (r == 0)
				r = strip_put(out, c, b->lowercase);
			run = i + k;
		}
		i += k;
	}
	if (r == 0 && tmp.n > run)
		r = strip_run(tmp.p + run, tmp.n - run, b->lowercase, out);
	free(tmp.p);
	return r;
}

/* tok_strip_marks as a BMP bitmap: one lookup per character of text. */
static uint8_t bmp_marks[0x10000 / 8];
static pthread_once_t bmp_marks_once = PTHREAD_ONCE_INIT;

static void bmp_marks_init(void) {
	for (size_t i = 0; i < TOK_ELEMENTSOF(tok_strip_marks); i++)
		for (uint32_t c = tok_strip_marks[i].lo; c <= tok_strip_marks[i].hi && c < 0x10000; c++)
			bmp_marks[c >> 3] |= (uint8_t) (1u << (c & 7));
}

static inline bool is_mark(uint32_t c) {
	if (c < 0x10000)
		return bmp_marks[c >> 3] >> (c & 7) & 1;
	return tok_range_has(tok_strip_marks, TOK_ELEMENTSOF(tok_strip_marks), c);
}

int tok_strip_accents(const uint8_t *s, size_t n, struct tok_buf *out) {
	size_t keep = 0; /* start of the text to copy */
	int r = tok_buf_reserve(out, n);

	pthread_once(&bmp_marks_once, bmp_marks_init);

	for (size_t i = 0; r == 0 && i < n;) {
		uint32_t c;
		uint64_t w;
		/* ASCII 8 bytes at a time; no mark below U+0300 (lead 0xcc). */
		if (i + 8 <= n && (memcpy(&w, s + i, 8), (w & 0x8080808080808080ull) == 0)) {
			i += 8;
			continue;
		}
		if (s[i] < 0xcc) {
			i += tok_utf8_len(s[i]);
			continue;
		}
		size_t k = tok_utf8_dec(s + i, &c);
		if (is_mark(c)) {
			r = tok_buf_append(out, s + keep, i - keep);
			keep = i + k;
		}
		i += k;
	}
	if (r == 0)
		r = tok_buf_append(out, s + keep, n - keep);
	return r;
}

int tok_bert_pretokenize(const uint8_t *s, size_t n, tok_piece_fn piece, void *userdata) {
	size_t word = 0;
	int r;

	for (size_t i = 0; i < n;) {
		uint32_t c;
		size_t k;
		bool white, punct;

		if (s[i] < 0x80) {
			c = s[i];
			k = 1;
			white = c == ' ' || (c >= 0x09 && c <= 0x0d);
			/* char::is_ascii_punctuation */
			punct = (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
				(c >= 0x7b && c <= 0x7e);
		} else {
			k = tok_utf8_dec(s + i, &c);
			white = is_white(c);
			punct = !white && tok_range_has(tok_bert_punct, TOK_ELEMENTSOF(tok_bert_punct), c);
		}
		if (white || punct) {
			if (i > word) {
				r = piece(userdata, s + word, i - word);
				if (r < 0)
					return r;
			}
			if (punct) {
				r = piece(userdata, s + i, k);
				if (r < 0)
					return r;
			}
			word = i + k;
		}
		i += k;
	}
	if (n > word)
		return piece(userdata, s + word, n - word);
	return 0;
}
