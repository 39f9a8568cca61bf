/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer models other than BPE, as HF tokenizers 0.23 runs them, and the
 * text passes they come with, as parts of the general tokenizer.json
 * pipeline (tok-pipe.h):
 *
 *   Unigram    (T5, mT5, XLM-R, ALBERT): Viterbi over scored pieces with
 *              unk_id, fused unknowns and byte_fallback   (tok-unigram.c),
 *   WordPiece  (BERT): greedy longest match with a continuing-subword
 *              prefix, max_input_chars_per_word, unk_token (tok-wordpiece.c),
 *   Precompiled      SentencePiece's charsmap (double-array trie + strings),
 *                    applied per grapheme as HF does    (tok-precompiled.c),
 *   BertNormalizer, BertPreTokenizer                    (tok-bert.c).
 *
 * tok-hf-model.c reads them from a tokenizer.json and plugs them into the
 * pipeline (t->model, tok_norm_add(), tok_pre_add()).  Each object is
 * read-only once built; per-thread scratch comes from the pipeline.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tok-pipe.h"

/* String -> id map.  Zero-initialise; add, then finish, then find.  A
 * string added twice maps to its later id (as a JSON object or HF's
 * HashMap::insert would have it). */
struct tok_strent {
	uint32_t off, len, id;
	uint32_t hash;
};

struct tok_strmap {
	char *bytes;            /* the strings, each NUL-terminated */
	size_t n_bytes, cap_bytes;
	struct tok_strent *ents;
	size_t n_ents, cap_ents;
	uint32_t *slots;        /* entry index + 1, 0 = empty */
	uint32_t mask;
	size_t max_len;         /* longest string, bytes */
};

int tok_strmap_add(struct tok_strmap *m, const char *s, size_t n, uint32_t id);
int tok_strmap_finish(struct tok_strmap *m);
void tok_strmap_clear(struct tok_strmap *m);
const struct tok_strent *tok_strmap_get(const struct tok_strmap *m, const uint8_t *s, size_t n);
static inline int64_t tok_strmap_find(const struct tok_strmap *m, const uint8_t *s, size_t n) {
	const struct tok_strent *e = tok_strmap_get(m, s, n);
	return e ? (int64_t) e->id : -1;
}

/* Code point ranges and case mappings (generated tables). */
struct tok_range {
	uint32_t lo, hi;
};

struct tok_lower {
	uint32_t cp;
	uint8_t n;
	uint32_t to[3];
};


/* Decodes one UTF-8 character of valid UTF-8 at s; returns its length. */
static inline size_t tok_utf8_dec(const uint8_t *s, uint32_t *ret_cp) {
	if (s[0] < 0x80) {
		*ret_cp = s[0];
		return 1;
	}
	if (s[0] < 0xe0) {
		*ret_cp = (uint32_t) (s[0] & 0x1f) << 6 | (s[1] & 0x3f);
		return 2;
	}
	if (s[0] < 0xf0) {
		*ret_cp = (uint32_t) (s[0] & 0x0f) << 12 | (uint32_t) (s[1] & 0x3f) << 6 | (s[2] & 0x3f);
		return 3;
	}
	*ret_cp = (uint32_t) (s[0] & 0x07) << 18 | (uint32_t) (s[1] & 0x3f) << 12 | (uint32_t) (s[2] & 0x3f) << 6 |
		  (s[3] & 0x3f);
	return 4;
}

static inline size_t tok_utf8_len(uint8_t lead) {
	return lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
}


/* --- Precompiled (tok-precompiled.c) ------------------------------------ */

struct tok_precompiled;

/* Parses a charsmap blob: u32le trie size in bytes, the double array, then
 * NUL-separated replacement strings.  Returns 0, -ENOMEM, or -EINVAL with a
 * message naming what is wrong in *ret_error (malloc'd). */
int tok_precompiled_new(const uint8_t *blob, size_t n, struct tok_precompiled **ret, char **ret_error);
struct tok_precompiled *tok_precompiled_free(struct tok_precompiled *p);

