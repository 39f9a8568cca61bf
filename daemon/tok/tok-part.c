/* SPDX-License-Identifier: MIT */
/*
 * One text encoded as it arrives in parts (tok.h, tok_part_*): a huge
 * document read and decoded a segment at a time gets the ids that
 * tok_encode_stream() gives the whole text, holding only a bounded tail.
 *
 * Where a part may end (the cuts that keep the ids equal):
 *   - conversion (UTF-8 repair, NFC): text is converted up to the last
 *     ASCII byte received, as tok.c's windows are (neither repair nor NFC
 *     joins anything across a cut before an ASCII byte); without NFC, a run
 *     of 64 KiB with no ASCII byte is cut before a character's first byte;
 *   - added tokens: matched with PCRE2_PARTIAL_HARD, so one that may run
 *     past the text received is waited for;
 *   - pre-tokens: the regex runs with PCRE2_PARTIAL_HARD from the first byte
 *     not yet encoded, with the pattern's look-behind kept before it
 *     (tok_split_from()); a pre-token that may run past the text received
 *     is carried over;
 *   - a pre-token longer than TOK_PIECE_MAX (one regex; a match, not a kept gap):
 *     merged in the 256 KiB chunks tok_piece() cuts it into anyway
 *     (docs/tokenizers.md, "Very long words"), each as soon as the text
 *     received shows that the piece runs past the chunk's end. The piece's
 *     end is found by matching the regex again from the chunk's cut: the
 *     rest of a run of letters, digits, spaces or punctuation is such a run
 *     again under every preset's pattern.
 * So the tail held is at most a pre-token of TOK_PIECE_MAX plus a part.
 * The general pipeline (tok-pipe.h) normalizes the text between two added
 * tokens whole: it is not streamed (tok_part_supported() says false).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tok-pipe.h"
#include "tok-unicode.h"
#include "tok.h"

/* Without NFC, a run with no ASCII byte is converted in cuts of this much. */
#define TOK_PART_RUN (64u * 1024u)
/* A pre-token that reaches the end of the text received ends at most this
 * many bytes before that end (one character: `\s+(?!\S)`). */
#define TOK_PART_SLACK 4u

struct tok_part {
	const struct tok *t;
	unsigned flags;
	uint8_t *raw;           /* received, not yet converted */
	size_t raw_n, raw_cap;
	uint8_t *buf;           /* converted: [0, pos) encoded (look-behind), [pos, n) not yet */
	size_t n, cap;
	size_t seg;             /* where the ordinary text being split starts (after an added token) */
	size_t pos;
	bool in_long;           /* pos is a cut inside a pre-token longer than TOK_PIECE_MAX */
	uint8_t *prev;          /* the last long chunk merged and its ids (a run of one character repeats it) */
	size_t prev_len, prev_cap;
	uint32_t *prev_ids;
	size_t prev_m, prev_ids_cap;
	size_t replaced;
	bool done;
};

bool tok_part_supported(const struct tok *t)
{
	return t && !t->general;
}

int tok_part_new(const struct tok *t, unsigned flags, struct tok_part **ret)
{
	if (!tok_part_supported(t))
		return -EOPNOTSUPP;
	struct tok_part *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->t = t;
	p->flags = flags;
	*ret = p;
	return 0;
}

struct tok_part *tok_part_free(struct tok_part *p)
{
	if (p) {
		free(p->raw);
		free(p->buf);
		free(p->prev);
		free(p->prev_ids);
		free(p);
	}
	return NULL;
}

size_t tok_part_replaced(const struct tok_part *p)
{
	return p->replaced;
}

size_t tok_part_held(const struct tok_part *p)
{
	return p->raw_cap + p->cap + p->prev_cap + p->prev_ids_cap * sizeof(uint32_t);
}

static int grow(void **b, size_t *cap, size_t want, size_t size)
{
	if (want <= *cap)
		return 0;
	size_t c = want + want / 2 + 64;
	void *q = realloc(*b, c * size);
	if (!q)
		return -ENOMEM;
	*b = q;
	*cap = c;
	return 0;
}

static inline bool is_cont(uint8_t b)
{
	return (b & 0xc0) == 0x80;
}

/* One chunk of a long pre-token, as tok_piece_long() merges it. */
static int long_chunk(struct tok_part *p, struct tok_state *st, const uint8_t *s, size_t len)
{
	if (len != p->prev_len || memcmp(s, p->prev, len) != 0) {
		size_t m;
		int r = tok_model_ids(st, s, len, &m);
		if (r == 0)
			r = grow((void **)&p->prev, &p->prev_cap, len, 1);
		if (r == 0)
			r = grow((void **)&p->prev_ids, &p->prev_ids_cap, m, sizeof(uint32_t));
		if (r < 0)
			return r;
		memcpy(p->prev, s, len);
		memcpy(p->prev_ids, st->bpe_out, m * sizeof(uint32_t));
		p->prev_len = len;
		p->prev_m = m;
	}
	for (size_t i = 0; i < p->prev_m; i++)
		tok_piece_id(st, p->prev_ids[i]);
	return 0;
}

/*
 * At a cut of a long pre-token: merges the chunks the text up to `end`
 * decides; leaves in_long when the pre-token ends before `end` (or final).
 */
