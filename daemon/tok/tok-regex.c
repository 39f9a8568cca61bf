/* SPDX-License-Identifier: MIT */
/*
 * Compiling pre-tokenizer patterns with PCRE2 so that they match as the
 * reference engines do (Rust's regex for tiktoken, Oniguruma for HF).
 */
#include <errno.h>
#include <stdio.h>

#include "tok-internal.h"

int tok_compile(const struct tok *t, const char *pattern, size_t len, uint32_t options,
		       pcre2_code **ret, bool *ret_jit, char **ret_error, const char *what) {
	PCRE2_UCHAR msg[256];
	PCRE2_SIZE off;
	int err;
	pcre2_code *re;

	re = pcre2_compile((PCRE2_SPTR) pattern, len, options, &err, &off, NULL);
	if (!re) {
		pcre2_get_error_message(err, msg, sizeof(msg));
		return tok_errorf(ret_error, -EINVAL, "%s: %s: offset %zu: %s", t->name, what, (size_t) off,
				  (const char *) msg);
	}
	/* JIT for whole subjects and for windows (partial matching); an
	 * interpreter fallback keeps working where JIT is unavailable. */
	*ret_jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD) == 0;
	*ret = re;
	return 0;
}

/* Unicode White_Space, which is what \s means to Rust's regex (tiktoken) and
 * to Oniguruma (HF).  PCRE2's \s also takes U+180E (a format character
 * since Unicode 6.3), which would split " \u180e" where the peers do not. */
#define TOK_WHITE_SPACE "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* The model's pattern, adjusted so PCRE2 reads it as the peer's engine does:
 *  - \s (and \S outside classes) spelled out as White_Space;
 *  - hf (Oniguruma, Ruby syntax): "X{n,m}+" is not possessive there but
 *    "(?:X{n,m})+", so "\p{N}{1,3}+" takes any run of digits (HF's output
 *    shows it); written that way for PCRE2.
 * Everything else is passed through untouched. */
static char *tok_translate_pattern(const char *p, bool hf) {
	size_t n = strlen(p), o = 0, depth = 0, atom = 0, groups[64], n_groups = 0;
	char *q = malloc(n * (sizeof(TOK_WHITE_SPACE) + 8) + 1);
	bool quoted = false;

	if (!q)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (quoted) {
			if (p[i] == '\\' && p[i + 1] == 'E') {
				quoted = false;
				q[o++] = p[i++];
			}
			atom = o;
			q[o++] = p[i];
			continue;
		}
		if (p[i] == '\\' && i + 1 < n) {
			char c = p[i + 1];
			if (depth == 0)
				atom = o;
			if (c == 'Q') {
				quoted = true;
				q[o++] = p[i++];
				q[o++] = p[i];
				continue;
			}
			if (c == 's' || (c == 'S' && depth == 0)) {
				o += (size_t) sprintf(q + o, depth ? "%s" : c == 's' ? "[%s]" : "[^%s]", TOK_WHITE_SPACE);
				i++;
				continue;
			}
			/* Oniguruma's \uHHHH is PCRE2's \x{HHHH}. */
			if (c == 'u' && i + 5 < n + 0 && strspn(p + i + 2, "0123456789abcdefABCDEF") >= 4) {
				o += (size_t) sprintf(q + o, "\\x{%.4s}", p + i + 2);
				i += 5;
				continue;
			}
			q[o++] = p[i++];
			q[o++] = p[i];
			/* \p{..}, \x{..} and the like are one escape. */
			if (strchr("pPxoNgk", c) && p[i + 1] == '{')
				while (i + 1 < n && p[i] != '}')
					q[o++] = p[++i];
			continue;
		}
		if (depth > 0) {
			if (p[i] == '[' && p[i + 1] == ':') {
				const char *e = strstr(p + i, ":]");
				if (e) {
					size_t k = (size_t) (e - (p + i)) + 2;
					memcpy(q + o, p + i, k);
					o += k;
					i += k - 1;
					continue;
				}
			}
			if (p[i] == ']')
				depth = 0;
			q[o++] = p[i];
			continue;
		}
		if (p[i] == '[') {
			depth = 1;
			atom = o;
			q[o++] = p[i];
			/* A ']' first in a class (after an optional '^') is literal. */
			if (p[i + 1] == '^')
				q[o++] = p[++i];
			if (p[i + 1] == ']')
				q[o++] = p[++i];
			continue;
		}
		if (p[i] == '(') {
			if (n_groups < TOK_ELEMENTSOF(groups))
				groups[n_groups] = o;
			n_groups++;
			q[o++] = p[i];
			continue;
		}
		if (p[i] == ')') {
			if (n_groups > 0 && --n_groups < TOK_ELEMENTSOF(groups))
				atom = groups[n_groups];
			q[o++] = p[i];
			continue;
		}
		if (p[i] == '{') {
			size_t k = i + 1;
			while (k < n && ((p[k] >= '0' && p[k] <= '9') || p[k] == ','))
				k++;
			if (k < n && p[k] == '}' && k > i + 1 && hf && p[k + 1] == '+') {
				memmove(q + atom + 3, q + atom, o - atom);
				memcpy(q + atom, "(?:", 3);
				o += 3;
				memcpy(q + o, p + i, k - i + 1);
				o += k - i + 1;
				q[o++] = ')';
				q[o++] = '+';
				i = k + 1;
				continue;
			}
			if (k < n && p[k] == '}') {
				memcpy(q + o, p + i, k - i + 1);
				o += k - i + 1;
				i = k;
				continue;
			}
		}
		if (!strchr("*+?|^$", p[i]))
			atom = o;
		q[o++] = p[i];
	}
	q[o] = 0;
	return q;
}

