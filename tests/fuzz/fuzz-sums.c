/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the checksum tables of daemon/io/sums.c, as feedd reads them
 * from files it did not necessarily write intact (cache entries, X.bin.sums
 * sidecars of any origin).
 *
 * Input: the first byte picks the reader: 0 checks the rest as a whole
 * cache file with a trailer (sums_check_buffer); 1 loads the rest as a
 * sidecar through a memfd (sums_load). Promises checked: no read outside the
 * input (ASan); an accepted trailer covers data inside the input, and an
 * accepted table's block count matches its data size.
 */
#include <assert.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/io/sums.h"
#include "tests/fuzz/fuzz.h"

unsigned long fuzz_accepted;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256];
	if (size < 1)
		return 0;
	const uint8_t *p = data + 1;
	size_t n = size - 1;
	if (data[0] == 0) {
		int64_t r = sums_check_buffer(p, n, "fuzz", err, sizeof(err));
		if (r >= 0) {
			assert((uint64_t)r <= n);
			fuzz_accepted++;
		}
		return 0;
	}
	int fd = memfd_create("fuzz-sums", MFD_CLOEXEC);
	if (fd < 0 || write(fd, p, n) != (ssize_t)n) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	struct sums *s = NULL;
	if (sums_load(fd, n, true, "fuzz", &s, err, sizeof(err)) == 0) {
		assert(s->n_blocks == (s->data_size + s->block - 1) / s->block);
		assert(s->n_blocks * 8 + SUMS_FOOTER == n);
		fuzz_accepted++;
		sums_free(s);
	}
	close(fd);
	return 0;
}
