/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: tiktoken rank files (tok_load_rankfile in daemon/tok).
 * Input: the first byte picks the preset, the rest is the file. See
 * tok-fuzz.h for the promises checked.
 */
#include <errno.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/tok-fuzz.h"

unsigned long fuzz_accepted;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const presets[] = { "gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base", "llama3" };
	if (size < 1)
		return 0;
	char path[64], name[16];
	int fd = tok_fuzz_memfd(data + 1, size - 1, path, sizeof(path), name, sizeof(name));
	struct tok *t = NULL;
	char *error = NULL;
	int r = tok_load_rankfile(path, presets[data[0] % (sizeof(presets) / sizeof(presets[0]))], &t, &error);
	tok_fuzz_check(r, t, error, name);
	close(fd);
	return 0;
}