int tok_add_regex(struct tok *t, const char *pattern, bool hf, char **ret_error) {
	/* Rust's regex (tiktoken) matches $ only at the end of the text;
	 * Oniguruma (HF) matches it before every newline too. */
	uint32_t opts = PCRE2_UTF | PCRE2_UCP | (hf ? PCRE2_MULTILINE : PCRE2_DOLLAR_ENDONLY);
	bool jit;
	int r;

	if (t->n_re >= TOK_MAX_REGEX)
		return tok_errorf(ret_error, -EOPNOTSUPP, "%s: more than %d pre-tokenizer regexes", t->name,
				  TOK_MAX_REGEX);
	_tok_cleanup_free_ char *translated = tok_translate_pattern(pattern, hf);
	if (!translated)
		return -ENOMEM;
	r = tok_compile(t, translated, PCRE2_ZERO_TERMINATED, opts, &t->re[t->n_re], &jit, ret_error,
			"pre-tokenizer pattern");
	if (r < 0)
		return r;
	if (t->n_re == 0) {
		t->jit = jit;
		pcre2_pattern_info(t->re[0], PCRE2_INFO_MAXLOOKBEHIND, &t->max_lookbehind);
	} else
		t->jit = t->jit && jit;
	t->n_re++;
	return 0;
}

int tok_compile_hf_pattern(const struct tok *t, const char *pattern, bool literal, pcre2_code **ret,
			   char **ret_error) {
	bool jit;

	if (literal) {
		/* A String pattern: every character literal. */
		size_t n = strlen(pattern), o = 0;
		_tok_cleanup_free_ char *q = malloc(4 * n + 1);
		if (!q)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char) pattern[i];
			if (c < 0x80 && !((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
				o += (size_t) sprintf(q + o, "\\x%02x", c);
			else
				q[o++] = (char) c;
		}
		q[o] = 0;
		return tok_compile(t, q, o, PCRE2_UTF | PCRE2_UCP, ret, &jit, ret_error, "pattern");
	}
	_tok_cleanup_free_ char *translated = tok_translate_pattern(pattern, true);
	if (!translated)
		return -ENOMEM;
	return tok_compile(t, translated, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, ret, &jit,
			   ret_error, "pattern");
}
