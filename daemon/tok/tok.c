/* SPDX-License-Identifier: MIT */
/*
 * Encoding with a loaded struct tok, and the per-thread struct tok_state.
 *
 * The struct tok is read-only here.  A tok_state belongs to one thread at a
 * time and owns: PCRE2 match data and JIT stack, the output batch, BPE
 * scratch, the window buffers for text that must be rewritten (invalid
 * UTF-8, NFC), and a bounded cache of piece -> ids for pieces that are not
 * a single token.
 *
 * Text that is valid UTF-8 and needs no normalisation is matched in place,
 * in the caller's buffer.  Other text is rewritten window by window; a
 * window is cut before an ASCII byte (a cut there changes neither UTF-8
 * repair nor NFC), and the regex runs on it with PCRE2_PARTIAL_HARD, so a
 * pre-token that might continue past the window is carried into the next
 * one instead of being cut.
 */
#include <errno.h>
#include <stdio.h>
#include <unistr.h>
#include <uninorm.h>

#include "tok-pipe.h"
#include "tok-unicode.h"


struct tok *tok_free(struct tok *t) {
	if (!t)
		return NULL;
	for (size_t i = 0; i < t->n_re; i++)
		pcre2_code_free(t->re[i]);
	pcre2_code_free(t->added_re);
	pcre2_code_free(t->plain_re);
	tok_pipe_free(t);
	for (size_t i = 0; i < t->n_added; i++) {
		free(t->added[i].text);
		free(t->added[i].norm);
	}
	free(t->added);
	free(t->ents);
	free(t->bytes);
	free(t->off);
	free(t->slots);
	free(t->pairs);
	free(t->pair2);
	free(t->whole_ok);
	free(t->name);
	free(t);
	return NULL;
}

bool tok_is_lossless(const struct tok *t) {
	/* The general pipeline may normalise, mark word starts (Metaspace)
	 * or give an unknown token. */
	return !t->general;
}

size_t tok_vocab_size(const struct tok *t) {
	return t->vocab_size;
}

int tok_special_id(const struct tok *t, const char *name) {
	size_t n = strlen(name);

	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].len == n && memcmp(t->added[i].text, name, n) == 0)
			return t->added[i].id;
	return -ENOENT;
}

int tok_token_bytes(const struct tok *t, int32_t id, const uint8_t **ret, size_t *ret_len) {
	if (id >= 0 && (uint32_t) id < t->n_ids && t->off[id + 1] > t->off[id]) {
		*ret = t->bytes + t->off[id];
		*ret_len = t->off[id + 1] - t->off[id];
		return 0;
	}
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].id == id) {
			*ret = (const uint8_t *) t->added[i].text;
			*ret_len = t->added[i].len;
			return 0;
		}
	return -ENOENT;
}

void tok_ids_done(struct tok_ids *v) {
	free(v->ids);
	*v = (struct tok_ids) { 0 };
}


int tok_add_special(struct tok *t, const char *text, size_t len, int32_t id, bool special) {
	struct tok_added *a;

	if (len == 0 || id < 0)
		return -EINVAL;
	a = realloc(t->added, (t->n_added + 1) * sizeof(*a));
	if (!a)
		return -ENOMEM;
	t->added = a;
	a = &t->added[t->n_added];
	*a = (struct tok_added) { 0 };
	a->text = strndup(text, len);
	if (!a->text)
		return -ENOMEM;
	a->len = len;
	a->id = id;
	a->special = special;
	t->n_added++;
	if (!special)
		t->has_nonspecial = true;
	return 0;
}

static int tok_added_cmp(const void *a, const void *b) {
	const struct tok_added *x = a, *y = b;
	return x->len > y->len ? -1 : x->len < y->len;
}

/* Alternation of literal added tokens, longest first so that the leftmost
 * match is also the longest there, as HF's Aho-Corasick does.  Byte mode
 * (no UTF): the tokens are literal bytes. */