/* Appends the normalisation of valid UTF-8 s[0..n) to out. */
int tok_precompiled_apply(const struct tok_precompiled *p, const uint8_t *s, size_t n, struct tok_buf *out);

/* --- BERT (tok-bert.c) --------------------------------------------------- */

struct tok_bert_norm {
	bool clean_text, handle_chinese_chars, strip_accents, lowercase;
};

/* Appends BertNormalizer's output for valid UTF-8 s[0..n) to out. */
int tok_bert_normalize(const struct tok_bert_norm *b, const uint8_t *s, size_t n, struct tok_buf *out);

/* StripAccents: appends s[0..n) without its combining marks to out. */
int tok_strip_accents(const uint8_t *s, size_t n, struct tok_buf *out);

/* BertPreTokenizer: calls piece() for each word and punctuation character. */
typedef int (*tok_piece_fn)(void *userdata, const uint8_t *s, size_t n);
int tok_bert_pretokenize(const uint8_t *s, size_t n, tok_piece_fn piece, void *userdata);

/* --- Unigram (tok-unigram.c) --------------------------------------------- */

struct tok_unigram;

int tok_unigram_new(size_t n_pieces, struct tok_unigram **ret);
struct tok_unigram *tok_unigram_free(struct tok_unigram *u);
/* Piece id = order of addition.  Returns 0 or -ENOMEM. */
int tok_unigram_add(struct tok_unigram *u, const char *piece, size_t len, double score);
/* After the last add: builds the trie and the byte-fallback table.
 * unk_id < 0: none.  Returns 0, -ENOMEM, -EINVAL (unk_id out of range). */
int tok_unigram_finish(struct tok_unigram *u, int64_t unk_id, bool byte_fallback);
/* Scratch bytes tok_unigram_encode() needs for a piece of n bytes. */
size_t tok_unigram_scratch_size(size_t n);
/* Writes the ids of one pre-token s[0..n) to out (room for n: every id
 * covers at least one byte) and returns how many.  The model must have an
 * unk_id (HF fails on an unknown character without one; the loader
 * refuses such files). */
size_t tok_unigram_encode(const struct tok_unigram *u, const uint8_t *s, size_t n, uint32_t *out, void *scratch);

/* --- WordPiece (tok-wordpiece.c) ----------------------------------------- */

struct tok_wordpiece;

int tok_wordpiece_new(const char *prefix, size_t max_chars, struct tok_wordpiece **ret);
struct tok_wordpiece *tok_wordpiece_free(struct tok_wordpiece *w);
int tok_wordpiece_add(struct tok_wordpiece *w, const char *token, size_t len, uint32_t id);
/* After the last add; unk must be in the vocabulary (-ENOENT if not). */
int tok_wordpiece_finish(struct tok_wordpiece *w, const char *unk);
/* Scratch bytes tok_wordpiece_encode() needs (whatever the word). */
size_t tok_wordpiece_scratch_size(const struct tok_wordpiece *w);
/* Writes the ids of one word s[0..n) to out (room for n) and returns how
 * many. */
size_t tok_wordpiece_encode(const struct tok_wordpiece *w, const uint8_t *s, size_t n, uint32_t *out, void *scratch);

/* --- tokenizer.json (tok-hf-model.c) ------------------------------------ */

/* Parsers of the tables in tok-hf.c and tok-hf-pipe.c. */
int tok_hf_unigram(struct tok *t, const json_t *model, const char *where, char **ret_error);
int tok_hf_wordpiece(struct tok *t, const json_t *model, const char *where, char **ret_error);
int tok_hf_precompiled(struct tok *t, const json_t *n, const char *where, char **ret_error);
int tok_hf_bert_normalizer(struct tok *t, const json_t *n, const char *where, char **ret_error);
int tok_hf_strip_accents(struct tok *t, const json_t *n, const char *where, char **ret_error);
int tok_hf_bert_pre_tokenizer(struct tok *t, const json_t *p, const char *where, char **ret_error);
