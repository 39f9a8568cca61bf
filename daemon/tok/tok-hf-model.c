/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.json with a Unigram or WordPiece model: the loader, and the
 * pipeline HF runs on each run of ordinary text (between added tokens):
 *
 *   normalizer     null | Precompiled | BertNormalizer | Sequence of those
 *   pre_tokenizer  null | Metaspace | BertPreTokenizer | WhitespaceSplit |
 *                  Sequence of WhitespaceSplit then Metaspace (T5)
 *   model          Unigram | WordPiece
 *
 * Anything else that would change the ids is refused with -EOPNOTSUPP and
 * the field named.  Long runs are cut into windows before an ASCII space
 * where that cannot change the result (the pre-tokenizer splits there and
 * no normalizer joins across it), so memory stays bounded by the window
 * unless a single pre-token is that long.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unigbrk.h>

#include "tok-internal.h"
#include "tok-model.h"

#define TOK_MODEL_WINDOW (64u * 1024u)
#define TOK_MAX_NORM 4

enum norm_kind { NORM_PRECOMPILED, NORM_BERT };
enum pre_kind { PRE_NONE, PRE_METASPACE, PRE_WS_METASPACE, PRE_WS, PRE_BERT };
enum prepend { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct norm_step {
	enum norm_kind kind;
	struct tok_precompiled *pc;
	struct tok_bert_norm bert;
};

struct tok_model {
	struct tok_unigram *unigram;
	struct tok_wordpiece *wordpiece;
	struct norm_step norm[TOK_MAX_NORM];
	size_t n_norm;
	enum pre_kind pre;
	uint8_t repl[4];        /* Metaspace replacement, UTF-8 */
	size_t repl_len;
	enum prepend prepend;
	bool split;
};

/* Pre-token -> ids, direct-mapped: words repeat (Zipf), and a hit skips
 * the Viterbi search or WordPiece's lookups.  Per thread. */
#define PIECE_CACHE_SLOTS (1u << 14)
#define PIECE_CACHE_KEY 30
#define PIECE_CACHE_IDS 6

struct piece_slot {
	uint32_t hash;
	uint8_t len, n_ids;
	uint8_t key[PIECE_CACHE_KEY];
	uint32_t ids[PIECE_CACHE_IDS];
};

struct tok_model_scratch {
	struct piece_slot cache[PIECE_CACHE_SLOTS];
	struct tok_buf a, b, m, fix;
	struct tok_u32s ids;
	struct tok_unigram_scratch *uni;
};

struct tok_model *tok_model_free(struct tok_model *m) {
	if (!m)
		return NULL;
	tok_unigram_free(m->unigram);
	tok_wordpiece_free(m->wordpiece);
	for (size_t i = 0; i < m->n_norm; i++)
		tok_precompiled_free(m->norm[i].pc);
	free(m);
	return NULL;
}

struct tok_model_scratch *tok_model_scratch_free(struct tok_model_scratch *s) {
	if (!s)
		return NULL;
	free(s->a.p);
	free(s->b.p);
	free(s->m.p);
	free(s->fix.p);
	free(s->ids.ids);
	tok_unigram_scratch_free(s->uni);
	free(s);
	return NULL;
}

size_t tok_model_vocab_size(const struct tok_model *m) {
	return m->unigram ? tok_unigram_size(m->unigram) : tok_wordpiece_size(m->wordpiece);
}

int tok_model_token(const struct tok_model *m, int32_t id, const uint8_t **ret, size_t *ret_len) {
	const char *s;

	if (id < 0)
		return -ENOENT;
	s = m->unigram ? tok_unigram_piece(m->unigram, (uint32_t) id, ret_len)
		       : tok_wordpiece_token(m->wordpiece, (uint32_t) id, ret_len);
	if (!s)
		return -ENOENT;
	*ret = (const uint8_t *) s;
	return 0;
}

int64_t tok_model_find(const struct tok_model *m, const char *s, size_t n) {
	return m->unigram ? tok_unigram_find(m->unigram, (const uint8_t *) s, n)
			  : tok_wordpiece_find(m->wordpiece, (const uint8_t *) s, n);
}

/* ---- loading ------------------------------------------------------------ */

static int unsupported(const struct tok *t, char **ret_error, const char *field, const json_t *v) {
	_tok_cleanup_free_ char *dump = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
	if (dump && strlen(dump) > 80)
		strcpy(dump + 77, "...");
	return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: unsupported value %s", t->name, field,
			  dump ? dump : "(missing)");
}

