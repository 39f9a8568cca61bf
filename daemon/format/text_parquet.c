/* SPDX-License-Identifier: MIT */
/*
 * A Parquet shard's decoded copy (text.h, text_parquet_build): the text
 * column of every row group, in file order, written back to back into the
 * cache directory, one document per row (a null: an empty one). The rows
 * are counted by the footer, so the index is sized once. Memory: one column
 * chunk and one page while decoding (parquet.h), plus the write buffer.
 * Bytes come through the source layer, so a shard in object storage is read
 * the same way. The copy is written through daemon/cache/cache.h (block
 * checksums, the cache's cap).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/cache/cache.h"
#include "daemon/format/format.h"
#include "daemon/format/parquet.h"
#include "daemon/format/text.h"
#include "proto/macro.h"

#define WBUF (8u << 20)

struct build {
	struct text_shard *s;
	uint64_t max_doc_bytes;
	struct cache_build *dst;
	uint8_t *buf;
	size_t n;
	uint64_t pos;    /* bytes of the copy so far */
	size_t cap;      /* rows the footer counts: the index's size */
	char *err;
	size_t errlen;
};

static int flush(struct build *b)
{
	int r = cache_build_write(b->dst, b->buf, b->n, b->err, b->errlen);
	b->n = 0;
	return r;
}

static int on_row(void *ctx, uint64_t row, const uint8_t *p, size_t n, bool null)
{
	struct build *b = ctx;
	struct text_shard *s = b->s;
	if (s->n_docs == b->cap)
		return -E2BIG; /* parquet.c keeps each row group to its num_rows; this is a second guard */
	s->offsets[s->n_docs] = b->pos;
	/* As text.c indexes a longer document: refused when read, never read into memory. */
	s->lengths[s->n_docs] = (uint32_t)MIN((uint64_t)n, b->max_doc_bytes + 1);
	s->n_docs++;
	b->pos += n;
	int r;
	if (n > WBUF - b->n && (r = flush(b)) < 0)
		return r;
	if (n >= WBUF)
		return cache_build_write(b->dst, p, n, b->err, b->errlen);
	if (n == 0)
		return 0; /* a null or empty value: p may be NULL, and memcpy's arguments may not */
	memcpy(b->buf + b->n, p, n);
	b->n += n;
	return 0;
}

struct source_ctx {
	struct source *src;
	struct source_reader *io;
};

/* parquet_read_fn over the source layer, in reads of at most 1 GiB. */
static int source_range(void *ctx, uint64_t offset, size_t len, void *dst)
{
	struct source_ctx *c = ctx;
	uint8_t *p = dst;
	while (len > 0) {
		size_t n = MIN(len, (size_t)1 << 30), failed;
		struct source_read q = { .src = c->src, .offset = offset, .len = n, .dst = p };
		int r = source_read(c->io, &q, 1, &failed);
		if (r < 0)
			return r;
		p += n;
		offset += n;
		len -= n;
	}
	return 0;
}

