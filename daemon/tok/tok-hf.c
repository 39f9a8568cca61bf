/* SPDX-License-Identifier: MIT */
/*
 * Loader for HF tokenizers' tokenizer.json, byte-level BPE models only
 * (GPT-2, Llama 3, Qwen2 and the like).
 *
 * Every field that changes the ids is either implemented exactly or refused
 * with -EOPNOTSUPP and a message naming the field; nothing is approximated.
 * Fields that only matter for decoding or for adding BOS/EOS (decoder,
 * post_processor) are ignored: feedd never adds specials implicitly, the
 * feed config names them (tok_special_id()).
 *
 * Vocabulary strings are in GPT-2's bytes-to-unicode alphabet: printable
 * Latin-1 bytes stand for themselves, the other 68 bytes for U+0100 + n in
 * byte order.  They are decoded to raw bytes here, so encoding works on
 * bytes like tiktoken.
 */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>

#include "tok-hf.h"
#include "tok-model.h"

/* HF ByteLevel's own regex (use_regex true), as in tokenizers' byte_level.rs. */
#define TOK_PAT_BYTELEVEL "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static int16_t tok_char_to_byte[0x144];

static void tok_init_alphabet(void) {
	int n = 0;

	for (int c = 0; c < 0x144; c++)
		tok_char_to_byte[c] = -1;
	for (int b = 0; b < 256; b++) {
		if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))
			tok_char_to_byte[b] = (int16_t) b;
		else
			tok_char_to_byte[0x100 + n++] = (int16_t) b;
	}
}

/* Decodes a byte-level string into bytes; returns length or -1. */
static ssize_t tok_bl_decode(const char *s, size_t n, uint8_t *out) {
	const uint8_t *p = (const uint8_t *) s;
	size_t o = 0;

	for (size_t i = 0; i < n;) {
		uint32_t c;
		if (p[i] < 0x80) {
			c = p[i++];
		} else if ((p[i] & 0xe0) == 0xc0 && i + 1 < n) {
			c = (uint32_t) (p[i] & 0x1f) << 6 | (p[i + 1] & 0x3f);
			i += 2;
		} else
			return -1;
		if (c >= 0x144 || tok_char_to_byte[c] < 0)
			return -1;
		out[o++] = (uint8_t) tok_char_to_byte[c];
	}
	return (ssize_t) o;
}

bool tok_json_is_false(const json_t *v) {
	return !v || json_is_null(v) || json_is_false(v);
}

bool tok_json_is_empty_str(const json_t *v) {
	return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0);
}

int tok_unsupported(const struct tok *t, char **ret_error, const char *field, const json_t *v) {
	_tok_cleanup_free_ char *dump = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
	if (dump && strlen(dump) > 80)
		strcpy(dump + 77, "...");
	return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: unsupported value %s", t->name, field,
			  dump ? dump : "(missing)");
}

int tok_check_keys(const struct tok *t, const json_t *obj, const char *const *known, const char *where,
			  char **ret_error) {
	const char *key;
	json_t *v;

	json_object_foreach((json_t *) obj, key, v) {
		bool ok = false;
		for (size_t i = 0; known[i]; i++)
			if (strcmp(known[i], key) == 0)
				ok = true;
		if (!ok)
			return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s%s%s: unknown field", t->name, where,
					  *where ? "." : "", key);
	}
	return 0;
}

int tok_unsupported_at(const struct tok *t, char **ret_error, const char *where, const char *key, const json_t *v) {
	char f[512];
	snprintf(f, sizeof(f), "%s.%s", where, key);
	return tok_unsupported(t, ret_error, f, v);
}

