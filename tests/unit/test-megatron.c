/* SPDX-License-Identifier: MIT */
/*
 * Megatron shards (daemon/format/megatron.h) and the reads under them
 * (daemon/io/reader.h), on real .idx/.bin files written by a small writer
 * here. A valid shard reports its documents and tokens; every corruption is
 * refused with an error that names the file and the bad field, so an operator
 * can find it; a shard changed under the daemon is noticed; document byte
 * ranges and token widening are exact. Both I/O engines read large files
 * correctly and report a file that ends early.
 */
#include <endian.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/format/megatron.h"
#include "daemon/io/reader.h"
#include "unit.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static char dir[64];
static pid_t main_pid;
static struct source_reader *src; /* what megatron_open reads through */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void cleanup(void)
{
	if (dir[0] && getpid() == main_pid)
		nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- the writer ---- */

struct idx_spec {
	const char *magic;  /* 9 bytes; NULL: "MMIDIDX\0\0" */
	uint64_t version;   /* 0: 1 */
	uint8_t dtype;
	size_t S, D;        /* entries in the arrays below */
	int64_t S_field, D_field; /* what the header says; -1: S, D */
	const int32_t *lengths;
	const int64_t *pointers;
	const int64_t *doc_idx;
	bool modes;         /* append S mode bytes */
	long cut;           /* >= 0: truncate the .idx to this many bytes */
	long bin_bytes;     /* size of the .bin */
	bool no_bin;
};

static void put(FILE *f, const void *p, size_t n)
{
	REQUIRE(fwrite(p, 1, n, f) == n, "write failed");
}

static void put_u64(FILE *f, uint64_t v)
{
	v = htole64(v);
	put(f, &v, 8);
}

/* Token bytes of the .bin: a pattern, so reads can be checked. */
static uint8_t bin_byte(uint64_t i)
{
	return (uint8_t)(i * 131 + 7);
}

/* Writes dir/name.idx and dir/name.bin; returns the .idx path in path. */
static void write_shard(const char *name, const struct idx_spec *s, char *path, size_t cap)
{
	snprintf(path, cap, "%s/%s.idx", dir, name);
	FILE *f = fopen(path, "we");
	REQUIRE(f, "cannot create %s: %s", path, strerror(errno));
	put(f, s->magic ? s->magic : "MMIDIDX\0\0", 9);
	put_u64(f, s->version ? s->version : 1);
	put(f, &s->dtype, 1);
	put_u64(f, s->S_field >= 0 ? (uint64_t)s->S_field : s->S);
	put_u64(f, s->D_field >= 0 ? (uint64_t)s->D_field : s->D);
	for (size_t i = 0; i < s->S; i++) {
		uint32_t v = htole32((uint32_t)s->lengths[i]);
		put(f, &v, 4);
	}
	for (size_t i = 0; i < s->S; i++)
		put_u64(f, (uint64_t)s->pointers[i]);
	for (size_t i = 0; i < s->D; i++)
		put_u64(f, (uint64_t)s->doc_idx[i]);
	if (s->modes)
		for (size_t i = 0; i < s->S; i++)
			put(f, "\1", 1);
	REQUIRE(fclose(f) == 0, "cannot write %s", path);
	if (s->cut >= 0)
		REQUIRE(truncate(path, s->cut) == 0, "truncate %s: %s", path, strerror(errno));

	char bin[256];
	snprintf(bin, sizeof(bin), "%s/%s.bin", dir, name);
	unlink(bin);
	if (s->no_bin)
		return;
	f = fopen(bin, "we");
	REQUIRE(f, "cannot create %s: %s", bin, strerror(errno));
	for (long i = 0; i < s->bin_bytes; i++)
		fputc(bin_byte((uint64_t)i), f);
	REQUIRE(fclose(f) == 0, "cannot write %s", bin);
}

/*
 * The base shard, u16 tokens (itemsize 2): five sequences of 3, 2, 0, 4, 1
 * tokens laid out back to back in a 20-byte .bin; four documents:
 * doc 0 = sequences 0-1 (5 tokens), doc 1 = sequence 2 (empty),
 * doc 2 = no sequences (empty), doc 3 = sequences 3-4 (5 tokens).
 */
static const int32_t base_len[] = { 3, 2, 0, 4, 1 };
static const int64_t base_ptr[] = { 0, 6, 10, 10, 18 };
static const int64_t base_doc[] = { 0, 2, 3, 3, 5 };

static struct idx_spec base_spec(void)
{
	return (struct idx_spec){
		.dtype = 8,
		.S = 5,
		.D = 5,
		.S_field = -1,
		.D_field = -1,
		.lengths = base_len,
		.pointers = base_ptr,
		.doc_idx = base_doc,
		.cut = -1,
		.bin_bytes = 20,
	};
}

/* ---- valid shards ---- */

static void check_base(const char *what, const struct megatron_shard *s, const char *idx)
{
	static const uint32_t want_tokens[] = { 5, 0, 0, 5 };
	CHECK_STR(s->idx_path, idx);
	CHECK(s->bin_path && strlen(s->bin_path) == strlen(idx) && strcmp(s->bin_path + strlen(idx) - 4, ".bin") == 0 &&
		      strncmp(s->bin_path, idx, strlen(idx) - 4) == 0,
	      "%s: bin_path \"%s\" is not the .bin beside %s", what, s->bin_path, idx);
	CHECK(s->bin && strcmp(source_name(s->bin), s->bin_path) == 0, "%s: the .bin source is not %s", what,
	      s->bin_path);
	CHECK_U64(s->dtype, 8);
	CHECK_U64(s->itemsize, 2);
	CHECK_STR(megatron_dtype_name(s->dtype), "u16");
	CHECK_U64(s->n_seqs, 5);
	CHECK_U64(s->n_docs, 4);
	CHECK_U64(s->n_tokens, 10);
	CHECK_U64(s->n_nonempty, 2);
	CHECK(s->scanned && s->idx_mapped, "%s: the index is not mapped and validated at open", what);
	char err[256];
	for (uint32_t d = 0; d < 4 && d < s->n_docs; d++) {
		uint64_t t = UINT64_MAX;
		int r = megatron_doc_tokens(s, d, &t, err, sizeof(err));
		CHECK(r == 0 && t == want_tokens[d], "%s: document %u: %d, %" PRIu64 " tokens, expected %u", what, d, r,
		      t, want_tokens[d]);
	}
	for (size_t i = 0; i < 5; i++) {
		int32_t l;
		int64_t p;
		megatron_seq(s, i, &l, &p);
		CHECK(l == base_len[i] && p == base_ptr[i], "%s: sequence %zu read as (%d, %" PRId64 ")", what, i, l, p);
	}
	for (size_t i = 0; i < 5; i++)
		CHECK(megatron_doc_start(s, i) == base_doc[i], "%s: doc_idx[%zu] read as %" PRId64, what, i,
		      megatron_doc_start(s, i));
}

static void test_valid(void)
{
	char idx[256], err[512];
	struct idx_spec spec = base_spec();
	struct megatron_shard *s = NULL;

	write_shard("base", &spec, idx, sizeof(idx));
	int r = megatron_open(idx, src, &s, err, sizeof(err));
	CHECK(r == 0 && s, "base shard: megatron_open returned %d: %s", r, err);
	if (r == 0) {
		check_base("base shard", s, idx);
		CHECK_INT(megatron_check(s, err, sizeof(err)), 0);
		s = megatron_free(s);
	}

	/* The optional trailing mode bytes change nothing. */
	spec.modes = true;
	write_shard("modes", &spec, idx, sizeof(idx));
	r = megatron_open(idx, src, &s, err, sizeof(err));
	CHECK(r == 0 && s, "shard with mode bytes: megatron_open returned %d: %s", r, err);
	if (r == 0) {
		check_base("shard with mode bytes", s, idx);
		s = megatron_free(s);
	}

	/* i32 tokens, a gap between sequences, one document of three sequences, trailing .bin bytes. */
	static const int32_t len[] = { 2, 1, 3 };
	static const int64_t ptr[] = { 0, 12, 16 };
	static const int64_t doc[] = { 0, 3 };
	struct idx_spec w = { .dtype = 4, .S = 3, .D = 2, .S_field = -1, .D_field = -1, .lengths = len,
			      .pointers = ptr, .doc_idx = doc, .cut = -1, .bin_bytes = 40 };
	write_shard("i32", &w, idx, sizeof(idx));
	r = megatron_open(idx, src, &s, err, sizeof(err));
	CHECK(r == 0 && s, "i32 shard: megatron_open returned %d: %s", r, err);
	if (r == 0) {
		CHECK_U64(s->itemsize, 4);
		CHECK_U64(s->n_docs, 1);
		uint64_t t = 0;
		CHECK_INT(megatron_doc_tokens(s, 0, &t, err, sizeof(err)), 0);
		CHECK_U64(t, 6);
		CHECK_U64(s->n_tokens, 6);
		CHECK_U64(s->n_nonempty, 1);
		s = megatron_free(s);
	}

	/* An empty shard: no sequences, no documents. */
	static const int64_t only0[] = { 0 };
	struct idx_spec e = { .dtype = 1, .S = 0, .D = 1, .S_field = -1, .D_field = -1, .doc_idx = only0, .cut = -1,
			      .bin_bytes = 0 };
	write_shard("empty", &e, idx, sizeof(idx));
	r = megatron_open(idx, src, &s, err, sizeof(err));
	CHECK(r == 0 && s, "empty shard: megatron_open returned %d: %s", r, err);
	if (r == 0) {
		CHECK_U64(s->n_docs, 0);
		CHECK_U64(s->n_tokens, 0);
		s = megatron_free(s);
	}
	CHECK(megatron_free(NULL) == NULL, "megatron_free(NULL)");
}

/* ---- corrupt shards ---- */

/* True when text contains one of the '|'-separated alternatives. */
static bool mentions(const char *text, const char *alternatives)
{
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", alternatives);
	char *save = NULL;
	for (char *a = strtok_r(buf, "|", &save); a; a = strtok_r(NULL, "|", &save))
		if (strstr(text, a))
			return true;
	return false;
}

/*
 * Opens the shard and expects `code`, and an error naming the .idx, `needle`
 * (alternatives separated by '|') and, when given, `needle2`.
 */
static void open_bad(const char *what, const struct idx_spec *spec, int code, const char *needle,
		     const char *needle2)
{
	char idx[256], err[512] = "";
	struct megatron_shard *s = (struct megatron_shard *)(uintptr_t)1; /* must stay untouched */
	write_shard("bad", spec, idx, sizeof(idx));
	int r = megatron_open(idx, src, &s, err, sizeof(err));
	CHECK(r == code, "%s: megatron_open returned %d (%s), expected %d; error \"%s\"", what, r,
	      r < 0 ? strerror(-r) : "success", code, err);
	if (r == 0) {
		megatron_free(s);
		return;
	}
	CHECK(s == (struct megatron_shard *)(uintptr_t)1, "%s: *ret written on failure", what);
	CHECK(strstr(err, idx), "%s: error \"%s\" does not name the file %s", what, err, idx);
	CHECK(mentions(err, needle), "%s: error \"%s\" does not name \"%s\"", what, err, needle);
	CHECK(!needle2 || strstr(err, needle2), "%s: error \"%s\" does not name \"%s\"", what, err, needle2);

	/*
	 * Opened lazily (no scan budget), the same fault is found: at open (the
	 * header, the size, the ends of the document index), else by the scan
	 * with the same words, and by the per-document check of some document.
	 */
	uint64_t budget = 0, tokens;
	uint32_t nonempty;
	char lazy[512] = "", doc_err[512] = "";
	r = megatron_open_budget(idx, src, &budget, &s, lazy, sizeof(lazy));
	if (r < 0) {
		CHECK(r == code && strcmp(lazy, err) == 0, "%s: lazy open: %d \"%s\", expected \"%s\"", what, r, lazy, err);
		return;
	}
	CHECK(!s->scanned, "%s: scanned at open with no budget", what);
	r = megatron_scan(s, NULL, &tokens, &nonempty, lazy, sizeof(lazy));
	CHECK(r == code && strcmp(lazy, err) == 0, "%s: megatron_scan: %d \"%s\", expected \"%s\"", what, r, lazy, err);
	bool found = false;
	for (uint32_t d = 0; d < s->n_docs && !found; d++)
		found = megatron_doc_tokens(s, d, &tokens, doc_err, sizeof(doc_err)) == -EBADMSG;
	/* A fault in a sequence no document covers is only the scan's to find. */
	CHECK(found || strstr(err, "sequence") || strstr(err, "pointers[") || strstr(err, "lengths["),
	      "%s: no document's check found the fault \"%s\"", what, err);
	CHECK(!found || strstr(doc_err, idx), "%s: per-document error \"%s\" does not name the file", what, doc_err);
	megatron_free(s);
}

static void test_corrupt(void)
{
	struct idx_spec s;
	int32_t len[5];
	int64_t ptr[5], doc[5];
#define RESET()                                             \
	do {                                                \
		s = base_spec();                            \
		memcpy(len, base_len, sizeof(len));         \
		memcpy(ptr, base_ptr, sizeof(ptr));         \
		memcpy(doc, base_doc, sizeof(doc));         \
		s.lengths = len;                            \
		s.pointers = ptr;                           \
		s.doc_idx = doc;                            \
	} while (0)

	RESET();
	s.cut = 20;
	open_bad("header cut at 20 bytes", &s, -EBADMSG, "header", NULL);
	s.cut = 0;
	open_bad("empty .idx", &s, -EBADMSG, "header", NULL);
	RESET();
	s.magic = "MMIDIDY\0\0";
	open_bad("bad magic", &s, -EBADMSG, "magic", NULL);
	RESET();
	s.version = 2;
	open_bad("version 2", &s, -EBADMSG, "version", NULL);
	RESET();
	s.dtype = 9;
	open_bad("dtype code 9", &s, -EBADMSG, "dtype", NULL);
	s.dtype = 0;
	open_bad("dtype code 0", &s, -EBADMSG, "dtype", NULL);
	s.dtype = 255;
	open_bad("dtype code 255", &s, -EBADMSG, "dtype", NULL);
	s.dtype = 7;
	open_bad("float32 dtype", &s, -EBADMSG, "dtype", NULL);
	s.dtype = 6;
	open_bad("float64 dtype", &s, -EBADMSG, "dtype", NULL);

	RESET();
	s.S_field = 6; /* arrays for 5 */
	open_bad("S one too many", &s, -EBADMSG, "size", NULL);
	RESET();
	s.D_field = 4;
	open_bad("D one too few", &s, -EBADMSG, "size", NULL);
	RESET();
	s.cut = 34 + 12 * 5 + 8 * 5 + 2; /* mode bytes, but only 2 of 5 */
	s.modes = true;
	open_bad(".idx with partial mode bytes", &s, -EBADMSG, "size", NULL);
	RESET();
	s.S_field = (int64_t)(UINT64_MAX / 4); /* would overflow a naive size formula */
	open_bad("huge S", &s, -EBADMSG, "S=", NULL);
	RESET();
	s.D = 0;
	open_bad("D = 0", &s, -EBADMSG, "D=0", NULL);

	RESET();
	len[2] = -1;
	open_bad("negative length", &s, -EBADMSG, "lengths[2]", NULL);
	RESET();
	len[0] = INT32_MIN;
	open_bad("INT32_MIN length", &s, -EBADMSG, "lengths[0]", NULL);
	RESET();
	ptr[1] = 7;
	open_bad("odd pointer for u16", &s, -EBADMSG, "pointers[1]", NULL);
	RESET();
	ptr[3] = -2;
	open_bad("negative pointer", &s, -EBADMSG, "pointers[3]", NULL);
	RESET();
	ptr[1] = 4; /* sequence 0 covers bytes 0..5 */
	open_bad("overlapping pointers", &s, -EBADMSG, "pointers[1]", NULL);
	RESET();
	ptr[4] = 20; /* 1 token at 20 ends at 22 > 20 */
	open_bad("sequence past the .bin", &s, -EBADMSG, "sequence 4|pointers[4]", ".bin");
	RESET();
	s.bin_bytes = 19;
	open_bad(".bin one byte short", &s, -EBADMSG, "sequence 4|pointers[4]", ".bin");
	RESET();
	ptr[4] = INT64_MAX - 1; /* even, so only the end check can catch it */
	open_bad("pointer near INT64_MAX", &s, -EBADMSG, "sequence 4|pointers[4]", ".bin");

	RESET();
	doc[0] = 1;
	open_bad("doc_idx[0] = 1", &s, -EBADMSG, "doc_idx[0]", NULL);
	RESET();
	doc[2] = 1; /* 0 2 1 3 5 */
	open_bad("doc_idx going down", &s, -EBADMSG, "doc_idx[2]", NULL);
	RESET();
	doc[4] = 4;
	open_bad("last doc_idx != S", &s, -EBADMSG, "doc_idx[4]", NULL);
	RESET();
	doc[4] = 6;
	open_bad("last doc_idx > S", &s, -EBADMSG, "doc_idx[4]", NULL);

	RESET();
	s.no_bin = true;
	char idx[256], err[512] = "";
	struct megatron_shard *sh = NULL;
	write_shard("nobin", &s, idx, sizeof(idx));
	int r = megatron_open(idx, src, &sh, err, sizeof(err));
	CHECK_INT(r, -ENOENT);
	CHECK_CONTAINS(err, "nobin.bin");
	if (r == 0)
		megatron_free(sh);

	/* Not a .idx path at all: refused before anything is opened. */
	RESET();
	write_shard("named", &s, idx, sizeof(idx));
	char other[300];
	snprintf(other, sizeof(other), "%s/named.bin", dir);
	r = megatron_open(other, src, &sh, err, sizeof(err));
	CHECK_INT(r, -EINVAL);
	CHECK_CONTAINS(err, other);
	snprintf(other, sizeof(other), "%s/named.idx.gz", dir);
	r = megatron_open(other, src, &sh, err, sizeof(err));
	CHECK_INT(r, -EINVAL);
	r = megatron_open("idx", src, &sh, err, sizeof(err));
	CHECK_INT(r, -EINVAL);
	snprintf(other, sizeof(other), "%s/missing.idx", dir);
	r = megatron_open(other, src, &sh, err, sizeof(err));
	CHECK_INT(r, -ENOENT);
	CHECK_CONTAINS(err, "missing.idx");
#undef RESET
}

/*
 * doc_idx that is not monotone, with an entry far beyond S before the entry
 * that goes down: 0, 1000000000, 3, 3, 5. The bad entry must be reported as
 * such; the documents' sequence ranges must never be walked before every
 * doc_idx entry is known to lie inside 0..S.
 */
static void doc_idx_far_past_s(void *ctx)
{
	/* The parent's io_uring must not be driven from a child: use a reader of our own. */
	REQUIRE(source_reader_new(IO_ENGINE_PREAD, 8, &src) == 0, "source_reader_new failed");
	struct idx_spec s = base_spec();
	static const int64_t doc[] = { 0, 1000000000, 3, 3, 5 };
	s.doc_idx = doc;
	open_bad("doc_idx[1] = 1e9 (not monotone, far past S)", &s, -EBADMSG, "doc_idx[", NULL);
}

/* ---- megatron_check ---- */

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ms * 1000000 };
	nanosleep(&ts, NULL);
}

