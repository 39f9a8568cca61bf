/* SPDX-License-Identifier: MIT */
/*
 * Pre-tokenizers of the general pipeline (see tok-pipe.h), each as HF
 * tokenizers 0.23 defines it, and HF's split behaviours.
 */
#include <errno.h>

#include "tok-pipe.h"
#include "tok-unicode.h"

struct tok_buf *tok_pre_buf(struct tok_state *st, size_t level) {
	return &st->pre_buf[level];
}

struct tok_spans *tok_pre_spans(struct tok_state *st, size_t level) {
	return &st->pre_spans[level];
}

int tok_spans_push(struct tok_spans *sp, size_t start, size_t end, bool match) {
	if (sp->n == sp->cap) {
		size_t cap = sp->cap ? sp->cap * 2 : 64;
		struct tok_span *v = realloc(sp->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		sp->v = v;
		sp->cap = cap;
	}
	sp->v[sp->n++] = (struct tok_span) { .start = start, .end = end, .match = match };
	return 0;
}

int tok_spans_chars(struct tok_spans *sp, const uint8_t *s, size_t n, bool (*pred)(uint32_t cp)) {
	size_t gap = 0;
	int r;

	sp->n = 0;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t k = tok_utf8_next(s + i, n - i, &cp);
		if (pred(cp)) {
			if (gap < i && (r = tok_spans_push(sp, gap, i, false)) < 0)
				return r;
			if ((r = tok_spans_push(sp, i, i + k, true)) < 0)
				return r;
			gap = i + k;
		}
		i += k;
	}
	if (gap < n)
		return tok_spans_push(sp, gap, n, false);
	return 0;
}

struct tok_pre *tok_pre_add(struct tok *t) {
	if (t->n_pres >= TOK_MAX_PRE)
		return NULL;
	if (!t->pres) {
		t->pres = calloc(TOK_MAX_PRE, sizeof(*t->pres));
		if (!t->pres)
			return NULL;
	}
	return &t->pres[t->n_pres++];
}

int tok_pre_run(struct tok_state *st, size_t level, const uint8_t *s, size_t n, bool first) {
	const struct tok *t = st->t;

	if (n == 0)
		return 0;
	if (level < t->n_pres)
		return t->pres[level].apply(&t->pres[level], st, level, s, n, first);
	if (t->cut) {
		/* Cut between characters that no token joins (t->cut): the
		 * same ids, and repeated words hit the piece caches. */
		size_t start = 0, i = 0;
		uint32_t prev;
		i = tok_utf8_next(s, n, &prev);
		while (i < n) {
			uint32_t cp;
			size_t k = tok_utf8_next(s + i, n - i, &cp);
			if (!tok_cut_joined(t, prev, cp)) {
				int r = tok_piece(st, s + start, i - start);
				if (r < 0)
					return r;
				start = i;
			}
			prev = cp;
			i += k;
		}
		return tok_piece(st, s + start, n - start);
	}
	return tok_piece(st, s, n);
}

#define TOK_EMIT(a, b)                                                                  \
	do {                                                                            \
		if ((b) > (a)) {                                                        \
			r = tok_pre_run(st, level + 1, s + (a), (b) - (a), first && (a) == 0); \
			if (r < 0)                                                      \
				return r;                                               \
		}                                                                       \
	} while (0)

