/* SPDX-License-Identifier: MIT */
/*
 * The general tokenizer.json pipeline (see tok-pipe.h): added tokens,
 * normalizers and the driver.  Pre-tokenizers are in tok-pretok.c.
 */
#include <errno.h>
#include <stdio.h>
#include <uninorm.h>

#include "tok-pipe.h"
#include "tok-unicode.h"

int tok_buf_reserve(struct tok_buf *b, size_t more) {
	if (b->n + more <= b->cap)
		return 0;
	size_t cap = b->n + more;
	cap += cap / 2 + 64;
	uint8_t *p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

int tok_buf_append(struct tok_buf *b, const void *s, size_t n) {
	int r = tok_buf_reserve(b, n);
	if (r < 0)
		return r;
	if (n > 0)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	return 0;
}

/* ---- normalizers ---- */

/* Appends the normal form of in[0..n) to out. */
static int nf_append(uninorm_t form, const uint8_t *in, size_t n, struct tok_buf *out) {
	size_t len = 0;
	uint8_t *o;
	int r;

	if (n == 0)
		return 0;
	o = u8_normalize(form, in, n, NULL, &len);
	if (!o)
		return -errno;
	r = tok_buf_append(out, o, len);
	free(o);
	return r;
}

int tok_norm_nf(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n, struct tok_buf *out) {
	uninorm_t forms[4] = { UNINORM_NFC, UNINORM_NFD, UNINORM_NFKC, UNINORM_NFKD };
	size_t len, seg = 0;
	uint8_t *o;
	int r;

	(void) st;
	/* ASCII is unchanged by every normalization form. */
	size_t i = 0;
	while (i < n && in[i] < 0x80)
		i++;
	if (i == n)
		return tok_buf_append(out, in, n);
	if (nm->form == 1 || nm->form == 3)
		return tok_nf_decompose(nm->form == 3, in, n, out);
	/* Characters HF's older normalization data do not know stay as they
	 * are (tok-nf.c); the text between them is normalized piece by piece
	 * (they are starters to HF, so nothing reorders or composes across
	 * them). */
	for (size_t k = i; k < n;) {
		uint32_t c;
		size_t l = tok_utf8_next(in + k, n - k, &c);
		if (c >= 0x3000 && tok_nf_hf_keeps(nm->form, c)) {
			r = nf_append(forms[nm->form], in + seg, k - seg, out);
			if (r == 0)
				r = tok_buf_append(out, in + k, l);
			if (r < 0)
				return r;
			seg = k + l;
		}
		k += l;
	}
	if (seg > 0)
		return nf_append(forms[nm->form], in + seg, n - seg, out);
	r = tok_buf_reserve(out, n + 16);
	if (r < 0)
		return r;
	len = out->cap;
	o = u8_normalize(forms[nm->form], in, n, out->p, &len);
	if (!o)
		return -errno;
	if (o != out->p) {
		free(out->p);
		out->p = o;
		out->cap = len;
	}
	out->n = len;
	return 0;
}

/* HF's Lowercase: Rust's char::to_lowercase character by character (so
 * no Final_Sigma context: "ΣΑΣ" -> "σασ"), with Unicode 16's mappings. */
int tok_norm_lowercase(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		       struct tok_buf *out) {
	int r;

	(void) nm;
	(void) st;
	r = tok_buf_reserve(out, 3 * n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		if (in[i] < 0x80) {
			out->p[out->n++] = (uint8_t) (in[i] >= 'A' && in[i] <= 'Z' ? in[i] | 0x20 : in[i]);
			i++;
			continue;
		}
		size_t k = tok_utf8_next(in + i, n - i, &cp);
		size_t lo = 0, hi = tok_uni_lower_n;
		while (lo < hi) {
			size_t mid = (lo + hi) / 2;
			if (tok_uni_lower_map[mid].cp < cp)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo < tok_uni_lower_n && tok_uni_lower_map[lo].cp == cp) {
			/* At most 3 characters of at most 3 bytes here (<= 3 * k). */
			for (int j = 0; j < 3 && tok_uni_lower_map[lo].to[j]; j++)
				out->n += tok_utf8_put(tok_uni_lower_map[lo].to[j], out->p + out->n);
		} else {
			memcpy(out->p + out->n, in + i, k);
			out->n += k;
		}
		i += k;
	}
	return 0;
}

int tok_norm_strip(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n, struct tok_buf *out) {
	size_t a = 0, b = n;
	uint32_t cp;

	(void) st;
	while (nm->left && a < b) {
		size_t k = tok_utf8_next(in + a, b - a, &cp);
		if (!tok_uni_is_space(cp))
			break;
		a += k;
	}
	while (nm->right && b > a) {
		size_t p = a + tok_utf8_prev(in + a, b - a);
		tok_utf8_next(in + p, b - p, &cp);
		if (!tok_uni_is_space(cp))
			break;
		b = p;
	}
	return tok_buf_append(out, in + a, b - a);
}

int tok_norm_prepend(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		     struct tok_buf *out) {
	int r;

	(void) st;
	if (n == 0)
		return 0;
	r = tok_buf_append(out, nm->str, nm->str_len);
	return r < 0 ? r : tok_buf_append(out, in, n);
}

int tok_norm_replace(const struct tok_norm *nm, struct tok_state *st, const uint8_t *in, size_t n,
		     struct tok_buf *out) {
	size_t pos = 0;
	int r;

	if (nm->lit) {
		for (;;) {
			const uint8_t *m = nm->lit_len <= n - pos ? memmem(in + pos, n - pos, nm->lit, nm->lit_len) : NULL;
			if (!m)
				break;
			r = tok_buf_append(out, in + pos, (size_t) (m - in) - pos);
			if (r == 0)
				r = tok_buf_append(out, nm->str, nm->str_len);
			if (r < 0)
				return r;
			pos = (size_t) (m - in) + nm->lit_len;
		}
		return tok_buf_append(out, in + pos, n - pos);
	}
	const uint8_t *m = tok_uni_map(&st->map_piece, in, n);  /* Unicode 16 for PCRE2 */
	if (!m)
		return -ENOMEM;
	for (size_t from = 0; from <= n;) {
		int k = pcre2_match(nm->re, m, n, from, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
		if (k == PCRE2_ERROR_NOMATCH)
			break;
		if (k < 0)
			return -EIO;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
		size_t ms = ov[0], me = ov[1];
		if (me == ms) {
			/* Empty matches replace nothing here. */
			from = ms + 1;
			while (from < n && (in[from] & 0xc0) == 0x80)
				from++;
			continue;
		}
		r = tok_buf_append(out, in + pos, ms - pos);
		if (r == 0)
			r = tok_buf_append(out, nm->str, nm->str_len);
		if (r < 0)
			return r;
		pos = from = me;
	}
	return tok_buf_append(out, in + pos, n - pos);
}

struct tok_norm *tok_norm_add(struct tok *t) {
	if (t->n_norms >= TOK_MAX_NORM)
		return NULL;
	if (!t->norms) {
		t->norms = calloc(TOK_MAX_NORM, sizeof(*t->norms));
		if (!t->norms)
			return NULL;
	}
	t->general = true;
	return &t->norms[t->n_norms++];
}

int tok_normalize(struct tok_state *st, const uint8_t *s, size_t n, const uint8_t **ret, size_t *ret_len) {
	const struct tok *t = st->t;
	const uint8_t *p = s;
	size_t len = n;

	for (size_t i = 0; i < t->n_norms; i++) {
		struct tok_buf *o = &st->norm_buf[i & 1];
		o->n = 0;
		int r = t->norms[i].apply(&t->norms[i], st, p, len, o);
		if (r < 0)
			return r;
		p = o->p;
		len = o->n;
	}
	*ret = p;
	*ret_len = len;
	return 0;
}

/* ---- added tokens ---- */

static bool tok_is_word_char(uint32_t cp) {
	return cp == '_' || tok_uni_is_alnum(cp);
}

/* The next added token of the set re (normalized or not) that HF takes in
 * s[pos..n), given that the previous split ended at floor: its id and the
 * span it replaces (lstrip/rstrip applied).  Returns 1, 0 for none, or
 * -EIO.  Like HF's Aho-Corasick iteration, a match that single_word
 * rejects is skipped whole. */
static int tok_added_next(struct tok_state *st, const pcre2_code *re, bool normalized, const uint8_t *s, size_t n,
			  size_t pos, size_t floor, size_t *ret_s, size_t *ret_e, int32_t *ret_id) {
	const struct tok *t = st->t;
	uint32_t cp;

	while (pos < n) {
		int k = pcre2_match(re, s, n, pos, 0, st->md, st->mctx);
		if (k == PCRE2_ERROR_NOMATCH)
			return 0;
		if (k < 0)
			return -EIO;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
		size_t ms = ov[0], me = ov[1];
		const struct tok_added *a = NULL;
		for (uint32_t i = (uint32_t) (tok_hash_bytes(s + ms, me - ms) + normalized) & t->gadd_mask;;
		     i = (i + 1) & t->gadd_mask) {
			uint32_t j = t->gadd_index[i];
			if (j == 0)
				return -EIO;
			const struct tok_added *x = &t->added[j - 1];
			if (x->match_len == me - ms && x->normalized == normalized && memcmp(x->match, s + ms, me - ms) == 0) {
				a = x;
				break;
			}
		}
		if (a->single_word) {
			bool before = ms > 0 && (tok_utf8_next(s + tok_utf8_prev(s, ms), ms - tok_utf8_prev(s, ms), &cp),
						 tok_is_word_char(cp));
			bool after = me < n && (tok_utf8_next(s + me, n - me, &cp), tok_is_word_char(cp));
			if (before || after) {
				pos = me;
				continue;
			}
		}
		if (a->lstrip) {
			size_t b = ms;
			while (b > 0) {
				size_t p = tok_utf8_prev(s, b);
				tok_utf8_next(s + p, b - p, &cp);
				if (!tok_uni_is_space(cp))
					break;
				b = p;
			}
			ms = b > floor ? b : floor;
		}
		if (a->rstrip)
			while (me < n) {
				size_t k2 = tok_utf8_next(s + me, n - me, &cp);
				if (!tok_uni_is_space(cp))
					break;
				me += k2;
			}
		*ret_s = ms;
		*ret_e = me;
		*ret_id = a->id;
		return 1;
	}
	return 0;
}

/* A normalized gap: through the pre-tokenizers. */
static int tok_gap(struct tok_state *st, const uint8_t *s, size_t n, bool first) {
	if (n == 0)
		return 0;
	return tok_pre_run(st, 0, s, n, first);
}

/* A raw gap between non-normalized added tokens: normalize it, then split
 * it on the normalized added tokens. */
static int tok_segment(struct tok_state *st, const uint8_t *s, size_t n, bool first, unsigned flags) {
	const struct tok *t = st->t;
	const pcre2_code *re = t->gadd_re[1][(flags & TOK_ENCODE_SPECIALS) ? 1 : 0];
	const uint8_t *p;
	size_t len, pos = 0;
	int r;

	if (n == 0)
		return 0;
	r = tok_normalize(st, s, n, &p, &len);
	if (r < 0)
		return r;
	if (!re)
		return tok_gap(st, p, len, first);
	for (;;) {
		size_t ms, me;
		int32_t id;
		r = tok_added_next(st, re, true, p, len, pos, pos, &ms, &me, &id);
		if (r < 0)
			return r;
		if (r == 0)
			break;
		r = tok_gap(st, p + pos, ms - pos, first && pos == 0);
		if (r < 0)
			return r;
		tok_piece_id(st, (uint32_t) id);
		pos = me;
	}
	return tok_gap(st, p + pos, len - pos, first && pos == 0);
}

int tok_encode_general(struct tok_state *st, const uint8_t *s, size_t n, unsigned flags, size_t *n_replaced) {
	const struct tok *t = st->t;
	const pcre2_code *re = t->gadd_re[0][(flags & TOK_ENCODE_SPECIALS) ? 1 : 0];
	size_t pos = 0;
	int r;

	if (!(flags & TOK_ENCODE_UTF8_VALID) && tok_utf8_valid_prefix(s, n) != n) {
		size_t rep = 0;
		st->text_buf.n = 0;
		r = tok_buf_reserve(&st->text_buf, 3 * n);
		if (r < 0)
			return r;
		st->text_buf.n = tok_utf8_replace(s, n, st->text_buf.p, &rep);
		*n_replaced += rep;
		s = st->text_buf.p;
		n = st->text_buf.n;
	}
	while (re) {
		size_t ms, me;
		int32_t id;
		r = tok_added_next(st, re, false, s, n, pos, pos, &ms, &me, &id);
		if (r < 0)
			return r;
		if (r == 0)
			break;
		r = tok_segment(st, s + pos, ms - pos, pos == 0, flags);
		if (r < 0)
			return r;
		tok_piece_id(st, (uint32_t) id);
		pos = me;
	}
	return tok_segment(st, s + pos, n - pos, pos == 0, flags);
}

/* Alternation of the literal added tokens of one set, longest first
 * (leftmost-longest, as HF's Aho-Corasick). */
static int tok_compile_set(struct tok *t, bool normalized, bool with_special, pcre2_code **ret, char **ret_error) {
	_tok_cleanup_free_ char *pat = NULL;
	size_t n = 0, cap = 16;
	bool jit, any = false;

	*ret = NULL;
	for (size_t i = 0; i < t->n_added; i++)
		cap += t->added[i].match_len * 4 + 1;
	pat = malloc(cap);
	if (!pat)
		return -ENOMEM;
	for (size_t i = 0; i < t->n_added; i++) {
		const struct tok_added *a = &t->added[i];
		if (a->normalized != normalized || (a->special && !with_special) || a->match_len == 0)
			continue;
		if (any)
			pat[n++] = '|';
		any = true;
		for (size_t j = 0; j < a->match_len; j++)
			n += (size_t) sprintf(pat + n, "\\x%02x", (unsigned char) a->match[j]);
	}
	pat[n] = 0;
	if (!any)
		return 0;
	return tok_compile(t, pat, n, 0, ret, &jit, ret_error, "added tokens");
}

static int tok_match_len_cmp(const void *a, const void *b) {
	const struct tok_added *x = a, *y = b;
	return x->match_len > y->match_len ? -1 : x->match_len < y->match_len;
}

int tok_pipe_finish(struct tok *t, char **ret_error) {
	int r;

	/* A normalized token matches by its normalized content. */
	for (size_t i = 0; i < t->n_added; i++) {
		struct tok_added *a = &t->added[i];
		a->match = (uint8_t *) a->text;
		a->match_len = a->len;
		if (a->normalized && t->n_norms > 0) {
			struct tok_state *st;
			const uint8_t *p;
			size_t len;
			r = tok_state_new(t, &st);
			if (r < 0)
				return r;
			r = tok_normalize(st, (const uint8_t *) a->text, a->len, &p, &len);
			if (r == 0) {
				a->norm = malloc(len ? len : 1);
				if (!a->norm)
					r = -ENOMEM;
				else {
					memcpy(a->norm, p, len);
					a->match = a->norm;
					a->match_len = len;
				}
			}
			tok_state_free(st);
			if (r < 0)
				return r;
		}
	}
	if (t->n_added > 1)
		qsort(t->added, t->n_added, sizeof(*t->added), tok_match_len_cmp);
	/* Which added token a match is: a hash of (normalized, text); the
	 * first of equal ones wins, as the scan in order did. */
	t->gadd_mask = 15;
	while (t->gadd_mask + 1 < 2 * t->n_added + 2)
		t->gadd_mask = t->gadd_mask * 2 + 1;
	t->gadd_index = calloc((size_t) t->gadd_mask + 1, sizeof(*t->gadd_index));
	if (!t->gadd_index)
		return -ENOMEM;
	for (size_t k = 0; k < t->n_added; k++) {
		const struct tok_added *a = &t->added[k];
		for (uint32_t i = (uint32_t) (tok_hash_bytes(a->match, a->match_len) + a->normalized) & t->gadd_mask;;
		     i = (i + 1) & t->gadd_mask) {
			uint32_t j = t->gadd_index[i];
			if (j == 0) {
				t->gadd_index[i] = (uint32_t) k + 1;
				break;
			}
			const struct tok_added *x = &t->added[j - 1];
			if (x->match_len == a->match_len && x->normalized == a->normalized &&
			    memcmp(x->match, a->match, a->match_len) == 0)
				break;
		}
	}
	for (int norm = 0; norm < 2; norm++)
		for (int sp = 0; sp < 2; sp++) {
			r = tok_compile_set(t, norm, sp, &t->gadd_re[norm][sp], ret_error);
			if (r < 0)
				return r;
		}
	return 0;
}

void tok_pipe_free(struct tok *t) {
	for (size_t i = 0; i < t->n_norms; i++) {
		struct tok_norm *nm = &t->norms[i];
		if (nm->done)
			nm->done(nm);
		free(nm->str);
		free(nm->lit);
		pcre2_code_free(nm->re);
	}
	free(t->norms);
	for (size_t i = 0; i < t->n_pres; i++) {
		struct tok_pre *p = &t->pres[i];
		if (p->done)
			p->done(p);
		pcre2_code_free(p->re);
	}
	free(t->pres);
	for (int a = 0; a < 2; a++)
		for (int b = 0; b < 2; b++)
			pcre2_code_free(t->gadd_re[a][b]);
	if (t->model_free)
		t->model_free(t->model_data);
	free(t->cut_pairs);
	free(t->gadd_index);
	free(t->bpe_prefix);
	free(t->bpe_suffix);
}

void tok_pipe_state_free(struct tok_state *st) {
	free(st->text_buf.p);
	for (int i = 0; i < 2; i++)
		free(st->norm_buf[i].p);
	free(st->map_buf.p);
	free(st->map_piece.p);
	for (size_t i = 0; i < TOK_MAX_PRE; i++) {
		free(st->pre_buf[i].p);
		free(st->pre_spans[i].v);
	}
}
