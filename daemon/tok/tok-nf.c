/* SPDX-License-Identifier: MIT */
/*
 * The code points HF tokenizers' normalizers leave alone although Unicode
 * normalizes them (tok-nf-tables.h, generated from the reference by
 * gen-nf-tables.mjs): HF's normalization data predate Unicode 12.1, and
 * libunistring's are 14.  tok_norm_nf() and BERT's strip_accents pass them
 * through.
 *
 * Also the decomposing forms (NFD, NFKD) of a text by runs: BMP characters
 * that have no decomposition of that kind and combining class 0 are copied
 * as they are and bound the runs libunistring normalizes (canonical
 * reordering never crosses a class-0 character), so most text never
 * reaches u8_normalize() (perf: a sixth of ALBERT's time).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unictype.h>
#include <uninorm.h>

#include "tok-nf-tables.h"
#include "tok-pipe.h"
#include "tok-unicode.h"

static bool in_sorted(const uint32_t *v, size_t n, uint32_t cp) {
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (v[mid] == cp)
			return true;
		if (v[mid] < cp)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

bool tok_nf_hf_keeps(int form, uint32_t cp) {
	/* Nothing below U+32FF is in any table. */
	if (cp < 0x3000)
		return false;
	switch (form) {
	case 0:
		return in_sorted(tok_nf_keep_nfc, TOK_NF_KEEP_NFC_N, cp);
	case 1:
		return in_sorted(tok_nf_keep_nfd, TOK_NF_KEEP_NFD_N, cp);
	case 2:
		return in_sorted(tok_nf_keep_nfkc, TOK_NF_KEEP_NFKC_N, cp);
	case 3:
		return in_sorted(tok_nf_keep_nfkd, TOK_NF_KEEP_NFKD_N, cp);
	}
	return false;
}

/* Bit c: BMP character c is left alone by NFD ([0]) / NFKD ([1]). */
static uint8_t inert[2][0x10000 / 8];
static pthread_once_t inert_once = PTHREAD_ONCE_INIT;

static void inert_init(void) {
	for (uint32_t c = 0; c < 0x10000; c++) {
		ucs4_t d[UC_DECOMPOSITION_MAX_LENGTH];
		int type;
		if ((c >= 0xd800 && c <= 0xdfff) || uc_combining_class(c) != 0)
			continue;
		if (uc_canonical_decomposition(c, d) < 0)
			inert[0][c >> 3] |= (uint8_t) (1u << (c & 7));
		if (uc_decomposition(c, &type, d) < 0)
			inert[1][c >> 3] |= (uint8_t) (1u << (c & 7));
	}
}

bool tok_nf_inert(bool compat, uint32_t cp) {
	pthread_once(&inert_once, inert_init);
	return cp < 0x10000 && (inert[compat][cp >> 3] >> (cp & 7) & 1);
}

static int run_append(bool compat, const uint8_t *in, size_t n, struct tok_buf *out) {
	size_t len = 0;
	uint8_t *o;
	int r;

	if (n == 0)
		return 0;
	o = u8_normalize(compat ? UNINORM_NFKD : UNINORM_NFD, in, n, NULL, &len);
	if (!o)
		return -errno;
	r = tok_buf_append(out, o, len);
	free(o);
	return r;
}

int tok_nf_decompose(bool compat, const uint8_t *in, size_t n, struct tok_buf *out) {
	const int form = compat ? 3 : 1;
	size_t run = 0, copy = 0, i = 0;
	int r;

	pthread_once(&inert_once, inert_init);
	r = tok_buf_reserve(out, n);
	/* [copy, run) is text to copy as it is, [run, i) text to normalize. */
	while (r == 0 && i < n) {
		uint32_t c;
		size_t k = in[i] < 0x80 ? (c = in[i], 1) : tok_utf8_next(in + i, n - i, &c);
		if (c < 0x80 || (c < 0x10000 && (inert[compat][c >> 3] >> (c & 7) & 1)) ||
		    (c >= 0x3000 && tok_nf_hf_keeps(form, c))) {
			if (i > run) {
				r = tok_buf_append(out, in + copy, run - copy);
				if (r == 0)
					r = run_append(compat, in + run, i - run, out);
				copy = i;
			}
			run = i + k;
		}
		i += k;
	}
	if (r == 0)
		r = tok_buf_append(out, in + copy, run - copy);
	if (r == 0)
		r = run_append(compat, in + run, n - run, out);
	return r;
}
