/* SPDX-License-Identifier: MIT */
/*
 * Private structures of the tokenizer, shared by tok.c (encoding),
 * tok-vocab.c (tables, BPE), tok-rankfile.c and tok-hf.c (loaders).
 *
 * A loaded struct tok is never written after tok_finish() returns, so it is
 * shared read-only between threads; PCRE2 compiled code is read-only too.
 */
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "tok.h"

#define TOK_MAX_REGEX 4

static inline void tok_freep(void *p) {
	free(*(void **) p);
}
#define _tok_cleanup_free_ __attribute__((cleanup(tok_freep)))

static inline void *tok_take_ptr(void *pp) {
	void **p = pp;
	void *v = *p;
	*p = NULL;
	return v;
}
#define TOK_TAKE_PTR(p) tok_take_ptr(&(p))
#define TOK_ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))

/* Open-addressing slot of the bytes -> id table; id UINT32_MAX = empty.
 * The first 8 bytes live in the slot, so most lookups touch one cache line. */
struct tok_slot {
	uint32_t id;
	uint32_t len;
	uint64_t head;  /* first min(len, 8) bytes, zero-padded (tok_load_head()) */
};

/* A merge of two single bytes, indexed by (first << 8 | second). */
struct tok_pair2 {
	uint32_t prio;
	uint32_t merged;
};

/* Open-addressing slot of the (left, right) -> merge table. */
struct tok_pair {
	uint64_t key;   /* left << 32 | right; UINT64_MAX = empty */
	uint32_t prio;  /* lower merges first: rank (tiktoken) or merge index (HF) */
	uint32_t merged;
};

struct tok_ent {
	uint32_t id;
	uint32_t off;
	uint32_t len;
	uint32_t line;  /* rank file line, 0 for tokenizer.json */
};

struct tok_added {
	char *text;
	size_t len;
	int32_t id;
	bool special;   /* false: HF added token matched always, like HF */
	/* General pipeline only (tok-pipe.c): */
	bool normalized, lstrip, rstrip, single_word;
	uint8_t *norm;          /* normalized content, when normalized */
	const uint8_t *match;   /* what is matched: text or norm */
	size_t match_len;
};

struct tok_norm;
struct tok_pre;
struct tok_buf {
	uint8_t *p;
	size_t n, cap;
};
struct tok_spans {
	struct tok_span *v;
	size_t n, cap;
};
#define TOK_MAX_PRE 8
#define TOK_MAX_NORM 16

/* Model of a general tok: ids of the piece s[0..n) into out (room for n),
 * with scratch of model_scratch(t, n) bytes; returns how many. */
typedef size_t (*tok_model_fn)(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch);

struct tok {
	char *name;             /* file basename, for messages */

	/* Ordinary tokens: bytes of id i are bytes[off[i] .. off[i + 1]). */
	struct tok_ent *ents;   /* while loading: (id, bytes, line) */
	size_t n_ents, cap_ents;
	size_t n_bytes, cap_bytes;
	uint32_t n_ids;         /* ordinary ids are < n_ids */
	uint32_t max_len;       /* longest ordinary token, bytes */
	uint8_t *bytes;
	uint32_t *off;          /* n_ids + 1 entries */
	struct tok_slot *slots; /* bytes -> id */
	uint32_t slot_mask;
	uint32_t byte_id[256];
	struct tok_pair2 *pair2;        /* 65536 entries, filled by tok_finish() */

	/* Merges: (left id, right id) -> (priority, merged id). */
	struct tok_pair *pairs;
	uint64_t pair_mask;
	unsigned pair_shift;
	size_t n_pairs;

	/* A piece that is one token is emitted as that token when
	 * whole_ok[id] (tiktoken always; HF when ignore_merges, or when
	 * the merges rebuild that token from its bytes anyway). */
	uint8_t *whole_ok;

	/* Pre-tokenizer: each regex splits the pieces of the previous one. */
	pcre2_code *re[TOK_MAX_REGEX];
	size_t n_re;
	bool keep_gaps;         /* HF Isolated keeps unmatched text; tiktoken drops it */
	bool split_cl100k;      /* re[0] is cl100k_base's pattern or a relative: ASCII text is split by hand */
	uint8_t split_digits;   /* ... with digit runs of at most this (tok_match_cl100k()) */
	bool split_end_rule;
	bool nfc;

	struct tok_added *added;
	size_t n_added;
	bool has_nonspecial;
	pcre2_code *added_re;   /* alternation of all added tokens, longest first */
	pcre2_code *plain_re;   /* only the non-special ones (HF), or NULL */
	uint32_t max_lookbehind; /* of re[0], in characters */
	bool jit;

