/* SPDX-License-Identifier: MIT */
/*
 * A huge single document is encoded in bounded memory: the peak RSS grows
 * by far less than the document while 256 MiB are encoded, both for valid
 * UTF-8 (matched in place) and for text with invalid bytes (repaired window
 * by window).  The ids are checked too: the document repeats one line, so
 * its ids must be that line's ids repeated, and every invalid byte must be
 * counted.  Uses a small hand-made vocabulary: needs no fetched data.
 */
#include <sys/resource.h>
#include <unistd.h>

#include "tok-test.h"

static int n_fail;

static long max_rss_kib(void) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

struct check {
	const int32_t *unit;
	size_t n_unit;
	size_t n;
	size_t bad;
};

/* Compares the stream with the unit's ids repeated, without storing it. */
static int sink(const int32_t *ids, size_t n, void *userdata) {
	struct check *c = userdata;
	for (size_t i = 0; i < n; i++, c->n++)
		if (ids[i] != c->unit[c->n % c->n_unit])
			c->bad++;
	return 0;
}

static void run(const struct tok *t, const char *unit, size_t unit_len, size_t total, size_t want_rep) {
	struct tok_state *st = NULL;
	struct tok_ids u = { 0 };
	size_t copies = total / unit_len, len = copies * unit_len, rep = 0;
	char *doc = malloc(len);
	long before;
	struct check c;
	int r;

	if (!doc || tok_state_new(t, &st) < 0)
		abort();
	for (size_t i = 0; i < copies; i++)
		memcpy(doc + i * unit_len, unit, unit_len);
	if (tok_encode(t, st, unit, unit_len, 0, &u, NULL) < 0)
		abort();
	before = max_rss_kib();
	c = (struct check) { .unit = u.ids, .n_unit = u.n };
	r = tok_encode_stream(t, st, doc, len, 0, sink, &c, &rep);
	long grown = max_rss_kib() - before;
	printf("%zu MiB document (%s): %zu ids, %zu U+FFFD, peak RSS grew by %ld KiB\n", len >> 20,
	       want_rep ? "invalid UTF-8, windowed" : "valid UTF-8, in place", c.n, rep, grown);
	if (r < 0 || c.n != copies * u.n || c.bad != 0 || rep != want_rep * copies) {
		printf("FAIL: r=%d ids %zu (want %zu), %zu differ, %zu replacements (want %zu)\n", r, c.n,
		       copies * u.n, c.bad, rep, want_rep * copies);
		n_fail++;
	}
	if (grown > 32 * 1024) {
		printf("FAIL: memory grew by %ld KiB for a %zu MiB document\n", grown, len >> 20);
		n_fail++;
	}
	tok_ids_done(&u);
	tok_state_free(st);
	free(doc);
}

int main(void) {
	char dir[] = "/tmp/tok-bounded-XXXXXX", path[64], *text = NULL;
	size_t n = 0;
	FILE *f;
	struct tok *t = NULL;
	char *error = NULL;
	static const char *const merges[] = { "th", "he", " t", "the", " the", "qu", "ck", "ow", "ove", "er",
					      "12", "123", "..", "\n\n" };

	if (!mkdtemp(dir))
		abort();
	snprintf(path, sizeof(path), "%s/toy.tiktoken", dir);
	f = open_memstream(&text, &n);
	for (int b = 0; b < 256; b++) {
		static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
		fprintf(f, "%c%c== %d\n", tab[b >> 2], tab[(b & 3) << 4], b);
	}
	for (size_t i = 0; i < TOK_ELEMENTSOF(merges); i++) {
		static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
		const uint8_t *s = (const uint8_t *) merges[i];
		size_t l = strlen(merges[i]);
		for (size_t k = 0; k < l; k += 3) {
			uint32_t w = (uint32_t) s[k] << 16 | (k + 1 < l ? (uint32_t) s[k + 1] << 8 : 0) |
				     (k + 2 < l ? s[k + 2] : 0);
			fprintf(f, "%c%c%c%c", tab[w >> 18 & 63], tab[w >> 12 & 63], k + 1 < l ? tab[w >> 6 & 63] : '=',
				k + 2 < l ? tab[w & 63] : '=');
		}
		fprintf(f, " %zu\n", 256 + i);
	}
	fclose(f);
	f = fopen(path, "we");
	fwrite(text, 1, n, f);
	fclose(f);
	free(text);
	if (tok_load_rankfile(path, "cl100k_base", &t, &error) < 0) {
		printf("FAIL load: %s\n", error);
		return 1;
	}
	unlink(path);
	rmdir(dir);

	/* Each unit ends in "\n\n" before a letter, a pre-token boundary. */
	static const char valid[] = "The quick brown fox jumps over the lazy dog 12345... Ünïcödé 日本語\n\nx";
	static const char invalid[] = "The quick \xff brown fox \xe2\x82 over the lazy dog 12345...\n\nx";
	run(t, valid, sizeof(valid) - 1, 256u << 20, 0);
	run(t, invalid, sizeof(invalid) - 1, 256u << 20, 2);
	tok_free(t);
	printf("%s\n", n_fail ? "FAIL" : "PASS");
	return n_fail ? 1 : 0;
}
