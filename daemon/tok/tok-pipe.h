/* SPDX-License-Identifier: MIT */
/*
 * The general tokenizer.json pipeline: the internal API that normalizers,
 * pre-tokenizers and models plug into (tok-pipe.c runs it).
 *
 * A tok whose tokenizer.json is not plain byte-level BPE (t->general) is
 * encoded as HF tokenizers does it:
 *
 *   raw text --(UTF-8 repair)--> split on added tokens with normalized:false
 *     each gap --normalizers t->norms[0..n_norms)--> normalized text
 *       split on added tokens with normalized:true (by normalized content)
 *         each gap --pre-tokenizers t->pres[0..n_pres)--> pieces
 *           each piece --model (tok_piece(): cache, whole-token check,
 *                              t->model or byte-level BPE)--> ids
 *
 * Normalizer: one function that writes the normalized form of a whole text
 * into a buffer.  Offsets are not tracked (feedd needs ids only).
 *
 * Pre-tokenizer stage k: apply(pre, st, k, s, n, first) gets one piece and
 * hands each of its own pieces, in order, to tok_pre_run(st, k + 1, ...),
 * which runs the next stage or, after the last, the model.  A stage that
 * rewrites text (Metaspace) writes it into tok_pre_buf(st, k) first.  A
 * stage that only splits computes spans (tok_pre_spans(st, k)) and calls
 * tok_pre_split() with an HF split behaviour.  `first` is HF's
 * "offsets_original().0 == 0": the piece starts the whole text.
 *
 * Model: t->model(t, s, n, out, scratch) writes the ids of one piece
 * s[0..n) (n >= 1) to out (room for n ids) using t->model_scratch(t, n)
 * bytes of scratch, and returns how many.  NULL means byte-level BPE
 * (tok_bpe()).  A model also sets whole_ok[id] for ids whose own text
 * encodes to exactly that id (tok_compute_whole_ok() does it by running
 * the model), so that tok_piece() can answer those without the model.
 */
#pragma once

#include "tok-internal.h"


/* Makes room for `more` bytes after b->n. */
int tok_buf_reserve(struct tok_buf *b, size_t more);
int tok_buf_append(struct tok_buf *b, const void *s, size_t n);

/* ---- normalizers ---- */

struct tok_norm;
/* Writes the normalized in[0..n) to out (out->n is 0 on entry). */
typedef int (*tok_norm_fn)(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
			   struct tok_buf *out);

struct tok_norm {
	tok_norm_fn apply;
	void (*done)(struct tok_norm *nm);      /* frees data; may be NULL */
	uint8_t *str;                           /* Prepend: text; Replace: content */
	size_t str_len;
	uint8_t *lit;                           /* Replace with a String pattern */
	size_t lit_len;
	pcre2_code *re;                         /* Replace with a Regex pattern */
	int form;                               /* NFC/NFD/NFKC/NFKD: 0..3 */
	bool left, right;                       /* Strip */
	void *data;                             /* other normalizers' own data */
};

/* Does HF's normalization (data older than Unicode 12.1) leave cp alone
 * in form 0 NFC, 1 NFD, 2 NFKC, 3 NFKD, where Unicode changes it?  (tok-nf.c) */
bool tok_nf_hf_keeps(int form, uint32_t cp);
/* NFD (compat false) or NFKD of in[0..n), as HF, appended to out. */
int tok_nf_decompose(bool compat, const uint8_t *in, size_t n, struct tok_buf *out);
/* No decomposition of that kind and combining class 0 (BMP only). */
bool tok_nf_inert(bool compat, uint32_t cp);

int tok_norm_nf(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n, struct tok_buf *out);
int tok_norm_lowercase(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		       struct tok_buf *out);
int tok_norm_strip(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n, struct tok_buf *out);
int tok_norm_prepend(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		     struct tok_buf *out);
int tok_norm_replace(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		     struct tok_buf *out);

