/* SPDX-License-Identifier: MIT */
/*
 * tokenizer.json normalizers and pre-tokenizers for the general pipeline
 * (tok-pipe.h).  Each supported type has a parse function in the tables
 * below; any other type, or an unknown field, is refused with its path.
 */
#include <errno.h>
#include <stdio.h>

#include "tok-hf.h"
#include "tok-model.h"
#include "tok-unicode.h"

static int tok_norm_slot(struct tok *t, const char *where, char **ret_error, struct tok_norm **ret) {
	*ret = tok_norm_add(t);
	if (!*ret)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: more than %d normalizers", t->name, where,
				  TOK_MAX_NORM);
	return 0;
}

static int tok_hf_nf(struct tok *t, const json_t *o, const char *where, char **ret_error, int form) {
	static const char *const known[] = { "type", NULL };
	struct tok_norm *nm;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_norm_slot(t, where, ret_error, &nm);
	if (r < 0)
		return r;
	nm->apply = tok_norm_nf;
	nm->form = form;
	return 0;
}

static int tok_hf_nfc(struct tok *t, const json_t *o, const char *w, char **e) {
	return tok_hf_nf(t, o, w, e, 0);
}
static int tok_hf_nfd(struct tok *t, const json_t *o, const char *w, char **e) {
	return tok_hf_nf(t, o, w, e, 1);
}
static int tok_hf_nfkc(struct tok *t, const json_t *o, const char *w, char **e) {
	return tok_hf_nf(t, o, w, e, 2);
}
static int tok_hf_nfkd(struct tok *t, const json_t *o, const char *w, char **e) {
	return tok_hf_nf(t, o, w, e, 3);
}

static int tok_hf_lowercase(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", NULL };
	struct tok_norm *nm;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_norm_slot(t, where, ret_error, &nm);
	if (r < 0)
		return r;
	nm->apply = tok_norm_lowercase;
	return 0;
}

static int tok_hf_strip(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "strip_left", "strip_right", NULL };
	struct tok_norm *nm;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_norm_slot(t, where, ret_error, &nm);
	if (r < 0)
		return r;
	nm->apply = tok_norm_strip;
	nm->left = json_is_true(json_object_get(o, "strip_left"));
	nm->right = json_is_true(json_object_get(o, "strip_right"));
	return 0;
}

static int tok_hf_prepend(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "prepend", NULL };
	const json_t *v = json_object_get(o, "prepend");
	struct tok_norm *nm;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r < 0)
		return r;
	if (!json_is_string(v))
		return tok_unsupported_at(t, ret_error, where, "prepend", v);
	r = tok_norm_slot(t, where, ret_error, &nm);
	if (r < 0)
		return r;
	nm->apply = tok_norm_prepend;
	nm->str_len = json_string_length(v);
	nm->str = (uint8_t *) strndup(json_string_value(v), nm->str_len);
	return nm->str ? 0 : -ENOMEM;
}

static int tok_hf_replace(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "pattern", "content", NULL };
	const json_t *pat = json_object_get(o, "pattern"), *content = json_object_get(o, "content");
	const char *lit = json_string_value(json_object_get(pat, "String"));
	const char *re = json_string_value(json_object_get(pat, "Regex"));
	struct tok_norm *nm;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r < 0)
		return r;
	if (!json_is_string(content))
		return tok_unsupported_at(t, ret_error, where, "content", content);
	if ((!lit && !re) || (lit && !*lit))
		return tok_unsupported_at(t, ret_error, where, "pattern", pat);
	r = tok_norm_slot(t, where, ret_error, &nm);
	if (r < 0)
		return r;
	nm->apply = tok_norm_replace;
	nm->str_len = json_string_length(content);
	nm->str = (uint8_t *) strndup(json_string_value(content), nm->str_len);
	if (!nm->str)
		return -ENOMEM;
	if (lit) {
		nm->lit_len = strlen(lit);
		nm->lit = (uint8_t *) strdup(lit);
		return nm->lit ? 0 : -ENOMEM;
	}
	return tok_compile_hf_pattern(t, re, false, &nm->re, ret_error);
}

static int tok_hf_norm_any(struct tok *t, const json_t *n, const char *where, char **ret_error);

/* A `Sequence` normalizer or pre-tokenizer: its `member` array, each entry parsed by `each`. */
static int tok_hf_sequence(struct tok *t, const json_t *o, const char *where, const char *member,
			   int (*each)(struct tok *, const json_t *, const char *, char **), char **ret_error) {
	const char *const known[] = { "type", member, NULL };
	const json_t *list = json_object_get(o, member), *x;
	size_t i;
	char f[256];
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r < 0)
		return r;
	if (!json_is_array(list))
		return tok_unsupported_at(t, ret_error, where, member, list);
	json_array_foreach(list, i, x) {
		snprintf(f, sizeof(f), "%s.%s[%zu]", where, member, i);
		r = each(t, x, f, ret_error);
		if (r < 0)
			return r;
	}
	return 0;
}

