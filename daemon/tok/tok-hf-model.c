/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.json parts of the Unigram and WordPiece families, plugged into
 * the general pipeline (tok-pipe.h, tok-hf.h):
 *
 *   model          Unigram (tok-unigram.c), WordPiece (tok-wordpiece.c)
 *   normalizer     Precompiled (tok-precompiled.c), BertNormalizer, StripAccents
 *   pre_tokenizer  BertPreTokenizer (tok-bert.c)
 *
 * Each parser checks every field and refuses, naming it, what it does not
 * implement exactly.  The vocabulary also goes into t's own table
 * (tok_vocab_add(), UTF-8 strings), which the pipeline uses for token
 * bytes, whole-token shortcuts and added-token ids.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok-hf.h"
#include "tok-model.h"

/* ---- models --------------------------------------------------------------- */

static size_t unigram_run(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	return tok_unigram_encode(t->model_data, s, n, out, scratch);
}

static size_t unigram_scratch(const struct tok *t, size_t n) {
	(void) t;
	return tok_unigram_scratch_size(n);
}

static void unigram_free(void *data) {
	tok_unigram_free(data);
}

static size_t wordpiece_run(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	return tok_wordpiece_encode(t->model_data, s, n, out, scratch);
}

static size_t wordpiece_scratch(const struct tok *t, size_t n) {
	(void) n;
	return tok_wordpiece_scratch_size(t->model_data);
}

static void wordpiece_free(void *data) {
	tok_wordpiece_free(data);
}

/* Unigram and WordPiece vocabularies are UTF-8 strings: a ByteLevel
 * pre-tokenizer would hand them the byte-level alphabet. */
static int need_unicode(struct tok *t, const json_t *model, char **ret_error) {
	if (t->unicode_vocab)
		return 0;
	return tok_errorf(ret_error, -EOPNOTSUPP, "%s: model.type: %s after a ByteLevel pre-tokenizer is unsupported",
			  t->name, json_string_value(json_object_get(model, "type")));
}

int tok_hf_unigram(struct tok *t, const json_t *model, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "unk_id", "vocab", "byte_fallback", NULL };
	json_t *vocab = json_object_get(model, "vocab"), *unk = json_object_get(model, "unk_id"), *x;
	struct tok_unigram *u = NULL;
	size_t i;
	int r;

	r = tok_check_keys(t, model, known, where, ret_error);
	if (r == 0)
		r = need_unicode(t, model, ret_error);
	if (r < 0)
		return r;
	if (!json_is_array(vocab) || json_array_size(vocab) == 0)
		return tok_unsupported_at(t, ret_error, where, "vocab", vocab);
	/* Without unk_id HF fails on the first character no piece covers;
	 * every released model has one. */
	if (!json_is_integer(unk))
		return tok_unsupported_at(t, ret_error, where, "unk_id", unk);
	if (json_integer_value(unk) < 0 || (size_t) json_integer_value(unk) >= json_array_size(vocab))
		return tok_errorf(ret_error, -EINVAL, "%s: %s.unk_id: %lld is not in %s.vocab", t->name, where,
				  (long long) json_integer_value(unk), where);
	r = tok_unigram_new(json_array_size(vocab), &u);
	if (r < 0)
		return r;
	t->model_data = u;
	t->model_free = unigram_free;
	json_array_foreach(vocab, i, x) {
		json_t *piece = json_array_get(x, 0), *score = json_array_get(x, 1);
		if (!json_is_array(x) || json_array_size(x) != 2 || !json_is_string(piece) || !json_is_number(score))
			return tok_errorf(ret_error, -EINVAL, "%s: %s.vocab[%zu]: expected [\"piece\", score]", t->name,
					  where, i);
		const char *p = json_string_value(piece);
		size_t len = json_string_length(piece);
		r = tok_unigram_add(u, p, len, json_number_value(score));
		/* An empty piece never matches (HF's trie neither). */
		if (r == 0 && len > 0)
			r = tok_vocab_add(t, (uint32_t) i, (const uint8_t *) p, len, 0);
		if (r == -EEXIST)
			return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s.vocab[%zu]: \"%s\" given twice is unsupported",
					  t->name, where, i, p);
		if (r < 0)
			return r;
	}
	/* The unknown token must have text (tok_token_bytes()); HF's would be
	 * an empty string. */
	if (json_string_length(json_array_get(json_array_get(vocab, (size_t) json_integer_value(unk)), 0)) == 0)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s.unk_id: %lld names an empty piece", t->name, where,
				  (long long) json_integer_value(unk));
	r = tok_unigram_finish(u, json_integer_value(unk), json_is_true(json_object_get(model, "byte_fallback")));
	if (r == 0)
		r = tok_vocab_finish(t, ret_error);
	if (r < 0)
		return r;
	t->unk_id = (uint32_t) json_integer_value(unk);
	t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
	t->model = unigram_run;
	t->model_scratch = unigram_scratch;
	return tok_compute_whole_ok(t);
}