	size_t vocab_size;

	/* The general pipeline (tok-pipe.h), when the file is more than
	 * byte-level BPE behind regex splits: */
	bool general;
	bool unicode_vocab;     /* vocabulary of UTF-8 strings, not bytes */
	struct tok_norm *norms;
	size_t n_norms;
	struct tok_pre *pres;
	size_t n_pres;
	pcre2_code *gadd_re[2][2]; /* added tokens [normalized][with specials] */
	uint32_t *gadd_index;   /* hash of (normalized, match) -> index + 1 into added */
	uint32_t gadd_mask;
	tok_model_fn model;     /* NULL: byte-level BPE (tok_bpe()) */
	size_t (*model_scratch)(const struct tok *t, size_t n);
	void *model_data;
	void (*model_free)(void *data);

	/* BPE over UTF-8 strings (tok-model-bpe.c). */
	uint32_t unk_id;        /* UINT32_MAX: none */
	bool fuse_unk, byte_fallback;
	uint32_t fallback_id[256]; /* "<0xXX>"; UINT32_MAX: missing */
	char *bpe_prefix, *bpe_suffix;
	size_t bpe_prefix_len, bpe_suffix_len;
	/* A piece may be cut between characters a and b when no token holds
	 * "ab": no merge can join across, so the ids stay the same, and
	 * short pieces repeat and hit the caches (SentencePiece-style files
	 * hand whole documents to the model; tok_model_bpe_utf8_prepare()).
	 * cut_ascii: bit b of [a] for ASCII pairs; cut_pairs: the others,
	 * open addressing of (a << 32 | b), 0 = empty. */
	bool cut;
	uint64_t cut_ascii[128][2];
	uint64_t *cut_pairs;
	uint64_t cut_mask;
};

#define TOK_WINDOW (256u * 1024u)
/* A BPE piece longer than this is merged in pieces of at most this many
 * bytes, cut between characters (docs/tokenizers.md, "Very long words"):
 * memory and time stay bounded whatever one word's length. */
#define TOK_PIECE_MAX (256u * 1024u)
#define TOK_BATCH 4096
#define TOK_CACHE_SLOTS (1u << 16)
#define TOK_CACHE_MAX_KEY 128
#define TOK_CACHE_KEY_BYTES (1u << 20)
#define TOK_CACHE_IDS (1u << 18)
#define TOK_HOT_SLOTS (1u << 15)
#define TOK_HOT_MAX_LEN 16
#define TOK_HOT_MAX_IDS 3

/* Direct-mapped cache of short pieces -> their ids.  Piece frequency is
 * Zipfian, so a table that stays in L2 answers most lookups, which would
 * otherwise miss in the multi-megabyte vocabulary table (measured: the
 * vocabulary probe was the largest cost of encoding). */
struct tok_hot_slot {
	uint64_t k0, k1;        /* piece bytes, zero-padded */
	uint8_t len;            /* 0 = empty */
	uint8_t n_ids;
	uint32_t ids[TOK_HOT_MAX_IDS];
};

struct tok_cache_slot {
	uint64_t hash;          /* 0 = empty */
	uint32_t key_off;
	uint32_t ids_off;
	uint16_t key_len;
	uint16_t n_ids;
};

struct tok_state {
	const struct tok *t;
	pcre2_match_data *md;
	pcre2_match_context *mctx;
	pcre2_jit_stack *jstack;

	tok_sink_fn sink;
	void *userdata;
	int sink_error;
	bool utf8_valid;        /* this call's text carries TOK_ENCODE_UTF8_VALID */
	int32_t batch[TOK_BATCH];
	size_t n_batch;

	uint32_t *bpe_out;
	void *bpe_scratch;
	size_t bpe_cap;

	uint8_t *conv;          /* window: carried text + rewritten text */
	size_t conv_len, conv_cap;
	uint8_t *fix;           /* UTF-8 repair output before NFC */
	size_t fix_cap;
	uint8_t *nfc;
	size_t nfc_cap;

	struct tok_hot_slot hot[TOK_HOT_SLOTS];

	/* General pipeline (tok-pipe.c, tok-pretok.c). */
	struct tok_buf text_buf;        /* UTF-8 repaired text */
	struct tok_buf norm_buf[2];
	struct tok_buf pre_buf[TOK_MAX_PRE];
	struct tok_spans pre_spans[TOK_MAX_PRE];

