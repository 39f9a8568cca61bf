/* SPDX-License-Identifier: MIT */
/*
 * Token-for-token comparison with the reference encoders.
 *
 *   test-tok-peers rank PRESET   rank file + preset vs tiktoken (npm WASM) on
 *                                the whole Debian-docs corpus (one document,
 *                                so it also crosses every internal window)
 *                                and on tests/tok/edge-cases.mjs, both with
 *                                specials as text and recognised; then the
 *                                same corpus from two threads sharing the tok.
 *   test-tok-peers hf NAME       tokenizer.json vs HF tokenizers on a corpus
 *                                subset and the edge cases.
 *   test-tok-peers model NAME    a Unigram or WordPiece tokenizer.json
 *                                (tests/tok/mkmodels.mjs) vs HF tokenizers on
 *                                the multilingual corpus, the edge cases and
 *                                every code point (allchars.txt),
 *                                with specials recognised and as text (HF's
 *                                encode_special_tokens), then from 2 threads.
 *
 * Reference ids come from scripts/fetch-tok-data.sh; without them: skip.
 */
#include <pthread.h>
#include <jansson.h>
#include <time.h>

#include "tok-test.h"

struct corpus_job {
	const struct tok *t;
	const char *text;
	size_t len;
	unsigned flags;
	struct tok_ids ids;
	int r;
};

