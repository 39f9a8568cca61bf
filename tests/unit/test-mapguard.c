/* SPDX-License-Identifier: MIT */
/*
 * A Megatron .idx is mapped (MAP_SHARED), so another process can truncate
 * or rewrite it under the daemon. Every read of the mapping must then end
 * in -ESTALE naming the file, never SIGBUS (truncated: the guard,
 * daemon/source/mapguard.h) nor a read past the index or the .bin
 * (rewritten in place: each entry bounded where it is used), and the
 * .bin's reads fail once the .idx changed. A SIGBUS
 * outside a guard keeps its default action. The scan stops on its flag.
 * Each case runs in a child, so a crash is reported, not fatal.
 */
#include <endian.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "daemon/format/megatron.h"
#include "daemon/io/reader.h"
#include "daemon/source/mapguard.h"
#include "unit.h"

#define S 8192 /* sequences (one token each) = documents: an .idx of ~160 KiB, 40 pages */

static char dir[64], idx_path[128], bin_path[128];

static void write_shard(void)
{
	size_t len = 34 + 12 * (size_t)S + 8 * (size_t)(S + 1);
	uint8_t *b = calloc(1, len);
	REQUIRE(b, "out of memory");
	memcpy(b, "MMIDIDX\0\0", 9);
	uint64_t v = htole64(1);
	memcpy(b + 9, &v, 8);
	b[17] = 8; /* u16 */
	v = htole64(S);
	memcpy(b + 18, &v, 8);
	v = htole64(S + 1);
	memcpy(b + 26, &v, 8);
	for (uint64_t q = 0; q < S; q++) {
		uint32_t l = htole32(1);
		uint64_t p = htole64(2 * q);
		memcpy(b + 34 + 4 * q, &l, 4);
		memcpy(b + 34 + 4 * S + 8 * q, &p, 8);
	}
	for (uint64_t d = 0; d <= S; d++) {
		v = htole64(d);
		memcpy(b + 34 + 12 * S + 8 * d, &v, 8);
	}
	int fd = open(idx_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	REQUIRE(fd >= 0 && write(fd, b, len) == (ssize_t)len && close(fd) == 0, "write %s", idx_path);
	memset(b, 1, 2 * S);
	fd = open(bin_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	REQUIRE(fd >= 0 && write(fd, b, 2 * S) == 2 * S && close(fd) == 0, "write %s", bin_path);
	free(b);
}

static int no_emit(void *ctx, uint64_t byte_offset, uint64_t n_tokens)
{
	(void)byte_offset;
	(void)n_tokens;
	++*(int *)ctx;
	return 0;
}

static struct megatron_shard *open_shard(bool lazy)
{
	struct source_reader *io;
	REQUIRE(source_reader_new(IO_ENGINE_AUTO, 8, &io) == 0, "source_reader_new failed");
	char err[512];
	uint64_t budget = 0;
	struct megatron_shard *s = NULL;
	REQUIRE(megatron_open_budget(idx_path, io, lazy ? &budget : NULL, &s, err, sizeof(err)) == 0, "open: %s", err);
	source_reader_free(io);
	CHECK(s->validated == !lazy, "validated at open: %d", s->validated);
	return s;
}

/* Every reader of the mapping, on a document whose entries lie past the truncation. */
static void expect_stale(struct megatron_shard *s, uint32_t doc, bool scan)
{
	char err[512] = "";
	uint64_t t;
	int emitted = 0;
	CHECK_INT(megatron_doc_tokens(s, doc, &t, err, sizeof(err)), -ESTALE);
	CHECK_CONTAINS(err, idx_path);
	CHECK_CONTAINS(err, "changed while serving");
	CHECK_INT(megatron_doc_ranges(s, doc, 0, 1, no_emit, &emitted), -ESTALE);
	CHECK_INT(emitted, 0);
	if (scan) {
		uint64_t tokens;
		uint32_t nonempty;
		err[0] = 0;
		CHECK_INT(megatron_scan(s, NULL, &tokens, &nonempty, err, sizeof(err)), -ESTALE);
		CHECK_CONTAINS(err, "changed while serving");
	}
}

static void truncated(void *ctx)
{
	bool lazy = ctx != NULL;
	write_shard();
	struct megatron_shard *s = open_shard(lazy);
	uint64_t t;
	char err[512];
	CHECK_INT(megatron_doc_tokens(s, S - 1, &t, err, sizeof(err)), 0);
	unsigned long before = mapguard_caught();
	REQUIRE(truncate(idx_path, 4096) == 0, "truncate: %s", strerror(errno));
	expect_stale(s, S - 1, true);
	CHECK(mapguard_caught() - before >= 3, "%lu faults caught", mapguard_caught() - before);
	/* The first page is still there: a document whose entries lie in it still reads. */
	megatron_free(s);
}

static void put64(uint64_t off, uint64_t v)
{
	int fd = open(idx_path, O_WRONLY | O_CLOEXEC);
	v = htole64(v);
	REQUIRE(fd >= 0 && pwrite(fd, &v, 8, (off_t)off) == 8 && close(fd) == 0, "pwrite %s", idx_path);
}

static void rewritten(void *ctx)
{
	(void)ctx;
	write_shard();
	struct megatron_shard *s = open_shard(false);
	uint64_t doc_idx = 34 + 12 * (uint64_t)S;
	/* A document's end far past S: not a read past the index. */
	put64(doc_idx + 8 * 11, UINT64_C(1) << 40);
	expect_stale(s, 10, false);
	/* A start after the end (a negative length). */
	put64(doc_idx + 8 * 11, 11);
	put64(doc_idx + 8 * 21, 25);
	expect_stale(s, 21, false);
	put64(doc_idx + 8 * 21, 21);
	/* A pointer past the .bin, a negative length: never a read outside it. */
	put64(34 + 4 * (uint64_t)S + 8 * 30, UINT64_C(1) << 50);
	int emitted = 0;
	CHECK_INT(megatron_doc_ranges(s, 30, 0, 1, no_emit, &emitted), -ESTALE);
	uint32_t neg = htole32(0xffffffffu);
	int fd = open(idx_path, O_WRONLY | O_CLOEXEC);
	REQUIRE(fd >= 0 && pwrite(fd, &neg, 4, 34 + 4 * 40) == 4 && close(fd) == 0, "pwrite");
	expect_stale(s, 40, false);
	CHECK_INT(emitted, 0);
	/* The untouched documents still read. */
	uint64_t t;
	char err[512];
	CHECK_INT(megatron_doc_tokens(s, 50, &t, err, sizeof(err)), 0);
	CHECK_INT(megatron_doc_ranges(s, 50, 0, 1, no_emit, &emitted), 0);
	megatron_free(s);
}

static void stopped(void *ctx)
{
	(void)ctx;
	write_shard();
	struct megatron_shard *s = open_shard(true);
	int stop = 1;
	uint64_t tokens;
	uint32_t nonempty;
	char err[512];
	CHECK_INT(megatron_scan(s, &stop, &tokens, &nonempty, err, sizeof(err)), -ECANCELED);
	stop = 0;
	CHECK_INT(megatron_scan(s, &stop, &tokens, &nonempty, err, sizeof(err)), 0);
	CHECK_U64(tokens, S);
	megatron_free(s);
}

/* The .bin's reads check the .idx too: a rewrite of the index in place (no lease, no watch) fails them. */
static void idx_checked_after_reads(void *ctx)
{
	(void)ctx;
	write_shard();
	struct megatron_shard *s = open_shard(false);
	struct source_reader *io;
	REQUIRE(source_reader_new(IO_ENGINE_AUTO, 8, &io) == 0, "source_reader_new failed");
	uint8_t buf[2];
	struct source_read req = { .src = s->bin, .offset = 0, .len = 2, .dst = buf };
	CHECK_INT(source_read(io, &req, 1, NULL), 0);
	struct timespec ms20 = { 0, 20 * 1000 * 1000 };
	nanosleep(&ms20, NULL); /* past the coarse clock's tick: the write moves ctime */
	put64(34 + 12 * (uint64_t)S, 0); /* the same bytes again: only the identity moves */
	CHECK_INT(source_read(io, &req, 1, NULL), -ESTALE);
	source_reader_free(io);
	megatron_free(s);
}

/* A SIGBUS outside any guard (or outside its range) still kills, as it did before the handler. */
static void unguarded(void)
{
	write_shard();
	struct mapguard g;
	mapguard_prepare(&g, NULL, 0); /* installs the handler */
	fflush(NULL);
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		int fd = open(idx_path, O_RDONLY | O_CLOEXEC);
		volatile const char *p = mmap(NULL, 65536, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED || ftruncate(open(idx_path, O_WRONLY | O_CLOEXEC), 0) < 0)
			_exit(3);
		(void)p[8192];
		_exit(0);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "unguarded fault: status %#x, expected death by SIGBUS", st);
}

int main(void)
{
	char tmpl[] = "/tmp/feedd-mapguard-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp: %s", strerror(errno));
	snprintf(dir, sizeof(dir), "%s", tmpl);
	snprintf(idx_path, sizeof(idx_path), "%s/s.idx", dir);
	snprintf(bin_path, sizeof(bin_path), "%s/s.bin", dir);

	unit_in_child("a lazily validated .idx truncated while mapped", truncated, (void *)1, 10);
	unit_in_child("a validated .idx truncated while mapped", truncated, NULL, 10);
	unit_in_child("a validated .idx rewritten in place (same size)", rewritten, NULL, 10);
	unit_in_child("the scan stops on its flag", stopped, NULL, 10);
	unit_in_child("a rewrite of the .idx fails the .bin's reads", idx_checked_after_reads, NULL, 10);
	unguarded();

	unlink(idx_path);
	unlink(bin_path);
	rmdir(dir);
	return unit_exit("test-mapguard");
}
