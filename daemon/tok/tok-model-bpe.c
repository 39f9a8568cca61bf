/* SPDX-License-Identifier: MIT */
/*
 * BPE over a vocabulary of UTF-8 strings (SentencePiece-style files such as
 * Llama 2's and Gemma's), as HF tokenizers' BPE::merge_word: each character
 * (with continuing_subword_prefix unless first, end_of_word_suffix if last)
 * is its vocabulary entry, else its bytes as "<0xXX>" tokens
 * (byte_fallback), else unk_token (runs fused when fuse_unk), else dropped;
 * then the merges apply by priority, leftmost first (tok_bpe_ids()).
 */
#include "tok-internal.h"
#include "tok-unicode.h"

#define TOK_AFFIX_MAX 64

size_t tok_model_bpe_utf8_scratch(const struct tok *t, size_t n) {
	(void) t;
	return n * sizeof(uint32_t) + tok_bpe_scratch_size(n) + 8;
}

size_t tok_model_bpe_utf8(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	uint32_t *init = scratch;
	uint8_t buf[2 * TOK_AFFIX_MAX + 4];
	bool unk = false;
	size_t m = 0;

	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k = tok_utf8_next(s + i, n - i, &cp);
		const uint8_t *w = s + i;
		size_t wn = k;
		int64_t id;

		if ((t->bpe_prefix_len && i > 0) || (t->bpe_suffix_len && i + k == n)) {
			wn = 0;
			if (i > 0) {
				memcpy(buf, t->bpe_prefix, t->bpe_prefix_len);
				wn = t->bpe_prefix_len;
			}
			memcpy(buf + wn, s + i, k);
			wn += k;
			if (i + k == n) {
				memcpy(buf + wn, t->bpe_suffix, t->bpe_suffix_len);
				wn += t->bpe_suffix_len;
			}
			w = buf;
		}
		i += k;
		id = tok_vocab_find(t, w, wn);
		if (id >= 0) {
			if (unk) {
				init[m++] = t->unk_id;
				unk = false;
			}
			init[m++] = (uint32_t) id;
			continue;
		}
		if (t->byte_fallback) {
			bool all = true;
			for (size_t j = 0; j < wn; j++)
				all = all && t->fallback_id[w[j]] != UINT32_MAX;
			if (all) {
				/* HF leaves a pending unk pending here. */
				for (size_t j = 0; j < wn; j++)
					init[m++] = t->fallback_id[w[j]];
				continue;
			}
		}
		if (t->unk_id != UINT32_MAX) {
			if (unk && !t->fuse_unk)
				init[m++] = t->unk_id;
			unk = true;
		}
	}
	if (unk)
		init[m++] = t->unk_id;
	if (m == 0)
		return 0;
	return tok_bpe_ids(t, init, m, out, init + n);
}

void tok_model_bpe_utf8_prepare(struct tok *t) {
	static const uint8_t meta[3] = { 0xe2, 0x96, 0x81 };
	bool fallback = t->byte_fallback;

	for (unsigned b = 0; b < 256; b++)
		fallback = fallback && t->fallback_id[b] != UINT32_MAX;
	/* Cutting must not change which characters are first or last
	 * (affixes), nor split a run of unknown characters (U+2581 is a
	 * token, or no character is unknown). */
	t->cut_meta = false;
	if (t->bpe_prefix_len || t->bpe_suffix_len || (!fallback && tok_vocab_find(t, meta, 3) < 0))
		return;
	for (uint32_t id = 0; id < t->n_ids; id++) {
		const uint8_t *s = t->bytes + t->off[id];
		size_t n = t->off[id + 1] - t->off[id];
		bool prev_other = false;
		for (size_t i = 0; i < n;) {
			uint32_t cp;
			i += tok_utf8_next(s + i, n - i, &cp);
			if (cp == 0x2581 && prev_other)
				return;
			prev_other = cp != 0x2581;
		}
	}
	t->cut_meta = true;
}