static int tok_hf_norm_sequence(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	return tok_hf_sequence(t, o, where, "normalizers", tok_hf_norm_any, ret_error);
}

static const struct tok_hf_parser tok_hf_normalizers[] = {
	{ "NFC", tok_hf_nfc },
	{ "NFD", tok_hf_nfd },
	{ "NFKC", tok_hf_nfkc },
	{ "NFKD", tok_hf_nfkd },
	{ "Lowercase", tok_hf_lowercase },
	{ "Strip", tok_hf_strip },
	{ "Prepend", tok_hf_prepend },
	{ "Replace", tok_hf_replace },
	{ "Sequence", tok_hf_norm_sequence },
	{ "Precompiled", tok_hf_precompiled },          /* tok-hf-model.c */
	{ "BertNormalizer", tok_hf_bert_normalizer },
	{ "StripAccents", tok_hf_strip_accents },
};

static int tok_hf_dispatch(struct tok *t, const struct tok_hf_parser *tab, size_t n_tab, const json_t *o,
			   const char *where, char **ret_error) {
	const char *type = json_string_value(json_object_get(o, "type"));

	for (size_t i = 0; type && i < n_tab; i++)
		if (strcmp(tab[i].type, type) == 0)
			return tab[i].parse(t, o, where, ret_error);
	return tok_unsupported_at(t, ret_error, where, "type", json_object_get(o, "type"));
}

static int tok_hf_norm_any(struct tok *t, const json_t *n, const char *where, char **ret_error) {
	return tok_hf_dispatch(t, tok_hf_normalizers, TOK_ELEMENTSOF(tok_hf_normalizers), n, where, ret_error);
}

int tok_hf_pipe_normalizer(struct tok *t, const json_t *n, char **ret_error) {
	if (!n || json_is_null(n))
		return 0;
	t->general = true;
	return tok_hf_norm_any(t, n, "normalizer", ret_error);
}

/* ---- pre-tokenizers ---- */

static int tok_pre_slot(struct tok *t, const char *where, char **ret_error, struct tok_pre **ret) {
	*ret = tok_pre_add(t);
	if (!*ret)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: more than %d pre-tokenizers", t->name, where,
				  TOK_MAX_PRE);
	return 0;
}

static int tok_hf_behavior(const struct tok *t, const json_t *o, const char *where, char **ret_error,
			   enum tok_split_behavior *ret) {
	static const char *const names[] = { "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
					     "Contiguous" };
	const char *b = json_string_value(json_object_get(o, "behavior"));

	for (size_t i = 0; b && i < TOK_ELEMENTSOF(names); i++)
		if (strcmp(b, names[i]) == 0) {
			*ret = (enum tok_split_behavior) i;
			return 0;
		}
	return tok_unsupported_at(t, ret_error, where, "behavior", json_object_get(o, "behavior"));
}

static int tok_hf_split(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "pattern", "behavior", "invert", NULL };
	const json_t *pat = json_object_get(o, "pattern");
	const char *lit = json_string_value(json_object_get(pat, "String"));
	const char *re = json_string_value(json_object_get(pat, "Regex"));
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r < 0)
		return r;
	if ((!lit && !re) || (lit && !*lit))
		return tok_unsupported_at(t, ret_error, where, "pattern", pat);
	r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = tok_pre_split_regex;
	p->invert = json_is_true(json_object_get(o, "invert"));
	r = tok_hf_behavior(t, o, where, ret_error, &p->behavior);
	if (r < 0)
		return r;
	return tok_compile_hf_pattern(t, lit ? lit : re, lit != NULL, &p->re, ret_error);
}

static int tok_hf_char_delimiter(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "delimiter", NULL };
	const char *d = json_string_value(json_object_get(o, "delimiter"));
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r < 0)
		return r;
	if (!d || !*d)
		return tok_unsupported_at(t, ret_error, where, "delimiter", json_object_get(o, "delimiter"));
	r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = tok_pre_split_regex;
	p->behavior = TOK_SPLIT_REMOVED;
	return tok_compile_hf_pattern(t, d, true, &p->re, ret_error);
}

