/* SPDX-License-Identifier: MIT */
/*
 * A Parquet shard's decoded copy (text.h, text_parquet_build): the text
 * column of every row group, in file order, written back to back into the
 * cache directory, one document per row (a null: an empty one). The rows
 * are counted by the footer, so the index is sized once. Memory: one column
 * chunk and one page while decoding (parquet.h), plus the write buffer.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/format/parquet.h"
#include "daemon/format/text.h"
#include "proto/macro.h"

#define WBUF (8u << 20)

struct build {
	struct text_shard *s;
	uint64_t max_doc_bytes;
	int fd;
	uint8_t *buf;
	size_t n;
	uint64_t pos;    /* bytes of the copy so far */
	size_t cap;      /* rows the footer counts: the index's size */
};

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int flush(struct build *b)
{
	int r = write_all(b->fd, b->buf, b->n);
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
		return write_all(b->fd, p, n);
	memcpy(b->buf + b->n, p, n);
	b->n += n;
	return 0;
}

int text_parquet_build(struct text_shard *s, const struct parquet_source *src, const char *column,
		       uint64_t max_doc_bytes, const char *data_tmp, char *err, size_t errlen)
{
	struct parquet_file *f = NULL;
	err[0] = 0;
	int r = parquet_open(src, &f, err, errlen);
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
	struct build b = { .s = s, .max_doc_bytes = max_doc_bytes, .fd = -1, .buf = malloc(WBUF), .cap = rows };
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
	b.fd = open(data_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (b.fd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create its decoded copy %s: %s", s->path, data_tmp, strerror(-r));
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
		snprintf(err, errlen, "%s: cannot write its decoded copy %s: %s", s->path, data_tmp, strerror(-r));
	if (b.fd >= 0)
		close(b.fd);
	free(b.buf);
	parquet_free(f);
	if (r == 0)
		s->bytes = b.pos;
	return r;
}