static int tok_compile_added(struct tok *t, bool only_plain, pcre2_code **ret, char **ret_error) {
	_tok_cleanup_free_ char *pat = NULL;
	size_t n = 0, cap = 16;
	bool jit, any = false;

	for (size_t i = 0; i < t->n_added; i++)
		cap += t->added[i].len * 6 + 1;
	pat = malloc(cap);
	if (!pat)
		return -ENOMEM;
	for (size_t i = 0; i < t->n_added; i++) {
		if (only_plain && t->added[i].special)
			continue;
		if (any)
			pat[n++] = '|';
		any = true;
		for (size_t j = 0; j < t->added[i].len; j++) {
			unsigned char c = (unsigned char) t->added[i].text[j];
			if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
				pat[n++] = (char) c;
			else
				n += (size_t) sprintf(pat + n, "\\x%02x", c);
		}
	}
	pat[n] = 0;
	if (!any) {
		*ret = NULL;
		return 0;
	}
	return tok_compile(t, pat, n, 0, ret, &jit, ret_error, "added tokens");
}

int tok_finish(struct tok *t, char **ret_error) {
	int r;

	if (t->n_re == 0 && !t->general)
		return tok_errorf(ret_error, -EINVAL, "%s: no pre-tokenizer pattern", t->name);
	if (t->n_added > 1) /* qsort(NULL, 0, ...) is undefined (UBSan) */
		qsort(t->added, t->n_added, sizeof(*t->added), tok_added_cmp);
	r = tok_compile_added(t, false, &t->added_re, ret_error);
	if (r < 0)
		return r;
	r = tok_compile_added(t, true, &t->plain_re, ret_error);
	if (r < 0)
		return r;
	if (t->general) {
		r = tok_pipe_finish(t, ret_error);
		if (r < 0)
			return r;
	}
	t->vocab_size = t->n_ids;
	for (size_t i = 0; i < t->n_added; i++)
		if ((size_t) t->added[i].id + 1 > t->vocab_size)
			t->vocab_size = (size_t) t->added[i].id + 1;
	return 0;
}

struct tok_state *tok_state_free(struct tok_state *st) {
	if (!st)
		return NULL;
	pcre2_match_data_free(st->md);
	pcre2_match_context_free(st->mctx);
	pcre2_jit_stack_free(st->jstack);
	free(st->bpe_out);
	free(st->bpe_scratch);
	free(st->conv);
	free(st->fix);
	free(st->nfc);
	free(st->cache);
	free(st->cache_keys);
	free(st->cache_ids);
	tok_pipe_state_free(st);
	free(st);
	return NULL;
}

int tok_state_new(const struct tok *t, struct tok_state **ret) {
	struct tok_state *st = calloc(1, sizeof(*st));

	if (!st)
		return -ENOMEM;
	st->t = t;
	/* One pair is enough: only the whole match is used, and a pattern
	 * with groups still reports it (rc 0). */
	st->md = pcre2_match_data_create(1, NULL);
	st->mctx = pcre2_match_context_create(NULL);
	/* Backtracking over long whitespace runs (\s+(?!\S)) needs more than
	 * the default 32 KiB JIT stack; it is only touched as used. */
	st->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
	st->cache = calloc(TOK_CACHE_SLOTS, sizeof(*st->cache));
	st->cache_keys = malloc(TOK_CACHE_KEY_BYTES);
	st->cache_ids = malloc(TOK_CACHE_IDS * sizeof(*st->cache_ids));
	if (!st->md || !st->mctx || !st->jstack || !st->cache || !st->cache_keys || !st->cache_ids) {
		tok_state_free(st);
		return -ENOMEM;
	}
	pcre2_jit_stack_assign(st->mctx, NULL, st->jstack);
	*ret = st;
	return 0;
}