static int tok_hf_normalizer(struct tok *t, const json_t *n, char **ret_error) {
	const char *type;

	if (!n || json_is_null(n))
		return 0;
	type = json_string_value(json_object_get(n, "type"));
	if (type && strcmp(type, "NFC") == 0) {
		t->nfc = true;
		return 0;
	}
	if (type && strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(n, "normalizers"), *x;
		size_t i;
		if (!json_is_array(list))
			return tok_unsupported(t, ret_error, "normalizer.normalizers", list);
		json_array_foreach(list, i, x) {
			const char *ty = json_string_value(json_object_get(x, "type"));
			if (!ty || strcmp(ty, "NFC") != 0) {
				char f[64];
				snprintf(f, sizeof(f), "normalizer.normalizers[%zu].type", i);
				return tok_unsupported(t, ret_error, f, json_object_get(x, "type"));
			}
			t->nfc = true;
		}
		return 0;
	}
	return tok_unsupported(t, ret_error, "normalizer.type", json_object_get(n, "type"));
}

static int tok_hf_bytelevel(struct tok *t, const json_t *p, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "add_prefix_space", "trim_offsets", "use_regex", NULL };
	char f[256];
	json_t *use_regex = json_object_get(p, "use_regex");
	int r;

	r = tok_check_keys(t, p, known, where, ret_error);
	if (r < 0)
		return r;
	if (!tok_json_is_false(json_object_get(p, "add_prefix_space"))) {
		snprintf(f, sizeof(f), "%s.add_prefix_space", where);
		return tok_unsupported(t, ret_error, f, json_object_get(p, "add_prefix_space"));
	}
	if (!use_regex || json_is_true(use_regex))
		return tok_add_regex(t, TOK_PAT_BYTELEVEL, true, ret_error);
	return 0;
}

static int tok_hf_split(struct tok *t, const json_t *p, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "pattern", "behavior", "invert", NULL };
	json_t *pat = json_object_get(p, "pattern");
	const char *behavior = json_string_value(json_object_get(p, "behavior"));
	const char *re;
	char f[256];
	int r;

	r = tok_check_keys(t, p, known, where, ret_error);
	if (r < 0)
		return r;
	/* Isolated keeps the gaps between matches; Removed with invert
	 * keeps only the matches (tiktoken's way, GPT-4o's HF file).  All
	 * splits of the fast path must agree. */
	bool isolated = behavior && strcmp(behavior, "Isolated") == 0 &&
			tok_json_is_false(json_object_get(p, "invert"));
	bool matches_only = behavior && strcmp(behavior, "Removed") == 0 && json_is_true(json_object_get(p, "invert"));
	if ((!isolated && !matches_only) || (t->n_re > 0 && t->keep_gaps != isolated)) {
		snprintf(f, sizeof(f), "%s.behavior", where);
		return tok_unsupported(t, ret_error, f, json_object_get(p, "behavior"));
	}
	t->keep_gaps = isolated;
	re = json_string_value(json_object_get(pat, "Regex"));
	if (re) {
		/* Llama 3's and Qwen2's patterns split ASCII text as the
		 * hand-written cl100k splitter does (without \s++$). */
		static const char llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
					     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
		static const char qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
					    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
		if (t->n_re == 0 && t->keep_gaps && (strcmp(re, llama3) == 0 || strcmp(re, qwen2) == 0)) {
			t->split_cl100k = true;
			t->split_digits = strcmp(re, llama3) == 0 ? 3 : 1;
			t->split_end_rule = false;
		}
		return tok_add_regex(t, re, true, ret_error);
	}
	const char *lit = json_string_value(json_object_get(pat, "String"));
	if (lit) {
		/* A literal: quote every character that PCRE2 might read. */
		size_t n = strlen(lit);
		_tok_cleanup_free_ char *q = malloc(2 * n + 1);
		size_t o = 0;
		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char) lit[i];
			if (c < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
				q[o++] = '\\';
			q[o++] = (char) c;
		}
		q[o] = 0;
		return tok_add_regex(t, q, true, ret_error);
	}
	snprintf(f, sizeof(f), "%s.pattern", where);
	return tok_unsupported(t, ret_error, f, pat);
}

