/* SPDX-License-Identifier: MIT */
/*
 * tok_part_*: a text fed in parts cut anywhere (inside characters, added
 * tokens, pre-tokens, long runs) gets exactly the ids of the whole text,
 * under each preset's pattern, and a 64 MiB one-word text fed in 1 MiB
 * parts holds a bounded tail. A hand-made vocabulary: no fetched data.
 */
#include <unistd.h>

#include "tok-test.h"

static int n_fail;

static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void put_b64(FILE *f, const uint8_t *s, size_t l)
{
	for (size_t k = 0; k < l; k += 3) {
		uint32_t w = (uint32_t)s[k] << 16 | (k + 1 < l ? (uint32_t)s[k + 1] << 8 : 0) | (k + 2 < l ? s[k + 2] : 0);
		fprintf(f, "%c%c%c%c", tab[w >> 18 & 63], tab[w >> 12 & 63], k + 1 < l ? tab[w >> 6 & 63] : '=',
			k + 2 < l ? tab[w & 63] : '=');
	}
}

static struct tok *load(const char *preset)
{
	static const char *const merges[] = { "th", "he", " t", "the", " the", "qu", "ck", "ow", "ove", "er", "12",
					      "123", "..", "\n\n", "aa", "aaaa", "aaaaaaaa", "  ", "    ", "\xc3\xa9\xc3\xa9" };
	char dir[] = "/tmp/tok-part-XXXXXX", path[64];
	struct tok *t = NULL;
	char *error = NULL;
	if (!mkdtemp(dir))
		abort();
	snprintf(path, sizeof(path), "%s/toy.tiktoken", dir);
	FILE *f = fopen(path, "we");
	for (int b = 0; b < 256; b++) {
		uint8_t c = (uint8_t)b;
		put_b64(f, &c, 1);
		fprintf(f, " %d\n", b);
	}
	for (size_t i = 0; i < TOK_ELEMENTSOF(merges); i++) {
		put_b64(f, (const uint8_t *)merges[i], strlen(merges[i]));
		fprintf(f, " %zu\n", 256 + i);
	}
	fclose(f);
	if (tok_load_rankfile(path, preset, &t, &error) < 0) {
		printf("FAIL load %s: %s\n", preset, error);
		exit(1);
	}
	unlink(path);
	rmdir(dir);
	return t;
}

static int append(const int32_t *ids, size_t n, void *userdata)
{
	struct tok_ids *v = userdata;
	if (tok_ids_reserve(v, n) < 0)
		return -ENOMEM;
	memcpy(v->ids + v->n, ids, n * sizeof(*ids));
	v->n += n;
	return 0;
}

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

/* Whole text vs parts of random sizes up to max_part. */
static void check(const struct tok *t, struct tok_state *st, const char *what, const char *s, size_t n, unsigned flags,
		  size_t max_part)
{
	struct tok_ids whole = { 0 }, parts = { 0 };
	size_t rep_whole = 0;
	struct tok_part *p;
	if (tok_encode(t, st, s, n, flags, &whole, &rep_whole) < 0 || tok_part_new(t, flags, &p) < 0)
		abort();
	int r = 0;
	for (size_t at = 0; r == 0;) {
		size_t len = 1 + rnd() % max_part;
		if (len > n - at)
			len = n - at;
		bool final = at + len == n;
		r = tok_part_feed(p, st, s + at, len, final, append, &parts);
		at += len;
		if (final)
			break;
	}
	bool ok = r == 0 && parts.n == whole.n && memcmp(parts.ids, whole.ids, whole.n * sizeof(int32_t)) == 0 &&
		  tok_part_replaced(p) == rep_whole;
	if (!ok) {
		size_t i = 0;
		while (i < parts.n && i < whole.n && parts.ids[i] == whole.ids[i])
			i++;
		printf("FAIL %s (parts <= %zu): r=%d, %zu ids (want %zu), first difference at %zu, %zu U+FFFD (want %zu)\n",
		       what, max_part, r, parts.n, whole.n, i, tok_part_replaced(p), rep_whole);
		n_fail++;
	}
	tok_part_free(p);
	tok_ids_done(&whole);
	tok_ids_done(&parts);
}

/* Random text of words, spaces, digits, punctuation, multibyte, invalid bytes, specials. */
static char *mixed(size_t n, bool long_runs)
{
	static const char *const bits[] = { "the", " the", " quick", " brown", "  ", "\n\n", "\n", " ", "123", "4567",
					    "...", "!?", "\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac", "\xf0\x9f\x98\x80", "'s",
					    "\xff", "\xe2\x82", "<|endoftext|>", "\t", "  \n ", "Th", "x" };
	char *s = malloc(n + (1u << 20));
	size_t at = 0;
	while (at < n) {
		if (long_runs && rnd() % 200 == 0) {
			size_t run = 200000 + rnd() % 400000;
			const char *unit = (const char *[]){ "a", "\xc3\xa9", " ", "1", "." }[rnd() % 5];
			size_t ul = strlen(unit);
			for (size_t k = 0; k + ul <= run && at + ul < n + (1u << 20); k += ul, at += ul)
				memcpy(s + at, unit, ul);
			continue;
		}
		const char *b = bits[rnd() % TOK_ELEMENTSOF(bits)];
		memcpy(s + at, b, strlen(b));
		at += strlen(b);
	}
	return s;
}

