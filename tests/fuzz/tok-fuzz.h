/* SPDX-License-Identifier: MIT */
/*
 * Shared by the tokenizer fuzz targets: the loaders take paths, so the input
 * goes into a memfd passed as /proc/self/fd/N. An accepted tokenizer must
 * encode a fixed ASCII text into ids below its vocabulary size whose bytes
 * spell the text again (byte-level BPE loses nothing; Unigram and WordPiece
 * normalise, so only their ids are checked); a refused one must say
 * so in a message that begins with the file's name.
 */
#pragma once

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/tok/tok.h"
#include "tests/fuzz/fuzz.h"

static int tok_fuzz_memfd(const uint8_t *data, size_t size, char *path, size_t cap, char *name, size_t name_cap)
{
	int fd = memfd_create("fuzz-tok", MFD_CLOEXEC);
	assert(fd >= 0);
	size_t off = 0;
	while (off < size) {
		ssize_t n = write(fd, data + off, size - off);
		assert(n > 0);
		off += (size_t)n;
	}
	snprintf(path, cap, "/proc/self/fd/%d", fd);
	snprintf(name, name_cap, "%d", fd);
	return fd;
}

static void tok_fuzz_check(int r, struct tok *t, char *error, const char *name)
{
	static const char text[] = "Hello, world! It's 2024: 3 apples cost $1.50.\n\tThe quick brown fox  jumps.";
	if (r < 0) {
		assert(!t);
		assert(error && strncmp(error, name, strlen(name)) == 0);
		free(error);
		return;
	}
	assert(t && !error);
	struct tok_state *st = NULL;
	struct tok_ids ids = { 0 };
	assert(tok_state_new(t, &st) == 0);
	r = tok_encode(t, st, text, sizeof(text) - 1, 0, &ids, NULL);
	/* PCRE2 may give up on a pathological pattern (-EIO); nothing else may fail. */
	assert(r == 0 || r == -EIO || r == -ENOMEM);
	if (r == 0) {
		char out[sizeof(text)];
		size_t n = 0;
		for (size_t i = 0; i < ids.n; i++) {
			const uint8_t *b;
			size_t len;
			assert(ids.ids[i] >= 0 && (size_t)ids.ids[i] < tok_vocab_size(t));
			assert(tok_token_bytes(t, ids.ids[i], &b, &len) == 0);
			if (!tok_is_lossless(t))
				continue;
			assert(n + len <= sizeof(text) - 1);
			memcpy(out + n, b, len);
			n += len;
		}
		assert(!tok_is_lossless(t) || (n == sizeof(text) - 1 && memcmp(out, text, n) == 0));
	}
	tok_ids_done(&ids);
	tok_state_free(st);
	tok_free(t);
	fuzz_accepted++;
}