/* Appends a normalizer to t (zeroed, to be filled); NULL if full. */
struct tok_norm *tok_norm_add(struct tok *t);

/* Runs all of t's normalizers over s[0..n); *ret points at the result
 * (s itself when there are none), valid until the next call. */
int tok_normalize(struct tok_state *st, const uint8_t *s, size_t n, const uint8_t **ret, size_t *ret_len);

/* ---- pre-tokenizers ---- */

/* HF's SplitDelimiterBehavior. */
enum tok_split_behavior {
	TOK_SPLIT_REMOVED,
	TOK_SPLIT_ISOLATED,
	TOK_SPLIT_MERGED_PREV,
	TOK_SPLIT_MERGED_NEXT,
	TOK_SPLIT_CONTIGUOUS,
};

/* A stretch of a piece: a match of the pattern or a gap between matches. */
struct tok_span {
	size_t start, end;
	bool match;
};


enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_pre;
typedef int (*tok_pre_fn)(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			  bool first);

struct tok_pre {
	tok_pre_fn apply;
	void (*done)(struct tok_pre *p);        /* frees data; may be NULL */
	pcre2_code *re;                         /* Split, ByteLevel with use_regex */
	bool jit;
	enum tok_split_behavior behavior;       /* Split, Punctuation */
	bool invert;                            /* Split */
	uint8_t rep[4];                         /* Metaspace replacement (UTF-8) */
	size_t rep_len;
	enum tok_prepend prepend;               /* Metaspace */
	bool split;                             /* Metaspace */
	bool individual;                        /* Digits */
	bool add_prefix_space;                  /* ByteLevel */
	void *data;                             /* other pre-tokenizers' own data */
};

int tok_pre_split_regex(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			bool first);
int tok_pre_metaspace(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		      bool first);
int tok_pre_digits(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		   bool first);
int tok_pre_whitespace_split(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			     bool first);
int tok_pre_punctuation(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			bool first);
int tok_pre_whitespace(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		       bool first);
int tok_pre_bytelevel(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		      bool first);

/* Appends a pre-tokenizer stage to t (zeroed, to be filled); NULL if full. */
struct tok_pre *tok_pre_add(struct tok *t);

/* Runs stage `level` on a piece (after the last stage: the model). */
int tok_pre_run(struct tok_state *st, size_t level, const uint8_t *s, size_t n, bool first);

/* Per-stage scratch of the state (in use while the stage's pieces run). */
struct tok_buf *tok_pre_buf(struct tok_state *st, size_t level);
struct tok_spans *tok_pre_spans(struct tok_state *st, size_t level);
int tok_spans_push(struct tok_spans *sp, size_t start, size_t end, bool match);

/* Spans of s[0..n) where each character with pred(cp) is one match. */
int tok_spans_chars(struct tok_spans *sp, const uint8_t *s, size_t n, bool (*pred)(uint32_t cp));

/* Cuts s[0..n) along sp (in order, covering s) as HF's
 * NormalizedString::split does with behaviour b (invert swaps matches and
 * gaps first), and runs stage level + 1 on each non-empty piece. */
int tok_pre_split(struct tok_state *st, size_t level, const uint8_t *s, size_t n, bool first, struct tok_spans *sp,
		  enum tok_split_behavior b, bool invert);

/* ---- the rest ---- */

/* One piece through the model (tok.c): cache, whole token, model. */
int tok_piece(struct tok_state *st, const uint8_t *s, size_t n);

/* Encodes text with a general tok (tok-pipe.c). */
int tok_encode_general(struct tok_state *st, const uint8_t *s, size_t n, unsigned flags, size_t *n_replaced);

/* Frees the pipeline parts of t / of st. */
void tok_pipe_free(struct tok *t);
void tok_pipe_state_free(struct tok_state *st);

/* Compiles the added-token matchers of a general tok (after the
 * normalizers are set). */
int tok_pipe_finish(struct tok *t, char **ret_error);