static int tok_hf_pre_tokenizer(struct tok *t, const json_t *p, char **ret_error) {
	const char *type = json_string_value(json_object_get(p, "type"));

	if (!p || json_is_null(p))
		return tok_errorf(ret_error, -EOPNOTSUPP,
				  "%s: pre_tokenizer: null is unsupported (byte-level BPE needs ByteLevel)", t->name);
	if (type && strcmp(type, "ByteLevel") == 0)
		return tok_hf_bytelevel(t, p, "pre_tokenizer", ret_error);
	if (type && strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(p, "pretokenizers"), *x;
		size_t i, n = json_array_size(list);
		char f[128];
		if (n == 0)
			return tok_unsupported(t, ret_error, "pre_tokenizer.pretokenizers", list);
		json_array_foreach(list, i, x) {
			const char *ty = json_string_value(json_object_get(x, "type"));
			int r;
			snprintf(f, sizeof(f), "pre_tokenizer.pretokenizers[%zu]", i);
			/* ByteLevel must come last: a Split after it would
			 * see the byte-level alphabet, not the text. */
			if (ty && strcmp(ty, "Split") == 0 && i + 1 < n)
				r = tok_hf_split(t, x, f, ret_error);
			else if (ty && strcmp(ty, "ByteLevel") == 0 && i + 1 == n)
				r = tok_hf_bytelevel(t, x, f, ret_error);
			else {
				snprintf(f, sizeof(f), "pre_tokenizer.pretokenizers[%zu].type", i);
				r = tok_unsupported(t, ret_error, f, json_object_get(x, "type"));
			}
			if (r < 0)
				return r;
		}
		return 0;
	}
	return tok_unsupported(t, ret_error, "pre_tokenizer.type", json_object_get(p, "type"));
}

static int tok_hf_added(struct tok *t, const json_t *list, char **ret_error) {
	static const char *const known[] = { "id", "content", "single_word", "lstrip", "rstrip", "normalized",
					     "special", NULL };
	json_t *x;
	size_t i;
	char f[128];

	if (!list || json_is_null(list))
		return 0;
	if (!json_is_array(list))
		return tok_unsupported(t, ret_error, "added_tokens", list);
	json_array_foreach(list, i, x) {
		json_t *id = json_object_get(x, "id"), *content = json_object_get(x, "content");
		static const char *const flags[] = { "single_word", "lstrip", "rstrip" };
		int r;

		snprintf(f, sizeof(f), "added_tokens[%zu]", i);
		r = tok_check_keys(t, x, known, f, ret_error);
		if (r < 0)
			return r;
		if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX) {
			snprintf(f, sizeof(f), "added_tokens[%zu].id", i);
			return tok_unsupported(t, ret_error, f, id);
		}
		if (!json_is_string(content) || json_string_length(content) == 0) {
			snprintf(f, sizeof(f), "added_tokens[%zu].content", i);
			return tok_unsupported(t, ret_error, f, content);
		}
		for (size_t k = 0; k < TOK_ELEMENTSOF(flags) && !t->general; k++)
			if (!tok_json_is_false(json_object_get(x, flags[k]))) {
				snprintf(f, sizeof(f), "added_tokens[%zu].%s", i, flags[k]);
				return tok_unsupported(t, ret_error, f, json_object_get(x, flags[k]));
			}
		/* HF matches a "normalized" added token in normalized text;
		 * with NFC that is not the raw text this code matches on. */
		if (t->nfc && json_is_true(json_object_get(x, "normalized"))) {
			snprintf(f, sizeof(f), "added_tokens[%zu].normalized", i);
			return tok_unsupported(t, ret_error, f, json_object_get(x, "normalized"));
		}
		r = tok_add_special(t, json_string_value(content), json_string_length(content),
				    (int32_t) json_integer_value(id), json_is_true(json_object_get(x, "special")));
		if (r < 0)
			return r;
		struct tok_added *a = &t->added[t->n_added - 1];
		a->normalized = json_is_true(json_object_get(x, "normalized"));
		a->lstrip = json_is_true(json_object_get(x, "lstrip"));
		a->rstrip = json_is_true(json_object_get(x, "rstrip"));
		a->single_word = json_is_true(json_object_get(x, "single_word"));
	}
	return 0;
}