static void test_check(void)
{
	char idx[256], bin[256], err[512];
	struct idx_spec spec = base_spec();
	struct megatron_shard *s = NULL;

	/* Truncated .bin. */
	write_shard("chk", &spec, idx, sizeof(idx));
	snprintf(bin, sizeof(bin), "%s/chk.bin", dir);
	REQUIRE(megatron_open(idx, src, &s, err, sizeof(err)) == 0, "open: %s", err);
	CHECK_INT(megatron_check(s, err, sizeof(err)), 0);
	REQUIRE(truncate(bin, 10) == 0, "truncate: %s", strerror(errno));
	err[0] = 0;
	CHECK_INT(megatron_check(s, err, sizeof(err)), -ESTALE);
	CHECK_CONTAINS(err, bin);
	s = megatron_free(s);

	/* .bin rewritten in place: same inode, same size, new contents. */
	write_shard("chk", &spec, idx, sizeof(idx));
	REQUIRE(megatron_open(idx, src, &s, err, sizeof(err)) == 0, "open: %s", err);
	sleep_ms(20); /* past the file system's timestamp granularity */
	int fd = open(bin, O_WRONLY | O_CLOEXEC);
	REQUIRE(fd >= 0, "open %s: %s", bin, strerror(errno));
	REQUIRE(pwrite(fd, "\xff\xff", 2, 4) == 2, "pwrite: %s", strerror(errno));
	close(fd);
	CHECK_INT(megatron_check(s, err, sizeof(err)), -ESTALE);
	s = megatron_free(s);

	/* .idx replaced by another file (rename over it). */
	write_shard("chk", &spec, idx, sizeof(idx));
	REQUIRE(megatron_open(idx, src, &s, err, sizeof(err)) == 0, "open: %s", err);
	char tmp[300];
	write_shard("chk2", &spec, tmp, sizeof(tmp));
	REQUIRE(rename(tmp, idx) == 0, "rename: %s", strerror(errno));
	err[0] = 0;
	CHECK_INT(megatron_check(s, err, sizeof(err)), -ESTALE);
	CHECK_CONTAINS(err, idx);
	s = megatron_free(s);

	/* .bin deleted. */
	write_shard("chk", &spec, idx, sizeof(idx));
	REQUIRE(megatron_open(idx, src, &s, err, sizeof(err)) == 0, "open: %s", err);
	REQUIRE(unlink(bin) == 0, "unlink: %s", strerror(errno));
	CHECK_INT(megatron_check(s, err, sizeof(err)), -ESTALE);
	s = megatron_free(s);
}

