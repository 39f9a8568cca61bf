/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: Megatron .idx validation (megatron_open in
 * daemon/format/megatron.c), the first thing feedd does with a shard.
 *
 * Input: u64 little-endian size of the .bin (taken modulo 1 GiB; the file is
 * sparse), then the .idx bytes. Both are written to a private temporary
 * directory and opened through the real path-based entry point, with the
 * pread engine. Promises checked for an accepted shard: every document's
 * byte ranges lie inside the .bin, the per-document token counts add up,
 * and the shard is unchanged on disk (megatron_check). A refused one must
 * come with a message naming the .idx file.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/format/megatron.h"
#include "daemon/source/source.h"
#include "tests/fuzz/fuzz.h"

static char dir[64], idx_path[128], bin_path[128];
static struct source_reader *io;

static void cleanup(void)
{
	unlink(idx_path);
	unlink(bin_path);
	rmdir(dir);
	io = source_reader_free(io);
}

unsigned long fuzz_accepted;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(dir, sizeof(dir), "%s/fuzz-idx-XXXXXX", tmp);
	if (!mkdtemp(dir) || source_reader_new(IO_ENGINE_PREAD, 8, &io) < 0) {
		perror("fuzz-idx: setup");
		abort();
	}
	snprintf(idx_path, sizeof(idx_path), "%s/shard.idx", dir);
	snprintf(bin_path, sizeof(bin_path), "%s/shard.bin", dir);
	atexit(cleanup);
	return 0;
}

static void write_file(const char *path, const void *p, size_t n, off_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert(fd >= 0);
	assert(write(fd, p, n) == (ssize_t)n);
	assert(ftruncate(fd, size) == 0);
	close(fd);
}

struct range_check {
	const struct megatron_shard *s;
	uint64_t tokens;
};

static int emit(void *ctx, uint64_t byte_offset, uint64_t n_tokens)
{
	struct range_check *rc = ctx;
	assert(n_tokens > 0);
	assert(byte_offset + n_tokens * rc->s->itemsize <= (uint64_t)rc->s->bin_id.size);
	rc->tokens += n_tokens;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 8)
		return 0;
	uint64_t bin_size;
	memcpy(&bin_size, data, 8);
	bin_size %= UINT64_C(1) << 30;
	write_file(idx_path, data + 8, size - 8, (off_t)(size - 8));
	write_file(bin_path, NULL, 0, (off_t)bin_size);

	/*
	 * Lazily (no scan budget): whatever the bytes, a document whose check
	 * passes is safe to read (its ranges stay inside the .bin, exactly its
	 * count), and a fault found by a document's check is one the scan finds.
	 */
	struct megatron_shard *s = NULL;
	char err[512];
	uint64_t budget = 0;
	bool doc_fault = false;
	int r = megatron_open_budget(idx_path, io, &budget, &s, err, sizeof(err));
	if (r == 0) {
		for (uint32_t d = 0; d < s->n_docs; d++) {
			uint64_t t;
			if (megatron_doc_tokens(s, d, &t, err, sizeof(err)) < 0) {
				assert(strstr(err, idx_path) != NULL);
				doc_fault = true;
				continue;
			}
			struct range_check rc = { .s = s };
			assert(megatron_doc_ranges(s, d, 0, t, emit, &rc) == 0 && rc.tokens == t);
		}
		uint64_t tokens;
		uint32_t nonempty;
		assert(!doc_fault || megatron_scan(s, NULL, &tokens, &nonempty, err, sizeof(err)) == -EBADMSG);
		s = megatron_free(s);
	}

	r = megatron_open(idx_path, io, &s, err, sizeof(err));
	if (r < 0) {
		assert(!s);
		assert(strstr(err, idx_path) != NULL);
		return 0;
	}
	assert(!doc_fault);
	assert(megatron_dtype_name(s->dtype) != NULL && s->itemsize > 0);
	uint64_t total = 0;
	uint32_t nonempty = 0;
	for (uint32_t d = 0; d < s->n_docs; d++) {
		struct range_check rc = { .s = s };
		uint64_t t;
		assert(megatron_doc_tokens(s, d, &t, err, sizeof(err)) == 0);
		assert(megatron_doc_ranges(s, d, 0, t, emit, &rc) == 0);
		assert(rc.tokens == t);
		/* Asking for more than the document holds is refused, not read past. */
		assert(megatron_doc_ranges(s, d, 0, t + 1, emit, &rc) == -EINVAL);
		total += t;
		nonempty += t > 0;
	}
	assert(total == s->n_tokens && nonempty == s->n_nonempty);
	assert(megatron_check(s, err, sizeof(err)) == 0);
	megatron_free(s);
	fuzz_accepted++;
	return 0;
}
