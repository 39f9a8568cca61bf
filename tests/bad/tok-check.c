/* SPDX-License-Identifier: MIT */
/*
 * Loads one tokenizer file the way feedd does (daemon/tok) and prints the
 * outcome, for tests/bad/test_bad.py:
 *
 *   tok-check FILE [PRESET]     FILE.json: tokenizer.json; else a rank file (PRESET, default gpt2)
 *
 * Prints "ok: vocabulary of N" and exits 0, or prints the loader's message
 * and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tok/tok.h"

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE [PRESET]\n", argv[0]);
		return 2;
	}
	size_t n = strlen(argv[1]);
	struct tok *t = NULL;
	char *error = NULL;
	int r = n > 5 && strcmp(argv[1] + n - 5, ".json") == 0
			? tok_load_hf(argv[1], &t, &error)
			: tok_load_rankfile(argv[1], argc > 2 ? argv[2] : "gpt2", &t, &error);
	if (r < 0) {
		printf("%s\n", error ? error : "(no message)");
		free(error);
		return 1;
	}
	printf("ok: vocabulary of %zu\n", tok_vocab_size(t));
	tok_free(t);
	return 0;
}