	/* Unicode 16 for PCRE2 (tok_uni_map()): the text being split by the
	 * fast path starts at sbase; patterns match at the same offsets of
	 * mbase (sbase itself, or map_buf with stand-ins). */
	const uint8_t *sbase, *mbase;
	struct tok_buf map_buf;
	struct tok_buf map_piece;       /* general pipeline: one piece or text */

	struct tok_cache_slot *cache;
	size_t cache_used;
	uint8_t *cache_keys;
	size_t cache_keys_len;
	uint32_t *cache_ids;
	size_t cache_ids_len;
};

/* Error text helper: formats "name:where: msg" into *ret_error (if not NULL)
 * and returns r. */
int tok_errorf(char **ret_error, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* New empty tok named after the basename of path. */
struct tok *tok_new(const char *path);

/* Adds token bytes with id to the ordinary vocabulary being built.
 * Returns 0, -EEXIST for a duplicate byte string, -ENOMEM. */
int tok_vocab_add(struct tok *t, uint32_t id, const uint8_t *bytes, size_t len, uint32_t line);

/* Finishes the vocabulary: lays tokens out by id and builds the hash table;
 * requires all 256 single bytes.  Returns 0, -ENOMEM, or -EINVAL with a
 * message (duplicate id or bytes, missing byte). */
int tok_vocab_finish(struct tok *t, char **ret_error);

/* Looks up bytes; returns id or -1. */
int64_t tok_vocab_find(const struct tok *t, const uint8_t *s, size_t n);

/* Adds a merge (left, right) -> merged with priority prio.  A repeated pair
 * replaces the earlier one, as HF's merge map does.  Returns 0 or -ENOMEM. */
int tok_pair_add(struct tok *t, uint32_t left, uint32_t right, uint32_t prio, uint32_t merged);

/* tiktoken: every split of a token into two tokens is a merge with the
 * token's rank as priority.  Also marks every token whole_ok. */
int tok_pairs_from_ranks(struct tok *t);

/* Builds the byte-pair table from the pair table; after the last
 * tok_pair_add(), before any tok_bpe(). */
int tok_pairs_finish(struct tok *t);

/* HF without ignore_merges: whole_ok[id] iff merging id's bytes gives id. */
int tok_compute_whole_ok(struct tok *t);

/* Compiles a pre-tokenizer regex (HF: multiline $ like Oniguruma). */
int tok_add_regex(struct tok *t, const char *pattern, bool hf, char **ret_error);

/* Adds a special/added token (copied). */
int tok_add_special(struct tok *t, const char *text, size_t len, int32_t id, bool special);

/* Pair lookup: priority or UINT32_MAX, and the merged id. */
static inline uint32_t tok_pair_find(const struct tok *t, uint32_t l, uint32_t r, uint32_t *ret_merged) {
	uint64_t key = (uint64_t) l << 32 | r;
	uint64_t i = (key * 0x9e3779b97f4a7c15ull) >> t->pair_shift;
	for (;; i = (i + 1) & t->pair_mask) {
		const struct tok_pair *p = &t->pairs[i];
		if (p->key == key) {
			*ret_merged = p->merged;
			return p->prio;
		}
		if (p->key == UINT64_MAX)
			return UINT32_MAX;
	}
}

/* Compiles the added-token regexes and computes vocab_size; last step. */
int tok_finish(struct tok *t, char **ret_error);

/*
 * BPE-merges the single bytes s[0..n) (n >= 2) into ids; out must hold n
 * entries.  scratch must hold tok_bpe_scratch_size(n) bytes.  Returns the
 * number of ids written.
 */
size_t tok_bpe(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch);
size_t tok_bpe_scratch_size(size_t n);

/* As tok_bpe() from the symbols init[0..n) (n >= 1) instead of bytes. */
size_t tok_bpe_ids(const struct tok *t, const uint32_t *init, size_t n, uint32_t *out, void *scratch);

/* The model of t on one piece (t->model or byte-level BPE), and its
 * scratch size. */
size_t tok_model_encode(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch);
size_t tok_model_scratch_size(const struct tok *t, size_t n);

/* BPE over UTF-8 strings: a tok_model_fn (tok-model-bpe.c). */
size_t tok_model_bpe_utf8(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch);
size_t tok_model_bpe_utf8_scratch(const struct tok *t, size_t n);
/* Sets up t->cut where it is safe; after the vocabulary, merges and settings. */
int tok_model_bpe_utf8_prepare(struct tok *t);
/* Whether a token holds the characters a, b adjacent (t->cut). */
bool tok_cut_joined(const struct tok *t, uint32_t a, uint32_t b);

/* Emits one id from inside tok_encode_stream() (tok.c). */
void tok_piece_id(struct tok_state *st, uint32_t id);

/* The first min(n, 8) bytes of s as a zero-padded little-endian word,
 * without reading past s + n. */
static inline uint64_t tok_load_head(const uint8_t *s, size_t n) {
	uint64_t w;

	if (n >= 8) {
		memcpy(&w, s, 8);
		return w;
	}
	if (n >= 4) {
		uint32_t a, b;
		memcpy(&a, s, 4);
		memcpy(&b, s + n - 4, 4);
		return (uint64_t) a | (uint64_t) b << (8 * (n - 4));
	}
	if (n == 0)
		return 0;
	return (uint64_t) s[0] | (uint64_t) s[n >> 1] << (8 * (n >> 1)) | (uint64_t) s[n - 1] << (8 * (n - 1));
}

/* Hash of a byte string (also used by the per-thread piece cache). */
static inline uint64_t tok_hash_bytes(const uint8_t *s, size_t n) {
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);

	if (n <= 8)
		h = (h ^ tok_load_head(s, n)) * 0xbf58476d1ce4e5b9ull;
	else {
		size_t i = 0;
		for (; i + 8 <= n; i += 8) {
			uint64_t w;
			memcpy(&w, s + i, 8);
			h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
			h ^= h >> 29;
		}
		if (i < n)
			h = (h ^ tok_load_head(s + i, n - i)) * 0xbf58476d1ce4e5b9ull;
	}
	h ^= h >> 32;
	h *= 0x94d049bb133111ebull;
	h ^= h >> 29;
	return h;
}

