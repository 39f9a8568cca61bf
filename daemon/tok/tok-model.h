/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer models other than byte-level BPE, as HF tokenizers 0.23 runs them:
 *
 *   Unigram    (T5, mT5, XLM-R, ALBERT): Viterbi over scored pieces with
 *              unk_id, fused unknowns and byte_fallback   (tok-unigram.c),
 *   WordPiece  (BERT): greedy longest match with a continuing-subword
 *              prefix, max_input_chars_per_word, unk_token (tok-wordpiece.c),
 *
 * and the text passes they come with:
 *
 *   Precompiled      SentencePiece's charsmap (double-array trie + strings),
 *                    applied per grapheme as HF does    (tok-precompiled.c),
 *   BertNormalizer, BertPreTokenizer                    (tok-bert.c),
 *   Metaspace, WhitespaceSplit                          (tok-hf-model.c).
 *
 * A struct tok_model is built by tok_hf_model_load() (tok-hf-model.c) from a
 * tokenizer.json and hangs off struct tok (t->model); it is read-only once
 * loaded.  Per-thread scratch is a struct tok_model_scratch, owned by the
 * struct tok_state.  tok.c hands every run of ordinary text (between added
 * tokens) to tok_model_encode().
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tok;

/* A growable byte buffer; zero-initialise, free(b->p). */
struct tok_buf {
	uint8_t *p;
	size_t n, cap;
};

int tok_buf_reserve(struct tok_buf *b, size_t extra);
int tok_buf_put(struct tok_buf *b, const void *s, size_t n);

/* A growable id list; zero-initialise, free(v->ids). */
struct tok_u32s {
	uint32_t *ids;
	size_t n, cap;
};

int tok_u32s_push(struct tok_u32s *v, uint32_t id);

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

bool tok_range_has(const struct tok_range *r, size_t n, uint32_t cp);

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

/* Encodes cp as UTF-8 into out (4 bytes room); returns its length. */
size_t tok_utf8_enc(uint32_t cp, uint8_t *out);

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

/* BertPreTokenizer: calls piece() for each word and punctuation character. */
typedef int (*tok_piece_fn)(void *userdata, const uint8_t *s, size_t n);
int tok_bert_pretokenize(const uint8_t *s, size_t n, tok_piece_fn piece, void *userdata);

/* --- Unigram (tok-unigram.c) --------------------------------------------- */

struct tok_unigram;
struct tok_unigram_scratch;

int tok_unigram_new(size_t n_pieces, struct tok_unigram **ret);
struct tok_unigram *tok_unigram_free(struct tok_unigram *u);
/* Piece id = order of addition.  Returns 0 or -ENOMEM. */
int tok_unigram_add(struct tok_unigram *u, const char *piece, size_t len, double score);
/* After the last add: builds the trie and the byte-fallback table.
 * unk_id < 0: none.  Returns 0, -ENOMEM, -EINVAL (unk_id out of range). */
int tok_unigram_finish(struct tok_unigram *u, int64_t unk_id, bool byte_fallback);
size_t tok_unigram_size(const struct tok_unigram *u);
/* The piece of id, or NULL. */
const char *tok_unigram_piece(const struct tok_unigram *u, uint32_t id, size_t *ret_len);
int64_t tok_unigram_find(const struct tok_unigram *u, const uint8_t *s, size_t n);
struct tok_unigram_scratch *tok_unigram_scratch_free(struct tok_unigram_scratch *s);
/* Appends the ids of one pre-token to out.  -ENOENT where HF fails
 * (an unknown character and no unk_id). */
int tok_unigram_encode(const struct tok_unigram *u, struct tok_unigram_scratch **scratch, const uint8_t *s, size_t n,
		       struct tok_u32s *out);

/* --- WordPiece (tok-wordpiece.c) ----------------------------------------- */

struct tok_wordpiece;

int tok_wordpiece_new(const char *prefix, size_t max_chars, struct tok_wordpiece **ret);
struct tok_wordpiece *tok_wordpiece_free(struct tok_wordpiece *w);
int tok_wordpiece_add(struct tok_wordpiece *w, const char *token, size_t len, uint32_t id);
/* After the last add; unk must be in the vocabulary (-ENOENT if not). */
int tok_wordpiece_finish(struct tok_wordpiece *w, const char *unk);
size_t tok_wordpiece_size(const struct tok_wordpiece *w);
const char *tok_wordpiece_token(const struct tok_wordpiece *w, uint32_t id, size_t *ret_len);
int64_t tok_wordpiece_find(const struct tok_wordpiece *w, const uint8_t *s, size_t n);
/* Appends the ids of one word to out. */
int tok_wordpiece_encode(const struct tok_wordpiece *w, const uint8_t *s, size_t n, struct tok_u32s *out);

/* --- The pipeline (tok-hf-model.c) --------------------------------------- */

struct tok_model;
struct tok_model_scratch;

/* Loads model, normalizer and pre_tokenizer of a Unigram or WordPiece
 * tokenizer.json (root) into t->model, and sets t's vocabulary size.
 * Refuses with -EOPNOTSUPP and the field named what it does not implement. */
int tok_hf_model_load(struct tok *t, const json_t *root, char **ret_error);
struct tok_model *tok_model_free(struct tok_model *m);
struct tok_model_scratch *tok_model_scratch_free(struct tok_model_scratch *s);
size_t tok_model_vocab_size(const struct tok_model *m);
/* Token text of id (a pointer into m), -ENOENT if none. */
int tok_model_token(const struct tok_model *m, int32_t id, const uint8_t **ret, size_t *ret_len);
/* Id of a token of the model's vocabulary, or -1. */
int64_t tok_model_find(const struct tok_model *m, const char *s, size_t n);

/*
 * Encodes one run of ordinary text (between added tokens) and hands the ids
 * to emit.  at_start: the run begins the document (Metaspace
 * prepend_scheme "first").  Unless utf8_valid, invalid UTF-8 is replaced
 * by U+FFFD window by window, adding the count to *n_replaced.  Returns 0
 * or a negative errno.
 */
typedef void (*tok_emit_fn)(void *userdata, const uint32_t *ids, size_t n);
int tok_model_encode(const struct tok_model *m, struct tok_model_scratch **scratch, const uint8_t *s, size_t n,
		     bool at_start, bool utf8_valid, tok_emit_fn emit, void *userdata, size_t *n_replaced);