static int check_keys(const struct tok *t, const json_t *obj, const char *const *known, const char *where,
		      char **ret_error) {
	const char *key;
	json_t *v;

	json_object_foreach((json_t *) obj, key, v) {
		bool ok = false;
		for (size_t i = 0; known[i]; i++)
			ok = ok || strcmp(known[i], key) == 0;
		if (!ok)
			return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s.%s: unknown field", t->name, where, key);
	}
	return 0;
}

static bool bool_or(const json_t *v, bool dflt) {
	return json_is_boolean(v) ? json_is_true(v) : dflt;
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

static int load_norm_one(struct tok *t, struct tok_model *m, const json_t *n, const char *where, char **ret_error) {
	const char *type = json_string_value(json_object_get(n, "type"));
	char f[160];
	int r;

	if (m->n_norm >= TOK_MAX_NORM)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: more than %d normalizers", t->name, where,
				  TOK_MAX_NORM);
	struct norm_step *st = &m->norm[m->n_norm];
	if (type && strcmp(type, "Precompiled") == 0) {
		static const char *const known[] = { "type", "precompiled_charsmap", NULL };
		json_t *cm = json_object_get(n, "precompiled_charsmap");
		r = check_keys(t, n, known, where, ret_error);
		if (r < 0)
			return r;
		snprintf(f, sizeof(f), "%s.precompiled_charsmap", where);
		if (!json_is_string(cm))
			return unsupported(t, ret_error, f, cm);
		size_t len = json_string_length(cm), blen;
		_tok_cleanup_free_ uint8_t *blob = malloc(len / 4 * 3 + 3);
		_tok_cleanup_free_ char *msg = NULL;
		if (!blob)
			return -ENOMEM;
		if (b64_decode(json_string_value(cm), len, blob, &blen) < 0)
			return tok_errorf(ret_error, -EINVAL, "%s: %s: not base64", t->name, f);
		r = tok_precompiled_new(blob, blen, &st->pc, &msg);
		if (r < 0)
			return tok_errorf(ret_error, r, "%s: %s: %s", t->name, where, msg ? msg : strerror(-r));
		st->kind = NORM_PRECOMPILED;
		m->n_norm++;
		return 0;
	}
	if (type && strcmp(type, "BertNormalizer") == 0) {
		static const char *const known[] = { "type", "clean_text", "handle_chinese_chars", "strip_accents",
						     "lowercase", NULL };
		r = check_keys(t, n, known, where, ret_error);
		if (r < 0)
			return r;
		st->kind = NORM_BERT;
		st->bert.clean_text = bool_or(json_object_get(n, "clean_text"), true);
		st->bert.handle_chinese_chars = bool_or(json_object_get(n, "handle_chinese_chars"), true);
		st->bert.lowercase = bool_or(json_object_get(n, "lowercase"), true);
		st->bert.strip_accents = bool_or(json_object_get(n, "strip_accents"), st->bert.lowercase);
		m->n_norm++;
		return 0;
	}
	snprintf(f, sizeof(f), "%s.type", where);
	return unsupported(t, ret_error, f, json_object_get(n, "type"));
}

static int load_normalizer(struct tok *t, struct tok_model *m, const json_t *n, char **ret_error) {
	const char *type = json_string_value(json_object_get(n, "type"));

	if (!n || json_is_null(n))
		return 0;
	if (type && strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(n, "normalizers"), *x;
		size_t i;
		char f[64];
		if (!json_is_array(list))
			return unsupported(t, ret_error, "normalizer.normalizers", list);
		json_array_foreach(list, i, x) {
			snprintf(f, sizeof(f), "normalizer.normalizers[%zu]", i);
			int r = load_norm_one(t, m, x, f, ret_error);
			if (r < 0)
				return r;
		}
		return 0;
	}
	return load_norm_one(t, m, n, "normalizer", ret_error);
}

