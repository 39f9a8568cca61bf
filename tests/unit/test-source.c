/* SPDX-License-Identifier: MIT */
/*
 * The source layer (daemon/source/source.h) on local files: open, size and
 * identity; the change check (rewritten, replaced, chmod'ed, deleted);
 * batches of reads over several sources submitted and completed, on pread
 * and on io_uring, with the failing read named in submission order; URL
 * schemes refused; pattern expansion in the contract's order.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/source/source.h"
#include "unit.h"

static char dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void write_file(const char *name, const char *text, char *path, size_t n)
{
	snprintf(path, n, "%s/%s", dir, name);
	FILE *f = fopen(path, "we");
	REQUIRE(f && fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ms * 1000000 };
	nanosleep(&ts, NULL);
}

static void test_open(void)
{
	char path[128], err[512] = "";
	struct source *s = NULL;
	write_file("a", "0123456789", path, sizeof(path));
	CHECK_INT(source_open(path, &s, err, sizeof(err)), 0);
	CHECK_STR(source_name(s), path);
	CHECK_U64(source_size(s), 10);
	struct stat st;
	REQUIRE(stat(path, &st) == 0, "stat");
	const struct source_id *id = source_identity(s);
	CHECK(id->ino == st.st_ino && id->dev == st.st_dev && id->size == 10, "identity is not the file's");
	CHECK(source_close(s) == NULL && source_close(NULL) == NULL, "source_close returns NULL");

	CHECK_INT(source_open("/nonexistent/x", &s, err, sizeof(err)), -ENOENT);
	CHECK_CONTAINS(err, "/nonexistent/x: cannot open");
	CHECK_INT(source_open(dir, &s, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "not a regular file");
	CHECK_INT(source_open("gs://bucket/key.jsonl", &s, err, sizeof(err)), -EPROTONOSUPPORT);
	CHECK_CONTAINS(err, "gs://bucket/key.jsonl");
}

static void test_check(void)
{
	char path[128], other[128], err[512] = "";
	struct source *s = NULL;
	struct source_id was;

	/* Untouched: 0. Rewritten in place (same size): -ESTALE. */
	write_file("c", "abcdef", path, sizeof(path));
	REQUIRE(source_open(path, &s, err, sizeof(err)) == 0, "%s", err);
	was = *source_identity(s);
	s = source_close(s);
	CHECK_INT(source_check(path, &was, err, sizeof(err)), 0);
	sleep_ms(20);
	write_file("c", "ABCDEF", path, sizeof(path));
	CHECK_INT(source_check(path, &was, err, sizeof(err)), -ESTALE);
	CHECK_CONTAINS(err, "changed while serving");

	/* Only the metadata changed (chmod): ctime tells. */
	REQUIRE(source_identify(path, &was) == 0, "identify");
	sleep_ms(20);
	REQUIRE(chmod(path, 0600) == 0, "chmod");
	CHECK_INT(source_check(path, &was, err, sizeof(err)), -ESTALE);

	/* Replaced by another file; deleted. */
	REQUIRE(source_identify(path, &was) == 0, "identify");
	write_file("c2", "abcdef", other, sizeof(other));
	REQUIRE(rename(other, path) == 0, "rename");
	CHECK_INT(source_check(path, &was, err, sizeof(err)), -ESTALE);
	REQUIRE(source_identify(path, &was) == 0, "identify");
	REQUIRE(unlink(path) == 0, "unlink");
	err[0] = 0;
	CHECK_INT(source_check(path, &was, err, sizeof(err)), -ESTALE);
	CHECK_CONTAINS(err, path);
}

static void test_reads(enum io_engine engine)
{
	char pa[128], pb[128], err[512];
	struct source *a = NULL, *b = NULL;
	write_file("ra", "0123456789", pa, sizeof(pa));
	write_file("rb", "abcdefghijklmnopqrstuvwxyz", pb, sizeof(pb));
	REQUIRE(source_open(pa, &a, err, sizeof(err)) == 0 && source_open(pb, &b, err, sizeof(err)) == 0, "%s", err);
	struct source_reader *r = NULL;
	REQUIRE(source_reader_new(engine, 4, &r) == 0, "source_reader_new");
	const char *name = source_reader_engine(r);

	/* Two submissions, one completion: every read lands, in any source. */
	char x[4] = "", y[5] = "", z[3] = "";
	struct source_read first[2] = {
		{ .src = a, .offset = 2, .len = 3, .dst = x },
		{ .src = b, .offset = 20, .len = 4, .dst = y },
	};
	struct source_read second = { .src = a, .offset = 8, .len = 2, .dst = z };
	CHECK_INT(source_submit(r, first, 2), 0);
	CHECK_INT(source_submit(r, &second, 1), 0);
	size_t failed = 99;
	CHECK_INT(source_complete(r, &failed), 0);
	CHECK(memcmp(x, "234", 3) == 0 && memcmp(y, "uvwx", 4) == 0 && memcmp(z, "89", 2) == 0,
	      "%s: wrong bytes: %.3s %.4s %.2s", name, x, y, z);
	CHECK_U64(source_reader_stats(r)->bytes, 9);

	/* A completion with nothing queued is empty. */
	CHECK_INT(source_complete(r, &failed), 0);

	/* A read past the end is named by its index in submission order. */
	struct source_read bad[3] = {
		{ .src = a, .offset = 0, .len = 2, .dst = x },
		{ .src = b, .offset = 0, .len = 2, .dst = y },
		{ .src = a, .offset = 9, .len = 3, .dst = z },
	};
	CHECK_INT(source_read(r, bad, 3, &failed), -ENODATA);
	CHECK_U64(failed, 2);

	/* The whole object. */
	void *all = NULL;
	CHECK_INT(source_read_all(r, b, &all), 0);
	CHECK(all && memcmp(all, "abcdefghijklmnopqrstuvwxyz", 26) == 0, "%s: source_read_all", name);
	free(all);

	source_reader_free(r);
	source_close(a);
	source_close(b);
}

