/* SPDX-License-Identifier: MIT */
/*
 * Block checksums (daemon/io/sums.h), the cache directory over them
 * (daemon/cache/cache.h) and the source layer's checked reads
 * (source_set_sums): a trailer and a sidecar written and loaded back; every
 * flipped byte found, named by its block's offset; unaligned reads served
 * right from whole blocks; a damaged table refused; builds that pass the
 * cap refused, LRU eviction that spares pinned entries and builds, and
 * crashed builds' temporary files removed.
 */
#include <glob.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/cache/cache.h"
#include "daemon/io/sums.h"
#include "daemon/source/source.h"
#include "proto/macro.h"
#include "unit.h"

static char dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static uint8_t *pattern(size_t n, unsigned seed)
{
	uint8_t *p = malloc(n);
	REQUIRE(p, "malloc");
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
	return p;
}

static void flip(const char *path, uint64_t at)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	REQUIRE(fd >= 0, "open %s", path);
	uint8_t b;
	REQUIRE(pread(fd, &b, 1, (off_t)at) == 1, "pread");
	b ^= 0x20;
	REQUIRE(pwrite(fd, &b, 1, (off_t)at) == 1, "pwrite");
	close(fd);
}

static uint64_t file_size(const char *path);

/* Closes src and opens data again with the sidecar side's sums: a fresh identity, as after a restart. */
static struct source *reopen(struct source *src, const char *data, const char *side)
{
	char err[256];
	source_close(src);
	REQUIRE(source_open(data, &src, err, sizeof(err)) == 0, "%s", err);
	struct sums *copy = NULL;
	int fd = open(side, O_RDONLY | O_CLOEXEC);
	REQUIRE(sums_load(fd, file_size(side), true, side, &copy, err, sizeof(err)) == 0, "%s", err);
	close(fd);
	REQUIRE(source_set_sums(src, copy) == 0, "source_set_sums");
	return src;
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_size : UINT64_MAX;
}

/* A trailer in memory: every size around block boundaries round-trips, every flipped byte is found. */
static void test_buffer(void)
{
	const uint32_t block = 1024;
	const size_t sizes[] = { 0, 1, 1023, 1024, 1025, 5000, 8192 };
	for (size_t k = 0; k < ARRAY_SIZE(sizes); k++) {
		size_t n = sizes[k];
		char path[96];
		snprintf(path, sizeof(path), "%s/buf%zu", dir, n);
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		REQUIRE(fd >= 0, "create");
		struct sums_writer *w = NULL;
		REQUIRE(sums_writer_new(fd, block, &w) == 0, "writer");
		uint8_t *data = pattern(n + 1, (unsigned)n);
		/* In uneven pieces, so partial blocks meet the streaming state. */
		for (size_t at = 0; at < n;) {
			size_t m = MIN(n - at, (size_t)(at % 7 == 0 ? 700 : 1500));
			CHECK_INT(sums_writer_write(w, data + at, m), 0);
			at += m;
		}
		uint64_t digest = 0;
		CHECK_INT(sums_writer_finish(w, fd, &digest), 0);
		sums_writer_free(w);
		uint64_t fsz = file_size(path);
		CHECK_U64(fsz, n + (n + block - 1) / block * 8 + SUMS_FOOTER);
		uint8_t *all = malloc(fsz);
		REQUIRE(pread(fd, all, fsz, 0) == (ssize_t)fsz, "read back");
		char err[256];
		CHECK_INT(sums_check_buffer(all, fsz, path, err, sizeof(err)), (long long)n);
		struct sums *s = NULL;
		CHECK_INT(sums_load(fd, fsz, false, path, &s, err, sizeof(err)), 0);
		if (s) {
			CHECK_U64(s->data_size, n);
			CHECK_U64(s->digest, digest);
			CHECK_INT(sums_verify(s, 0, data, n, NULL), 0);
			if (n > block)
				CHECK_INT(sums_verify(s, 1, data + 1, block, NULL), -EINVAL);
		}
		/* Each byte of the data flipped: the damaged block is the one named. */
		for (size_t i = 0; i < n; i += 97) {
			all[i] ^= 1;
			CHECK_INT(sums_check_buffer(all, fsz, path, err, sizeof(err)), -EBADMSG);
			char want[128];
			snprintf(want, sizeof(want), "block at byte %zu ", i / block * block);
			CHECK(strstr(err, want), "size %zu, byte %zu: %s", n, i, err);
			uint64_t bad = 0;
			if (s) {
				CHECK_INT(sums_verify(s, 0, all, n, &bad), -EBADMSG);
				CHECK_U64(bad, i / block * block);
			}
			all[i] ^= 1;
		}
		/* The table itself damaged: refused as a whole. */
		all[fsz - 20] ^= 4;
		CHECK_INT(sums_check_buffer(all, fsz, path, err, sizeof(err)), -EBADMSG);
		CHECK(strstr(err, "checksum"), "%s", err);
		sums_free(s);
		free(all);
		free(data);
		close(fd);
	}
	char err[128];
	uint8_t junk[100] = { 0 };
	CHECK_INT(sums_check_buffer(junk, sizeof(junk), "junk", err, sizeof(err)), -EBADMSG);
	struct sums_writer *w = NULL;
	CHECK_INT(sums_writer_new(-1, 1000, &w), -EINVAL);
}