static int load_metaspace(struct tok *t, struct tok_model *m, const json_t *p, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "replacement", "prepend_scheme", "split", "add_prefix_space",
					     "str_rep", NULL };
	json_t *repl = json_object_get(p, "replacement"), *aps = json_object_get(p, "add_prefix_space");
	const char *scheme = json_string_value(json_object_get(p, "prepend_scheme"));
	char f[160];
	int r;

	r = check_keys(t, p, known, where, ret_error);
	if (r < 0)
		return r;
	/* One character, as HF's Metaspace takes a char. */
	if (!json_is_string(repl) || json_string_length(repl) == 0 ||
	    tok_utf8_len((uint8_t) json_string_value(repl)[0]) != json_string_length(repl)) {
		snprintf(f, sizeof(f), "%s.replacement", where);
		return unsupported(t, ret_error, f, repl);
	}
	memcpy(m->repl, json_string_value(repl), json_string_length(repl));
	m->repl_len = json_string_length(repl);
	/* HF: add_prefix_space false wins, then prepend_scheme, then always. */
	if (json_is_false(aps))
		m->prepend = PREPEND_NEVER;
	else if (!scheme || strcmp(scheme, "always") == 0)
		m->prepend = PREPEND_ALWAYS;
	else if (strcmp(scheme, "first") == 0)
		m->prepend = PREPEND_FIRST;
	else if (strcmp(scheme, "never") == 0)
		m->prepend = PREPEND_NEVER;
	else {
		snprintf(f, sizeof(f), "%s.prepend_scheme", where);
		return unsupported(t, ret_error, f, json_object_get(p, "prepend_scheme"));
	}
	m->split = bool_or(json_object_get(p, "split"), true);
	return 0;
}

static int load_pre_tokenizer(struct tok *t, struct tok_model *m, const json_t *p, char **ret_error) {
	const char *type = json_string_value(json_object_get(p, "type"));

	if (!p || json_is_null(p)) {
		m->pre = PRE_NONE;
		return 0;
	}
	if (type && strcmp(type, "Metaspace") == 0) {
		m->pre = PRE_METASPACE;
		return load_metaspace(t, m, p, "pre_tokenizer", ret_error);
	}
	if (type && (strcmp(type, "BertPreTokenizer") == 0 || strcmp(type, "WhitespaceSplit") == 0)) {
		static const char *const known[] = { "type", NULL };
		m->pre = type[0] == 'B' ? PRE_BERT : PRE_WS;
		return check_keys(t, p, known, "pre_tokenizer", ret_error);
	}
	if (type && strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(p, "pretokenizers");
		const char *t0 = json_string_value(json_object_get(json_array_get(list, 0), "type"));
		const char *t1 = json_string_value(json_object_get(json_array_get(list, 1), "type"));
		if (json_array_size(list) == 1 && t0 && strcmp(t0, "Metaspace") == 0) {
			m->pre = PRE_METASPACE;
			return load_metaspace(t, m, json_array_get(list, 0), "pre_tokenizer.pretokenizers[0]", ret_error);
		}
		if (json_array_size(list) == 2 && t0 && strcmp(t0, "WhitespaceSplit") == 0 && t1 &&
		    strcmp(t1, "Metaspace") == 0) {
			m->pre = PRE_WS_METASPACE;
			return load_metaspace(t, m, json_array_get(list, 1), "pre_tokenizer.pretokenizers[1]", ret_error);
		}
		return unsupported(t, ret_error, "pre_tokenizer.pretokenizers", list);
	}
	return unsupported(t, ret_error, "pre_tokenizer.type", json_object_get(p, "type"));
}

static int load_unigram(struct tok *t, struct tok_model *m, const json_t *model, char **ret_error) {
	static const char *const known[] = { "type", "unk_id", "vocab", "byte_fallback", NULL };
	json_t *vocab = json_object_get(model, "vocab"), *unk = json_object_get(model, "unk_id"), *x;
	size_t i;
	int r;

	r = check_keys(t, model, known, "model", ret_error);
	if (r < 0)
		return r;
	if (!json_is_array(vocab) || json_array_size(vocab) == 0)
		return unsupported(t, ret_error, "model.vocab", vocab);
	if (unk && !json_is_null(unk) && !json_is_integer(unk))
		return unsupported(t, ret_error, "model.unk_id", unk);
	r = tok_unigram_new(json_array_size(vocab), &m->unigram);
	if (r < 0)
		return r;
	json_array_foreach(vocab, i, x) {
		json_t *piece = json_array_get(x, 0), *score = json_array_get(x, 1);
		if (!json_is_array(x) || json_array_size(x) != 2 || !json_is_string(piece) || !json_is_number(score))
			return tok_errorf(ret_error, -EINVAL, "%s: model.vocab[%zu]: expected [\"piece\", score]",
					  t->name, i);
		r = tok_unigram_add(m->unigram, json_string_value(piece), json_string_length(piece),
				    json_number_value(score));
		if (r < 0)
			return r;
	}
	json_int_t unk_id = json_is_integer(unk) ? json_integer_value(unk) : -1;
	if (json_is_integer(unk) && (unk_id < 0 || (size_t) unk_id >= json_array_size(vocab)))
		return tok_errorf(ret_error, -EINVAL, "%s: model.unk_id: %lld is not in model.vocab", t->name,
				  (long long) unk_id);
	return tok_unigram_finish(m->unigram, unk_id, json_is_true(json_object_get(model, "byte_fallback")));
}