static int tok_hf_metaspace(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "replacement", "prepend_scheme", "split", "add_prefix_space",
					     "str_rep", NULL };
	const json_t *rep = json_object_get(o, "replacement"), *ps = json_object_get(o, "prepend_scheme");
	const json_t *split = json_object_get(o, "split");
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r < 0)
		return r;
	if (!json_is_string(rep) || json_string_length(rep) == 0 || json_string_length(rep) > 4)
		return tok_unsupported_at(t, ret_error, where, "replacement", rep);
	r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = tok_pre_metaspace;
	p->rep_len = json_string_length(rep);
	memcpy(p->rep, json_string_value(rep), p->rep_len);
	p->split = !split || json_is_true(split);
	if (ps && !json_is_null(ps)) {
		const char *s = json_string_value(ps);
		if (s && strcmp(s, "always") == 0)
			p->prepend = TOK_PREPEND_ALWAYS;
		else if (s && strcmp(s, "first") == 0)
			p->prepend = TOK_PREPEND_FIRST;
		else if (s && strcmp(s, "never") == 0)
			p->prepend = TOK_PREPEND_NEVER;
		else
			return tok_unsupported_at(t, ret_error, where, "prepend_scheme", ps);
	} else {
		/* Files older than prepend_scheme: add_prefix_space (default true). */
		const json_t *aps = json_object_get(o, "add_prefix_space");
		p->prepend = !aps || json_is_true(aps) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
	}
	return 0;
}

static int tok_hf_digits(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "individual_digits", NULL };
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = tok_pre_digits;
	p->individual = json_is_true(json_object_get(o, "individual_digits"));
	return 0;
}

static int tok_hf_simple_pre(struct tok *t, const json_t *o, const char *where, char **ret_error, tok_pre_fn fn) {
	static const char *const known[] = { "type", NULL };
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = fn;
	return 0;
}

static int tok_hf_whitespace(struct tok *t, const json_t *o, const char *w, char **e) {
	return tok_hf_simple_pre(t, o, w, e, tok_pre_whitespace);
}

static int tok_hf_whitespace_split(struct tok *t, const json_t *o, const char *w, char **e) {
	return tok_hf_simple_pre(t, o, w, e, tok_pre_whitespace_split);
}

static int tok_hf_punctuation(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "behavior", NULL };
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = tok_pre_punctuation;
	p->behavior = TOK_SPLIT_ISOLATED;
	if (json_object_get(o, "behavior"))
		return tok_hf_behavior(t, o, where, ret_error, &p->behavior);
	return 0;
}

/* HF ByteLevel's own regex (use_regex true), as in tokenizers' byte_level.rs. */
#define TOK_PAT_BYTELEVEL "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static int tok_hf_bytelevel_pre(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	static const char *const known[] = { "type", "add_prefix_space", "trim_offsets", "use_regex", NULL };
	const json_t *use_regex = json_object_get(o, "use_regex");
	struct tok_pre *p;
	int r = tok_check_keys(t, o, known, where, ret_error);
	if (r == 0)
		r = tok_pre_slot(t, where, ret_error, &p);
	if (r < 0)
		return r;
	p->apply = tok_pre_bytelevel;
	p->add_prefix_space = json_is_true(json_object_get(o, "add_prefix_space"));
	if (!use_regex || json_is_true(use_regex))
		return tok_compile_hf_pattern(t, TOK_PAT_BYTELEVEL, false, &p->re, ret_error);
	return 0;
}

static int tok_hf_pre_any(struct tok *t, const json_t *o, const char *where, char **ret_error);

static int tok_hf_pre_sequence(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	return tok_hf_sequence(t, o, where, "pretokenizers", tok_hf_pre_any, ret_error);
}

static const struct tok_hf_parser tok_hf_pre_tokenizers[] = {
	{ "Split", tok_hf_split },
	{ "CharDelimiterSplit", tok_hf_char_delimiter },
	{ "Metaspace", tok_hf_metaspace },
	{ "Digits", tok_hf_digits },
	{ "Whitespace", tok_hf_whitespace },
	{ "WhitespaceSplit", tok_hf_whitespace_split },
	{ "Punctuation", tok_hf_punctuation },
	{ "ByteLevel", tok_hf_bytelevel_pre },
	{ "BertPreTokenizer", tok_hf_bert_pre_tokenizer }, /* tok-hf-model.c */
	{ "Sequence", tok_hf_pre_sequence },
};

static int tok_hf_pre_any(struct tok *t, const json_t *o, const char *where, char **ret_error) {
	/* After ByteLevel the text is in its byte alphabet, which feedd does
	 * not build: ByteLevel must be the last stage. */
	if (t->n_pres > 0 && t->pres[t->n_pres - 1].apply == tok_pre_bytelevel)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: %s: a pre-tokenizer after ByteLevel is unsupported",
				  t->name, where);
	return tok_hf_dispatch(t, tok_hf_pre_tokenizers, TOK_ELEMENTSOF(tok_hf_pre_tokenizers), o, where, ret_error);
}

int tok_hf_pipe_pre_tokenizer(struct tok *t, const json_t *p, bool *ret_byte_level, char **ret_error) {
	int r;

	*ret_byte_level = false;
	t->general = true;
	if (!p || json_is_null(p))
		return 0;
	r = tok_hf_pre_any(t, p, "pre_tokenizer", ret_error);
	if (r < 0)
		return r;
	*ret_byte_level = t->n_pres > 0 && t->pres[t->n_pres - 1].apply == tok_pre_bytelevel;
	return 0;
}