int tok_hf_wordpiece(struct tok *t, const json_t *model, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "unk_token", "continuing_subword_prefix",
					     "max_input_chars_per_word", "vocab", NULL };
	json_t *vocab = json_object_get(model, "vocab"), *v;
	json_t *unk = json_object_get(model, "unk_token"), *prefix = json_object_get(model, "continuing_subword_prefix");
	json_t *maxc = json_object_get(model, "max_input_chars_per_word");
	const char *unk_s = json_is_string(unk) ? json_string_value(unk) : "[UNK]";
	struct tok_wordpiece *w = NULL;
	const char *key;
	int r;

	r = tok_check_keys(t, model, known, where, ret_error);
	if (r == 0)
		r = need_unicode(t, model, ret_error);
	if (r < 0)
		return r;
	if (!json_is_object(vocab) || json_object_size(vocab) == 0)
		return tok_unsupported_at(t, ret_error, where, "vocab", vocab);
	if (unk && (!json_is_string(unk) || json_string_length(unk) == 0))
		return tok_unsupported_at(t, ret_error, where, "unk_token", unk);
	if (prefix && !json_is_string(prefix))
		return tok_unsupported_at(t, ret_error, where, "continuing_subword_prefix", prefix);
	if (maxc && !(json_is_integer(maxc) && json_integer_value(maxc) >= 0))
		return tok_unsupported_at(t, ret_error, where, "max_input_chars_per_word", maxc);
	r = tok_wordpiece_new(prefix ? json_string_value(prefix) : "##",
			      maxc ? (size_t) json_integer_value(maxc) : 100, &w);
	if (r < 0)
		return r;
	t->model_data = w;
	t->model_free = wordpiece_free;
	json_object_foreach(vocab, key, v) {
		size_t len = strlen(key);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
			return tok_errorf(ret_error, -EINVAL, "%s: %s.vocab: \"%s\": bad id", t->name, where, key);
		r = tok_wordpiece_add(w, key, len, (uint32_t) json_integer_value(v));
		if (r == 0 && len > 0)
			r = tok_vocab_add(t, (uint32_t) json_integer_value(v), (const uint8_t *) key, len, 0);
		if (r < 0)
			return r;
	}
	r = tok_wordpiece_finish(w, unk_s);
	if (r == -ENOENT)
		return tok_errorf(ret_error, -EINVAL, "%s: %s.unk_token: \"%s\" is not in %s.vocab", t->name, where,
				  unk_s, where);
	if (r == 0)
		r = tok_vocab_finish(t, ret_error);
	if (r < 0)
		return r;
	t->unk_id = (uint32_t) tok_vocab_find(t, (const uint8_t *) unk_s, strlen(unk_s));
	t->model = wordpiece_run;
	t->model_scratch = wordpiece_scratch;
	return tok_compute_whole_ok(t);
}

/* ---- normalizers -------------------------------------------------------- */

static int precompiled_apply(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
			     struct tok_buf *out) {
	(void) st;
	return tok_precompiled_apply(nm->data, in, n, out);
}

static void precompiled_done(struct tok_norm *nm) {
	nm->data = tok_precompiled_free(nm->data);
}

static int b64_decode(const char *s, size_t n, uint8_t *out, size_t *ret_len) {
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint32_t acc = 0;
	size_t o = 0, bits = 0;

	for (size_t i = 0; i < n; i++) {
		if (s[i] == '=')
			break;
		const char *p = s[i] ? strchr(tab, s[i]) : NULL;
		if (!p)
			return -EINVAL;
		acc = acc << 6 | (uint32_t) (p - tab);
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			out[o++] = (uint8_t) (acc >> bits);
		}
	}
	*ret_len = o;
	return 0;
}