void tok_flush(struct tok_state *st) {
	if (st->n_batch > 0 && st->sink_error == 0) {
		int r = st->sink(st->batch, st->n_batch, st->userdata);
		if (r < 0)
			st->sink_error = r;
	}
	st->n_batch = 0;
}

static inline void tok_emit(struct tok_state *st, uint32_t id) {
	if (st->n_batch == TOK_BATCH)
		tok_flush(st);
	st->batch[st->n_batch++] = (int32_t) id;
}

static void tok_cache_put(struct tok_state *st, uint64_t h, const uint8_t *s, size_t n, const uint32_t *ids, size_t m) {
	struct tok_cache_slot *sl;

	if (n > TOK_CACHE_MAX_KEY)
		return;
	/* Full: start over.  Cheap, and text changes topic anyway. */
	if (st->cache_used * 2 >= TOK_CACHE_SLOTS || st->cache_keys_len + n > TOK_CACHE_KEY_BYTES ||
	    st->cache_ids_len + m > TOK_CACHE_IDS) {
		memset(st->cache, 0, TOK_CACHE_SLOTS * sizeof(*st->cache));
		st->cache_used = st->cache_keys_len = st->cache_ids_len = 0;
	}
	h |= 1;
	for (size_t i = h & (TOK_CACHE_SLOTS - 1);; i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
		sl = &st->cache[i];
		if (sl->hash == 0)
			break;
	}
	memcpy(st->cache_keys + st->cache_keys_len, s, n);
	memcpy(st->cache_ids + st->cache_ids_len, ids, m * sizeof(*ids));
	*sl = (struct tok_cache_slot) {
		.hash = h,
		.key_off = (uint32_t) st->cache_keys_len,
		.ids_off = (uint32_t) st->cache_ids_len,
		.key_len = (uint16_t) n,
		.n_ids = (uint16_t) m,
	};
	st->cache_keys_len += n;
	st->cache_ids_len += m;
	st->cache_used++;
}

static const struct tok_cache_slot *tok_cache_get(const struct tok_state *st, uint64_t h, const uint8_t *s, size_t n) {
	h |= 1;
	for (size_t i = h & (TOK_CACHE_SLOTS - 1);; i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
		const struct tok_cache_slot *sl = &st->cache[i];
		if (sl->hash == 0)
			return NULL;
		if (sl->hash == h && sl->key_len == n && memcmp(st->cache_keys + sl->key_off, s, n) == 0)
			return sl;
	}
}

/* One pre-token: a single token if it is one (and merging would keep it
 * whole), else cached or freshly merged ids. */
void tok_piece_id(struct tok_state *st, uint32_t id) {
	tok_emit(st, id);
}

/* Whether the model's pieces may be cut for length: BPE without word affixes
 * (WordPiece answers unk_token for a long word; Unigram is left whole). */
static bool tok_piece_cuttable(const struct tok *t) {
	return !t->model || (t->model == tok_model_bpe_utf8 && !t->bpe_prefix_len && !t->bpe_suffix_len);
}

/* The model's ids of one piece, into st->bpe_out (valid until the next call). */
int tok_model_ids(struct tok_state *st, const uint8_t *s, size_t n, size_t *ret_m) {
	const struct tok *t = st->t;
	if (n > st->bpe_cap) {
		size_t cap = n < 256 ? 256 : n + n / 2;
		uint32_t *o = realloc(st->bpe_out, cap * sizeof(*o));
		if (!o)
			return -ENOMEM;
		st->bpe_out = o;
		void *sc = realloc(st->bpe_scratch, tok_model_scratch_size(t, cap));
		if (!sc)
			return -ENOMEM;
		st->bpe_scratch = sc;
		st->bpe_cap = cap;
	}
	*ret_m = tok_model_encode(t, s, n, st->bpe_out, st->bpe_scratch);
	return 0;
}