/* Looks up s[0..n) (n >= 1) with its hash h; returns the slot or NULL. */
static inline const struct tok_slot *tok_vocab_slot(const struct tok *t, const uint8_t *s, size_t n, uint64_t h) {
	uint64_t head = tok_load_head(s, n);

	for (uint32_t i = (uint32_t) h & t->slot_mask;; i = (i + 1) & t->slot_mask) {
		const struct tok_slot *sl = &t->slots[i];
		if (sl->id == UINT32_MAX)
			return NULL;
		if (sl->len == n && sl->head == head &&
		    (n <= 8 || memcmp(t->bytes + t->off[sl->id] + 8, s + 8, n - 8) == 0))
			return sl;
	}
}

/* Compiles a PCRE2 pattern (JIT when possible); what names it in errors. */
int tok_compile(const struct tok *t, const char *pattern, size_t len, uint32_t options,
		pcre2_code **ret, bool *ret_jit, char **ret_error, const char *what);

/* cl100k_base's pattern by hand for ASCII text: end of the pre-token that
 * starts at pos, or 0 where PCRE2 must decide (tok-cl100k.c).  digits: the
 * longest digit run (3; Qwen2: 1); end_rule: the pattern has \s++$ first
 * (tiktoken's cl100k_base), else its white space alternatives are Llama 3's
 * \s*[\r\n]+|\s+(?!\S)|\s+. */
size_t tok_match_cl100k(const uint8_t *s, size_t n, size_t pos, unsigned digits, bool end_rule);

/* Compiles an HF pattern (Regex as Oniguruma reads it, or a literal
 * String) for the general pipeline. */
int tok_compile_hf_pattern(const struct tok *t, const char *pattern, bool literal, pcre2_code **ret,
			   char **ret_error);

/* ---- shared by tok.c and tok-part.c ---- */

/* Hands the ids collected so far to the sink. */
void tok_flush(struct tok_state *st);
/* A PCRE2 match (JIT when t has it) of re on s[0..n) from pos. */
int tok_match(const struct tok_state *st, const pcre2_code *re, const uint8_t *s, size_t n, size_t pos,
	      uint32_t opts);
/* Pre-tokenizes s[pos..n) with regex `level` (st->sbase/mbase set); unless
 * final, stops before a pre-token that may run past n, at *ret_keep. */
int tok_split_from(struct tok_state *st, size_t level, const uint8_t *s, size_t n, size_t pos, bool final,
		   size_t *ret_keep);
/* The model's ids of one piece into st->bpe_out. */
int tok_model_ids(struct tok_state *st, const uint8_t *s, size_t n, size_t *ret_m);
/* Appends src[0..n) UTF-8 repaired (and NFC'd when t->nfc) to a buffer. */
int tok_convert_to(struct tok_state *st, const uint8_t *src, size_t n, size_t *n_replaced, uint8_t **buf,
		   size_t *len_used, size_t *cap);
