/* SPDX-License-Identifier: MIT */
/*
 * Parquet's level and length encodings (parquet_enc.h), from the
 * specification's Encodings.md: the RLE/bit-packed hybrid is a sequence of
 * runs, each a ULEB128 header whose low bit says bit-packed (groups of 8
 * values, LSB first) or RLE (one value in ceil(bw/8) bytes, repeated);
 * DELTA_BINARY_PACKED is a header (block size, miniblocks per block, count,
 * first value), then blocks of a zigzag min delta, one bit width per
 * miniblock and the miniblocks' bit-packed deltas.
 */
#include <errno.h>
#include <string.h>

#include "daemon/format/parquet_enc.h"
#include "proto/macro.h"

/* ---- RLE / bit-packed hybrid ---------------------------------------------- */


void rle_init(struct rle *d, const uint8_t *p, size_t n, unsigned bw)
{
	*d = (struct rle){ .p = p, .end = n ? p + n : p, .bw = bw }; /* p is NULL for a required column's levels */
}

/* The next value: 0, or -EBADMSG when the data runs out or is malformed (*why says which). */
int rle_next(struct rle *d, uint32_t *ret, const char **why)
{
	while (d->left == 0) {
		uint64_t h = 0;
		unsigned shift = 0;
		for (;;) {
			if (d->p >= d->end || shift > 35) {
				*why = "RLE/bit-packed data ends before its values";
				return -EBADMSG;
			}
			uint8_t b = *d->p++;
			h |= (uint64_t)(b & 0x7f) << shift;
			shift += 7;
			if (!(b & 0x80))
				break;
		}
		if (h & 1) {
			uint64_t groups = h >> 1;
			uint64_t bytes = groups * d->bw;
			d->packed = true;
			d->bits = d->p;
			/* The last run may be cut short by its writer; only values read are checked. */
			d->nbits_bytes = (size_t)MIN(bytes, (uint64_t)(d->end - d->p));
			d->p += d->nbits_bytes;
			d->bit = 0;
			d->left = (uint32_t)MIN(groups * 8, (uint64_t)UINT32_MAX);
		} else {
			unsigned vb = (d->bw + 7) / 8;
			if ((size_t)(d->end - d->p) < vb) {
				*why = "RLE run ends before its value";
				return -EBADMSG;
			}
			uint32_t v = 0;
			for (unsigned i = 0; i < vb; i++)
				v |= (uint32_t)d->p[i] << (8 * i);
			d->p += vb;
			d->packed = false;
			d->value = v;
			d->left = (uint32_t)MIN(h >> 1, (uint64_t)UINT32_MAX);
		}
	}
	d->left--;
	if (!d->packed) {
		*ret = d->value;
		return 0;
	}
	if (d->bw == 0) {
		*ret = 0;
		return 0;
	}
	uint64_t byte = d->bit >> 3;
	unsigned sh = (unsigned)(d->bit & 7), need = (sh + d->bw + 7) / 8;
	if (byte + need > d->nbits_bytes) {
		*why = "bit-packed run ends before its values";
		return -EBADMSG;
	}
	uint64_t w = 0;
	for (unsigned k = 0; k < need; k++)
		w |= (uint64_t)d->bits[byte + k] << (8 * k);
	*ret = (uint32_t)((w >> sh) & ((UINT64_C(1) << d->bw) - 1));
	d->bit += d->bw;
	return 0;
}

/* ---- DELTA_BINARY_PACKED (the lengths of DELTA_LENGTH_BYTE_ARRAY) ---------- */


static int uvarint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
	uint64_t v = 0;
	for (unsigned shift = 0; shift < 64; shift += 7) {
		if (*p >= end)
			return -EBADMSG;
		uint8_t b = *(*p)++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return -EBADMSG;
}

static int svarint(const uint8_t **p, const uint8_t *end, int64_t *ret)
{
	uint64_t v;
	if (uvarint(p, end, &v) < 0)
		return -EBADMSG;
	*ret = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
	return 0;
}

/* Reads the header; the stream must hold exactly `count` values. */
int delta_init(struct delta *d, const uint8_t *p, size_t n, uint64_t count, const char **why)
{
	*d = (struct delta){ .p = p, .end = p + n, .first = true };
	uint64_t block, total;
	if (uvarint(&d->p, d->end, &block) < 0 || uvarint(&d->p, d->end, &d->n_mini) < 0 ||
	    uvarint(&d->p, d->end, &total) < 0 || svarint(&d->p, d->end, &d->last) < 0) {
		*why = "DELTA_BINARY_PACKED header runs past its page";
		return -EBADMSG;
	}
	if (block == 0 || block % 128 || block > (1u << 20) || d->n_mini == 0 || block % d->n_mini ||
	    (block / d->n_mini) % 32) {
		*why = "DELTA_BINARY_PACKED block or miniblock size is not valid";
		return -EBADMSG;
	}
	if (total != count) {
		*why = "DELTA_BINARY_PACKED value count differs from the page's non-null values";
		return -EBADMSG;
	}
	d->per_mini = block / d->n_mini;
	d->left = total;
	d->mini_i = d->n_mini;
	return 0;
}

int delta_next(struct delta *d, int64_t *ret, const char **why)
{
	if (d->left == 0) {
		*why = "DELTA_BINARY_PACKED stream has no values left";
		return -EBADMSG;
	}
	d->left--;
	if (d->first) {
		d->first = false;
		*ret = d->last;
		return 0;
	}
	if (d->in_mini == 0) {
		if (d->mini_i == d->n_mini) {
			if (svarint(&d->p, d->end, &d->min_delta) < 0 || (uint64_t)(d->end - d->p) < d->n_mini) {
				*why = "DELTA_BINARY_PACKED block header runs past its page";
				return -EBADMSG;
			}
			d->widths = d->p;
			d->p += d->n_mini;
			d->mini_i = 0;
		}
		d->bw = d->widths[d->mini_i++];
		uint64_t bytes = d->per_mini * d->bw / 8;
		if (d->bw > 64 || bytes > (uint64_t)(d->end - d->p)) {
			*why = "DELTA_BINARY_PACKED miniblock runs past its page";
			return -EBADMSG;
		}
		d->bits = d->p;
		d->p += bytes;
		d->bit = 0;
		d->in_mini = d->per_mini;
	}
	d->in_mini--;
	uint64_t v = 0;
	for (unsigned got = 0; got < d->bw;) {
		unsigned off = (unsigned)(d->bit & 7), take = MIN(8 - off, d->bw - got);
		v |= (uint64_t)((d->bits[d->bit >> 3] >> off) & ((1u << take) - 1)) << got;
		got += take;
		d->bit += take;
	}
	d->last = (int64_t)((uint64_t)d->last + (uint64_t)d->min_delta + v);
	*ret = d->last;
	return 0;
}

/* Where a DELTA_BINARY_PACKED stream of count values at p[0..n) ends (its values checked as they are skipped). */
int delta_end(const uint8_t *p, size_t n, uint64_t count, const uint8_t **ret, const char **why)
{
	struct delta d;
	int r = delta_init(&d, p, n, count, why);
	for (uint64_t i = 0; r == 0 && i < count; i++) {
		int64_t v;
		r = delta_next(&d, &v, why);
	}
	if (r == 0)
		*ret = d.p;
	return r;
}

