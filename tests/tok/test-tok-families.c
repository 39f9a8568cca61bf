/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer families vs HF tokenizers 0.23.2, document by document.
 *
 *   test-tok-families NAME [CORPUS]
 *
 * loads fam/NAME.json (built by tests/tok/reffamilies.mjs), or for NAME
 * rank-PRESET the rank file ranks/PRESET.tiktoken with that preset (the
 * reference is then tiktoken, npm), and encodes each
 * document of every corpus fam/CORPUS.txt (document sizes in CORPUS.idx:
 * the multilingual corpus and the Unicode 15/16 corpus) twice: without
 * TOK_ENCODE_SPECIALS (HF with encode_special_tokens=true) and with it (HF's
 * default); the reference ids are fam/ref/NAME.CORPUS.{text,special}.u32,
 * each document as its id count followed by its ids.  Prints the number of
 * documents that differ and the first differences; fails if any does.
 * Without the fetched data: skip (77).
 */
#include <time.h>

#include "tok-test.h"

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static bool check(const struct tok *t, const char *name, const char *corpus, bool special) {
	char rel[256];
	size_t len, idx_len, ref_len, n_docs = 0, n_bad = 0, off = 0, ref = 0, n_ids = 0;
	double secs = 0;
	struct tok_state *st = NULL;

	snprintf(rel, sizeof(rel), "fam/%s.txt", corpus);
	_tok_cleanup_free_ char *tpath = test_data_path(rel);
	snprintf(rel, sizeof(rel), "fam/%s.idx", corpus);
	_tok_cleanup_free_ char *ipath = test_data_path(rel);
	snprintf(rel, sizeof(rel), "fam/ref/%s.%s.%s.u32", name, corpus, special ? "special" : "text");
	_tok_cleanup_free_ char *rpath = test_data_path(rel);
	_tok_cleanup_free_ char *text = test_read_file(tpath, &len);
	_tok_cleanup_free_ char *idx = test_read_file(ipath, &idx_len);
	_tok_cleanup_free_ char *refbuf = test_read_file(rpath, &ref_len);
	const uint32_t *want = (const uint32_t *) refbuf;
	size_t n_want = ref_len / 4;

	if (tok_state_new(t, &st) < 0)
		return false;
	for (char *line = idx, *nl; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		if (!nl)
			break;
		size_t dlen = strtoull(line, NULL, 10);
		struct tok_ids ids = { 0 };
		double t0 = now();
		int r = tok_encode(t, st, text + off, dlen, special ? TOK_ENCODE_SPECIALS : 0, &ids, NULL);
		secs += now() - t0;
		if (r < 0 || ref >= n_want || ref + 1 + want[ref] > n_want) {
			printf("FAIL %s %s doc %zu: encode %d or reference short\n", name, corpus, n_docs, r);
			tok_ids_done(&ids);
			tok_state_free(st);
			return false;
		}
		size_t nw = want[ref];
		if (ids.n != nw || memcmp(ids.ids, want + ref + 1, nw * 4) != 0) {
			if (++n_bad <= 3) {
				char what[128];
				snprintf(what, sizeof(what), "%s %s %s doc %zu (byte %zu)", name, corpus,
					 special ? "special" : "text", n_docs, off);
				test_ids_equal(t, what, (const int32_t *) want + ref + 1, nw, ids.ids, ids.n);
			}
		}
		n_ids += ids.n;
		tok_ids_done(&ids);
		ref += 1 + nw;
		off += dlen;
		n_docs++;
	}
	tok_state_free(st);
	printf("%s %s %s: %zu docs, %zu bytes, %zu ids, %.1f MB/s, %zu docs differ\n", name, corpus,
	       special ? "special" : "text", n_docs, off, n_ids, off / 1e6 / (secs > 0 ? secs : 1e-9), n_bad);
	return n_bad == 0 && off == len;
}

int main(int argc, char **argv) {
	char rel[256];
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	bool ok = true;

	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: %s NAME [multi|uni16]\n", argv[0]);
		return 2;
	}
	const char *preset = strncmp(argv[1], "rank-", 5) == 0 ? argv[1] + 5 : NULL;
	if (preset)
		snprintf(rel, sizeof(rel), "ranks/%s.tiktoken", strcmp(preset, "gpt2") == 0 ? "r50k_base" : preset);
	else
		snprintf(rel, sizeof(rel), "fam/%s.json", argv[1]);
	_tok_cleanup_free_ char *path = test_data_path(rel);
	double t0 = now();
	int r = preset ? tok_load_rankfile(path, preset, &t, &error) : tok_load_hf(path, &t, &error);
	if (r < 0) {
		printf("FAIL %s: %s\n", path, error ? error : strerror(-r));
		return 1;
	}
	printf("%s: loaded in %.2fs (%s path)\n", argv[1], now() - t0, t->general ? "general" : "byte-level");
	for (int c = 0; c < 2; c++)
		for (int sp = 0; sp < 2; sp++)
			if (argc < 3 || strcmp(argv[2], c ? "uni16" : "multi") == 0)
				ok = check(t, argv[1], c ? "uni16" : "multi", sp) && ok;
	tok_free(t);
	printf("%s\n", ok ? "PASS" : "FAIL");
	return ok ? 0 : 1;
}