/* A piece over TOK_PIECE_MAX bytes: merged TOK_PIECE_MAX bytes at a time,
 * each cut before a character's first byte, so that the scratch stays
 * bounded (a 128 MB word used to take 3 GB). A chunk equal to the one
 * before it (a run of one character) reuses its ids. */
static int tok_piece_long(struct tok_state *st, const uint8_t *s, size_t n) {
	size_t prev = 0, prev_len = 0, m = 0;
	for (size_t at = 0; at < n;) {
		size_t len = n - at > TOK_PIECE_MAX ? TOK_PIECE_MAX : n - at;
		while (at + len < n && len > 1 && (s[at + len] & 0xc0) == 0x80)
			len--;
		if (len != prev_len || memcmp(s + at, s + prev, len) != 0) {
			int r = tok_model_ids(st, s + at, len, &m);
			if (r < 0)
				return r;
		}
		for (size_t i = 0; i < m; i++)
			tok_emit(st, st->bpe_out[i]);
		prev = at;
		prev_len = len;
		at += len;
	}
	return 0;
}

int tok_piece(struct tok_state *st, const uint8_t *s, size_t n) {
	const struct tok *t = st->t;
	const struct tok_cache_slot *c;
	const struct tok_slot *sl;
	struct tok_hot_slot *hs = NULL;
	uint64_t h = 0, k0 = 0, k1 = 0;
	size_t m;

	if (n == 1 && !t->model) {
		tok_emit(st, t->byte_id[s[0]]);
		return 0;
	}
	/* A piece longer than any token and than cache keys: straight to
	 * the model, without hashing it. */
	if (n > TOK_CACHE_MAX_KEY && n > t->max_len)
		goto model;
	h = tok_hash_bytes(s, n);
	if (n <= TOK_HOT_MAX_LEN) {
		k0 = tok_load_head(s, n);
		k1 = n > 8 ? tok_load_head(s + 8, n - 8) : 0;
		hs = &st->hot[(h >> 40) & (TOK_HOT_SLOTS - 1)];
		if (hs->len == n && hs->k0 == k0 && hs->k1 == k1) {
			for (size_t i = 0; i < hs->n_ids; i++)
				tok_emit(st, hs->ids[i]);
			return 0;
		}
	}
	sl = tok_vocab_slot(t, s, n, h);
	if (sl && t->whole_ok[sl->id]) {
		if (hs)
			*hs = (struct tok_hot_slot) { .k0 = k0, .k1 = k1, .len = (uint8_t) n, .n_ids = 1,
						      .ids = { sl->id } };
		tok_emit(st, sl->id);
		return 0;
	}
	c = tok_cache_get(st, h, s, n);
	if (c) {
		for (size_t i = 0; i < c->n_ids; i++)
			tok_emit(st, st->cache_ids[c->ids_off + i]);
		if (hs && c->n_ids <= TOK_HOT_MAX_IDS) {
			*hs = (struct tok_hot_slot) { .k0 = k0, .k1 = k1, .len = (uint8_t) n, .n_ids = (uint8_t) c->n_ids };
			memcpy(hs->ids, st->cache_ids + c->ids_off, c->n_ids * sizeof(*hs->ids));
		}
		return 0;
	}
model:
	if (n > TOK_PIECE_MAX && tok_piece_cuttable(t))
		return tok_piece_long(st, s, n);
	int r = tok_model_ids(st, s, n, &m);
	if (r < 0)
		return r;
	for (size_t i = 0; i < m; i++)
		tok_emit(st, st->bpe_out[i]);
	if (hs && m <= TOK_HOT_MAX_IDS) {
		*hs = (struct tok_hot_slot) { .k0 = k0, .k1 = k1, .len = (uint8_t) n, .n_ids = (uint8_t) m };
		memcpy(hs->ids, st->bpe_out, m * sizeof(*st->bpe_out));
	}
	if (m <= UINT16_MAX)
		tok_cache_put(st, h, s, n, st->bpe_out, m);
	return 0;
}

