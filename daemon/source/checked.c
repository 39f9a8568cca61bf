/* SPDX-License-Identifier: MIT */
/*
 * Checked reads (source.h, source_set_sums): every read of a source with
 * block checksums covers whole blocks and is verified when it completes
 * (docs/checksums.md). Split from source.c, which calls these hooks from
 * source_submit() and source_complete().
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/io/sums.h"
#include "daemon/source/source-internal.h"
#include "proto/macro.h"

/* ---- checksummed sources (daemon/io/sums.h) ------------------------------ */

int source_set_sums(struct source *s, struct sums *sums)
{
	if (sums->data_size > s->id.size)
		return -EINVAL;
	/* bench/checksum's peer: the same run without checking reads (docs/checksums.md); never for serving. */
	const char *off = getenv("FEEDD_BENCH_NO_VERIFY");
	if (off && strcmp(off, "1") == 0) {
		sums_free(sums);
		return 0;
	}
	sums_free(s->sums);
	s->sums = sums;
	return 0;
}

void source_set_cache_entry(struct source *s)
{
	s->cache_entry = true;
}

const struct sums *source_sums(const struct source *s)
{
	return s->sums;
}

const char *source_reader_error(const struct source_reader *r)
{
	return r->why;
}

const char *source_reader_stale(const struct source_reader *r)
{
	return r->stale[0] ? r->stale : NULL;
}

/*
 * The checks wrap whatever carries the reads: verify_plan() hands the
 * backend a copy of the caller's reads in which every read of a checked
 * source covers whole blocks (into a bounce buffer when that is more than the
 * caller's bytes), and verify_finish() checks them once the backend is done
 * and copies the caller's bytes out.
 */

static uint8_t *bounce_new(struct source_reader *r, size_t size)
{
	if (r->n_bounce == r->cap_bounce) {
		size_t cap = MAX(r->cap_bounce * 2, (size_t)4);
		struct bounce *v = realloc(r->bounce, cap * sizeof(*v));
		if (!v)
			return NULL;
		r->bounce = v;
		r->cap_bounce = cap;
	}
	struct bounce b = { 0 };
	if (r->spare.p && r->spare.size >= size) {
		b = r->spare;
		r->spare = (struct bounce){ 0 };
	} else if (!(b.p = malloc(size)))
		return NULL;
	else
		b.size = size;
	r->bounce[r->n_bounce++] = b;
	return b.p;
}

/* Frees the bounce buffers of a completed batch but the largest, kept for the next. */
void source_verify_clear(struct source_reader *r)
{
	for (size_t i = 0; i < r->n_bounce; i++) {
		struct bounce b = r->bounce[i];
		if (b.size > r->spare.size) {
			struct bounce t = r->spare;
			r->spare = b;
			b = t;
		}
		free(b.p);
	}
	r->n_bounce = 0;
	r->n_vr = 0;
	r->n_sub = 0;
}

/*
 * Plans reads[0..n) (submitted at r->n_sub on): *ret is NULL when none is of
 * a checked source, else a copy to submit instead (the reader's, valid until
 * the next submission).
 */
int source_verify_plan(struct source_reader *r, const struct source_read *reads, size_t n, struct source_read **ret)
{
	size_t k = 0, bytes = 0;
	*ret = NULL;
	for (size_t i = 0; i < n; i++)
		k += reads[i].src->sums && reads[i].len;
	if (!k)
		return 0;
	if (r->n_vr + k > r->cap_vr) {
		size_t cap = MAX(r->n_vr + k, MAX(r->cap_vr * 2, (size_t)16));
		struct verify_rec *v = realloc(r->vr, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		r->vr = v;
		r->cap_vr = cap;
	}
	if (n > r->wide_cap) {
		struct source_read *g = realloc(r->wide, n * sizeof(*g));
		if (!g)
			return -ENOMEM;
		r->wide = g;
		r->wide_cap = n;
	}
	struct source_read *w = r->wide;
	memcpy(w, reads, n * sizeof(*w));
	struct verify_rec *v = r->vr + r->n_vr;
	for (size_t i = 0, j = 0; i < n; i++) {
		const struct sums *sums = reads[i].src->sums;
		if (!sums || !reads[i].len)
			continue;
		struct verify_rec *x = &v[j++];
		*x = (struct verify_rec){ .req = r->n_sub + i, .src = reads[i].src, .offset = reads[i].offset,
					  .len = reads[i].len, .dst = reads[i].dst };
		if (reads[i].offset > sums->data_size || reads[i].len > sums->data_size - reads[i].offset)
			continue; /* past what the sums cover: refused at completion */
		uint64_t lo, hi;
		sums_cover(sums, reads[i].offset, reads[i].len, &lo, &hi);
		x->lo = lo;
		x->span = (size_t)(hi - lo);
		if (lo != reads[i].offset || hi != reads[i].offset + reads[i].len)
			bytes += x->span; /* else whole blocks: checked where they land */
	}
	uint8_t *b = bytes ? bounce_new(r, bytes) : NULL;
	if (bytes && !b)
		return -ENOMEM;
	for (size_t i = 0, j = 0; i < n; i++) {
		if (!reads[i].src->sums || !reads[i].len)
			continue;
		struct verify_rec *x = &v[j++];
		if (!x->span || (x->lo == x->offset && x->span == x->len))
			continue;
		x->bounce = b;
		w[i] = (struct source_read){ .src = reads[i].src, .offset = x->lo, .len = x->span, .dst = b };
		b += x->span;
	}
	r->n_vr += k;
	*ret = w;
	return 0;
}

/* Checks every block read and copies the caller's bytes out of the bounce buffers. */
int source_verify_finish(struct source_reader *r, size_t *ret_failed)
{
	for (size_t i = 0; i < r->n_vr; i++) {
		const struct verify_rec *v = &r->vr[i];
		uint64_t bad = v->lo;
		const uint8_t *p = v->bounce ? v->bounce : v->dst;
		int e = v->span ? sums_verify(v->src->sums, v->lo, p, v->span, &bad) : -EUCLEAN;
		if (e < 0) {
			if (v->span)
				snprintf(r->why, sizeof(r->why), "%s: block at byte %" PRIu64 " (%u bytes) does not match its checksum: the file is damaged or changed",
					 v->src->name, bad, v->src->sums->block);
			else
				snprintf(r->why, sizeof(r->why), "%s: read at byte %" PRIu64 " is past the %" PRIu64 " bytes its checksums cover",
					 v->src->name, v->offset, v->src->sums->data_size);
			if (ret_failed)
				*ret_failed = v->req;
			return -EUCLEAN;
		}
		if (v->bounce)
			memcpy(v->dst, p + (v->offset - v->lo), v->len);
	}
	return 0;
}

