/* SPDX-License-Identifier: MIT */
/*
 * The Thrift compact reader (daemon/format/thrift.c) on hand-made bytes,
 * and the Parquet reader (daemon/format/parquet*.c) on the small files
 * DuckDB wrote into tests/fuzz/corpus/parquet/ (argv[1]): every codec, page
 * v1 and v2, dictionary on and off, 40 rows of which every 7th from row 3 is
 * null. Row i is 'doc ' || i % 5 when i % 10 < 8, else 'document ' || i.
 */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "daemon/format/parquet.h"
#include "daemon/format/thrift.h"
#include "tests/unit/unit.h"

static void test_thrift_values(void)
{
	/* struct { 1: i32 -3, 5: binary "ab", 300: i64 1<<40, 301: list<i32> of 16 x 1, 302: true } */
	uint8_t b[64], *p = b;
	*p++ = 0x15, *p++ = 0x05;             /* field 1 i32, zigzag(-3) = 5 */
	*p++ = 0x48, *p++ = 2, *p++ = 'a', *p++ = 'b'; /* delta 4 -> 5, binary */
	*p++ = 0x06, *p++ = 0xd8, *p++ = 0x04; /* long form: type i64, id zigzag(300) = 600 */
	uint64_t v = (uint64_t)1 << 41;       /* zigzag(1 << 40) */
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	*p++ = 0x19, *p++ = 0xf5, *p++ = 16; /* field 301, list: size 15 = varint follows, i32 */
	for (int i = 0; i < 16; i++)
		*p++ = 2;
	*p++ = 0x11;                          /* field 302, bool true */
	*p++ = 0;
	struct thrift t;
	thrift_init(&t, b, (size_t)(p - b), 1000);
	int16_t last = 0, id;
	uint8_t ty;
	int32_t i32 = 0;
	int64_t i64 = 0;
	const uint8_t *s;
	size_t n;
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(id, 1);
	CHECK_INT(thrift_i32(&t, ty, &i32), 0);
	CHECK_INT(i32, -3);
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(id, 5);
	CHECK_INT(thrift_binary(&t, ty, &s, &n), 0);
	CHECK(n == 2 && memcmp(s, "ab", 2) == 0, "binary");
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(id, 300);
	CHECK_INT(thrift_i32(&t, ty, &i32), -EBADMSG); /* an i64 is not an i32 */
	thrift_init(&t, b, (size_t)(p - b), 1000);
	last = 0;
	for (int k = 0; k < 3; k++) {
		CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
		if (k < 2)
			CHECK_INT(thrift_skip(&t, ty), 0);
	}
	CHECK_INT(thrift_i64(&t, ty, &i64), 0);
	CHECK(i64 == (int64_t)1 << 40, "i64 %" PRId64, i64);
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	uint8_t et;
	uint32_t ln;
	CHECK_INT(thrift_list(&t, ty, &et, &ln), 0);
	CHECK_INT(ln, 16);
	for (uint32_t i = 0; i < ln; i++)
		CHECK_INT(thrift_i32(&t, et, &i32), 0);
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	bool bv = false;
	CHECK_INT(thrift_bool(&t, ty, &bv), 0);
	CHECK(bv, "bool");
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 0);
	CHECK(t.error == NULL, "no error");
}