int tok_pre_split(struct tok_state *st, size_t level, const uint8_t *s, size_t n, bool first, struct tok_spans *sp,
		  enum tok_split_behavior b, bool invert) {
	size_t ps = 0, pe = 0;
	bool have = false, prev = false;
	int r;

	(void) n;
	if (invert)
		for (size_t i = 0; i < sp->n; i++)
			sp->v[i].match = !sp->v[i].match;
	for (size_t i = 0; i < sp->n; i++) {
		const struct tok_span *x = &sp->v[i];
		switch (b) {
		case TOK_SPLIT_REMOVED:
			if (!x->match)
				TOK_EMIT(x->start, x->end);
			break;
		case TOK_SPLIT_ISOLATED:
			TOK_EMIT(x->start, x->end);
			break;
		case TOK_SPLIT_CONTIGUOUS:
			if (have && x->match == prev)
				pe = x->end;
			else {
				if (have)
					TOK_EMIT(ps, pe);
				ps = x->start;
				pe = x->end;
				have = true;
			}
			break;
		case TOK_SPLIT_MERGED_PREV:
			/* A match joins the gap before it. */
			if (x->match && !prev && have)
				pe = x->end;
			else {
				if (have)
					TOK_EMIT(ps, pe);
				ps = x->start;
				pe = x->end;
				have = true;
			}
			break;
		case TOK_SPLIT_MERGED_NEXT:
			/* A match joins the gap after it; have = a match waits. */
			if (have) {
				if (!x->match) {
					TOK_EMIT(ps, x->end);
					have = false;
					break;
				}
				TOK_EMIT(ps, pe);
				have = false;
			}
			if (x->match) {
				ps = x->start;
				pe = x->end;
				have = true;
			} else
				TOK_EMIT(x->start, x->end);
			break;
		}
		prev = x->match;
	}
	if (have)
		TOK_EMIT(ps, pe);
	return 0;
}

/* Matches of re in s[0..n) as HF's Pattern for an Oniguruma regex: gaps and
 * matches in order; an empty match right after the previous match is
 * skipped, as the onig crate's find_iter does. */
static int tok_spans_regex(struct tok_state *st, const pcre2_code *re, const uint8_t *s, size_t n,
			   struct tok_spans *sp) {
	size_t last_end = 0, prev = 0, last_match_end = SIZE_MAX;
	const uint8_t *m = tok_uni_map(&st->map_piece, s, n);  /* Unicode 16 for PCRE2 */
	int r;

	if (!m)
		return -ENOMEM;
	sp->n = 0;
	while (last_end <= n) {
		int k = pcre2_match(re, m, n, last_end, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
		if (k == PCRE2_ERROR_NOMATCH)
			break;
		if (k < 0)
			return -EIO;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
		size_t ms = ov[0], me = ov[1];
		if (ms == me && last_match_end == me) {
			if (last_end >= n)
				break;
			uint32_t cp;
			last_end += tok_utf8_next(m + last_end, n - last_end, &cp);
			continue;
		}
		last_end = last_match_end = me;
		if (prev != ms && (r = tok_spans_push(sp, prev, ms, false)) < 0)
			return r;
		if ((r = tok_spans_push(sp, ms, me, true)) < 0)
			return r;
		prev = me;
	}
	if (prev != n)
		return tok_spans_push(sp, prev, n, false);
	return 0;
}

int tok_pre_split_regex(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			bool first) {
	struct tok_spans *sp = tok_pre_spans(st, level);
	int r = tok_spans_regex(st, p->re, s, n, sp);
	if (r < 0)
		return r;
	return tok_pre_split(st, level, s, n, first, sp, p->behavior, p->invert);
}

static bool tok_is_space_char(uint32_t cp) {
	return tok_uni_is_space(cp);
}

static bool tok_is_punct_char(uint32_t cp) {
	return tok_uni_is_punct(cp);
}

static bool tok_is_numeric_char(uint32_t cp) {
	return tok_uni_is_numeric(cp);
}

int tok_pre_metaspace(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		      bool first) {
	struct tok_buf *b = tok_pre_buf(st, level);
	bool starts;
	int r;

	b->n = 0;
	r = tok_buf_reserve(b, n * p->rep_len + p->rep_len);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ') {
			memcpy(b->p + b->n, p->rep, p->rep_len);
			b->n += p->rep_len;
		} else
			b->p[b->n++] = s[i];
	}
	starts = b->n >= p->rep_len && memcmp(b->p, p->rep, p->rep_len) == 0;
	if (!starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && first))) {
		memmove(b->p + p->rep_len, b->p, b->n);
		memcpy(b->p, p->rep, p->rep_len);
		b->n += p->rep_len;
	}
	if (!p->split)
		return tok_pre_run(st, level + 1, b->p, b->n, first);
	/* Split on the replacement, each one joining what follows it. */
	struct tok_spans *sp = tok_pre_spans(st, level);
	size_t gap = 0;
	sp->n = 0;
	for (size_t i = 0; i + p->rep_len <= b->n;) {
		if (memcmp(b->p + i, p->rep, p->rep_len) == 0) {
			if (gap < i && (r = tok_spans_push(sp, gap, i, false)) < 0)
				return r;
			if ((r = tok_spans_push(sp, i, i + p->rep_len, true)) < 0)
				return r;
			i += p->rep_len;
			gap = i;
		} else
			i++;
	}
	if (gap < b->n && (r = tok_spans_push(sp, gap, b->n, false)) < 0)
		return r;
	return tok_pre_split(st, level, b->p, b->n, first, sp, TOK_SPLIT_MERGED_NEXT, false);
}

