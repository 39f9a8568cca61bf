/* SPDX-License-Identifier: MIT */
/*
 * The WordPiece model (BERT), as HF tokenizers' models/wordpiece runs it:
 * a word longer than max_input_chars_per_word characters is unk_token;
 * otherwise, from its start, the longest vocabulary entry is taken (after
 * the first, with the continuing-subword prefix, "##"), shrinking a
 * character at a time; if some position has no entry the whole word is
 * unk_token.  Lengths past the longest entry cannot match and are skipped,
 * which gives the same result as HF's search from the end of the word.
 * Read-only after tok_wordpiece_finish().
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"
#include "tok-model.h"

struct tok_wordpiece {
	struct tok_strmap map;
	char *prefix;
	size_t prefix_len;
	size_t max_chars;
	uint32_t unk;
};

int tok_wordpiece_new(const char *prefix, size_t max_chars, struct tok_wordpiece **ret) {
	struct tok_wordpiece *w = calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->prefix = strdup(prefix);
	if (!w->prefix) {
		free(w);
		return -ENOMEM;
	}
	w->prefix_len = strlen(prefix);
	w->max_chars = max_chars;
	*ret = w;
	return 0;
}

struct tok_wordpiece *tok_wordpiece_free(struct tok_wordpiece *w) {
	if (!w)
		return NULL;
	tok_strmap_clear(&w->map);
	free(w->prefix);
	free(w);
	return NULL;
}

int tok_wordpiece_add(struct tok_wordpiece *w, const char *token, size_t len, uint32_t id) {
	if (id >= INT32_MAX)
		return -E2BIG;
	return tok_strmap_add(&w->map, token, len, id);
}

int tok_wordpiece_finish(struct tok_wordpiece *w, const char *unk) {
	int64_t id;
	int r;

	r = tok_strmap_finish(&w->map);
	if (r < 0)
		return r;
	id = tok_strmap_find(&w->map, (const uint8_t *) unk, strlen(unk));
	if (id < 0)
		return -ENOENT;
	w->unk = (uint32_t) id;
	return 0;
}

size_t tok_wordpiece_scratch_size(const struct tok_wordpiece *w) {
	return w->map.max_len + 1;
}

size_t tok_wordpiece_encode(const struct tok_wordpiece *w, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	const size_t max_len = w->map.max_len;
	uint8_t *buf = scratch;   /* prefix + candidate: at most max_len bytes */
	size_t chars = 0, m = 0;

	for (size_t i = 0; i < n; i++)
		chars += (s[i] & 0xc0) != 0x80;
	if (chars > w->max_chars)
		goto unk;
	for (size_t start = 0; start < n;) {
		const size_t pre = start > 0 ? w->prefix_len : 0;
		int64_t id = -1;
		size_t end;

		if (pre >= max_len)
			goto unk;
		end = n - start + pre > max_len ? start + max_len - pre : n;
		for (; end > start; end--) {
			if (end < n && (s[end] & 0xc0) == 0x80)
				continue;
			const uint8_t *key = s + start;
			if (pre) {
				memcpy(buf, w->prefix, pre);
				memcpy(buf + pre, s + start, end - start);
				key = buf;
			}
			id = tok_strmap_find(&w->map, key, pre + end - start);
			if (id >= 0)
				break;
		}
		if (id < 0)
			goto unk;
		out[m++] = (uint32_t) id;
		start = end;
	}
	return m;
unk:
	out[0] = w->unk;
	return 1;
}
