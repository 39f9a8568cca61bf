/* SPDX-License-Identifier: MIT */
/*
 * Growable byte buffers and id lists used by the text passes and models of
 * tok-model.h, and the small UTF-8 and code point range helpers they share.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tok-model.h"

int tok_buf_reserve(struct tok_buf *b, size_t extra) {
	if (b->n + extra <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < b->n + extra)
		cap *= 2;
	uint8_t *p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

int tok_buf_put(struct tok_buf *b, const void *s, size_t n) {
	int r = tok_buf_reserve(b, n);
	if (r < 0)
		return r;
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	return 0;
}

int tok_u32s_push(struct tok_u32s *v, uint32_t id) {
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 64;
		uint32_t *p = realloc(v->ids, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		v->ids = p;
		v->cap = cap;
	}
	v->ids[v->n++] = id;
	return 0;
}

size_t tok_utf8_enc(uint32_t cp, uint8_t *out) {
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

bool tok_range_has(const struct tok_range *r, size_t n, uint32_t cp) {
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