static void test_thrift_hostile(void)
{
	struct thrift t;
	int16_t last = 0, id;
	uint8_t ty;
	/* A list claiming 1000 elements in 3 bytes. */
	const uint8_t list[] = { 0x19, 0xf5, 0xe8, 0x07, 0, 0, 0 };
	thrift_init(&t, list, sizeof(list), 50);
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(thrift_skip(&t, ty), -EBADMSG);
	CHECK_CONTAINS(t.error, "more elements than it has bytes");
	CHECK_U64(t.error_at, 54);
	/* Structs nested past the depth limit. */
	uint8_t deep[80];
	for (size_t i = 0; i < sizeof(deep); i++)
		deep[i] = 0x1c; /* field +1, struct */
	thrift_init(&t, deep, sizeof(deep), 0);
	last = 0;
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(thrift_skip(&t, ty), -EBADMSG);
	CHECK_CONTAINS(t.error, "nested too deep");
	/* A varint of 11 bytes; a binary longer than its bytes; a struct without STOP. */
	const uint8_t longv[] = { 0x15, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 };
	thrift_init(&t, longv, sizeof(longv), 0);
	last = 0;
	int32_t x;
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(thrift_i32(&t, ty, &x), -EBADMSG);
	const uint8_t bin[] = { 0x18, 0x10, 'a' };
	thrift_init(&t, bin, sizeof(bin), 0);
	last = 0;
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(thrift_skip(&t, ty), -EBADMSG);
	CHECK_CONTAINS(t.error, "longer than the bytes left");
	const uint8_t nostop[] = { 0x15, 0x02 };
	thrift_init(&t, nostop, sizeof(nostop), 0);
	last = 0;
	CHECK_INT(thrift_field(&t, &last, &ty, &id), 1);
	CHECK_INT(thrift_skip(&t, ty), 0);
	CHECK_INT(thrift_field(&t, &last, &ty, &id), -EBADMSG);
	CHECK_CONTAINS(t.error, "no STOP");
}

struct rows {
	unsigned n, nulls, bad;
};

static int check_row(void *ctx, uint64_t row, const uint8_t *p, size_t n, bool null)
{
	struct rows *r = ctx;
	uint64_t i = row + 0; /* one row group: row i of the file */
	char want[32];
	r->n++;
	if (i % 7 == 3) {
		r->nulls += null;
		r->bad += !null;
		return 0;
	}
	if (i % 10 < 8)
		snprintf(want, sizeof(want), "doc %u", (unsigned)(i % 5));
	else
		snprintf(want, sizeof(want), "document %u", (unsigned)i);
	r->bad += null || n != strlen(want) || memcmp(p, want, n) != 0;
	return 0;
}

static void test_duckdb_files(const char *dir)
{
	DIR *d = opendir(dir);
	REQUIRE(d, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	unsigned files = 0;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, "duckdb-", 7) != 0 || !strstr(e->d_name, ".parquet"))
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		struct stat st;
		REQUIRE(fd >= 0 && fstat(fd, &st) == 0, "%s", path);
		struct parquet_source src = { .name = path, .size = (uint64_t)st.st_size, .read = parquet_read_fd,
					      .ctx = (void *)(intptr_t)fd };
		struct parquet_file *f = NULL;
		char err[512];
		int r = parquet_open(&src, &f, err, sizeof(err));
		CHECK(r == 0, "%s", err);
		if (r == 0) {
			CHECK_U64((uint64_t)f->n_rows, 40);
			CHECK_INT(f->n_row_groups, 1);
			int col = parquet_text_column(f, "text", err, sizeof(err));
			CHECK(col == 1, "%s", err);
			struct rows rows = { 0 };
			r = parquet_read_column(f, 0, (uint32_t)col, check_row, &rows, err, sizeof(err));
			CHECK(r == 0, "%s", err);
			CHECK(rows.n == 40 && rows.nulls == 6 && rows.bad == 0, "%s: %u rows, %u nulls, %u wrong", path,
			      rows.n, rows.nulls, rows.bad);
			CHECK(parquet_text_column(f, "score", err, sizeof(err)) == -ENOTSUP, "score is a DOUBLE");
			CHECK_CONTAINS(err, "not BYTE_ARRAY");
			CHECK(parquet_text_column(f, "meta", err, sizeof(err)) == -ENOTSUP, "meta is a struct");
			CHECK(parquet_text_column(f, "nope", err, sizeof(err)) == -ENOENT, "no such column");
		}
		parquet_free(f);
		close(fd);
		files++;
	}
	closedir(d);
	CHECK(files == 16, "%u DuckDB files in %s", files, dir);
}

int main(int argc, char **argv)
{
	REQUIRE(argc == 2, "usage: test-parquet CORPUS_DIR");
	test_thrift_values();
	test_thrift_hostile();
	test_duckdb_files(argv[1]);
	return unit_exit("parquet");
}