static int long_run(struct tok_part *p, struct tok_state *st, size_t end, bool final)
{
	const struct tok *t = p->t;
	size_t me = p->pos;
	/* The match that starts at pos (JIT ignores PCRE2_ANCHORED: a later one is no match here). */
	int k = tok_match(st, t->re[0], st->mbase + p->seg, end - p->seg, p->pos - p->seg, PCRE2_ANCHORED);
	if (k >= 0 && pcre2_get_ovector_pointer(st->md)[0] == p->pos - p->seg)
		me = p->seg + pcre2_get_ovector_pointer(st->md)[1];
	else if (k < 0 && k != PCRE2_ERROR_NOMATCH)
		return -EIO;
	const bool known = final || me + TOK_PART_SLACK < end;
	const size_t lim = known ? me : me > TOK_PART_SLACK ? me - TOK_PART_SLACK : 0;
	while (p->pos < lim) {
		size_t at = p->pos, len;
		if (known) {
			len = lim - at > TOK_PIECE_MAX ? TOK_PIECE_MAX : lim - at;
			while (at + len < lim && len > 1 && is_cont(p->buf[at + len]))
				len--;
		} else {
			if (lim - at <= TOK_PIECE_MAX)
				break;
			len = TOK_PIECE_MAX;
			while (len > 1 && is_cont(p->buf[at + len]))
				len--;
		}
		int r = long_chunk(p, st, p->buf + at, len);
		if (r < 0)
			return r;
		p->pos += len;
	}
	if (known)
		p->in_long = false;
	return 0;
}

/* Encodes what buf[pos, n) decides (all of it when final). */
static int part_run(struct tok_part *p, struct tok_state *st, bool final)
{
	const struct tok *t = p->t;
	const pcre2_code *sre = (p->flags & TOK_ENCODE_SPECIALS) ? t->added_re : t->plain_re;
	const bool long_ok = t->n_re == 1;
	int r;

	if (p->n == 0)
		return 0;
	st->sbase = p->buf;
	st->mbase = tok_uni_map(&st->map_buf, p->buf, p->n);
	if (!st->mbase)
		return -ENOMEM;
	for (;;) {
		size_t end = p->n, ame = 0;
		bool seg_final = final, added = false;
		if (sre && p->pos < p->n) {
			int k = tok_match(st, sre, p->buf, p->n, p->pos, final ? 0 : PCRE2_PARTIAL_HARD);
			if (k >= 0 || k == PCRE2_ERROR_PARTIAL) {
				const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
				end = ov[0];
				added = k >= 0 && (final || ov[1] < p->n);
				ame = ov[1];
				seg_final = added;
			} else if (k != PCRE2_ERROR_NOMATCH) {
				return -EIO;
			}
		}
		if (p->in_long) {
			r = long_run(p, st, end, seg_final);
			if (r < 0)
				return r;
		}
		if (!p->in_long && p->pos < end) {
			size_t keep;
			r = tok_split_from(st, 0, p->buf + p->seg, end - p->seg, p->pos - p->seg, seg_final, &keep);
			if (r < 0)
				return r;
			p->pos = p->seg + keep;
			if (!seg_final && long_ok && end - p->pos > TOK_PIECE_MAX + TOK_PART_SLACK) {
				p->in_long = true;
				r = long_run(p, st, end, false);
				if (r < 0)
					return r;
			}
		}
		if (!added || p->in_long || p->pos != end)
			return 0;
		int id = -ENOENT;
		for (size_t i = 0; i < t->n_added && id < 0; i++)
			if (t->added[i].len == ame - end && memcmp(t->added[i].text, p->buf + end, ame - end) == 0)
				id = t->added[i].id;
		tok_piece_id(st, (uint32_t)id);
		p->pos = p->seg = ame;
	}
}

/* Drops the encoded text but the look-behind the pattern needs. */
static void part_compact(struct tok_part *p)
{
	size_t back = p->pos;
	for (uint32_t k = 0; k <= p->t->max_lookbehind && back > 0; k++) {
		back--;
		while (back > 0 && is_cont(p->buf[back]))
			back--;
	}
	const size_t d = back > p->seg ? back : p->seg;
	if (d == 0)
		return;
	memmove(p->buf, p->buf + d, p->n - d);
	p->n -= d;
	p->pos -= d;
	p->seg = 0; /* d >= seg: the run's start is gone, the look-behind kept says so to ^ and \b */
}

/* How much of raw[0, n) may be converted now (see the top of the file). */
static size_t convert_cut(const struct tok *t, const uint8_t *raw, size_t n)
{
	for (size_t i = n; i > 0; i--)
		if (raw[i - 1] < 0x80)
			return i - 1;
	if (t->nfc || n < TOK_PART_RUN)
		return 0;
	for (size_t i = n; i > 0; i--)
		if (!is_cont(raw[i - 1]))
			return i - 1;
	return 0;
}

int tok_part_feed(struct tok_part *p, struct tok_state *st, const char *text, size_t len, bool final,
		  tok_sink_fn sink, void *userdata)
{
	if (!st || st->t != p->t || p->done)
		return -EINVAL;
	st->sink = sink;
	st->userdata = userdata;
	st->sink_error = 0;
	st->n_batch = 0;
	st->utf8_valid = false;
	int r = grow((void **)&p->raw, &p->raw_cap, p->raw_n + len, 1);
	if (r < 0)
		return r;
	if (len)
		memcpy(p->raw + p->raw_n, text, len);
	p->raw_n += len;
	const size_t cut = final ? p->raw_n : convert_cut(p->t, p->raw, p->raw_n);
	if (cut > 0) {
		r = tok_convert_to(st, p->raw, cut, &p->replaced, &p->buf, &p->n, &p->cap);
		if (r < 0)
			return r;
		memmove(p->raw, p->raw + cut, p->raw_n - cut);
		p->raw_n -= cut;
	}
	r = part_run(p, st, final);
	if (r == 0)
		tok_flush(st);
	if (r == 0 && st->sink_error < 0)
		r = st->sink_error;
	if (r < 0)
		return r;
	if (final)
		p->done = true;
	else
		part_compact(p);
	return 0;
}
