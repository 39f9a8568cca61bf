/* SPDX-License-Identifier: MIT */
/*
 * The Precompiled normalizer: SentencePiece's precompiled_charsmap (the
 * nmt_nfkc rules of T5, XLM-R, ALBERT, mBART...) as HF tokenizers applies it.
 *
 * The blob is a little-endian u32 with the byte size of a darts-clone double
 * array of u32 units, that array, then replacement strings, each ended by
 * NUL.  A key (a UTF-8 sequence) maps to the offset of its replacement.
 *
 * HF (normalizers/precompiled.rs, crate spm_precompiled) walks the text by
 * extended grapheme cluster: a cluster shorter than 6 bytes of which some
 * prefix is a key is replaced whole by the replacement of its SHORTEST such
 * prefix (SentencePiece takes the longest, HF the first result of its
 * common-prefix search); every other cluster is taken character by
 * character, each replaced if it is a key.  Both quirks are reproduced, as
 * the reference is HF.  Clusters come from libunistring (Unicode 14 in
 * Debian 12, HF's unicode-segmentation is 16); only clusters under 6 bytes
 * matter, and no rule added since 14 can form one except a new combining
 * mark after a one- or two-byte base, so this is the one case that could
 * differ.
 *
 * The struct is read-only after tok_precompiled_new().
 */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unigbrk.h>

#include "tok-internal.h"
#include "tok-model.h"

struct tok_precompiled {
	uint32_t *units;
	size_t n_units;
	char *strings;          /* replacement strings, NUL-terminated each */
	size_t n_strings;
	/* ASCII characters: replacement offset, or -1 when none. */
	int32_t ascii[128];
};

struct tok_precompiled *tok_precompiled_free(struct tok_precompiled *p) {
	if (!p)
		return NULL;
	free(p->units);
	free(p->strings);
	free(p);
	return NULL;
}

static inline bool unit_has_leaf(uint32_t u) {
	return (u >> 8) & 1;
}

static inline uint32_t unit_value(uint32_t u) {
	return u & ((1u << 31) - 1);
}

static inline uint32_t unit_label(uint32_t u) {
	return u & ((1u << 31) | 0xff);
}

static inline size_t unit_offset(uint32_t u) {
	return (size_t) ((u >> 10) << ((u & (1u << 9)) >> 6));
}

/* The value of the shortest key that is a prefix of s[0..n) (darts-clone's
 * common prefix search, first result), or -1.  A NUL byte ends the key. */
static int64_t pc_first_prefix(const struct tok_precompiled *p, const uint8_t *s, size_t n) {
	size_t pos = 0;
	uint32_t u;

	if (p->n_units == 0)
		return -1;
	u = p->units[0];
	pos ^= unit_offset(u);
	for (size_t i = 0; i < n && s[i] != 0; i++) {
		pos ^= s[i];
		if (pos >= p->n_units)
			return -1;
		u = p->units[pos];
		if (unit_label(u) != s[i])
			return -1;
		pos ^= unit_offset(u);
		if (pos >= p->n_units)
			return -1;
		if (unit_has_leaf(u))
			return unit_value(p->units[pos]);
	}
	return -1;
}