/* ---- document ranges and widening ---- */

struct ranges {
	size_t n;
	uint64_t off[8], count[8];
	int fail_at; /* return -EIO at this call; -1: never */
};

static int collect(void *ctx, uint64_t byte_offset, uint64_t n_tokens)
{
	struct ranges *r = ctx;
	if ((int)r->n == r->fail_at)
		return -EIO;
	if (r->n < 8) {
		r->off[r->n] = byte_offset;
		r->count[r->n] = n_tokens;
	}
	r->n++;
	return 0;
}

static void check_ranges(const struct megatron_shard *s, uint32_t doc, uint64_t offset, uint64_t count, int code,
			 size_t n, const uint64_t *off, const uint64_t *cnt)
{
	struct ranges got = { .fail_at = -1 };
	int r = megatron_doc_ranges(s, doc, offset, count, collect, &got);
	CHECK(r == code, "doc %u offset %" PRIu64 " count %" PRIu64 ": returned %d, expected %d", doc, offset, count,
	      r, code);
	if (code < 0)
		return;
	CHECK(got.n == n, "doc %u offset %" PRIu64 " count %" PRIu64 ": %zu ranges, expected %zu", doc, offset, count,
	      got.n, n);
	for (size_t i = 0; i < n && i < got.n; i++)
		CHECK(got.off[i] == off[i] && got.count[i] == cnt[i],
		      "doc %u offset %" PRIu64 " count %" PRIu64 ": range %zu = (byte %" PRIu64 ", %" PRIu64
		      " tokens), expected (%" PRIu64 ", %" PRIu64 ")",
		      doc, offset, count, i, got.off[i], got.count[i], off[i], cnt[i]);
}

