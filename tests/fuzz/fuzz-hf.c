/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: HF tokenizer.json files (tok_load_hf in daemon/tok). The
 * input is the file. See tok-fuzz.h for the promises checked.
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
	char path[64], name[16];
	int fd = tok_fuzz_memfd(data, size, path, sizeof(path), name, sizeof(name));
	struct tok *t = NULL;
	char *error = NULL;
	int r = tok_load_hf(path, &t, &error);
	tok_fuzz_check(r, t, error, name);
	close(fd);
	return 0;
}
