/* SPDX-License-Identifier: MIT */
/*
 * Small helpers shared by the tokenizer tests: locating the fetched data
 * (scripts/fetch-tok-data.sh), reading files, base64, comparing id lists.
 */
#pragma once

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok-internal.h"

#define SKIP 77

/* The data directory: $FEEDD_TOKDATA, else the default the build passes in
 * FEEDD_TOKDATA_DEFAULT. */
static inline const char *test_data_dir(void) {
	const char *d = getenv("FEEDD_TOKDATA");
	if (d && *d)
		return d;
#ifdef FEEDD_TOKDATA_DEFAULT
	return FEEDD_TOKDATA_DEFAULT;
#else
	return "build/tokdata";
#endif
}

/* Exits 77 (skip) saying why when a fetched file is missing. */
static inline char *test_data_path(const char *rel) {
	char *p = NULL;
	struct stat st;

	if (asprintf(&p, "%s/%s", test_data_dir(), rel) < 0)
		abort();
	if (stat(p, &st) < 0) {
		printf("SKIP: %s is missing; run scripts/fetch-tok-data.sh (or set FEEDD_TOKDATA)\n", p);
		exit(SKIP);
	}
	return p;
}

static inline char *test_read_file(const char *path, size_t *ret_len) {
	FILE *f = fopen(path, "rbe");
	char *buf;
	long n;

	if (!f) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		exit(1);
	}
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t) n + 1);
	if (!buf || fread(buf, 1, (size_t) n, f) != (size_t) n) {
		fprintf(stderr, "%s: read failed\n", path);
		exit(1);
	}
	buf[n] = 0;
	fclose(f);
	*ret_len = (size_t) n;
	return buf;
}

static inline size_t test_b64_decode(const char *s, uint8_t *out) {
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint32_t acc = 0;
	int bits = 0;
	size_t o = 0;

	for (; *s && *s != '='; s++) {
		const char *p = strchr(tab, *s);
		if (!p)
			abort();
		acc = acc << 6 | (uint32_t) (p - tab);
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			out[o++] = (uint8_t) (acc >> bits);
		}
	}
	return o;
}

/* Prints the first difference between two id lists with the tokens around
 * it; returns true if they are equal. */
static inline bool test_ids_equal(const struct tok *t, const char *what, const int32_t *want, size_t n_want,
				  const int32_t *got, size_t n_got) {
	size_t i = 0;

	while (i < n_want && i < n_got && want[i] == got[i])
		i++;
	if (i == n_want && i == n_got)
		return true;
	printf("FAIL %s: %zu ids expected, %zu got; first difference at %zu\n", what, n_want, n_got, i);
	for (int side = 0; side < 2; side++) {
		const int32_t *v = side ? got : want;
		size_t n = side ? n_got : n_want;
		printf("  %s:", side ? "got " : "want");
		for (size_t k = i > 3 ? i - 3 : 0; k < n && k < i + 6; k++) {
			const uint8_t *b;
			size_t bl;
			printf(" %d", v[k]);
			if (tok_token_bytes(t, v[k], &b, &bl) == 0) {
				printf("[");
				for (size_t j = 0; j < bl; j++)
					printf(b[j] >= 0x20 && b[j] < 0x7f ? "%c" : "\\x%02x", b[j]);
				printf("]");
			}
		}
		printf("\n");
	}
	return false;
}