/* A sidecar on a file with a companion, and reads through a checked source, aligned or not. */
static void test_sidecar_and_source(void)
{
	char data[96], extra[96], side[96], err[256];
	snprintf(data, sizeof(data), "%s/x.bin", dir);
	snprintf(extra, sizeof(extra), "%s/x.idx", dir);
	snprintf(side, sizeof(side), "%s/x.bin.sums", dir);
	const size_t n = 100000;
	uint8_t *bytes = pattern(n, 7);
	FILE *f = fopen(data, "we");
	REQUIRE(f && fwrite(bytes, 1, n, f) == n && fclose(f) == 0, "write data");
	f = fopen(extra, "we");
	REQUIRE(f && fputs("companion", f) >= 0 && fclose(f) == 0, "write extra");
	CHECK_INT(sums_write_sidecar(side, data, extra, 4096, err, sizeof(err)), 0);
	CHECK_U64(file_size(side), (n + 4095) / 4096 * 8 + SUMS_FOOTER);

	int fd = open(side, O_RDONLY | O_CLOEXEC);
	struct sums *s = NULL;
	CHECK_INT(sums_load(fd, file_size(side), true, side, &s, err, sizeof(err)), 0);
	/* A sidecar is not a trailer. */
	struct sums *t = NULL;
	CHECK_INT(sums_load(fd, file_size(side), false, side, &t, err, sizeof(err)), -EBADMSG);
	close(fd);
	REQUIRE(s, "sidecar loaded");
	uint64_t esz = 0, eh = 0;
	CHECK_INT(sums_hash_file(extra, &esz, &eh, err, sizeof(err)), 0);
	CHECK_U64(s->extra_size, 9);
	CHECK_U64(s->extra_hash, eh);

	for (int engine = IO_ENGINE_URING; engine <= IO_ENGINE_PREAD; engine++) {
		struct source_reader *r = NULL;
		if (source_reader_new((enum io_engine)engine, 8, &r) < 0)
			continue;
		struct source *src = NULL;
		REQUIRE(source_open(data, &src, err, sizeof(err)) == 0, "%s", err);
		struct sums *copy = NULL;
		fd = open(side, O_RDONLY | O_CLOEXEC);
		REQUIRE(sums_load(fd, file_size(side), true, side, &copy, err, sizeof(err)) == 0, "%s", err);
		close(fd);
		CHECK_INT(source_set_sums(src, copy), 0);
		/* Aligned, unaligned, spanning blocks, the short last block, all in one batch. */
		static const struct { uint64_t off; size_t len; } cases[] = {
			{ 0, 4096 }, { 5, 10 }, { 4090, 20 }, { 8192, 3 * 4096 }, { 99990, 10 }, { 98304, 1696 }, { 1, 99999 },
		};
		uint8_t *out[ARRAY_SIZE(cases)];
		struct source_read q[ARRAY_SIZE(cases)];
		for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
			out[i] = malloc(cases[i].len);
			q[i] = (struct source_read){ .src = src, .offset = cases[i].off, .len = cases[i].len, .dst = out[i] };
		}
		size_t failed = 99;
		CHECK_INT(source_read(r, q, ARRAY_SIZE(cases), &failed), 0);
		for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
			CHECK(memcmp(out[i], bytes + cases[i].off, cases[i].len) == 0, "engine %d, read %zu", engine, i);
		/* Two submissions, one completion: each keeps its own bounce buffer, the failing index counts both. */
		for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
			memset(out[i], 0, cases[i].len);
		CHECK_INT(source_submit(r, q, 3), 0);
		CHECK_INT(source_submit(r, q + 3, ARRAY_SIZE(cases) - 3), 0);
		CHECK_INT(source_complete(r, &failed), 0);
		for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
			CHECK(memcmp(out[i], bytes + cases[i].off, cases[i].len) == 0, "engine %d, split, read %zu", engine, i);
		/* Past the covered data (here also past the file's end): refused. */
		struct source_read past = { .src = src, .offset = n - 2, .len = 4, .dst = out[0] };
		CHECK_INT(source_read(r, &past, 1, &failed), -ENODATA);
		/*
		 * One byte flipped on disk. Through the open source that is a write
		 * (its ctime moved): -ESTALE from the check after the read, before
		 * any checksum. Opened again (damage found later, e.g. after a
		 * restart), the read touching it fails, naming the file and block.
		 */
		flip(data, 50000);
		CHECK_INT(source_read(r, q, ARRAY_SIZE(cases), &failed), -ESTALE);
		src = reopen(src, data, side);
		for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
			q[i].src = src;
		CHECK_INT(source_read(r, q, ARRAY_SIZE(cases), &failed), -EUCLEAN);
		/* A cache entry of feedd's own is judged by its sums alone (its mtime moves with use): damage, not a write. */
		source_set_cache_entry(src);
		flip(data, 50001);
		CHECK_INT(source_read(r, q, ARRAY_SIZE(cases), &failed), -EUCLEAN);
		flip(data, 50001);
		CHECK_INT(failed, 6); /* { 1, 99999 } is the only read over byte 50000 */
		CHECK_INT(source_submit(r, q, 3), 0);
		CHECK_INT(source_submit(r, q + 3, ARRAY_SIZE(cases) - 3), 0);
		CHECK_INT(source_complete(r, &failed), -EUCLEAN);
		CHECK_INT(failed, 6);
		CHECK(strstr(source_reader_error(r), "x.bin: block at byte 49152 "), "%s", source_reader_error(r));
		struct source_read clean = { .src = src, .offset = 0, .len = 4096, .dst = out[0] };
		CHECK_INT(source_read(r, &clean, 1, &failed), 0);
		void *all = NULL;
		CHECK_INT(source_read_all(r, src, &all), -EUCLEAN);
		flip(data, 50000);
		src = reopen(src, data, side);
		CHECK_INT(source_read_all(r, src, &all), 0);
		free(all);
		for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
			free(out[i]);
		source_close(src);
		source_reader_free(r);
	}
	sums_free(s);
	free(bytes);
}