static void test_ranges(void)
{
	char idx[256], err[512];
	struct idx_spec spec = base_spec();
	struct megatron_shard *s = NULL;
	write_shard("ranges", &spec, idx, sizeof(idx));
	REQUIRE(megatron_open(idx, src, &s, err, sizeof(err)) == 0, "open: %s", err);

	/* doc 0 = seq 0 (3 tokens at byte 0) + seq 1 (2 tokens at byte 6). */
	check_ranges(s, 0, 0, 5, 0, 2, (const uint64_t[]){ 0, 6 }, (const uint64_t[]){ 3, 2 });
	check_ranges(s, 0, 1, 4, 0, 2, (const uint64_t[]){ 2, 6 }, (const uint64_t[]){ 2, 2 });
	check_ranges(s, 0, 1, 1, 0, 1, (const uint64_t[]){ 2 }, (const uint64_t[]){ 1 });
	check_ranges(s, 0, 3, 2, 0, 1, (const uint64_t[]){ 6 }, (const uint64_t[]){ 2 });
	check_ranges(s, 0, 4, 1, 0, 1, (const uint64_t[]){ 8 }, (const uint64_t[]){ 1 });
	check_ranges(s, 0, 2, 2, 0, 2, (const uint64_t[]){ 4, 6 }, (const uint64_t[]){ 1, 1 });
	/* doc 3 = seq 3 (4 tokens at byte 10) + seq 4 (1 token at byte 18). */
	check_ranges(s, 3, 0, 5, 0, 2, (const uint64_t[]){ 10, 18 }, (const uint64_t[]){ 4, 1 });
	check_ranges(s, 3, 2, 3, 0, 2, (const uint64_t[]){ 14, 18 }, (const uint64_t[]){ 2, 1 });
	check_ranges(s, 3, 4, 1, 0, 1, (const uint64_t[]){ 18 }, (const uint64_t[]){ 1 });
	check_ranges(s, 3, 0, 0, 0, 0, NULL, NULL);
	/* More than the document holds is an error, not a silent short read. */
	check_ranges(s, 0, 0, 6, -EINVAL, 0, NULL, NULL);
	check_ranges(s, 3, 4, 2, -EINVAL, 0, NULL, NULL);
	check_ranges(s, 1, 0, 1, -EINVAL, 0, NULL, NULL);

	/* The callback's error stops the walk and comes back. */
	struct ranges got = { .fail_at = 1 };
	CHECK_INT(megatron_doc_ranges(s, 0, 0, 5, collect, &got), -EIO);
	CHECK_U64(got.n, 1);
	megatron_free(s);
}

