/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: Parquet files (daemon/format/parquet.c, parquet_page.c and
 * the Thrift reader under them): the footer, page headers and pages.
 *
 * Input: the file. It is opened through an in-memory byte-range callback;
 * when the footer is accepted, every top-level column the reader agrees to
 * read as text is decoded, row group by row group. Promises checked: an
 * accepted footer's row groups add up to its row count; each value
 * callback comes with the next row number, in order; a null has no bytes;
 * a chunk read without error delivered exactly its row group's rows; a
 * refusal says why, naming the file.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "daemon/format/parquet.h"
#include "tests/fuzz/fuzz.h"

unsigned long fuzz_accepted;

struct mem {
	const uint8_t *p;
	size_t n;
};

static int mem_read(void *ctx, uint64_t offset, size_t len, void *dst)
{
	const struct mem *m = ctx;
	if (offset > m->n || len > m->n - offset)
		return -ENODATA;
	memcpy(dst, m->p + offset, len);
	return 0;
}

struct rows {
	uint64_t next;
	uint64_t bytes;
};

static int on_value(void *ctx, uint64_t row, const uint8_t *p, size_t n, bool null)
{
	struct rows *r = ctx;
	assert(row == r->next);
	assert(!null || (p == NULL && n == 0));
	if (n)
		r->bytes += p[0] + p[n - 1]; /* touch both ends: ASan checks they are inside the page */
	r->next++;
	return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mem m = { data, size };
	struct parquet_source src = { .name = "fuzz.parquet", .size = size, .read = mem_read, .ctx = &m };
	struct parquet_file *f = NULL;
	char err[512] = "";
	int r = parquet_open(&src, &f, err, sizeof(err));
	if (r < 0) {
		assert(strstr(err, "fuzz.parquet") && (r == -EBADMSG || r == -ENOTSUP || r == -ENOMEM));
		return 0;
	}
	uint64_t sum = 0;
	for (uint32_t g = 0; g < f->n_row_groups; g++) {
		assert(f->row_groups[g].first_row == sum);
		sum += (uint64_t)f->row_groups[g].n_rows;
	}
	assert(sum == (uint64_t)f->n_rows);
	for (uint32_t i = 0; i < f->n_schema; i++) {
		if (f->schema[i].depth != 1)
			continue;
		err[0] = 0;
		int col = parquet_text_column(f, f->schema[i].name, err, sizeof(err));
		if (col < 0) {
			assert(strstr(err, "fuzz.parquet"));
			continue;
		}
		for (uint32_t g = 0; g < f->n_row_groups; g++) {
			struct rows rows = { 0 };
			err[0] = 0;
			r = parquet_read_column(f, g, (uint32_t)col, on_value, &rows, err, sizeof(err));
			if (r == 0) {
				assert(rows.next == (uint64_t)f->row_groups[g].n_rows);
				fuzz_accepted++;
			} else {
				assert(r == -ENOMEM || strstr(err, "fuzz.parquet"));
			}
		}
	}
	parquet_free(f);
	return 0;
}