/* A vocabulary string as token bytes: decoded from the byte-level
 * alphabet, or as it is (UTF-8) for other vocabularies.  Returns the
 * length or -1. */
static ssize_t tok_hf_decode(const struct tok *t, const char *s, size_t n, uint8_t *out) {
	if (t->unicode_vocab) {
		memcpy(out, s, n);
		return n > 0 ? (ssize_t) n : -1;
	}
	return tok_bl_decode(s, n, out);
}

/* Is (content, id) one of the added tokens?  Vocabularies often list them
 * too, in text that is not in the byte-level alphabet. */
static bool tok_is_added(const struct tok *t, const char *s, size_t n, json_int_t id) {
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].id == id && t->added[i].len == n && memcmp(t->added[i].text, s, n) == 0)
			return true;
	return false;
}

static int tok_hf_vocab(struct tok *t, const json_t *vocab, char **ret_error) {
	_tok_cleanup_free_ uint8_t *buf = NULL;
	size_t cap = 0;
	const char *key;
	json_t *v;
	int r;

	if (!json_is_object(vocab) || json_object_size(vocab) == 0)
		return tok_unsupported(t, ret_error, "model.vocab", vocab);
	json_object_foreach((json_t *) vocab, key, v) {
		size_t n = strlen(key);
		ssize_t k;

		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
			return tok_errorf(ret_error, -EINVAL, "%s: model.vocab: \"%s\": bad id", t->name, key);
		if (n > cap) {
			cap = n * 2;
			free(buf);
			buf = malloc(cap);
			if (!buf)
				return -ENOMEM;
		}
		k = tok_hf_decode(t, key, n, buf);
		if (k <= 0) {
			if (tok_is_added(t, key, n, json_integer_value(v)) || (t->unicode_vocab && n == 0))
				continue;
			return tok_errorf(ret_error, -EOPNOTSUPP,
					  "%s: model.vocab: \"%s\": not in the byte-level alphabet "
					  "(not a byte-level BPE vocabulary)", t->name, key);
		}
		r = tok_vocab_add(t, (uint32_t) json_integer_value(v), buf, (size_t) k, 0);
		if (r < 0)
			return r;
	}
	return tok_vocab_finish(t, ret_error);
}

static int tok_hf_merge_part(struct tok *t, const char *s, size_t n, uint8_t *buf, size_t *ret_len,
			     uint32_t *ret_id) {
	ssize_t k = tok_hf_decode(t, s, n, buf);
	int64_t id;

	if (k <= 0)
		return -EINVAL;
	id = tok_vocab_find(t, buf, (size_t) k);
	if (id < 0)
		return -ENOENT;
	*ret_len = (size_t) k;
	*ret_id = (uint32_t) id;
	return 0;
}