/* The fetched tokenizers (scripts/fetch-tok-data.sh) over the multilingual corpus, cut anywhere. */
static int peers(void)
{
	static const char *const hf[] = { "gpt2", "llama3", "qwen-nfc", "cl100k" };
	static const char *const ranks[][2] = { { "cl100k_base", "cl100k_base" }, { "o200k_base", "o200k_base" } };
	size_t n;
	char *corpus_path = test_data_path("multi.txt");
	char *s = test_read_file(corpus_path, &n);
	for (size_t i = 0; i < TOK_ELEMENTSOF(hf) + TOK_ELEMENTSOF(ranks); i++) {
		char rel[64], *error = NULL;
		struct tok *t = NULL;
		if (i < TOK_ELEMENTSOF(hf))
			snprintf(rel, sizeof(rel), "hf/%s.json", hf[i]);
		else
			snprintf(rel, sizeof(rel), "ranks/%s.tiktoken", ranks[i - TOK_ELEMENTSOF(hf)][0]);
		char *path = test_data_path(rel);
		int r = i < TOK_ELEMENTSOF(hf) ? tok_load_hf(path, &t, &error)
					       : tok_load_rankfile(path, ranks[i - TOK_ELEMENTSOF(hf)][1], &t, &error);
		free(path);
		if (r < 0) {
			printf("FAIL load %s: %s\n", rel, error);
			n_fail++;
			free(error);
			continue;
		}
		struct tok_state *st;
		if (tok_state_new(t, &st) < 0)
			abort();
		if (!tok_part_supported(t)) {
			printf("%s: the general pipeline, not streamed\n", rel);
		} else {
			check(t, st, rel, s, n, 0, 70000);
			check(t, st, rel, s, n, TOK_ENCODE_SPECIALS, 1u << 20);
			check(t, st, rel, s, 200000, 0, 97);
			printf("%s: %zu bytes in parts, same ids\n", rel, n);
		}
		tok_state_free(st);
		tok_free(t);
	}
	free(s);
	free(corpus_path);
	printf("%s\n", n_fail ? "FAIL" : "PASS");
	return n_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "peers") == 0)
		return peers();
	static const char *const presets[] = { "gpt2", "cl100k_base", "o200k_base", "llama3" };
	for (size_t i = 0; i < TOK_ELEMENTSOF(presets); i++) {
		struct tok *t = load(presets[i]);
		struct tok_state *st;
		if (tok_state_new(t, &st) < 0)
			abort();
		char what[128];
		for (int k = 0; k < 6; k++) {
			size_t n = 4000 + rnd() % 4000;
			char *s = mixed(n, false);
			snprintf(what, sizeof(what), "%s mixed %d", presets[i], k);
			check(t, st, what, s, n, 0, 1 + k * 3);
			check(t, st, what, s, n, TOK_ENCODE_SPECIALS, 1 + k * 7);
			free(s);
		}
		/* Long runs (over TOK_PIECE_MAX) among ordinary text. */
		size_t n = 6u << 20;
		char *s = mixed(n, true);
		snprintf(what, sizeof(what), "%s long runs", presets[i]);
		check(t, st, what, s, n, TOK_ENCODE_SPECIALS, 300000);
		check(t, st, what, s, n, 0, 70000);
		free(s);
		/* One word of 64 MiB in 1 MiB parts: the tail held stays bounded. */
		n = 64u << 20;
		s = malloc(n);
		memset(s, 'a', n);
		struct tok_part *p;
		struct tok_ids got = { 0 };
		size_t held = 0;
		if (tok_part_new(t, 0, &p) < 0)
			abort();
		for (size_t at = 0; at < n; at += 1u << 20) {
			got.n = 0;
			if (tok_part_feed(p, st, s + at, 1u << 20, at + (1u << 20) == n, append, &got) < 0)
				abort();
			held = tok_part_held(p) > held ? tok_part_held(p) : held;
		}
		tok_part_free(p);
		tok_ids_done(&got);
		printf("%s: 64 MiB word in 1 MiB parts held at most %zu KiB\n", presets[i], held >> 10);
		if (held > (4u << 20)) {
			printf("FAIL %s: held %zu bytes\n", presets[i], held);
			n_fail++;
		}
		free(s);
		tok_state_free(st);
		tok_free(t);
	}
	printf("%s\n", n_fail ? "FAIL" : "PASS");
	return n_fail ? 1 : 0;
}