int tok_match(const struct tok_state *st, const pcre2_code *re, const uint8_t *s, size_t n, size_t pos,
	      uint32_t opts) {
	if (st->t->jit)
		return pcre2_jit_match(re, s, n, pos, opts, st->md, st->mctx);
	return pcre2_match(re, s, n, pos, opts | PCRE2_NO_UTF_CHECK, st->md, st->mctx);
}

static int tok_split(struct tok_state *st, size_t level, const uint8_t *s, size_t n);


static int tok_sub(struct tok_state *st, size_t level, const uint8_t *s, size_t n) {
	if (level < st->t->n_re)
		return tok_split(st, level, s, n);
	return tok_piece(st, s, n);
}

/*
 * Pre-tokenizes s[pos..n) with regex `level` and hands each piece (and, for
 * HF Split's Isolated behaviour, each gap between matches) to the next level
 * (HF Sequence of Splits) or to BPE. Bytes before pos are look-behind context
 * only. Unless final, stops where a match might run into text not yet seen
 * and returns in *ret_keep (when not NULL) where that text must resume.
 */
int tok_split_from(struct tok_state *st, size_t level, const uint8_t *s, size_t n, size_t pos, bool final,
		   size_t *ret_keep) {
	const struct tok *t = st->t;
	uint32_t opts = final ? 0 : PCRE2_PARTIAL_HARD;
	int r;

	const bool cl100k = t->split_cl100k && level == 0 && final;

	while (pos < n) {
		PCRE2_SIZE *ov;
		size_t ms, me;

		if (cl100k) {
			me = tok_match_cl100k(s, n, pos, t->split_digits, t->split_end_rule);
			if (me > pos) {
				r = tok_sub(st, level + 1, s + pos, me - pos);
				if (r < 0)
					return r;
				pos = me;
				continue;
			}
		}
		/* The same offsets of the text with Unicode 16 stand-ins. */
		r = tok_match(st, t->re[level], st->mbase + (s - st->sbase), n, pos, opts);
		if (r == PCRE2_ERROR_NOMATCH || r == PCRE2_ERROR_PARTIAL)
			break;
		if (r < 0)
			return -EIO;
		ov = pcre2_get_ovector_pointer(st->md);
		ms = ov[0];
		me = ov[1];
		if (!final && me >= n)
			break;
		if (t->keep_gaps && ms > pos) {
			r = tok_sub(st, level + 1, s + pos, ms - pos);
			if (r < 0)
				return r;
		}
		if (me == ms) {
			/* Empty match: step one character, as iterators do. */
			pos = ms + 1;
			while (pos < n && (s[pos] & 0xc0) == 0x80)
				pos++;
			if (t->keep_gaps && pos > ms) {
				r = tok_sub(st, level + 1, s + ms, pos - ms);
				if (r < 0)
					return r;
			}
			continue;
		}
		r = tok_sub(st, level + 1, s + ms, me - ms);
		if (r < 0)
			return r;
		pos = me;
	}
	if (final && t->keep_gaps && pos < n) {
		r = tok_sub(st, level + 1, s + pos, n - pos);
		if (r < 0)
			return r;
		pos = n;
	}
	if (ret_keep)
		*ret_keep = pos;
	return 0;
}

static int tok_split(struct tok_state *st, size_t level, const uint8_t *s, size_t n) {
	return tok_split_from(st, level, s, n, 0, true, NULL);
}

static int tok_reserve(uint8_t **buf, size_t *cap, size_t need) {
	if (need <= *cap)
		return 0;
	size_t c = need + need / 2;
	uint8_t *b = realloc(*buf, c);
	if (!b)
		return -ENOMEM;
	*buf = b;
	*cap = c;
	return 0;
}

/* Where to end a window that should reach about src+want: before an ASCII
 * byte.  Repairing UTF-8 never joins an ASCII byte to its neighbours, and
 * NFC never composes anything with a following ASCII character. */
