/* SPDX-License-Identifier: MIT */
/*
 * The code points HF tokenizers' normalizers leave alone although Unicode
 * normalizes them (tok-nf-tables.h, generated from the reference by
 * gen-nf-tables.mjs): HF's normalization data predate Unicode 12.1, and
 * libunistring's are 14.  tok_norm_nf() and BERT's strip_accents pass them
 * through.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok-nf-tables.h"
#include "tok-pipe.h"

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
