/* SPDX-License-Identifier: MIT */
/*
 * A large mapped .idx read at random places (daemon/format/megatron_cold.c):
 * on a cold index the walk's prefetch asks the kernel for the pages a
 * document will need (MADV_WILLNEED) instead of leaving them to page faults
 * that read 8 MiB around each; on a cached index it asks for nothing, so a
 * warm start makes no system call per page. Real files: a shard written
 * here, dropped from the page cache or read into it.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "daemon/format/megatron.h"
#include "daemon/io/reader.h"
#include "unit.h"

#define N_DOCS 400000u /* one sequence each: 8 MB of index, ~2,000 pages */

static char idx_path[96], bin_path[96];

static void put(FILE *f, const void *p, size_t n)
{
	REQUIRE(fwrite(p, 1, n, f) == n, "write failed");
}

static void write_shard(void)
{
	FILE *f = fopen(idx_path, "we");
	REQUIRE(f, "cannot write %s: %s", idx_path, strerror(errno));
	put(f, "MMIDIDX\0\0", 9);
	uint64_t v = 1, s = N_DOCS, d = N_DOCS + 1;
	put(f, &v, 8);
	put(f, &(uint8_t){ 8 }, 1); /* u16 */
	put(f, &s, 8);
	put(f, &d, 8);
	for (uint32_t i = 0; i < N_DOCS; i++)
		put(f, &(int32_t){ 1 + (int32_t)(i % 5) }, 4);
	int64_t at = 0;
	for (uint32_t i = 0; i < N_DOCS; i++) {
		put(f, &at, 8);
		at += 2 * (1 + i % 5);
	}
	for (uint64_t i = 0; i <= N_DOCS; i++)
		put(f, &i, 8);
	REQUIRE(fflush(f) == 0 && fsync(fileno(f)) == 0 && fclose(f) == 0, "cannot write %s", idx_path);
	int fd = open(bin_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	REQUIRE(fd >= 0 && ftruncate(fd, at) == 0 && close(fd) == 0, "cannot write %s", bin_path);
}

/* Pages of the .idx in the page cache. */
static size_t resident(void)
{
	int fd = open(idx_path, O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0, "open %s", idx_path);
	struct stat st;
	REQUIRE(fstat(fd, &st) == 0, "fstat");
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	REQUIRE(p != MAP_FAILED, "mmap");
	size_t page = (size_t)sysconf(_SC_PAGESIZE), n = ((size_t)st.st_size + page - 1) / page, in = 0;
	unsigned char *vec = malloc(n);
	REQUIRE(vec && mincore(p, (size_t)st.st_size, vec) == 0, "mincore");
	for (size_t i = 0; i < n; i++)
		in += vec[i] & 1;
	free(vec);
	munmap(p, (size_t)st.st_size);
	close(fd);
	return in;
}

/* Opens the shard lazily (as a large one: validated by the scanner) and warms 64 documents spread over it. */
static struct megatron_shard *open_and_walk(struct source_reader *src, uint64_t *ret_sum)
{
	char err[512];
	uint64_t budget = 0, sum = 0;
	struct megatron_shard *s = NULL;
	REQUIRE(megatron_open_budget(idx_path, src, &budget, &s, err, sizeof(err)) == 0, "open: %s", err);
	CHECK(!s->scanned && s->cold, "a lazily opened mapped shard is read cold (scanned %d, bitmap %p)", s->scanned,
	      (void *)s->cold);
	for (uint32_t k = 0; k < 64; k++) {
		uint32_t doc = (uint32_t)((uint64_t)k * 2654435761u % N_DOCS);
		megatron_doc_prefetch(s, doc, 0);
		megatron_doc_prefetch(s, doc, 1);
		uint64_t t = 0;
		int r = megatron_doc_tokens(s, doc, &t, err, sizeof(err));
		CHECK(r == 0, "document %u: %d %s", doc, r, err);
		CHECK_U64(t, 1 + doc % 5);
		sum += t;
	}
	*ret_sum = sum;
	return s;
}

int main(void)
{
	char tmpl[] = "/tmp/feedd-megatron-cold-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp: %s", strerror(errno));
	snprintf(idx_path, sizeof(idx_path), "%s/s.idx", tmpl);
	snprintf(bin_path, sizeof(bin_path), "%s/s.bin", tmpl);
	write_shard();
	struct source_reader *src = NULL;
	REQUIRE(source_reader_new(IO_ENGINE_AUTO, 8, &src) == 0, "source_reader_new failed");

	/* Cached: every page of the index in the page cache; nothing is asked for. */
	char buf[1 << 16];
	int fd = open(idx_path, O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0, "open %s", idx_path);
	while (read(fd, buf, sizeof(buf)) > 0)
		;
	uint64_t warm_sum, cold_sum;
	struct megatron_shard *s = open_and_walk(src, &warm_sum);
	CHECK(s->cold_asked[2] >= 30, "cached index: %" PRIu64 " of %" PRIu64 " probed pages found cached",
	      s->cold_asked[2], s->cold_asked[1]);
	CHECK_U64(s->cold_asked[0], 0); /* no page asked for */
	s = megatron_free(s);

	/* Cold: dropped from the page cache (where the file system can); its pages are asked for. */
	REQUIRE(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0, "fadvise");
	close(fd);
	size_t in = resident();
	if (in > 8) {
		fprintf(stderr, "SKIP cold part: %zu pages of %s stay cached after POSIX_FADV_DONTNEED\n", in, idx_path);
	} else {
		s = open_and_walk(src, &cold_sum);
		CHECK(s->cold_asked[2] < 30, "cold index taken as cached (%" PRIu64 " of %" PRIu64 " probes)",
		      s->cold_asked[2], s->cold_asked[1]);
		CHECK(s->cold_asked[0] >= 64, "cold index: %" PRIu64 " pages asked for by 64 documents", s->cold_asked[0]);
		/* Single pages, not read-arounds: far less of the 8 MB index is read than a fault's read-around would. */
		in = resident();
		CHECK(in < 1024, "%zu pages of the index read for 64 documents", in);
		CHECK_U64(cold_sum, warm_sum);
		s = megatron_free(s);
	}
	src = source_reader_free(src);
	unlink(idx_path);
	unlink(bin_path);
	rmdir(tmpl);
	return unit_exit("test-megatron-cold");
}