static int load_wordpiece(struct tok *t, struct tok_model *m, const json_t *model, char **ret_error) {
	static const char *const known[] = { "type", "unk_token", "continuing_subword_prefix",
					     "max_input_chars_per_word", "vocab", NULL };
	json_t *vocab = json_object_get(model, "vocab"), *v;
	json_t *unk = json_object_get(model, "unk_token"), *prefix = json_object_get(model, "continuing_subword_prefix");
	json_t *maxc = json_object_get(model, "max_input_chars_per_word");
	const char *key;
	int r;

	r = check_keys(t, model, known, "model", ret_error);
	if (r < 0)
		return r;
	if (!json_is_object(vocab) || json_object_size(vocab) == 0)
		return unsupported(t, ret_error, "model.vocab", vocab);
	if (unk && !json_is_string(unk))
		return unsupported(t, ret_error, "model.unk_token", unk);
	if (prefix && !json_is_string(prefix))
		return unsupported(t, ret_error, "model.continuing_subword_prefix", prefix);
	if (maxc && !(json_is_integer(maxc) && json_integer_value(maxc) >= 0))
		return unsupported(t, ret_error, "model.max_input_chars_per_word", maxc);
	r = tok_wordpiece_new(prefix ? json_string_value(prefix) : "##",
			      maxc ? (size_t) json_integer_value(maxc) : 100, &m->wordpiece);
	if (r < 0)
		return r;
	json_object_foreach(vocab, key, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
			return tok_errorf(ret_error, -EINVAL, "%s: model.vocab: \"%s\": bad id", t->name, key);
		r = tok_wordpiece_add(m->wordpiece, key, strlen(key), (uint32_t) json_integer_value(v));
		if (r < 0)
			return r;
	}
	r = tok_wordpiece_finish(m->wordpiece, unk ? json_string_value(unk) : "[UNK]");
	if (r == -ENOENT)
		return tok_errorf(ret_error, -EINVAL, "%s: model.unk_token: \"%s\" is not in model.vocab", t->name,
				  unk ? json_string_value(unk) : "[UNK]");
	return r;
}

/* HF gives an added token the id of the same string in the model's
 * vocabulary, else the next id after the vocabulary and the added ids so
 * far (AddedVocabulary::add_tokens), whatever added_tokens[].id says. */
static void assign_added_ids(struct tok *t, const struct tok_model *m) {
	size_t vocab_size = tok_model_vocab_size(m);
	bool have_max = false;
	int32_t max = 0;

	for (size_t i = 0; i < t->n_added; i++) {
		struct tok_added *a = &t->added[i];
		int64_t id = -1;

		for (size_t k = 0; k < i && id < 0; k++)
			if (strcmp(t->added[k].text, a->text) == 0)
				id = t->added[k].id;
		if (id < 0)
			id = tok_model_find(m, a->text, a->len);
		if (id < 0)
			id = (int64_t) (have_max && (size_t) max >= vocab_size ? (size_t) max + 1 : vocab_size);
		a->id = (int32_t) id;
		if (!have_max || id > max)
			max = (int32_t) id;
		have_max = true;
	}
}

static int model_load(struct tok *t, const json_t *root, char **ret_error) {
	const json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens"), *x;
	const char *type = json_string_value(json_object_get(model, "type"));
	struct tok_model *m;
	size_t i;
	int r;

	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	t->model = m;
	if (type && strcmp(type, "Unigram") == 0)
		r = load_unigram(t, m, model, ret_error);
	else if (type && strcmp(type, "WordPiece") == 0)
		r = load_wordpiece(t, m, model, ret_error);
	else
		r = unsupported(t, ret_error, "model.type", json_object_get(model, "type"));
	if (r < 0)
		return r;
	r = load_normalizer(t, m, json_object_get(root, "normalizer"), ret_error);
	if (r < 0)
		return r;
	/* HF matches a "normalized" added token in the normalized text; this
	 * code matches added tokens in the raw text, which is the same only
	 * without a normalizer. */
	json_array_foreach(added, i, x)
		if (m->n_norm > 0 && json_is_true(json_object_get(x, "normalized"))) {
			char f[64];
			snprintf(f, sizeof(f), "added_tokens[%zu].normalized", i);
			return unsupported(t, ret_error, f, json_object_get(x, "normalized"));
		}
	r = load_pre_tokenizer(t, m, json_object_get(root, "pre_tokenizer"), ret_error);
	if (r < 0)
		return r;
	assign_added_ids(t, m);
	return 0;
}