static int tok_hf_merges(struct tok *t, const json_t *merges, char **ret_error) {
	_tok_cleanup_free_ uint8_t *buf = NULL;
	size_t cap = 0, i;
	json_t *m;

	if (!json_is_array(merges))
		return tok_unsupported(t, ret_error, "model.merges", merges);
	json_array_foreach(merges, i, m) {
		const char *a, *b;
		size_t na, nb, la, lb;
		uint32_t ia, ib;
		int64_t merged;
		int r;

		if (json_is_string(m)) {
			const char *s = json_string_value(m), *sp = strchr(s, ' ');
			if (!sp || strchr(sp + 1, ' '))
				return tok_errorf(ret_error, -EINVAL, "%s: model.merges[%zu]: expected \"a b\", got \"%s\"",
						  t->name, i, s);
			a = s;
			na = (size_t) (sp - s);
			b = sp + 1;
			nb = strlen(b);
		} else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
			   json_is_string(json_array_get(m, 1))) {
			a = json_string_value(json_array_get(m, 0));
			na = json_string_length(json_array_get(m, 0));
			b = json_string_value(json_array_get(m, 1));
			nb = json_string_length(json_array_get(m, 1));
		} else
			return tok_errorf(ret_error, -EINVAL, "%s: model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]",
					  t->name, i);
		if (na + nb > cap) {
			cap = (na + nb) * 2;
			free(buf);
			buf = malloc(cap);
			if (!buf)
				return -ENOMEM;
		}
		r = tok_hf_merge_part(t, a, na, buf, &la, &ia);
		if (r == 0)
			r = tok_hf_merge_part(t, b, nb, buf + la, &lb, &ib);
		if (r < 0)
			return tok_errorf(ret_error, -EINVAL, "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\": part not in vocab",
					  t->name, i, (int) na, a, (int) nb, b);
		/* HF: merged = a + b[len(continuing_subword_prefix):] */
		size_t skip = t->unicode_vocab ? t->bpe_prefix_len : 0;
		if (skip > lb)
			return tok_errorf(ret_error, -EINVAL, "%s: model.merges[%zu]: \"%.*s\" shorter than the prefix",
					  t->name, i, (int) nb, b);
		memmove(buf + la, buf + la + skip, lb - skip);
		merged = tok_vocab_find(t, buf, la + lb - skip);
		if (merged < 0)
			return tok_errorf(ret_error, -EINVAL, "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\": merged token not in vocab",
					  t->name, i, (int) na, a, (int) nb, b);
		if (i >= UINT32_MAX - 1)
			return tok_errorf(ret_error, -EINVAL, "%s: model.merges: too many", t->name);
		r = tok_pair_add(t, ia, ib, (uint32_t) i, (uint32_t) merged);
		if (r < 0)
			return r;
	}
	return 0;
}

/* HF tokenizers does not take added_tokens[].id from the file: on loading it
 * gives each added token the id of the same string in model.vocab, or else
 * the next id after max(len(model.vocab), largest added id so far)
 * (AddedVocabulary::add_tokens).  Do the same, so ids equal HF's even for a
 * file whose ids disagree. */
static void tok_hf_assign_added_ids(struct tok *t, const json_t *vocab) {
	/* Unigram's vocabulary is an array of [piece, score]. */
	size_t vocab_size = json_is_array(vocab) ? json_array_size(vocab) : json_object_size(vocab);
	bool have_max = false;
	int32_t max = 0;

	for (size_t i = 0; i < t->n_added; i++) {
		struct tok_added *a = &t->added[i];
		json_t *v = json_object_get(vocab, a->text);
		int32_t id = -1;

		for (size_t k = 0; k < i; k++)
			if (strcmp(t->added[k].text, a->text) == 0)
				id = t->added[k].id;
		if (id < 0 && json_is_integer(v))
			id = (int32_t) json_integer_value(v);
		if (id < 0 && json_is_array(vocab))
			id = (int32_t) tok_vocab_find(t, (const uint8_t *) a->text, a->len);
		if (id < 0)
			id = (int32_t) (have_max && (size_t) max >= vocab_size ? (size_t) max + 1 : vocab_size);
		a->id = id;
		if (!have_max || id > max)
			max = id;
		have_max = true;
	}
}

static int tok_hf_affix(struct tok *t, const json_t *model, const char *key, char **ret, size_t *ret_len,
			char **ret_error) {
	const json_t *v = json_object_get(model, key);

	if (tok_json_is_empty_str(v))
		return 0;
	/* Byte-level vocabularies: not with this path; byte fallback of a
	 * character with its affix: HF's output may hold more ids than bytes. */
	if (!json_is_string(v) || !t->unicode_vocab || json_string_length(v) > 64 ||
	    json_is_true(json_object_get(model, "byte_fallback")))
		return tok_unsupported_at(t, ret_error, "model", key, v);
	*ret_len = json_string_length(v);
	*ret = strndup(json_string_value(v), *ret_len);
	return *ret ? 0 : -ENOMEM;
}

