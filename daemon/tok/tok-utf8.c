/* SPDX-License-Identifier: MIT */
/*
 * UTF-8 validation and repair.
 *
 * Repair replaces each maximal subpart of an ill-formed sequence by one
 * U+FFFD (Unicode ch. 3, "U+FFFD Substitution of Maximal Subparts"), which
 * is what Python's bytes.decode("utf-8", errors="replace") and the WHATWG
 * decoder (Node's Buffer.toString) do.  The reference encoders see text
 * repaired that way, so feedd must repair identically to match their ids.
 */
#include "tok-internal.h"

/* Second-byte range of a lead byte (Unicode Table 3-7), 0 for bytes that
 * cannot start a sequence. */
static inline int tok_utf8_need(uint8_t b, uint8_t *lo, uint8_t *hi) {
	*lo = 0x80;
	*hi = 0xbf;
	if (b >= 0xc2 && b <= 0xdf)
		return 1;
	if (b >= 0xe0 && b <= 0xef) {
		if (b == 0xe0)
			*lo = 0xa0;
		else if (b == 0xed)
			*hi = 0x9f;
		return 2;
	}
	if (b >= 0xf0 && b <= 0xf4) {
		if (b == 0xf0)
			*lo = 0x90;
		else if (b == 0xf4)
			*hi = 0x8f;
		return 3;
	}
	return 0;
}

/* Length of the well-formed sequence at s[0..n), or minus the length of the
 * maximal subpart to replace (at least 1). */
static inline int tok_utf8_seq(const uint8_t *s, size_t n) {
	uint8_t lo, hi;
	int need = tok_utf8_need(s[0], &lo, &hi);
	int k;

	if (s[0] < 0x80)
		return 1;
	if (need == 0)
		return -1;
	for (k = 1; k <= need; k++) {
		if ((size_t) k >= n)
			return -k;
		if (s[k] < lo || s[k] > hi)
			return -k;
		lo = 0x80;
		hi = 0xbf;
	}
	return need + 1;
}

size_t tok_utf8_valid_prefix(const uint8_t *s, size_t n) {
	size_t i = 0;

	while (i < n) {
		/* Text is mostly ASCII: check 16 bytes at a time. */
		while (i + 16 <= n) {
			uint64_t a, b;
			memcpy(&a, s + i, 8);
			memcpy(&b, s + i + 8, 8);
			if ((a | b) & 0x8080808080808080ull)
				break;
			i += 16;
		}
		if (i >= n)
			break;
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		int k = tok_utf8_seq(s + i, n - i);
		if (k < 0)
			return i;
		i += (size_t) k;
	}
	return n;
}

size_t tok_utf8_replace(const uint8_t *src, size_t n, uint8_t *dst, size_t *ret_n_replaced) {
	size_t i = 0, o = 0, rep = 0;

	while (i < n) {
		int k = tok_utf8_seq(src + i, n - i);
		if (k > 0) {
			memcpy(dst + o, src + i, (size_t) k);
			o += (size_t) k;
			i += (size_t) k;
		} else {
			dst[o++] = 0xef;
			dst[o++] = 0xbf;
			dst[o++] = 0xbd;
			i += (size_t) -k;
			rep++;
		}
	}
	*ret_n_replaced = rep;
	return o;
}
