/* SPDX-License-Identifier: MIT */
/*
 * Parquet's encodings of levels and lengths (parquet_enc.c), over untrusted
 * bytes: the RLE/bit-packed hybrid (definition levels, dictionary indexes)
 * and DELTA_BINARY_PACKED (the lengths of DELTA_LENGTH_BYTE_ARRAY and
 * DELTA_BYTE_ARRAY). Decoders read values one at a time and never read past
 * their bytes; a failure returns -EBADMSG with a static reason in *why.
 * Internal to daemon/format/parquet*.c.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct rle {
	const uint8_t *p, *end;
	unsigned bw;
	uint32_t left;        /* values left in the current run */
	bool packed;
	uint32_t value;       /* an RLE run's value */
	const uint8_t *bits;  /* a bit-packed run's bytes */
	size_t nbits_bytes;
	uint64_t bit;         /* next bit in it */
};

/* A decoder of bw-bit values (bw <= 32) over p[0..n); p may be NULL when n is 0. */
void rle_init(struct rle *d, const uint8_t *p, size_t n, unsigned bw);
/* The next value: 0, or -EBADMSG when the data runs out or is malformed. */
int rle_next(struct rle *d, uint32_t *ret, const char **why);

struct delta {
	const uint8_t *p, *end;
	uint64_t per_mini, n_mini, left;
	int64_t last, min_delta;
	bool first;
	const uint8_t *widths;
	uint64_t mini_i;       /* next miniblock of the block; n_mini when a block header is due */
	uint64_t in_mini;      /* values left in the current miniblock */
	const uint8_t *bits;
	uint64_t bit;
	unsigned bw;
};

/* Reads the header at p[0..n); the stream must hold exactly `count` values. */
int delta_init(struct delta *d, const uint8_t *p, size_t n, uint64_t count, const char **why);
int delta_next(struct delta *d, int64_t *ret, const char **why);
/* Where a stream of count values at p[0..n) ends (its values checked as they are skipped). */
int delta_end(const uint8_t *p, size_t n, uint64_t count, const uint8_t **ret, const char **why);