/* The general pipeline's BPE settings over a UTF-8 vocabulary. */
static int tok_hf_bpe_utf8(struct tok *t, const json_t *model, char **ret_error) {
	const json_t *unk = json_object_get(model, "unk_token");

	t->unk_id = UINT32_MAX;
	if (unk && !json_is_null(unk)) {
		int64_t id = json_is_string(unk) ? tok_vocab_find(t, (const uint8_t *) json_string_value(unk),
								   json_string_length(unk)) : -1;
		if (id < 0)
			return tok_unsupported_at(t, ret_error, "model", "unk_token", unk);
		t->unk_id = (uint32_t) id;
	}
	t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
	t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
	for (unsigned b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof(name), "<0x%02X>", b);
		int64_t id = tok_vocab_find(t, (const uint8_t *) name, 6);
		t->fallback_id[b] = id < 0 ? UINT32_MAX : (uint32_t) id;
	}
	t->model = tok_model_bpe_utf8;
	t->model_scratch = tok_model_bpe_utf8_scratch;
	return 0;
}

/* model.type "BPE": byte-level (vocabulary in GPT-2's byte alphabet, when
 * the pre-tokenizer ends with ByteLevel) or over UTF-8 strings. */
static int tok_hf_bpe(struct tok *t, const json_t *model, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "dropout", "unk_token", "continuing_subword_prefix",
					     "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
					     "vocab", "merges", NULL };
	json_t *dropout = json_object_get(model, "dropout");
	int r;

	r = tok_check_keys(t, model, known, where, ret_error);
	if (r < 0)
		return r;
	if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
		return tok_unsupported(t, ret_error, "model.dropout", dropout);
	r = tok_hf_affix(t, model, "continuing_subword_prefix", &t->bpe_prefix, &t->bpe_prefix_len, ret_error);
	if (r == 0)
		r = tok_hf_affix(t, model, "end_of_word_suffix", &t->bpe_suffix, &t->bpe_suffix_len, ret_error);
	if (r < 0)
		return r;
	/* Byte-level: unk_token, fuse_unk and byte_fallback never apply, all
	 * 256 bytes are tokens (tok_vocab_finish() checks).  The fast path
	 * refuses byte_fallback anyway, so that a file that asks for it is
	 * read by the general path, which knows it. */
	if (!t->general && !tok_json_is_false(json_object_get(model, "byte_fallback")))
		return tok_unsupported(t, ret_error, "model.byte_fallback", json_object_get(model, "byte_fallback"));
	r = tok_hf_vocab(t, json_object_get(model, "vocab"), ret_error);
	if (r < 0)
		return r;
	if (t->unicode_vocab) {
		r = tok_hf_bpe_utf8(t, model, ret_error);
		if (r < 0)
			return r;
	}
	r = tok_hf_merges(t, json_object_get(model, "merges"), ret_error);
	if (r < 0)
		return r;
	r = tok_pairs_finish(t);
	if (r < 0)
		return r;
	if (t->unicode_vocab) {
		r = tok_model_bpe_utf8_prepare(t);
		if (r < 0)
			return r;
	}
	if (json_is_true(json_object_get(model, "ignore_merges"))) {
		/* Like tiktoken: a piece that is a token is that token. */
		for (uint32_t id = 0; id < t->n_ids; id++)
			t->whole_ok[id] = t->off[id + 1] > t->off[id];
		return 0;
	}
	return tok_compute_whole_ok(t);
}

/* Model types of the general pipeline; the fast path takes only BPE.  A
 * model sets t->model & co. (tok-pipe.h) unless it is byte-level BPE. */
static const struct tok_hf_parser tok_hf_models[] = {
	{ "BPE", tok_hf_bpe },
	{ "Unigram", tok_hf_unigram },          /* tok-hf-model.c */
	{ "WordPiece", tok_hf_wordpiece },
};