static int build(const char *cdir, uint64_t cap, const char *name, size_t n, char *err, size_t errlen)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/%s", cdir, name);
	struct cache_build *b = NULL;
	int r = cache_build_begin(cdir, cap, path, 4096, &b, err, errlen);
	if (r < 0)
		return r;
	uint8_t *p = pattern(n, 3);
	for (size_t at = 0; at < n && r == 0; at += 10000)
		r = cache_build_write(b, p + at, MIN((size_t)10000, n - at), err, errlen);
	free(p);
	if (r < 0) {
		cache_build_abort(b);
		return r;
	}
	return cache_build_commit(b, err, errlen);
}

static void touch_back(const char *path, int seconds_ago)
{
	struct timespec ts[2];
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= seconds_ago;
	ts[1] = ts[0];
	utimensat(AT_FDCWD, path, ts, 0);
}

static void test_cache(void)
{
	char cdir[96], err[512], p[160];
	snprintf(cdir, sizeof(cdir), "%s/cache", dir);
	CHECK_INT(cache_clean(cdir, err, sizeof(err)), 0);
	const uint64_t cap = 300000;
	/* An entry alone over the cap: refused, nothing left behind. */
	CHECK_INT(build(cdir, cap, "huge", 400000, err, sizeof(err)), -EFBIG);
	CHECK(strstr(err, "huge") && strstr(err, "cache_max_bytes"), "%s", err);
	CHECK_U64(cache_usage(cdir), 0);
	/* Three entries of ~100 KB fit; the oldest unpinned goes for a fourth. */
	CHECK_INT(build(cdir, cap, "a", 90000, err, sizeof(err)), 0);
	CHECK_INT(build(cdir, cap, "b", 90000, err, sizeof(err)), 0);
	CHECK_INT(build(cdir, cap, "c", 90000, err, sizeof(err)), 0);
	snprintf(p, sizeof(p), "%s/a", cdir);
	touch_back(p, 30);
	snprintf(p, sizeof(p), "%s/b", cdir);
	touch_back(p, 20);
	struct cache_pin *pin = NULL;
	snprintf(p, sizeof(p), "%s/a", cdir);
	CHECK_INT(cache_pin(p, &pin), 0);   /* a is the oldest but in use (and now the newest) */
	snprintf(p, sizeof(p), "%s/b", cdir);
	touch_back(p, 20);
	CHECK_INT(build(cdir, cap, "d", 90000, err, sizeof(err)), 0);
	CHECK(cache_usage(cdir) <= (int64_t)cap, "usage %lld", (long long)cache_usage(cdir));
	snprintf(p, sizeof(p), "%s/a", cdir);
	CHECK(access(p, F_OK) == 0, "the pinned entry was evicted");
	snprintf(p, sizeof(p), "%s/b", cdir);
	CHECK(access(p, F_OK) != 0, "the least recently used entry stayed");
	/* With a, c and d pinned nothing can go: refused with a message, not over the cap. */
	struct cache_pin *pc = NULL, *pd = NULL;
	snprintf(p, sizeof(p), "%s/c", cdir);
	CHECK_INT(cache_pin(p, &pc), 0);
	snprintf(p, sizeof(p), "%s/d", cdir);
	CHECK_INT(cache_pin(p, &pd), 0);
	CHECK_INT(build(cdir, cap, "e", 90000, err, sizeof(err)), -ENOSPC);
	CHECK(strstr(err, "in use"), "%s", err);
	CHECK(cache_usage(cdir) <= (int64_t)cap, "usage %lld", (long long)cache_usage(cdir));
	/* The pin is checked: the entry read back through its fd is intact. */
	struct sums *s = NULL;
	CHECK_INT(sums_load(cache_pin_fd(pd), file_size(p), false, p, &s, err, sizeof(err)), 0);
	CHECK(s && s->data_size == 90000, "entry d's trailer");
	sums_free(s);
	cache_unpin(pc);
	cache_unpin(pd);
	CHECK_INT(build(cdir, cap, "e", 90000, err, sizeof(err)), 0);
	cache_unpin(pin);
	CHECK_INT(cache_pin("/nonexistent/x", &pin), -ENOENT);

	/* An index goes with its copy, never before it: not while the copy is pinned, though older. */
	char pdir[96];
	snprintf(pdir, sizeof(pdir), "%s/pairs", dir);
	CHECK_INT(cache_clean(pdir, err, sizeof(err)), 0);
	CHECK_INT(build(pdir, cap, "x.data", 90000, err, sizeof(err)), 0);
	CHECK_INT(build(pdir, cap, "x.idx", 20000, err, sizeof(err)), 0);
	CHECK_INT(build(pdir, cap, "y.data", 90000, err, sizeof(err)), 0);
	CHECK_INT(build(pdir, cap, "y.idx", 20000, err, sizeof(err)), 0);
	snprintf(p, sizeof(p), "%s/x.idx", pdir);
	touch_back(p, 50);
	snprintf(p, sizeof(p), "%s/y.data", pdir);
	touch_back(p, 40);
	snprintf(p, sizeof(p), "%s/y.idx", pdir);
	touch_back(p, 60);
	snprintf(p, sizeof(p), "%s/x.data", pdir);
	CHECK_INT(cache_pin(p, &pin), 0);
	CHECK_INT(build(pdir, cap, "z.data", 90000, err, sizeof(err)), 0);
	snprintf(p, sizeof(p), "%s/x.idx", pdir);
	CHECK(access(p, F_OK) == 0, "the index of a pinned copy was evicted");
	snprintf(p, sizeof(p), "%s/y.idx", pdir);
	CHECK(access(p, F_OK) != 0, "an index outlived its evicted copy");
	snprintf(p, sizeof(p), "%s/y.data", pdir);
	CHECK(access(p, F_OK) != 0, "the least recently used copy stayed");
	CHECK(cache_usage(pdir) <= (int64_t)cap, "usage %lld", (long long)cache_usage(pdir));
	cache_unpin(pin);

	/* Temporary files: a crashed build's goes, a live build's (locked) stays. */
	snprintf(p, sizeof(p), "%s/x.data.tmp-999999", cdir);
	FILE *f = fopen(p, "we");
	REQUIRE(f && fputs("partial", f) >= 0 && fclose(f) == 0, "stale tmp");
	struct cache_build *live = NULL;
	snprintf(p, sizeof(p), "%s/y.data", cdir);
	CHECK_INT(cache_build_begin(cdir, 0, p, 4096, &live, err, sizeof(err)), 0);
	/* Another process cleans, as a second feedd would. */
	pid_t pid = fork();
	if (pid == 0)
		_exit(cache_clean(cdir, err, sizeof(err)) == 1 ? 0 : 1);
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "cache_clean removed exactly the stale file");
	snprintf(p, sizeof(p), "%s/x.data.tmp-999999", cdir);
	CHECK(access(p, F_OK) != 0, "stale tmp left");
	/* The live build's tmp: "y.data.tmp-" then digits (a sequence number of its process, and its pid). */
	snprintf(p, sizeof(p), "%s/y.data.tmp-*", cdir);
	glob_t g = { 0 };
	CHECK(glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 1, "a live build's tmp was removed");
	if (g.gl_pathc == 1)
		snprintf(p, sizeof(p), "%s", g.gl_pathv[0]);
	globfree(&g);
	cache_build_abort(live);
	CHECK(access(p, F_OK) != 0, "abort leaves its tmp");

	/* Two builds of one entry at once (two feeds over one shard): each its own tmp, neither truncates the other. */
	struct cache_build *b1 = NULL, *b2 = NULL;
	snprintf(p, sizeof(p), "%s/z.data", cdir);
	CHECK_INT(cache_build_begin(cdir, 0, p, 4096, &b1, err, sizeof(err)), 0);
	CHECK_INT(cache_build_begin(cdir, 0, p, 4096, &b2, err, sizeof(err)), 0);
	snprintf(p, sizeof(p), "%s/z.data.tmp-*", cdir);
	g = (glob_t){ 0 };
	CHECK(glob(p, 0, NULL, &g) == 0 && g.gl_pathc == 2, "two builds of one entry share a tmp file");
	globfree(&g);
	cache_build_abort(b1);
	cache_build_abort(b2);
}

int main(void)
{
	char tmpl[] = "/tmp/test-sums-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp");
	snprintf(dir, sizeof(dir), "%s", tmpl);
	test_buffer();
	test_sidecar_and_source();
	test_cache();
	nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return unit_exit("sums");
}