static size_t tok_window_end(const uint8_t *s, size_t n, size_t want) {
	if (want >= n)
		return n;
	for (size_t i = want; i < n; i++)
		if (s[i] < 0x80)
			return i;
	return n;
}

/* Pre-tokenizes the current window, conv[ctx..conv_len), with the first regex. */
static int tok_split_window(struct tok_state *st, size_t ctx, bool final, size_t *ret_keep) {
	st->sbase = st->conv;
	st->mbase = tok_uni_map(&st->map_buf, st->conv, st->conv_len);
	if (!st->mbase)
		return -ENOMEM;
	return tok_split_from(st, 0, st->conv, st->conv_len, ctx, final, ret_keep);
}

/* Appends the rewritten form of src[0..n) to *buf (*len bytes used of
 * *cap): UTF-8 repaired, then NFC if the model wants it. */
int tok_convert_to(struct tok_state *st, const uint8_t *src, size_t n, size_t *n_replaced, uint8_t **buf,
		   size_t *len_used, size_t *cap) {
	const uint8_t *p = src;
	size_t len = n, rep = 0;
	int r;

	if (tok_utf8_valid_prefix(src, n) != n) {
		r = tok_reserve(&st->fix, &st->fix_cap, 3 * n + 1);
		if (r < 0)
			return r;
		len = tok_utf8_replace(src, n, st->fix, &rep);
		*n_replaced += rep;
		p = st->fix;
	}
	if (st->t->nfc) {
		/* Nothing below U+0300 (lead byte < 0xCC) changes under NFC
		 * or composes with what precedes it. */
		bool plain = true;
		for (size_t i = 0; i < len; i++)
			if (p[i] >= 0xcc) {
				plain = false;
				break;
			}
		if (!plain) {
			size_t out_len = st->nfc_cap;
			uint8_t *o = u8_normalize(UNINORM_NFC, p, len, st->nfc, &out_len);
			if (!o)
				return -errno;
			if (o != st->nfc) {
				free(st->nfc);
				st->nfc = o;
				st->nfc_cap = out_len;
			}
			p = st->nfc;
			len = out_len;
		}
	}
	r = tok_reserve(buf, cap, *len_used + len);
	if (r < 0)
		return r;
	memcpy(*buf + *len_used, p, len);
	*len_used += len;
	return 0;
}

static int tok_convert(struct tok_state *st, const uint8_t *src, size_t n, size_t *n_replaced) {
	return tok_convert_to(st, src, n, n_replaced, &st->conv, &st->conv_len, &st->conv_cap);
}

static int tok_ordinary_windowed(struct tok_state *st, const uint8_t *s, size_t n, size_t *n_replaced) {
	size_t src = 0, ctx = 0;
	int r;

	st->conv_len = 0;
	for (;;) {
		size_t end = tok_window_end(s, n, src + TOK_WINDOW), keep, back;
		bool final = end == n;

		r = tok_convert(st, s + src, end - src, n_replaced);
		if (r < 0)
			return r;
		src = end;
		r = tok_split_window(st, ctx, final, &keep);
		if (r < 0)
			return r;
		if (final)
			return 0;
		/* Keep the unfinished tail, and enough characters before it
		 * for the pattern's look-behind (at least one, so that ^ and
		 * \b see that the text does not start there). */
		back = keep;
		for (uint32_t k = 0; k <= st->t->max_lookbehind && back > 0; k++) {
			back--;
			while (back > 0 && (st->conv[back] & 0xc0) == 0x80)
				back--;
		}
		memmove(st->conv, st->conv + back, st->conv_len - back);
		st->conv_len -= back;
		ctx = keep - back;
	}
}

/* Whether any byte of s[0..n) is >= min. */
static bool memchr_ge(const uint8_t *s, size_t n, uint8_t min) {
	for (size_t i = 0; i < n; i++)
		if (s[i] >= min)
			return true;
	return false;
}