static int tok_hf_model(struct tok *t, const json_t *model, char **ret_error) {
	const char *type = json_string_value(json_object_get(model, "type"));

	if (!json_is_object(model))
		return tok_unsupported(t, ret_error, "model", model);
	for (size_t i = 0; type && i < TOK_ELEMENTSOF(tok_hf_models); i++)
		if (strcmp(tok_hf_models[i].type, type) == 0) {
			if (!t->general && i != 0)
				break;
			return tok_hf_models[i].parse(t, model, "model", ret_error);
		}
	return tok_unsupported(t, ret_error, "model.type", json_object_get(model, "type"));
}

/* Builds t from the parsed file: as plain byte-level BPE behind regex
 * splits (the fast path of tok.c) unless general, else as the general
 * pipeline (tok-pipe.h).  -EOPNOTSUPP from the fast path means: try the
 * general one. */
static int tok_hf_build(struct tok *t, const json_t *root, char **ret_error) {
	int r;

	if (!t->general) {
		r = tok_hf_normalizer(t, json_object_get(root, "normalizer"), ret_error);
		if (r == 0)
			r = tok_hf_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), ret_error);
	} else {
		bool byte_level = false; /* read even when the normalizer fails */
		r = tok_hf_pipe_normalizer(t, json_object_get(root, "normalizer"), ret_error);
		if (r == 0)
			r = tok_hf_pipe_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), &byte_level, ret_error);
		t->unicode_vocab = !byte_level;
	}
	if (r == 0)
		r = tok_hf_added(t, json_object_get(root, "added_tokens"), ret_error);
	if (r == 0)
		r = tok_hf_model(t, json_object_get(root, "model"), ret_error);
	if (r < 0)
		return r;
	tok_hf_assign_added_ids(t, json_object_get(json_object_get(root, "model"), "vocab"));
	return tok_finish(t, ret_error);
}

int tok_load_hf(const char *path, struct tok **ret, char **ret_error) {
	static const char *const known[] = { "version", "truncation", "padding", "added_tokens", "normalizer",
					     "pre_tokenizer", "post_processor", "decoder", "model", NULL };
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	json_error_t jerr;
	json_t *root;
	struct tok *t;
	int r;

	pthread_once(&once, tok_init_alphabet);
	t = tok_new(path);
	if (!t)
		return -ENOMEM;
	t->keep_gaps = true;
	root = json_load_file(path, 0, &jerr);
	if (!root) {
		r = tok_errorf(ret_error, json_error_code(&jerr) == json_error_cannot_open_file ? -ENOENT : -EINVAL,
			       "%s:%d:%d: %s", t->name, jerr.line, jerr.column, jerr.text);
		goto fail;
	}
	if (!json_is_object(root)) {
		r = tok_errorf(ret_error, -EINVAL, "%s: not a JSON object", t->name);
		goto fail;
	}
	r = tok_check_keys(t, root, known, "", ret_error);
	if (r < 0)
		goto fail;
	if (json_object_get(root, "truncation") && !json_is_null(json_object_get(root, "truncation"))) {
		r = tok_unsupported(t, ret_error, "truncation", json_object_get(root, "truncation"));
		goto fail;
	}
	if (json_object_get(root, "padding") && !json_is_null(json_object_get(root, "padding"))) {
		r = tok_unsupported(t, ret_error, "padding", json_object_get(root, "padding"));
		goto fail;
	}
	r = tok_hf_build(t, root, ret_error);
	if (r == -EOPNOTSUPP) {
		/* Not plain byte-level BPE: the general pipeline, whose own
		 * refusal (if any) names what is really unsupported. */
		tok_free(t);
		if (ret_error) {
			free(*ret_error);
			*ret_error = NULL;
		}
		t = tok_new(path);
		if (!t) {
			r = -ENOMEM;
			goto fail;
		}
		t->general = true;
		r = tok_hf_build(t, root, ret_error);
	}
	if (r < 0)
		goto fail;
	json_decref(root);
	*ret = t;
	return 0;
fail:
	json_decref(root);
	tok_free(t);
	return r;
}
