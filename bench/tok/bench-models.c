/* SPDX-License-Identifier: MIT */
/*
 * Throughput of the Unigram and WordPiece models against HF tokenizers, in
 * one run, on the same documents: multi.txt (the multilingual corpus of
 * scripts/fetch-tok-data.sh) cut at the first LF after every 16 KiB, and
 * the tokenizer.json files of tests/tok/mkmodels.mjs.
 *
 *   bench-models [--no-peers] [--repeat N] [NAME...]
 *
 * Prints per file: feedd on one thread (best of N), then HF tokenizers on
 * one thread (bench/tok/peers-models.mjs) and the ratio.  Both are MB per
 * second of CPU time of the process (the machines this runs on are
 * shared; wall time swung 3x between runs), feedd's wall-clock MB/s too.
 * Specials are recognised on both sides, as HF does by default.
 */
#include <getopt.h>
#include <time.h>

#include "../../tests/tok/tok-test.h"

#define DOC_BYTES 16384

struct doc {
	const char *text;
	size_t len;
};

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static int count_ids(const int32_t *ids, size_t n, void *userdata) {
	(void) ids;
	*(size_t *) userdata += n;
	return 0;
}

static int bench(const char *name, const struct doc *docs, size_t n_docs, size_t total, int repeat, bool peers) {
	_tok_cleanup_free_ char *rel = NULL, *path = NULL, *error = NULL;
	struct tok *t = NULL;
	struct tok_state *st = NULL;
	double best = 0, best_wall = 0;
	size_t n_ids = 0;
	int r;

	if (asprintf(&rel, "hf/%s.json", name) < 0)
		abort();
	path = test_data_path(rel);
	r = tok_load_hf(path, &t, &error);
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", name, error ? error : strerror(-r));
		return 1;
	}
	r = tok_state_new(t, &st);
	for (int k = 0; r == 0 && k < repeat; k++) {
		double t0 = now(), c0 = cpu_now();
		n_ids = 0;
		for (size_t i = 0; r == 0 && i < n_docs; i++)
			r = tok_encode_stream(t, st, docs[i].text, docs[i].len, TOK_ENCODE_SPECIALS, count_ids, &n_ids, NULL);
		double mbps = (double) total / 1e6 / (cpu_now() - c0), wall = (double) total / 1e6 / (now() - t0);
		if (mbps > best)
			best = mbps;
		if (wall > best_wall)
			best_wall = wall;
	}
	tok_state_free(st);
	tok_free(t);
	if (r < 0) {
		fprintf(stderr, "%s: encode: %s\n", name, strerror(-r));
		return 1;
	}
	printf("%-16s feedd(1-thread)            %7.1f MB/s  (%zu ids)  wall %.1f MB/s\n", name, best, n_ids,
	       best_wall);
	if (peers) {
		char cmd[4096], line[512];
		FILE *f;
		snprintf(cmd, sizeof(cmd),
			 "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node '%s/bench/tok/peers-models.mjs' '%s' '%s' %d",
			 FEEDD_SOURCE_ROOT, test_data_dir(), name, DOC_BYTES);
		fflush(stdout);
		f = popen(cmd, "r");
		if (!f)
			return 1;
		while (fgets(line, sizeof(line), f)) {
			char peer[64];
			double mbps;
			size_t ids;
			if (sscanf(line, "peer %63s %lf %zu", peer, &mbps, &ids) == 3)
				printf("%-16s %-26s %7.1f MB/s  (%zu ids)  feedd/peer %.1fx%s\n", name, peer, mbps, ids,
				       best / mbps, ids == n_ids ? "" : "  [id count differs]");
			else
				fputs(line, stdout);
		}
		if (pclose(f) != 0)
			fprintf(stderr, "peers-models.mjs failed\n");
	}
	return 0;
}

int main(int argc, char **argv) {
	static const struct option opts[] = {
		{ "no-peers", no_argument, NULL, 'n' },
		{ "repeat", required_argument, NULL, 'r' },
		{ NULL, 0, NULL, 0 },
	};
	static const char *const all[] = { "t5-albert", "xlmr-albert", "unigram-bytefb", "albert", "bert-uncased", "bert-cased" };
	bool peers = true;
	int repeat = 3, c, rc = 0;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0) {
		if (c == 'n')
			peers = false;
		else if (c == 'r')
			repeat = atoi(optarg);
		else
			return 2;
	}
	_tok_cleanup_free_ char *path = test_data_path("multi.txt");
	size_t len, n_docs = 0;
	_tok_cleanup_free_ char *text = test_read_file(path, &len);
	_tok_cleanup_free_ struct doc *docs = calloc(len / DOC_BYTES + 2, sizeof(*docs));
	if (!docs)
		return 1;
	for (size_t off = 0; off < len;) {
		size_t end = off + DOC_BYTES < len ? off + DOC_BYTES : len;
		while (end < len && text[end - 1] != '\n')
			end++;
		docs[n_docs++] = (struct doc) { text + off, end - off };
		off = end;
	}
	printf("multi.txt: %zu bytes, %zu documents\n", len, n_docs);
	if (optind < argc)
		for (int i = optind; i < argc; i++)
			rc |= bench(argv[i], docs, n_docs, len, repeat, peers);
	else
		for (size_t i = 0; i < TOK_ELEMENTSOF(all); i++)
			rc |= bench(all[i], docs, n_docs, len, repeat, peers);
	return rc;
}