int tok_precompiled_new(const uint8_t *blob, size_t n, struct tok_precompiled **ret, char **ret_error) {
	struct tok_precompiled *p;
	uint32_t trie_size;

	if (n < 4)
		return tok_errorf(ret_error, -EINVAL, "precompiled_charsmap: %zu bytes, too short", n);
	memcpy(&trie_size, blob, 4);
	trie_size = le32toh(trie_size);
	if ((size_t) trie_size / 4 * 4 > n - 4)
		return tok_errorf(ret_error, -EINVAL, "precompiled_charsmap: trie of %u bytes past the end (%zu)",
				  trie_size, n);
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->n_units = trie_size / 4;
	p->units = malloc(p->n_units * sizeof(uint32_t) + 1);
	p->n_strings = n - 4 - p->n_units * 4;
	p->strings = malloc(p->n_strings + 1);
	if (!p->units || !p->strings) {
		tok_precompiled_free(p);
		return -ENOMEM;
	}
	for (size_t i = 0; i < p->n_units; i++) {
		uint32_t u;
		memcpy(&u, blob + 4 + 4 * i, 4);
		p->units[i] = le32toh(u);
	}
	memcpy(p->strings, blob + 4 + 4 * p->n_units, p->n_strings);
	p->strings[p->n_strings] = 0;
	if (tok_utf8_valid_prefix((const uint8_t *) p->strings, p->n_strings) != p->n_strings) {
		tok_precompiled_free(p);
		return tok_errorf(ret_error, -EINVAL, "precompiled_charsmap: replacement strings are not UTF-8");
	}
	for (uint8_t c = 0; c < 128; c++) {
		int64_t v = pc_first_prefix(p, &c, 1);
		p->ascii[c] = v >= 0 && (size_t) v <= p->n_strings && (p->strings[v] & 0xc0) != 0x80 ? (int32_t) v : -1;
	}
	*ret = p;
	return 0;
}

/* Appends the replacement at value v; 1 if v is out of range (HF would
 * panic on such a charsmap; here the key counts as unmapped). */
static int pc_put(const struct tok_precompiled *p, int64_t v, struct tok_buf *out) {
	/* Also refuse an offset inside a character, so the output stays
	 * UTF-8 (the strings are UTF-8 as a whole, NUL ends a character). */
	if (v < 0 || (size_t) v > p->n_strings || (p->strings[v] & 0xc0) == 0x80)
		return 1;
	return tok_buf_append(out, p->strings + v, strlen(p->strings + v));
}

/* One cluster (or one character) g[0..n): per HF's Precompiled. */
static int pc_cluster(const struct tok_precompiled *p, const uint8_t *g, size_t n, struct tok_buf *out) {
	int r;

	if (n < 6) {
		int64_t v = pc_first_prefix(p, g, n);
		if (v >= 0) {
			r = pc_put(p, v, out);
			if (r <= 0)
				return r;
		}
	}
	for (size_t i = 0; i < n;) {
		size_t k = tok_utf8_len(g[i]);
		int64_t v = pc_first_prefix(p, g + i, k);
		r = v >= 0 ? pc_put(p, v, out) : 1;
		if (r > 0)
			r = tok_buf_append(out, g + i, k);
		if (r < 0)
			return r;
		i += k;
	}
	return 0;
}

int tok_precompiled_apply(const struct tok_precompiled *p, const uint8_t *s, size_t n, struct tok_buf *out) {
	const uint8_t *end = s + n;
	int r;

	r = tok_buf_reserve(out, n);
	if (r < 0)
		return r;
	while (s < end) {
		/* ASCII followed by ASCII other than LF (CR LF is one cluster)
		 * is a cluster of one character; a run of unmapped ones is
		 * copied at once. */
		const uint8_t *a = s;
		while (a < end && a[0] < 0x80 && p->ascii[a[0]] < 0 &&
		       (a + 1 == end || (a[1] < 0x80 && !(a[0] == '\r' && a[1] == '\n'))))
			a++;
		if (a > s) {
			r = tok_buf_append(out, s, (size_t) (a - s));
			if (r < 0)
				return r;
			s = a;
			continue;
		}
		if (s[0] < 0x80 && (s + 1 == end || (s[1] < 0x80 && !(s[0] == '\r' && s[1] == '\n')))) {
			int32_t v = p->ascii[s[0]];
			r = tok_buf_append(out, p->strings + v, strlen(p->strings + v));
			if (r < 0)
				return r;
			s++;
			continue;
		}
		const uint8_t *g = u8_grapheme_next(s, end);
		if (!g || g <= s)
			g = s + tok_utf8_len(s[0]);
		r = pc_cluster(p, s, (size_t) (g - s), out);
		if (r < 0)
			return r;
		s = g;
	}
	return 0;
}
