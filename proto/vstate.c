/* SPDX-License-Identifier: MIT */
/* Elastic state text: encoding with a check value, parsing, merging the ranks' states. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/macro.h"
#include "proto/vstate.h"

/* The contract's check: low 32 bits of mix(FNV1a64(body)) (docs/sample-order.md, section 7.1). */
static uint32_t check_of(const char *s, size_t n)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * UINT64_C(0x100000001b3);
	h ^= h >> 30;
	h *= UINT64_C(0xBF58476D1CE4E5B9);
	h ^= h >> 27;
	h *= UINT64_C(0x94D049BB133111EB);
	h ^= h >> 31;
	return (uint32_t)h;
}

void vstate_clear(struct vstate *st)
{
	free(st->s);
	*st = (struct vstate){ 0 };
}

int vstate_is(const char *text)
{
	return text && strncmp(text, "fv1-", 4) == 0;
}

struct buf {
	char *p;
	size_t n, cap;
	bool oom;
};

/* Appends "-" and v in lower-case hex (`width` digits at least). A state has thousands of fields: no printf. */
static void put(struct buf *b, unsigned width, uint64_t v)
{
	if (b->oom)
		return;
	if (b->cap - b->n < 24) {
		size_t cap = MAX(b->cap * 2, (size_t)256);
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	char tmp[16];
	unsigned n = 0;
	do {
		tmp[n++] = "0123456789abcdef"[v & 15];
		v >>= 4;
	} while (v);
	while (n < width)
		tmp[n++] = '0';
	char *o = b->p + b->n;
	*o++ = '-';
	while (n)
		*o++ = tmp[--n];
	*o = 0;
	b->n = (size_t)(o - b->p);
}

/* "-" and v in hex (at least `width` digits) at *o, advancing it; false past end. */
static bool hex_at(char **o, const char *end, unsigned width, uint64_t v)
{
	char tmp[16];
	unsigned n = 0;
	do {
		tmp[n++] = "0123456789abcdef"[v & 15];
		v >>= 4;
	} while (v);
	while (n < width)
		tmp[n++] = '0';
	if (end - *o < (ptrdiff_t)n + 2)
		return false;
	*(*o)++ = '-';
	while (n)
		*(*o)++ = tmp[--n];
	**o = 0;
	return true;
}

int vstate_format_head(const struct vstate *st, char *buf, size_t cap)
{
	char *o = buf + 3, *end = buf + cap;
	if (cap < 4)
		return -ENOBUFS;
	memcpy(buf, "fv1", 4);
	bool ok = hex_at(&o, end, 16, st->fingerprint) && hex_at(&o, end, 0, st->vranks) &&
		  hex_at(&o, end, 0, st->world) && hex_at(&o, end, 0, st->rank) && hex_at(&o, end, 0, st->batch) &&
		  hex_at(&o, end, 0, st->n);
	return ok ? (int)(o - buf) : -ENOBUFS;
}

int vstate_format_entry(const struct vstate_stream *e, char *buf, size_t cap)
{
	char *o = buf, *end = buf + cap;
	if (e->n_sources > VSTATE_MAX_SOURCES)
		return -EINVAL;
	bool ok = hex_at(&o, end, 0, e->v) && hex_at(&o, end, 0, e->n_sources);
	for (unsigned k = 0; ok && k < vstate_fields(e->n_sources); k++)
		ok = hex_at(&o, end, 0, e->f[k]);
	return ok ? (int)(o - buf) : -ENOBUFS;
}

int vstate_format_kw(const struct vstate_stream *e, char *buf, size_t cap)
{
	char *o = buf, *end = buf + cap;
	if (e->n_sources > VSTATE_MAX_SOURCES || cap < 1)
		return -EINVAL;
	*o = 0;
	bool ok = true;
	for (unsigned k = 0; ok && e->has_kw && k < vstate_kws(e->n_sources); k++)
		ok = hex_at(&o, end, 0, e->kw[k]);
	return ok ? (int)(o - buf) : -ENOBUFS;
}

/* Whether the state carries the <kw> list: every entry has its k_w (all or nothing). */
static bool all_kw(const struct vstate *st)
{
	for (size_t i = 0; i < st->n; i++)
		if (!st->s[i].has_kw)
			return false;
	return st->n > 0;
}

int vstate_format_check(char *text, size_t n, size_t cap)
{
	char *o = text + n;
	return hex_at(&o, text + cap, 8, check_of(text, n)) ? (int)(o - text) : -ENOBUFS;
}

int vstate_format(const struct vstate *st, char **ret)
{
	struct buf b = { 0 };
	for (size_t i = 1; i < st->n; i++)
		if (st->s[i].v <= st->s[i - 1].v)
			return -EINVAL;
	put(&b, 0, 0);
	memcpy(b.p, "fv1", 3); /* "fv1" over the "-0" just written */
	b.n = 3;
	put(&b, 16, st->fingerprint);
	put(&b, 0, st->vranks);
	put(&b, 0, st->world);
	put(&b, 0, st->rank);
	put(&b, 0, st->batch);
	put(&b, 0, st->n);
	for (size_t i = 0; i < st->n; i++) {
		const struct vstate_stream *e = &st->s[i];
		if (e->n_sources > VSTATE_MAX_SOURCES) {
			free(b.p);
			return -EINVAL;
		}
		put(&b, 0, e->v);
		put(&b, 0, e->n_sources);
		for (unsigned k = 0; k < vstate_fields(e->n_sources); k++)
			put(&b, 0, e->f[k]);
	}
	for (size_t i = 0; all_kw(st) && i < st->n; i++)
		for (unsigned k = 0; k < vstate_kws(st->s[i].n_sources); k++)
			put(&b, 0, st->s[i].kw[k]);
	if (!b.oom)
		put(&b, 8, check_of(b.p, b.n));
	if (b.oom) {
		free(b.p);
		return -ENOMEM;
	}
	*ret = b.p;
	return (int)MIN(b.n, (size_t)INT32_MAX);
}

int vstate_hex_field(const char **p, uint64_t *ret)
{
	const char *s = *p;
	if (*s != '-')
		return -EINVAL;
	s++;
	uint64_t v = 0;
	int digits = 0;
	for (; (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'); s++, digits++) {
		if (digits == 16)
			return -EINVAL;
		v = v << 4 | (uint64_t)(*s <= '9' ? *s - '0' : *s - 'a' + 10);
	}
	if (digits == 0)
		return -EINVAL;
	*p = s;
	*ret = v;
	return 0;
}

int vstate_parse(const char *text, struct vstate *ret)
{
	if (!vstate_is(text))
		return -EINVAL;
	const char *p = text + 3, *start = p;
	uint64_t h[6];
	for (int i = 0; i < 6; i++)
		if (vstate_hex_field(&p, &h[i]) < 0)
			return -EINVAL;
	if (strspn(start + 1, "0123456789abcdef") != 16)
		return -EINVAL;
	if (h[1] == 0 || h[1] > VSTATE_MAX_VRANKS || h[2] > h[1] || (h[2] ? h[3] >= h[2] : h[3] != 0) ||
	    h[5] > h[1])
		return -EINVAL;
	/* Each entry takes at least 14 characters ("-v-0" and 5 one-digit fields): no allocation a text cannot fill. */
	if (h[5] > strlen(p) / 14)
		return -EINVAL;
	struct vstate st = { .fingerprint = h[0], .vranks = (uint32_t)h[1], .world = (uint32_t)h[2],
			     .rank = (uint32_t)h[3], .batch = h[4], .n = (size_t)h[5] };
	st.s = calloc(MAX(st.n, (size_t)1), sizeof(*st.s));
	if (!st.s)
		return -ENOMEM;
	for (size_t i = 0; i < st.n; i++) {
		struct vstate_stream *e = &st.s[i];
		uint64_t v, ns;
		if (vstate_hex_field(&p, &v) < 0 || vstate_hex_field(&p, &ns) < 0 || v >= st.vranks || ns > VSTATE_MAX_SOURCES ||
		    (i > 0 && v <= st.s[i - 1].v) || (st.world && v % st.world != st.rank))
			goto bad;
		e->v = (uint32_t)v;
		e->n_sources = (uint32_t)ns;
		for (unsigned k = 0; k < vstate_fields(e->n_sources); k++)
			if (vstate_hex_field(&p, &e->f[k]) < 0)
				goto bad;
	}
	/* The <kw> list, when a field follows that is not the last (the check). */
	const char *q = p;
	uint64_t kw;
	if (st.n > 0 && vstate_hex_field(&q, &kw) == 0 && *q == '-') {
		for (size_t i = 0; i < st.n; i++) {
			struct vstate_stream *e = &st.s[i];
			e->has_kw = true;
			for (unsigned k = 0; k < vstate_kws(e->n_sources); k++)
				if (vstate_hex_field(&p, &e->kw[k]) < 0)
					goto bad;
		}
	}
	size_t body = (size_t)(p - text);
	uint64_t check;
	if (vstate_hex_field(&p, &check) < 0 || *p != 0 || (size_t)(p - text) - body != 9 || check != check_of(text, body))
		goto bad;
	*ret = st;
	return 0;
bad:
	vstate_clear(&st);
	return -EINVAL;
}

static int by_v(const void *a, const void *b)
{
	const struct vstate_stream *x = a, *y = b;
	return (x->v > y->v) - (x->v < y->v);
}

int vstate_merge(const struct vstate *states, size_t n, struct vstate *ret, char *err, size_t errlen)
{
	if (n == 0) {
		snprintf(err, errlen, "no states to merge");
		return -EINVAL;
	}
	const struct vstate *a = &states[0];
	if (n == 1 && a->world == 0) {
		struct vstate g = *a;
		g.s = malloc(MAX(a->n, (size_t)1) * sizeof(*g.s));
		if (!g.s)
			return -ENOMEM;
		memcpy(g.s, a->s, a->n * sizeof(*g.s));
		*ret = g;
		return 0;
	}
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		const struct vstate *b = &states[i];
		if (b->fingerprint != a->fingerprint || b->vranks != a->vranks) {
			snprintf(err, errlen, "state %zu is of another feed or version (fingerprint %016" PRIx64 ", V %u) than state 0 (%016" PRIx64 ", V %u)",
				 i, b->fingerprint, b->vranks, a->fingerprint, a->vranks);
			return -EINVAL;
		}
		if (b->world == 0) {
			snprintf(err, errlen, "state %zu is a merged (global) state already: merge the states of one world's ranks", i);
			return -EINVAL;
		}
		if (b->world != a->world) {
			snprintf(err, errlen, "state %zu is of world %u, state 0 of world %u", i, b->world, a->world);
			return -EINVAL;
		}
		total += b->n;
	}
	if (n != a->world) {
		snprintf(err, errlen, "%zu states for a world of %u ranks: every rank's state is needed, each once", n, a->world);
		return -EINVAL;
	}
	_cleanup_free_ uint8_t *seen = calloc(a->world, 1);
	struct vstate g = { .fingerprint = a->fingerprint, .vranks = a->vranks };
	g.s = malloc(MAX(total, (size_t)1) * sizeof(*g.s));
	if (!seen || !g.s) {
		free(g.s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		const struct vstate *b = &states[i];
		if (seen[b->rank]++) {
			free(g.s);
			snprintf(err, errlen, "rank %u's state is given twice", b->rank);
			return -EINVAL;
		}
		g.batch = MAX(g.batch, b->batch);
		memcpy(g.s + g.n, b->s, b->n * sizeof(*g.s));
		g.n += b->n;
	}
	/* Ranks serve disjoint streams (v mod world = rank, checked when parsed): no duplicates. */
	qsort(g.s, g.n, sizeof(*g.s), by_v);
	*ret = g;
	return 0;
}