static void test_widen(void)
{
	int32_t out[8];
	size_t bad;
	uint8_t raw[64];

	/* u8: every value fits. */
	static const uint8_t u8[] = { 0, 1, 127, 255 };
	CHECK_INT(megatron_widen(1, u8, 4, out, &bad), 0);
	CHECK(out[0] == 0 && out[1] == 1 && out[2] == 127 && out[3] == 255, "u8 widened wrongly");

	/* i8: negative ids are out of range. */
	static const int8_t i8[] = { 5, 127, -1 };
	bad = 99;
	CHECK_INT(megatron_widen(2, i8, 2, out, &bad), 0);
	CHECK(out[0] == 5 && out[1] == 127, "i8 widened wrongly");
	CHECK_INT(megatron_widen(2, i8, 3, out, &bad), -ERANGE);
	CHECK_U64(bad, 2);

	/* i16, little-endian: 1, 32767, then -2. */
	uint16_t i16[3] = { htole16(1), htole16(32767), htole16((uint16_t)-2) };
	memcpy(raw, i16, sizeof(i16));
	CHECK_INT(megatron_widen(3, raw, 2, out, &bad), 0);
	CHECK(out[0] == 1 && out[1] == 32767, "i16 widened wrongly: %d %d", out[0], out[1]);
	bad = 99;
	CHECK_INT(megatron_widen(3, raw, 3, out, &bad), -ERANGE);
	CHECK_U64(bad, 2);
	/* A negative i16 first. */
	uint16_t neg = htole16(0x8000);
	bad = 99;
	CHECK_INT(megatron_widen(3, &neg, 1, out, &bad), -ERANGE);
	CHECK_U64(bad, 0);

	/* u16: 65535 is a valid id (it would be -1 as i16). */
	uint16_t u16[2] = { htole16(65535), htole16(50257) };
	CHECK_INT(megatron_widen(8, u16, 2, out, &bad), 0);
	CHECK(out[0] == 65535 && out[1] == 50257, "u16 widened wrongly: %d %d", out[0], out[1]);

	/* i32. */
	uint32_t i32[3] = { htole32(0), htole32(INT32_MAX), htole32((uint32_t)-5) };
	CHECK_INT(megatron_widen(4, i32, 2, out, &bad), 0);
	CHECK(out[0] == 0 && out[1] == INT32_MAX, "i32 widened wrongly");
	bad = 99;
	CHECK_INT(megatron_widen(4, i32, 3, out, &bad), -ERANGE);
	CHECK_U64(bad, 2);

	/* i64: INT32_MAX fits, one more does not; nor does a negative. */
	uint64_t i64[4] = { htole64(7), htole64(INT32_MAX), htole64((uint64_t)INT32_MAX + 1), htole64(1) };
	CHECK_INT(megatron_widen(5, i64, 2, out, &bad), 0);
	CHECK(out[0] == 7 && out[1] == INT32_MAX, "i64 widened wrongly");
	bad = 99;
	CHECK_INT(megatron_widen(5, i64, 4, out, &bad), -ERANGE);
	CHECK_U64(bad, 2);
	uint64_t i64n[2] = { htole64(3), htole64((uint64_t)-1) };
	bad = 99;
	CHECK_INT(megatron_widen(5, i64n, 2, out, &bad), -ERANGE);
	CHECK_U64(bad, 1);
	uint64_t i64big = htole64(UINT64_C(1) << 32); /* low half 0: truncation would pass it */
	CHECK_INT(megatron_widen(5, &i64big, 1, out, &bad), -ERANGE);

	/* Float and unknown codes are not token types. */
	CHECK_INT(megatron_widen(7, raw, 1, out, &bad), -EINVAL);
	CHECK_INT(megatron_widen(6, raw, 1, out, &bad), -EINVAL);
	CHECK_INT(megatron_widen(9, raw, 1, out, &bad), -EINVAL);
	CHECK_INT(megatron_widen(0, raw, 1, out, &bad), -EINVAL);

	static const struct {
		uint8_t code;
		const char *name;
	} names[] = { { 1, "u8" }, { 2, "i8" }, { 3, "i16" }, { 4, "i32" }, { 5, "i64" }, { 8, "u16" } };
	for (size_t i = 0; i < ARRAY_LEN(names); i++)
		CHECK_STR(megatron_dtype_name(names[i].code), names[i].name);
	CHECK(megatron_dtype_name(9) == NULL && megatron_dtype_name(0) == NULL, "unknown dtype codes have names");
}