/* ---- encoding ----------------------------------------------------------- */

struct run {
	const struct tok_model *m;
	struct tok_model_scratch *sc;
};

static int model_piece(void *userdata, const uint8_t *s, size_t n) {
	struct run *run = userdata;
	struct tok_u32s *out = &run->sc->ids;
	struct piece_slot *c = NULL;
	size_t first = out->n;
	int r;

	if (n == 0)
		return 0;
	if (n <= PIECE_CACHE_KEY) {
		uint32_t h = (uint32_t) tok_hash_bytes(s, n);
		c = &run->sc->cache[h & (PIECE_CACHE_SLOTS - 1)];
		if (c->len == n && c->hash == h && memcmp(c->key, s, n) == 0) {
			for (size_t i = 0; i < c->n_ids; i++) {
				r = tok_u32s_push(out, c->ids[i]);
				if (r < 0)
					return r;
			}
			return 0;
		}
		c->hash = h;
		c->len = 0;
	}
	if (run->m->unigram)
		r = tok_unigram_encode(run->m->unigram, &run->sc->uni, s, n, out);
	else
		r = tok_wordpiece_encode(run->m->wordpiece, s, n, out);
	if (r < 0)
		return r;
	if (c && out->n - first <= PIECE_CACHE_IDS) {
		c->len = (uint8_t) n;
		c->n_ids = (uint8_t) (out->n - first);
		memcpy(c->key, s, n);
		memcpy(c->ids, out->ids + first, c->n_ids * sizeof(uint32_t));
	}
	return 0;
}

static bool is_white(uint32_t c) {
	return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* Metaspace on one split s[0..n) (no ' ' left in it unless replace):
 * ' ' -> replacement, the replacement prepended if asked, then pieces cut
 * before each replacement (split) or one piece. */
static int metaspace(struct run *run, const uint8_t *s, size_t n, bool prepend) {
	const struct tok_model *m = run->m;
	struct tok_buf *b = &run->sc->m;
	size_t last = 0;
	int r;

	if (n == 0)
		return 0;
	b->n = 0;
	/* HF replaces first, so a leading ' ' counts as a replacement. */
	if (prepend && s[0] != ' ' && !(n >= m->repl_len && memcmp(s, m->repl, m->repl_len) == 0)) {
		r = tok_buf_put(b, m->repl, m->repl_len);
		if (r < 0)
			return r;
	}
	r = tok_buf_reserve(b, n * m->repl_len);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++)
		if (s[i] == ' ')
			r = tok_buf_put(b, m->repl, m->repl_len);
		else
			b->p[b->n++] = s[i];
	if (r < 0)
		return r;
	if (!m->split)
		return model_piece(run, b->p, b->n);
	for (size_t i = 0; i + m->repl_len <= b->n; i++)
		if (b->p[i] == m->repl[0] && memcmp(b->p + i, m->repl, m->repl_len) == 0) {
			if (i > last) {
				r = model_piece(run, b->p + last, i - last);
				if (r < 0)
					return r;
			}
			last = i;
			i += m->repl_len - 1;
		}
	return model_piece(run, b->p + last, b->n - last);
}

/* WhitespaceSplit, then Metaspace on each word when meta. */
static int ws_split(struct run *run, const uint8_t *s, size_t n, bool meta, bool first_at_start) {
	size_t word = 0;
	int r;

	for (size_t i = 0; i <= n;) {
		uint32_t c = 0;
		size_t k = 1;
		if (i < n)
			k = tok_utf8_dec(s + i, &c);
		if (i == n || is_white(c)) {
			if (i > word) {
				bool pre = run->m->prepend == PREPEND_ALWAYS ||
					   (run->m->prepend == PREPEND_FIRST && first_at_start && word == 0);
				r = meta ? metaspace(run, s + word, i - word, pre) : model_piece(run, s + word, i - word);
				if (r < 0)
					return r;
			}
			word = i + k;
		}
		i += k;
	}
	return 0;
}