int text_parquet_build(struct text_shard *s, struct source *src, struct source_reader *io, const char *column,
		       uint64_t max_doc_bytes, struct cache_build *dst, char *err, size_t errlen)
{
	struct source_ctx sc = { .src = src, .io = io };
	struct parquet_source ps = { .name = s->path, .size = source_size(src), .read = source_range, .ctx = &sc };
	struct parquet_file *f = NULL;
	err[0] = 0;
	int r = parquet_open(&ps, &f, err, errlen);
	if (r < 0)
		return r;
	int col = parquet_text_column(f, column, err, errlen);
	if (col < 0) {
		parquet_free(f);
		return col;
	}
	if ((uint64_t)f->n_rows >= UINT32_MAX - 1) {
		snprintf(err, errlen, "%s: more than %u documents in one shard; split it", s->path, UINT32_MAX - 2);
		parquet_free(f);
		return -E2BIG;
	}
	size_t rows = (size_t)f->n_rows;
	struct build b = { .s = s, .max_doc_bytes = max_doc_bytes, .dst = dst, .buf = malloc(WBUF), .cap = rows,
			   .err = err, .errlen = errlen };
	free(s->offsets);
	free(s->lengths);
	free(s->lines);
	s->lines = NULL;
	s->n_docs = 0;
	s->offsets = malloc(MAX(rows, (size_t)1) * sizeof(*s->offsets));
	s->lengths = malloc(MAX(rows, (size_t)1) * sizeof(*s->lengths));
	if (!b.buf || !s->offsets || !s->lengths) {
		free(b.buf);
		parquet_free(f);
		return -ENOMEM;
	}
	/* One row group's column at a time. */
	for (uint32_t g = 0; r == 0 && g < f->n_row_groups; g++)
		r = parquet_read_column(f, g, (uint32_t)col, on_row, &b, err, errlen);
	if (r == 0)
		r = flush(&b);
	if (r == 0 && s->n_docs != rows) {
		snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": its row groups decoded to %u rows, not %zu", s->path,
			 f->footer_offset, s->n_docs, rows);
		r = -EBADMSG;
	}
	if (r < 0 && !err[0] && r != -ENOMEM)
		snprintf(err, errlen, "%s: cannot write its decoded copy: %s", s->path, strerror(-r));
	free(b.buf);
	parquet_free(f);
	if (r == 0)
		s->bytes = b.pos;
	return r;
}

/*
 * The format layer's view (format.h): a text shard like format_text's (one
 * document per stored range, the bytes are the text), opened as a Parquet
 * shard (text.c's open picks TEXT_PARQUET by the format), and placed by row.
 */
static int pq_open(struct shard *sh, const char *name, const struct format_opts *o, struct source_reader *r,
		   char *err, size_t errlen)
{
	return format_text.open(sh, name, o, r, err, errlen);
}

static void pq_close(struct shard *sh)
{
	format_text.close(sh);
}

static int pq_check(const struct shard *sh, char *err, size_t errlen)
{
	return format_text.check(sh, err, errlen);
}

static uint64_t pq_doc_bytes(const struct shard *sh, uint32_t doc)
{
	return format_text.doc_bytes(sh, doc);
}

static void pq_doc_read(const struct shard *sh, uint32_t doc, struct source_read *ret)
{
	format_text.doc_read(sh, doc, ret);
}

static int pq_doc_text(const struct shard *sh, uint32_t doc, const uint8_t *bytes, size_t len,
		       struct format_state *st, struct format_text *ret, char *why, size_t whylen)
{
	return format_text.doc_text(sh, doc, bytes, len, st, ret, why, whylen);
}

static int pq_acquire(const struct shard *sh, struct source_reader *r, char *note, size_t notelen, char *err,
		      size_t errlen)
{
	return text_acquire(sh->impl, r, note, notelen, err, errlen);
}

static void pq_release(const struct shard *sh)
{
	text_release(sh->impl);
}

static void pq_prepare(const struct shard *sh)
{
	text_prepare(sh->impl);
}

static int pq_index(const struct shard *sh, struct source_reader *r, uint32_t *ret_docs, char *err, size_t errlen)
{
	return format_text.index(sh, r, ret_docs, err, errlen);
}

static void pq_doc_where(const struct shard *sh, uint32_t doc, char *buf, size_t n)
{
	snprintf(buf, n, ": row %" PRIu32, doc);
}

const struct format format_parquet = {
	.name = "parquet",
	.content = FORMAT_TEXT,
	.open = pq_open,
	.close = pq_close,
	.check = pq_check,
	.doc_bytes = pq_doc_bytes,
	.doc_read = pq_doc_read,
	.doc_text = pq_doc_text,
	.doc_where = pq_doc_where,
	.acquire = pq_acquire,
	.release = pq_release,
	.prepare = pq_prepare,
	.index = pq_index,
};