/* ---- I/O engines ---- */

#define BIG ((size_t)(3u << 20) + (512u << 10) + 123) /* 3.5 MiB + 123: several 1 MiB chunks and a tail */

static void check_engine(enum io_engine engine, const char *path, const uint8_t *want)
{
	struct io_reader *r = NULL;
	int e = io_reader_new(engine, 8, &r);
	CHECK(e == 0, "io_reader_new(%d) returned %d", engine, e);
	if (e < 0)
		return;
	const char *name = io_reader_engine(r);
	if (engine == IO_ENGINE_PREAD)
		CHECK_STR(name, "pread");
	if (engine == IO_ENGINE_AUTO && strcmp(name, "io_uring") != 0)
		printf("note: io_uring unavailable here (%s); AUTO runs on pread\n",
		       strerror(-io_reader_fallback(r)));
	if (engine == IO_ENGINE_AUTO)
		CHECK(strcmp(name, "io_uring") == 0 ? io_reader_fallback(r) == 0 : io_reader_fallback(r) < 0,
		      "AUTO on %s reports fallback %d", name, io_reader_fallback(r));

	int fd = open(path, O_RDONLY | O_CLOEXEC);
	REQUIRE(fd >= 0, "open %s: %s", path, strerror(errno));

	/* The whole file, a large unaligned piece, the tail, an empty read, and many small ones (more than depth). */
	enum { N = 24 };
	struct io_req reqs[N];
	uint8_t *bufs[N];
	size_t n = 0;
	const struct {
		uint64_t off;
		size_t len;
	} shape[] = { { 0, BIG }, { 1, (2u << 20) + 5 }, { BIG - 100, 100 }, { 17, 0 }, { (1u << 20) - 1, 2 } };
	for (size_t i = 0; i < ARRAY_LEN(shape); i++, n++)
		reqs[n] = (struct io_req){ .fd = fd, .offset = shape[i].off, .len = shape[i].len };
	for (; n < N; n++)
		reqs[n] = (struct io_req){ .fd = fd, .offset = n * 40961, .len = 4096 + n };
	uint64_t total = 0;
	for (size_t i = 0; i < N; i++) {
		bufs[i] = malloc(reqs[i].len + 1);
		REQUIRE(bufs[i], "out of memory");
		memset(bufs[i], 0xee, reqs[i].len);
		reqs[i].dst = bufs[i];
		total += reqs[i].len;
	}
	size_t failed = 12345;
	e = io_reader_run(r, reqs, N, &failed);
	CHECK(e == 0, "%s: io_reader_run returned %d (request %zu)", name, e, failed);
	for (size_t i = 0; i < N && e == 0; i++)
		CHECK(memcmp(bufs[i], want + reqs[i].offset, reqs[i].len) == 0,
		      "%s: request %zu (offset %" PRIu64 ", %zu bytes) read wrong bytes", name, i, reqs[i].offset,
		      reqs[i].len);
	CHECK(e < 0 || io_reader_stats(r)->bytes == total, "%s: stats say %" PRIu64 " bytes, %" PRIu64 " were read",
	      name, io_reader_stats(r)->bytes, total);
	for (size_t i = 0; i < N; i++)
		free(bufs[i]);

	/* A request past the end of the file: -ENODATA, and which request it was. */
	uint8_t a[64], b[128], c[64];
	struct io_req eof[3] = {
		{ .fd = fd, .offset = 0, .len = sizeof(a), .dst = a },
		{ .fd = fd, .offset = BIG - 28, .len = sizeof(b), .dst = b },
		{ .fd = fd, .offset = 4096, .len = sizeof(c), .dst = c },
	};
	failed = 12345;
	CHECK_INT(io_reader_run(r, eof, 3, &failed), -ENODATA);
	CHECK_U64(failed, 1);
	struct io_req beyond = { .fd = fd, .offset = BIG + 4096, .len = 10, .dst = a };
	failed = 12345;
	CHECK_INT(io_reader_run(r, &beyond, 1, &failed), -ENODATA);
	CHECK_U64(failed, 0);
	/* The reader still works after a failure. */
	struct io_req again = { .fd = fd, .offset = 5, .len = sizeof(a), .dst = a };
	CHECK_INT(io_reader_run(r, &again, 1, NULL), 0);
	CHECK(memcmp(a, want + 5, sizeof(a)) == 0, "%s: read after a failure gave wrong bytes", name);

	/* The whole-file helper, and a file that is shorter than its caller believes. */
	void *all = NULL;
	CHECK_INT(io_reader_read_file(r, fd, BIG, &all), 0);
	CHECK(all && memcmp(all, want, BIG) == 0, "%s: io_reader_read_file read wrong bytes", name);
	free(all);
	all = NULL;
	CHECK_INT(io_reader_read_file(r, fd, BIG + 1, &all), -ENODATA);
	close(fd);

	/* A bad fd is the read's own error. */
	struct io_req badfd = { .fd = 9999, .offset = 0, .len = 8, .dst = a };
	CHECK_INT(io_reader_run(r, &badfd, 1, &failed), -EBADF);
	io_reader_free(r);
}