static int window(struct run *run, const uint8_t *s, size_t n, bool run_start, bool at_start) {
	const struct tok_model *m = run->m;
	struct tok_model_scratch *sc = run->sc;
	struct tok_buf *bufs[2] = { &sc->a, &sc->b };
	const uint8_t *cur = s;
	size_t len = n;
	int r;

	for (size_t i = 0; i < m->n_norm; i++) {
		struct tok_buf *o = bufs[i & 1];
		o->n = 0;
		if (m->norm[i].kind == NORM_PRECOMPILED)
			r = tok_precompiled_apply(m->norm[i].pc, cur, len, o);
		else
			r = tok_bert_normalize(&m->norm[i].bert, cur, len, o);
		if (r < 0)
			return r;
		cur = o->p;
		len = o->n;
	}
	switch (m->pre) {
	case PRE_NONE:
		return model_piece(run, cur, len);
	case PRE_METASPACE:
		return metaspace(run, cur, len,
				 run_start && (m->prepend == PREPEND_ALWAYS || (m->prepend == PREPEND_FIRST && at_start)));
	case PRE_WS_METASPACE:
		return ws_split(run, cur, len, true, run_start && at_start);
	case PRE_WS:
		return ws_split(run, cur, len, false, false);
	case PRE_BERT:
		return tok_bert_pretokenize(cur, len, model_piece, run);
	}
	return -EINVAL;
}

/* Where a window that should reach about want may end: before an ASCII
 * space that does not follow a Prepend character (the only character a
 * grapheme cluster joins to a following space), or n.  Repairing invalid
 * UTF-8 never joins across an ASCII byte either, so s may be invalid. */
static size_t window_end(const uint8_t *s, size_t n, size_t want) {
	for (size_t i = want; i < n; i++) {
		if (s[i] != ' ')
			continue;
		size_t p = i - 1;
		uint32_t c = ' ';
		while (p > 0 && i - p < 4 && (s[p] & 0xc0) == 0x80)
			p--;
		if (tok_utf8_valid_prefix(s + p, i - p) == i - p)
			tok_utf8_dec(s + p, &c);
		if (uc_graphemeclusterbreak_property(c) != GBP_PREPEND)
			return i;
	}
	return n;
}

int tok_model_encode(const struct tok_model *m, struct tok_model_scratch **scratch, const uint8_t *s, size_t n,
		     bool at_start, bool utf8_valid, tok_emit_fn emit, void *userdata, size_t *n_replaced) {
	struct run run = { .m = m };
	const bool windows = m->pre != PRE_NONE && !(m->pre == PRE_METASPACE && !m->split);
	size_t pos = 0;
	int r;

	if (!*scratch) {
		*scratch = calloc(1, sizeof(**scratch));
		if (!*scratch)
			return -ENOMEM;
	}
	run.sc = *scratch;
	while (pos < n) {
		size_t end = windows ? window_end(s, n, pos + TOK_MODEL_WINDOW) : n;
		const uint8_t *w = s + pos;
		size_t len = end - pos;
		if (!utf8_valid && tok_utf8_valid_prefix(w, len) != len) {
			struct tok_buf *fix = &run.sc->fix;
			size_t rep = 0;
			fix->n = 0;
			r = tok_buf_reserve(fix, 3 * len + 1);
			if (r < 0)
				return r;
			len = tok_utf8_replace(w, len, fix->p, &rep);
			*n_replaced += rep;
			w = fix->p;
		}
		run.sc->ids.n = 0;
		r = window(&run, w, len, pos == 0, at_start);
		if (r < 0)
			return r;
		if (run.sc->ids.n)
			emit(userdata, run.sc->ids.ids, run.sc->ids.n);
		pos = end;
	}
	return 0;
}

int tok_hf_model_load(struct tok *t, const json_t *root, char **ret_error) {
	char *error = NULL;
	int r = model_load(t, root, &error);

	/* Every failure names the file, even one deep in a helper (-ENOMEM,
	 * -E2BIG) that has no message of its own. */
	if (r < 0 && !error)
		tok_errorf(&error, r, "%s: model: %s", t->name, strerror(-r));
	if (r < 0 && ret_error)
		*ret_error = error;
	else
		free(error);
	return r;
}