static void test_glob(void)
{
	char p[128], err[512] = "", pattern[2][160];
	write_file("g-b.jsonl", "x", p, sizeof(p));
	write_file("g-a.jsonl", "x", p, sizeof(p));
	write_file("h.jsonl", "x", p, sizeof(p));
	snprintf(pattern[0], sizeof(pattern[0]), "%s/g-*.jsonl", dir);
	snprintf(pattern[1], sizeof(pattern[1]), "%s/./h.jsonl", dir);
	const char *pats[2] = { pattern[0], pattern[1] };
	char **names = NULL;
	size_t n = 0;
	CHECK_INT(source_glob(pats, 2, &names, &n, err, sizeof(err)), 0);
	CHECK_U64(n, 3);
	if (n == 3) {
		/* Each pattern in order, its matches sorted; names canonical. */
		CHECK(strstr(names[0], "/g-a.jsonl") && strstr(names[1], "/g-b.jsonl") && strstr(names[2], "/h.jsonl") &&
			      !strstr(names[2], "/./"),
		      "order or names: %s %s %s", names[0], names[1], names[2]);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);

	const char *twice[2] = { pattern[1], pattern[1] };
	CHECK_INT(source_glob(twice, 2, &names, &n, err, sizeof(err)), -EINVAL);
	CHECK_CONTAINS(err, "listed twice");
	snprintf(pattern[0], sizeof(pattern[0]), "%s/none-*", dir);
	CHECK_INT(source_glob(pats, 1, &names, &n, err, sizeof(err)), -ENOENT);
	CHECK_CONTAINS(err, "matches no file");
}

/* A source over bytes in memory: read with files in one batch; a read past its end named by its index. */
static void test_mem(void)
{
	char pa[128], err[512];
	struct source *a = NULL, *m = NULL;
	write_file("ma", "0123456789", pa, sizeof(pa));
	REQUIRE(source_open(pa, &a, err, sizeof(err)) == 0, "%s", err);
	char *bytes = strdup("abcdefghij");
	REQUIRE(bytes && source_open_mem("copy of ma", bytes, 10, &m, err, sizeof(err)) == 0, "%s", err);
	CHECK_U64(source_size(m), 10);
	CHECK(strcmp(source_name(m), "copy of ma") == 0, "name %s", source_name(m));
	struct source_reader *r = NULL;
	REQUIRE(source_reader_new(IO_ENGINE_AUTO, 4, &r) == 0, "source_reader_new");
	char x[4] = "", y[4] = "", z[4] = "";
	struct source_read reads[3] = {
		{ .src = m, .offset = 7, .len = 3, .dst = x },
		{ .src = a, .offset = 1, .len = 3, .dst = y },
		{ .src = m, .offset = 0, .len = 3, .dst = z },
	};
	size_t failed = 99;
	CHECK_INT(source_read(r, reads, 3, &failed), 0);
	CHECK(memcmp(x, "hij", 3) == 0 && memcmp(y, "123", 3) == 0 && memcmp(z, "abc", 3) == 0, "wrong bytes: %.3s %.3s %.3s",
	      x, y, z);
	struct source_read bad[2] = {
		{ .src = a, .offset = 0, .len = 2, .dst = x },
		{ .src = m, .offset = 9, .len = 2, .dst = y },
	};
	CHECK_INT(source_read(r, bad, 2, &failed), -ENODATA);
	CHECK_U64(failed, 1);
	/* The error is the batch's only: the next one reads. */
	CHECK_INT(source_read(r, reads, 1, &failed), 0);
	source_reader_free(r);
	source_close(a);
	source_close(m);
}

int main(void)
{
	char tmpl[] = "/tmp/feedd-source-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp");
	snprintf(dir, sizeof(dir), "%s", tmpl);

	test_open();
	test_check();
	test_reads(IO_ENGINE_PREAD);
	test_reads(IO_ENGINE_AUTO);
	test_glob();
	test_mem();

	nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return unit_exit("test-source");
}