static void test_io(void)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/big.bin", dir);
	uint8_t *want = malloc(BIG);
	REQUIRE(want, "out of memory");
	for (size_t i = 0; i < BIG; i++)
		want[i] = (uint8_t)((i * 2654435761u) >> 13);
	FILE *f = fopen(path, "we");
	REQUIRE(f && fwrite(want, 1, BIG, f) == BIG && fclose(f) == 0, "cannot write %s", path);

	check_engine(IO_ENGINE_PREAD, path, want);
	check_engine(IO_ENGINE_AUTO, path, want);
	free(want);
	CHECK(io_reader_free(NULL) == NULL, "io_reader_free(NULL)");
}

int main(void)
{
	char tmpl[] = "/tmp/feedd-megatron-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp: %s", strerror(errno));
	snprintf(dir, sizeof(dir), "%s", tmpl);
	main_pid = getpid();
	atexit(cleanup);
	REQUIRE(source_reader_new(IO_ENGINE_AUTO, 8, &src) == 0, "source_reader_new failed");

	test_valid();
	test_corrupt();
	unit_in_child("megatron_open with doc_idx 0, 1e9, 3, 3, 5", doc_idx_far_past_s, NULL, 3);
	test_check();
	test_ranges();
	test_widen();
	test_io();

	src = source_reader_free(src);
	return unit_exit("test-megatron");
}