static int tok_ordinary(struct tok_state *st, const uint8_t *s, size_t n, size_t *n_replaced) {
	if (n == 0)
		return 0;
	/* Text below U+0300 (no byte >= 0xCC) is its own NFC: in place too. */
	if ((!st->t->nfc || !memchr_ge(s, n, 0xcc)) && (st->utf8_valid || tok_utf8_valid_prefix(s, n) == n)) {
		st->sbase = s;
		st->mbase = tok_uni_map(&st->map_buf, s, n);
		if (!st->mbase)
			return -ENOMEM;
		return tok_split(st, 0, s, n);
	}
	return tok_ordinary_windowed(st, s, n, n_replaced);
}

static int tok_added_id(const struct tok *t, const uint8_t *s, size_t n) {
	for (size_t i = 0; i < t->n_added; i++)
		if (t->added[i].len == n && memcmp(t->added[i].text, s, n) == 0)
			return t->added[i].id;
	return -ENOENT;
}

int tok_encode_stream(const struct tok *t, struct tok_state *st, const char *text, size_t len,
		      unsigned flags, tok_sink_fn sink, void *userdata, size_t *ret_n_replaced) {
	const uint8_t *s = (const uint8_t *) text;
	const pcre2_code *sre = (flags & TOK_ENCODE_SPECIALS) ? t->added_re : t->plain_re;
	size_t pos = 0, n_replaced = 0;
	int r = 0;

	if (!st || st->t != t)
		return -EINVAL;
	st->sink = sink;
	st->userdata = userdata;
	st->sink_error = 0;
	st->n_batch = 0;
	st->utf8_valid = flags & TOK_ENCODE_UTF8_VALID;

	if (t->general) {
		r = tok_encode_general(st, s, len, flags, &n_replaced);
		len = pos = 0;
	}
	while (r == 0 && sre && pos < len && st->sink_error == 0) {
		PCRE2_SIZE *ov;
		int k = tok_match(st, sre, s, len, pos, 0);

		if (k == PCRE2_ERROR_NOMATCH)
			break;
		if (k < 0) {
			r = -EIO;
			break;
		}
		ov = pcre2_get_ovector_pointer(st->md);
		size_t ms = ov[0], me = ov[1];
		r = tok_ordinary(st, s + pos, ms - pos, &n_replaced);
		if (r < 0)
			break;
		tok_emit(st, (uint32_t) tok_added_id(t, s + ms, me - ms));
		pos = me;
	}
	if (r == 0 && st->sink_error == 0)
		r = tok_ordinary(st, s + pos, len - pos, &n_replaced);
	if (r == 0)
		tok_flush(st);
	if (r == 0 && st->sink_error < 0)
		r = st->sink_error;
	if (r < 0)
		return r;
	if (ret_n_replaced)
		*ret_n_replaced = n_replaced;
	return 0;
}

int tok_ids_reserve(struct tok_ids *v, size_t n) {
	if (v->n + n > v->cap) {
		size_t cap = v->cap ? v->cap : 1024;
		while (cap < v->n + n)
			cap *= 2;
		int32_t *p = realloc(v->ids, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		v->ids = p;
		v->cap = cap;
	}
	return 0;
}

static int tok_append(const int32_t *ids, size_t n, void *userdata) {
	struct tok_ids *v = userdata;

	if (tok_ids_reserve(v, n) < 0)
		return -ENOMEM;
	memcpy(v->ids + v->n, ids, n * sizeof(*ids));
	v->n += n;
	return 0;
}

int tok_encode(const struct tok *t, struct tok_state *st, const char *text, size_t len,
	       unsigned flags, struct tok_ids *out, size_t *ret_n_replaced) {
	return tok_encode_stream(t, st, text, len, flags, tok_append, out, ret_n_replaced);
}
