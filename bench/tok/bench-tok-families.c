/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer families: feedd's tok against HF tokenizers on one thread, in
 * one run, on the multilingual corpus (fam/multi.txt, one document per
 * source; tests/tok/reffamilies.mjs builds it and the tokenizer.json files).
 *
 *   bench-tok-families [--repeat N] [--no-peers] [NAME...]
 *
 * Prints a table: family, feedd's path (byte-level fast path or the general
 * pipeline), feedd MB/s (best of N, one thread, special tokens as text),
 * HF MB/s (bench/tok/peers-families.mjs, the same documents and setting) and
 * the ratio, by wall time and by CPU time (the encoding thread's for feedd,
 * node's process for HF; a VM shared with other work slows wall time
 * unevenly between the two runs, CPU time much less); "ids differ" flags a
 * count that is not HF's.
 */
#include <getopt.h>
#include <time.h>

#include "../../tests/tok/tok-test.h"

static const char *const default_names[] = { "gpt2", "llama3", "llama3_1", "qwen2_5", "qwen3", "mistral_nemo",
					      "deepseek_v3", "gpt4o", "llama2", "gemma", "gemma2", "neox", "smollm",
					      "t5-albert", "xlmr-albert", "unigram-bytefb", "albert", "bert-uncased", "bert-cased",
					      NULL };

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int count_ids(const int32_t *ids, size_t n, void *userdata) {
	(void) ids;
	*(size_t *) userdata += n;
	return 0;
}

int main(int argc, char **argv) {
	static const struct option opts[] = {
		{ "repeat", required_argument, NULL, 'r' },
		{ "no-peers", no_argument, NULL, 'n' },
		{ 0 },
	};
	int repeat = 3, c;
	bool peers = true;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0)
		switch (c) {
		case 'r': repeat = atoi(optarg); break;
		case 'n': peers = false; break;
		default: return 2;
		}
	const char *const *names = optind < argc ? (const char *const *) argv + optind : default_names;
	_tok_cleanup_free_ char *cpath = test_data_path("fam/multi.txt");
	_tok_cleanup_free_ char *ipath = test_data_path("fam/multi.idx");
	size_t len, ilen, n_docs = 0, off = 0;
	_tok_cleanup_free_ char *text = test_read_file(cpath, &len);
	_tok_cleanup_free_ char *idx = test_read_file(ipath, &ilen);
	_tok_cleanup_free_ size_t *sizes = calloc(ilen / 2 + 1, sizeof(*sizes));

	for (char *p = idx, *e; *p; p = e) {
		size_t n = strtoull(p, &e, 10);
		if (e == p)
			break;
		sizes[n_docs++] = n;
		while (*e == '\n')
			e++;
	}
	printf("corpus: fam/multi.txt, %.1f MB, %zu documents; one thread; special tokens as text\n", len / 1e6,
	       n_docs);
	printf("| family | feedd path | feedd MB/s | HF tokenizers MB/s | feedd / HF | feedd / HF, CPU time |\n"
	       "|---|---|---|---|---|---|\n");
	for (size_t k = 0; names[k]; k++) {
		char rel[256], cmd[4096], line[512];
		struct tok *t = NULL;
		struct tok_state *st = NULL;
		_tok_cleanup_free_ char *error = NULL;
		double best = 1e30, best_cpu = 1e30, hf = 0, hf_cpu = 0;
		size_t n_ids = 0, hf_ids = 0;

		snprintf(rel, sizeof(rel), "fam/%s.json", names[k]);
		_tok_cleanup_free_ char *path = test_data_path(rel);
		if (tok_load_hf(path, &t, &error) < 0 || tok_state_new(t, &st) < 0) {
			printf("| %s | %s | | | |\n", names[k], error ? error : "load failed");
			tok_free(t);
			continue;
		}
		for (int rep = 0; rep < repeat; rep++) {
			double t0 = now(), c0 = cpu_now();
			n_ids = 0;
			off = 0;
			for (size_t i = 0; i < n_docs; i++) {
				if (tok_encode_stream(t, st, text + off, sizes[i], 0, count_ids, &n_ids, NULL) < 0)
					abort();
				off += sizes[i];
			}
			if (now() - t0 < best)
				best = now() - t0;
			if (cpu_now() - c0 < best_cpu)
				best_cpu = cpu_now() - c0;
		}
		if (peers) {
			snprintf(cmd, sizeof(cmd),
				 "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node '%s/bench/tok/peers-families.mjs' '%s' '%s'",
				 FEEDD_SOURCE_ROOT, test_data_dir(), names[k]);
			fflush(stdout);
			FILE *f = popen(cmd, "r");
			while (f && fgets(line, sizeof(line), f))
				if (sscanf(line, "peer %*s %lf %zu %lf", &hf, &hf_ids, &hf_cpu) != 3)
					fputs(line, stderr);
			if (f)
				pclose(f);
		}
		double mbps = len / 1e6 / best, mbps_cpu = len / 1e6 / best_cpu;
		printf("| %s | %s | %.1f | %.2f | %.1fx%s | %.1fx |\n", names[k], t->general ? "general" : "byte-level",
		       mbps, hf, hf > 0 ? mbps / hf : 0, hf_ids && hf_ids != n_ids ? " (ids differ)" : "",
		       hf_cpu > 0 ? mbps_cpu / hf_cpu : 0);
		fflush(stdout);
		tok_state_free(st);
		tok_free(t);
	}
	return 0;
}