int tok_pre_digits(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		   bool first) {
	struct tok_spans *sp = tok_pre_spans(st, level);
	int r = tok_spans_chars(sp, s, n, tok_is_numeric_char);
	if (r < 0)
		return r;
	return tok_pre_split(st, level, s, n, first, sp, p->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS,
			     false);
}

int tok_pre_whitespace_split(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			     bool first) {
	struct tok_spans *sp = tok_pre_spans(st, level);
	int r;

	(void) p;
	r = tok_spans_chars(sp, s, n, tok_is_space_char);
	if (r < 0)
		return r;
	return tok_pre_split(st, level, s, n, first, sp, TOK_SPLIT_REMOVED, false);
}

int tok_pre_punctuation(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
			bool first) {
	struct tok_spans *sp = tok_pre_spans(st, level);
	int r = tok_spans_chars(sp, s, n, tok_is_punct_char);
	if (r < 0)
		return r;
	return tok_pre_split(st, level, s, n, first, sp, p->behavior, false);
}

/* Oniguruma's \w: Alphabetic, marks, decimal digits, connectors. */
static bool tok_is_onig_word(uint32_t cp) {
	enum tok_gc g = tok_uni_gc(cp);
	return (tok_uni_props(cp) & TOK_UNI_ALPHABETIC) || g == TOK_GC_MN || g == TOK_GC_MC || g == TOK_GC_ME ||
	       g == TOK_GC_ND || g == TOK_GC_PC;
}

/* Whitespace: the matches of \w+|[^\w\s]+, the rest removed. */
int tok_pre_whitespace(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		       bool first) {
	struct tok_spans *sp = tok_pre_spans(st, level);
	size_t i = 0;
	int r;

	(void) p;
	sp->n = 0;
	while (i < n) {
		uint32_t cp;
		size_t start = i, k = tok_utf8_next(s + i, n - i, &cp);
		int cls = tok_is_onig_word(cp) ? 1 : tok_uni_is_space(cp) ? 0 : 2;
		i += k;
		while (i < n) {
			k = tok_utf8_next(s + i, n - i, &cp);
			int c2 = tok_is_onig_word(cp) ? 1 : tok_uni_is_space(cp) ? 0 : 2;
			if (c2 != cls)
				break;
			i += k;
		}
		if ((r = tok_spans_push(sp, start, i, cls != 0)) < 0)
			return r;
	}
	return tok_pre_split(st, level, s, n, first, sp, TOK_SPLIT_REMOVED, true);
}

int tok_pre_bytelevel(const struct tok_pre *p, struct tok_state *st, size_t level, const uint8_t *s, size_t n,
		      bool first) {
	if (p->add_prefix_space && s[0] != ' ') {
		struct tok_buf *b = tok_pre_buf(st, level);
		b->n = 0;
		int r = tok_buf_append(b, " ", 1);
		if (r == 0)
			r = tok_buf_append(b, s, n);
		if (r < 0)
			return r;
		s = b->p;
		n = b->n;
	}
	if (!p->re)
		return tok_pre_run(st, level + 1, s, n, first);
	struct tok_spans *sp = tok_pre_spans(st, level);
	int r = tok_spans_regex(st, p->re, s, n, sp);
	if (r < 0)
		return r;
	return tok_pre_split(st, level, s, n, first, sp, TOK_SPLIT_ISOLATED, false);
}