static void *corpus_thread(void *arg) {
	struct corpus_job *j = arg;
	struct tok_state *st = NULL;

	j->r = tok_state_new(j->t, &st);
	if (j->r == 0)
		j->r = tok_encode(j->t, st, j->text, j->len, j->flags, &j->ids, NULL);
	tok_state_free(st);
	return NULL;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int32_t *read_u32(const char *path, size_t *ret_n) {
	size_t len;
	char *buf = test_read_file(path, &len);
	/* Little-endian on disk; the tests run on little-endian hosts. */
	*ret_n = len / 4;
	return (int32_t *) buf;
}

static bool check_corpus(const struct tok *t, const char *corpus_rel, const char *ref_rel, unsigned flags,
			 bool threads) {
	_tok_cleanup_free_ char *cpath = test_data_path(corpus_rel), *rpath = test_data_path(ref_rel);
	size_t len, n_want;
	_tok_cleanup_free_ char *text = test_read_file(cpath, &len);
	_tok_cleanup_free_ int32_t *want = read_u32(rpath, &n_want);
	struct corpus_job jobs[2] = {
		{ .t = t, .text = text, .len = len, .flags = flags },
		{ .t = t, .text = text, .len = len, .flags = flags },
	};
	bool ok = true;
	double t0 = now();

	corpus_thread(&jobs[0]);
	if (jobs[0].r < 0) {
		printf("FAIL %s: encode: %s\n", corpus_rel, strerror(-jobs[0].r));
		return false;
	}
	printf("%s: %zu bytes -> %zu ids, %.1f MB/s\n", corpus_rel, len, jobs[0].ids.n, len / 1e6 / (now() - t0));
	ok = test_ids_equal(t, corpus_rel, want, n_want, jobs[0].ids.ids, jobs[0].ids.n);
	tok_ids_done(&jobs[0].ids);
	if (ok && threads) {
		/* One tok shared read-only, one state per thread. */
		pthread_t th[2];
		for (int i = 0; i < 2; i++)
			if (pthread_create(&th[i], NULL, corpus_thread, &jobs[i]) != 0)
				abort();
		for (int i = 0; i < 2; i++) {
			pthread_join(th[i], NULL);
			if (jobs[i].r < 0 || !test_ids_equal(t, "corpus (2 threads)", want, n_want, jobs[i].ids.ids,
							     jobs[i].ids.n))
				ok = false;
			tok_ids_done(&jobs[i].ids);
		}
		if (ok)
			printf("%s: same ids from 2 threads\n", corpus_rel);
	}
	return ok;
}

static bool check_edge(const struct tok *t, struct tok_state *st, const char *ref_rel, const char *field,
		       unsigned flags) {
	_tok_cleanup_free_ char *path = test_data_path(ref_rel);
	json_error_t err;
	json_t *root = json_load_file(path, 0, &err), *c;
	size_t i, n_fail = 0, n_rep_total = 0;

	if (!root) {
		printf("FAIL %s:%d: %s\n", path, err.line, err.text);
		return false;
	}
	json_array_foreach(root, i, c) {
		const char *b64 = json_string_value(json_object_get(c, "b64"));
		json_t *ids = json_object_get(c, field);
		_tok_cleanup_free_ uint8_t *text = malloc(strlen(b64) + 4);
		_tok_cleanup_free_ int32_t *want = malloc((json_array_size(ids) + 1) * sizeof(int32_t));
		struct tok_ids got = { 0 };
		size_t n = test_b64_decode(b64, text), n_rep = 0;
		char what[64];
		int r;

		for (size_t k = 0; k < json_array_size(ids); k++)
			want[k] = (int32_t) json_integer_value(json_array_get(ids, k));
		r = tok_encode(t, st, (const char *) text, n, flags, &got, &n_rep);
		snprintf(what, sizeof(what), "%s case %zu (%s)", ref_rel, i, field);
		if (r < 0) {
			printf("FAIL %s: %s\n", what, strerror(-r));
			n_fail++;
		} else if (!test_ids_equal(t, what, want, json_array_size(ids), got.ids, got.n)) {
			printf("  text: %.*s\n", (int) (n > 120 ? 120 : n), text);
			n_fail++;
		}
		n_rep_total += n_rep;
		tok_ids_done(&got);
	}
	printf("%s (%s): %zu cases, %zu failed, %zu U+FFFD substituted\n", ref_rel, field, json_array_size(root),
	       n_fail, n_rep_total);
	json_decref(root);
	return n_fail == 0;
}

static const struct {
	const char *preset;
	const char *file;
} rank_files[] = {
	{ "gpt2", "ranks/r50k_base.tiktoken" },
	{ "p50k_base", "ranks/p50k_base.tiktoken" },
	{ "cl100k_base", "ranks/cl100k_base.tiktoken" },
	{ "o200k_base", "ranks/o200k_base.tiktoken" },
	{ "llama3", "ranks/llama3.tiktoken" },
};

int main(int argc, char **argv) {
	struct tok *t = NULL;
	struct tok_state *st = NULL;
	char *error = NULL, *rel = NULL;
	bool ok = true;
	int r;

	if (argc != 3) {
		fprintf(stderr, "usage: %s rank PRESET | hf NAME | model NAME\n", argv[0]);
		return 2;
	}
	if (strcmp(argv[1], "rank") == 0) {
		const char *file = NULL;
		for (size_t i = 0; i < TOK_ELEMENTSOF(rank_files); i++)
			if (strcmp(rank_files[i].preset, argv[2]) == 0)
				file = rank_files[i].file;
		if (!file) {
			fprintf(stderr, "unknown preset %s\n", argv[2]);
			return 2;
		}
		_tok_cleanup_free_ char *path = test_data_path(file);
		r = tok_load_rankfile(path, argv[2], &t, &error);
	} else {
		if (asprintf(&rel, "hf/%s.json", argv[2]) < 0)
			abort();
		_tok_cleanup_free_ char *path = test_data_path(rel);
		free(rel);
		r = tok_load_hf(path, &t, &error);
	}
	if (r < 0) {
		printf("FAIL load: %s\n", error ? error : strerror(-r));
		return 1;
	}
	if (tok_state_new(t, &st) < 0)
		abort();

	if (strcmp(argv[1], "rank") == 0) {
		if (asprintf(&rel, "ref/%s.edge.json", argv[2]) < 0)
			abort();
		ok &= check_edge(t, st, rel, "ids", 0);
		ok &= check_edge(t, st, rel, "ids_special", TOK_ENCODE_SPECIALS);
		free(rel);
		if (asprintf(&rel, "ref/%s.corpus.u32", argv[2]) < 0)
			abort();
		ok &= check_corpus(t, "corpus.txt", rel, 0, true);
		free(rel);
	} else if (strcmp(argv[1], "model") == 0) {
		if (asprintf(&rel, "ref/hf-%s.edge.json", argv[2]) < 0)
			abort();
		ok &= check_edge(t, st, rel, "ids", TOK_ENCODE_SPECIALS);
		ok &= check_edge(t, st, rel, "ids_nosp", 0);
		free(rel);
		if (asprintf(&rel, "ref/hf-%s.allchars.u32", argv[2]) < 0)
			abort();
		ok &= check_corpus(t, "allchars.txt", rel, TOK_ENCODE_SPECIALS, false);
		free(rel);
		if (asprintf(&rel, "ref/hf-%s.multi.u32", argv[2]) < 0)
			abort();
		ok &= check_corpus(t, "multi.txt", rel, TOK_ENCODE_SPECIALS, false);
		free(rel);
		if (asprintf(&rel, "ref/hf-%s-nosp.multi.u32", argv[2]) < 0)
			abort();
		ok &= check_corpus(t, "multi.txt", rel, 0, true);
		free(rel);
	} else {
		/* HF always splits added tokens out of the text. */
		if (asprintf(&rel, "ref/hf-%s.edge.json", argv[2]) < 0)
			abort();
		ok &= check_edge(t, st, rel, "ids", TOK_ENCODE_SPECIALS);
		free(rel);
		if (asprintf(&rel, "ref/hf-%s.small.u32", argv[2]) < 0)
			abort();
		ok &= check_corpus(t, "corpus-small.txt", rel, TOK_ENCODE_SPECIALS, false);
		free(rel);
	}
	tok_state_free(st);
	tok_free(t);
	free(error);
	printf("%s\n", ok ? "PASS" : "FAIL");
	return ok ? 0 : 1;
}
