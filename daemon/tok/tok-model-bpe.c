/* SPDX-License-Identifier: MIT */
/*
 * BPE over a vocabulary of UTF-8 strings (SentencePiece-style files such as
 * Llama 2's and Gemma's), as HF tokenizers' BPE::merge_word: each character
 * (with continuing_subword_prefix unless first, end_of_word_suffix if last)
 * is its vocabulary entry, else its bytes as "<0xXX>" tokens
 * (byte_fallback), else unk_token (runs fused when fuse_unk), else dropped;
 * then the merges apply by priority, leftmost first (tok_bpe_ids()).
 */
#include <errno.h>

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

static uint64_t tok_cut_hash(uint64_t k) {
	k *= 0x9e3779b97f4a7c15ull;
	return k ^ (k >> 29);
}

bool tok_cut_joined(const struct tok *t, uint32_t a, uint32_t b) {
	if (a < 128 && b < 128)
		return t->cut_ascii[a][b >> 6] >> (b & 63) & 1;
	uint64_t k = (uint64_t) a << 32 | b;
	for (uint64_t i = tok_cut_hash(k) & t->cut_mask;; i = (i + 1) & t->cut_mask) {
		if (t->cut_pairs[i] == k)
			return true;
		if (t->cut_pairs[i] == 0)
			return false;
	}
}

static void tok_cut_put(uint64_t *tab, uint64_t mask, uint64_t k, size_t *n) {
	for (uint64_t i = tok_cut_hash(k) & mask;; i = (i + 1) & mask) {
		if (tab[i] == k)
			return;
		if (tab[i] == 0) {
			tab[i] = k;
			(*n)++;
			return;
		}
	}
}

/* Adds the pair (a, b); the table doubles at half full, so it stays as
 * small as the distinct pairs (tens of thousands) and in cache. */
static int tok_cut_insert(struct tok *t, uint32_t a, uint32_t b, size_t *n) {
	if (a < 128 && b < 128) {
		t->cut_ascii[a][b >> 6] |= 1ull << (b & 63);
		return 0;
	}
	if ((*n + 1) * 2 > t->cut_mask + 1) {
		uint64_t mask = t->cut_mask * 2 + 1, *tab = calloc(mask + 1, sizeof(*tab));
		size_t m = 0;
		if (!tab)
			return -ENOMEM;
		for (uint64_t i = 0; i <= t->cut_mask; i++)
			if (t->cut_pairs[i])
				tok_cut_put(tab, mask, t->cut_pairs[i], &m);
		free(t->cut_pairs);
		t->cut_pairs = tab;
		t->cut_mask = mask;
	}
	tok_cut_put(t->cut_pairs, t->cut_mask, (uint64_t) a << 32 | b, n);
	return 0;
}

int tok_model_bpe_utf8_prepare(struct tok *t) {
	bool fallback = t->byte_fallback;
	size_t n_pairs = 0;

	/* Can any character be unknown?  Not if every byte has its
	 * fallback token, or is an ASCII character that is a token itself
	 * (Gemma has no <0x09>: a tab is "\t"). */
	for (unsigned b = 0; b < 256; b++) {
		uint8_t c = (uint8_t) b;
		fallback = fallback && (t->fallback_id[b] != UINT32_MAX || (b < 0x80 && tok_vocab_find(t, &c, 1) >= 0));
	}
	/* Cutting must not change which characters are first or last
	 * (affixes), nor split a fused run of unknown characters, nor
	 * separate byte-fallback tokens that a merge could join. */
	t->cut = false;
	if (t->bpe_prefix_len || t->bpe_suffix_len || (!fallback && t->unk_id != UINT32_MAX && t->fuse_unk))
		return 0;
	for (uint64_t i = 0; i <= t->pair_mask; i++) {
		const struct tok_pair *p = &t->pairs[i];
		if (p->key == UINT64_MAX)
			continue;
		for (unsigned b = 0; b < 256; b++)
			if (t->fallback_id[b] == (uint32_t) (p->key >> 32) || t->fallback_id[b] == (uint32_t) p->key)
				return 0;
	}
	/* Every adjacent pair of characters in a token. */
	t->cut_mask = 1023;
	t->cut_pairs = calloc(t->cut_mask + 1, sizeof(*t->cut_pairs));
	if (!t->cut_pairs)
		return -ENOMEM;
	for (uint32_t id = 0; id < t->n_ids; id++) {
		const uint8_t *s = t->bytes + t->off[id];
		size_t n = t->off[id + 1] - t->off[id];
		uint32_t prev = UINT32_MAX;
		for (size_t i = 0; i < n;) {
			uint32_t cp;
			i += tok_utf8_next(s + i, n - i, &cp);
			if (prev != UINT32_MAX && tok_cut_insert(t, prev, cp, &n_pairs) < 0)
				return -ENOMEM;
			prev = cp;
		}
	}
	t->cut = true;
	return 0;
}