int tok_hf_precompiled(struct tok *t, const json_t *n, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "precompiled_charsmap", NULL };
	json_t *cm = json_object_get(n, "precompiled_charsmap");
	_tok_cleanup_free_ uint8_t *blob = NULL;
	_tok_cleanup_free_ char *msg = NULL;
	struct tok_precompiled *pc = NULL;
	struct tok_norm *nm;
	size_t len, blen;
	int r;

	r = tok_check_keys(t, n, known, where, ret_error);
	if (r < 0)
		return r;
	if (!json_is_string(cm))
		return tok_unsupported_at(t, ret_error, where, "precompiled_charsmap", cm);
	len = json_string_length(cm);
	blob = malloc(len / 4 * 3 + 3);
	if (!blob)
		return -ENOMEM;
	if (b64_decode(json_string_value(cm), len, blob, &blen) < 0)
		return tok_errorf(ret_error, -EINVAL, "%s: %s.precompiled_charsmap: not base64", t->name, where);
	r = tok_precompiled_new(blob, blen, &pc, &msg);
	if (r < 0)
		return tok_errorf(ret_error, r, "%s: %s: %s", t->name, where, msg ? msg : strerror(-r));
	nm = tok_norm_add(t);
	if (!nm) {
		tok_precompiled_free(pc);
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: too many normalizers", t->name, where);
	}
	nm->apply = precompiled_apply;
	nm->done = precompiled_done;
	nm->data = pc;
	return 0;
}

static int bert_apply(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		      struct tok_buf *out) {
	(void) st;
	return tok_bert_normalize(nm->data, in, n, out);
}

static void bert_done(struct tok_norm *nm) {
	free(nm->data);
	nm->data = NULL;
}

static bool bool_or(const json_t *v, bool dflt) {
	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

int tok_hf_bert_normalizer(struct tok *t, const json_t *n, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "clean_text", "handle_chinese_chars", "strip_accents",
					     "lowercase", NULL };
	static const char *const flags[] = { "clean_text", "handle_chinese_chars", "strip_accents", "lowercase" };
	struct tok_bert_norm *b;
	struct tok_norm *nm;
	int r;

	r = tok_check_keys(t, n, known, where, ret_error);
	if (r < 0)
		return r;
	for (size_t i = 0; i < TOK_ELEMENTSOF(flags); i++) {
		json_t *v = json_object_get(n, flags[i]);
		if (v && !json_is_boolean(v) && !json_is_null(v))
			return tok_unsupported_at(t, ret_error, where, flags[i], v);
	}
	b = calloc(1, sizeof(*b));
	nm = b ? tok_norm_add(t) : NULL;
	if (!nm) {
		free(b);
		return b ? tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: too many normalizers", t->name, where) : -ENOMEM;
	}
	b->clean_text = bool_or(json_object_get(n, "clean_text"), true);
	b->handle_chinese_chars = bool_or(json_object_get(n, "handle_chinese_chars"), true);
	b->lowercase = bool_or(json_object_get(n, "lowercase"), true);
	/* HF: strip_accents null follows lowercase. */
	b->strip_accents = bool_or(json_object_get(n, "strip_accents"), b->lowercase);
	nm->apply = bert_apply;
	nm->done = bert_done;
	nm->data = b;
	return 0;
}

static int strip_accents_apply(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
			       struct tok_buf *out) {
	(void) nm;
	(void) st;
	return tok_strip_accents(in, n, out);
}

int tok_hf_strip_accents(struct tok *t, const json_t *n, const char *where, char **ret_error) {
	static const char *const known[] = { "type", NULL };
	struct tok_norm *nm;
	int r;

	r = tok_check_keys(t, n, known, where, ret_error);
	if (r < 0)
		return r;
	nm = tok_norm_add(t);
	if (!nm)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: too many normalizers", t->name, where);
	nm->apply = strip_accents_apply;
	return 0;
}

/* ---- pre-tokenizers ----------------------------------------------------- */

struct bert_run {
	struct tok_state *st;
	size_t level;
	const uint8_t *start;
	bool first;
};

static int bert_piece(void *userdata, const uint8_t *s, size_t n) {
	struct bert_run *b = userdata;
	return tok_pre_run(b->st, b->level + 1, s, n, b->first && s == b->start);
}

static int bert_pre_apply(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			  bool first) {
	struct bert_run b = { .st = st, .level = level, .start = s, .first = first };
	(void) p;
	return tok_bert_pretokenize(s, n, bert_piece, &b);
}

int tok_hf_bert_pre_tokenizer(struct tok *t, const json_t *p, const char *where, char **ret_error) {
	static const char *const known[] = { "type", NULL };
	struct tok_pre *pre;
	int r;

	r = tok_check_keys(t, p, known, where, ret_error);
	if (r < 0)
		return r;
	pre = tok_pre_add(t);
	if (!pre)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: too many pre-tokenizers", t->name, where);
	pre->apply = bert_pre_apply;
	return 0;
}
