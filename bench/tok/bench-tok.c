/* SPDX-License-Identifier: MIT */
/*
 * Tokenizer throughput: feedd's tok against its peers, in one run, on the
 * same corpus (Debian docs, one document per source file) and the same
 * vocabulary.
 *
 *   bench-tok [--encoding cl100k_base] [--no-peers] [--repeat N]
 *   bench-tok --threads T [--encoding E] [--repeat N] [--shuffle SEED]
 *
 * Prints, per encoding: PCRE2 JIT splitting alone (the floor), feedd on one
 * thread, feedd on two threads (each encodes half of the documents; scaling
 * = MB/s(2) / (2 * MB/s(1))), then runs bench/tok/peers.mjs (tiktoken npm
 * WASM, gpt-tokenizer, HF tokenizers on one thread) and prints feedd / peer
 * for each.  Data: scripts/fetch-tok-data.sh ($FEEDD_TOKDATA).
 *
 * With --threads T it times only feedd on T threads and prints one line per
 * repetition, "threads T seconds S cpu_seconds C bytes B ids I docs D" (wall
 * and process CPU time of the encoding alone), for bench/textpath/run.py.
 * --shuffle SEED encodes the documents in a random order (the same for a
 * seed), the way a shuffled feed visits them; in the corpus's order
 * neighbouring documents share their words, which the tokenizer's caches
 * reward (~10 % less CPU on this corpus).
 */
#include <getopt.h>
#include <pthread.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/tok/tok-test.h"

struct doc {
	const char *text;
	size_t len;
};

/* Documents are handed out in blocks of this many, as feedd's pool hands out chunks. */
#define BLOCK_DOCS 8

struct job {
	const struct tok *t;
	const struct doc *docs;
	size_t n_docs;
	size_t *next; /* the first document no thread has taken yet, shared */
	size_t n_ids;
	int r;
};

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static double cpu_now(void) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double) ru.ru_utime.tv_sec + (double) ru.ru_utime.tv_usec * 1e-6 + (double) ru.ru_stime.tv_sec +
	       (double) ru.ru_stime.tv_usec * 1e-6;
}

static int count_ids(const int32_t *ids, size_t n, void *userdata) {
	*(size_t *) userdata += n;
	return 0;
}

static void *run_job(void *arg) {
	struct job *j = arg;
	struct tok_state *st = NULL;

	j->n_ids = 0;
	j->r = tok_state_new(j->t, &st);
	for (;;) {
		size_t first = __atomic_fetch_add(j->next, BLOCK_DOCS, __ATOMIC_RELAXED);
		for (size_t i = first; j->r == 0 && i < first + BLOCK_DOCS && i < j->n_docs; i++)
			j->r = tok_encode_stream(j->t, st, j->docs[i].text, j->docs[i].len, 0, count_ids, &j->n_ids, NULL);
		if (j->r < 0 || first + BLOCK_DOCS >= j->n_docs)
			break;
	}
	tok_state_free(st);
	return NULL;
}

/*
 * Wall time of encoding all docs with n threads taking blocks of documents
 * from a shared counter, as feedd's workers take chunks: a fixed split into
 * n contiguous shares of equal bytes measured the corpus's uneven cost per
 * byte (one half took ~1.5x the other), not the tokenizer.  Best of repeat runs.
 */
static double time_threads(const struct tok *t, const struct doc *docs, size_t n_docs, size_t total, int n,
			   int repeat, size_t *ret_ids) {
	double best = 1e30;

	(void) total;
	for (int rep = 0; rep < repeat; rep++) {
		struct job jobs[8];
		pthread_t th[8];
		size_t next = 0;
		double t0;

		for (int i = 0; i < n; i++)
			jobs[i] = (struct job) { .t = t, .docs = docs, .n_docs = n_docs, .next = &next };
		t0 = now();
		for (int i = 0; i < n; i++)
			if (pthread_create(&th[i], NULL, run_job, &jobs[i]) != 0)
				abort();
		*ret_ids = 0;
		for (int i = 0; i < n; i++) {
			pthread_join(th[i], NULL);
			if (jobs[i].r < 0) {
				fprintf(stderr, "encode: %s\n", strerror(-jobs[i].r));
				exit(1);
			}
			*ret_ids += jobs[i].n_ids;
		}
		double dt = now() - t0;
		if (dt < best)
			best = dt;
	}
	return best;
}

/* PCRE2 JIT splitting alone with the same compiled pattern, one thread. */
static double time_split(const struct tok *t, const struct doc *docs, size_t n_docs, size_t *ret_pieces) {
	pcre2_match_data *md = pcre2_match_data_create(1, NULL);
	pcre2_match_context *mc = pcre2_match_context_create(NULL);
	pcre2_jit_stack *js = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
	size_t pieces = 0;
	double t0;

	pcre2_jit_stack_assign(mc, NULL, js);
	t0 = now();
	for (size_t i = 0; i < n_docs; i++) {
		size_t pos = 0;
		while (pos < docs[i].len) {
			int r = pcre2_jit_match(t->re[0], (PCRE2_SPTR) docs[i].text, docs[i].len, pos, 0, md, mc);
			if (r < 0)
				break;
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
			pos = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
			pieces++;
		}
	}
	t0 = now() - t0;
	pcre2_match_data_free(md);
	pcre2_match_context_free(mc);
	pcre2_jit_stack_free(js);
	*ret_pieces = pieces;
	return t0;
}

static const char *rank_file(const char *enc) {
	if (strcmp(enc, "gpt2") == 0 || strcmp(enc, "r50k_base") == 0)
		return "ranks/r50k_base.tiktoken";
	if (strcmp(enc, "p50k_base") == 0)
		return "ranks/p50k_base.tiktoken";
	if (strcmp(enc, "cl100k_base") == 0)
		return "ranks/cl100k_base.tiktoken";
	if (strcmp(enc, "o200k_base") == 0)
		return "ranks/o200k_base.tiktoken";
	if (strcmp(enc, "llama3") == 0)
		return "ranks/llama3.tiktoken";
	fprintf(stderr, "unknown encoding %s\n", enc);
	exit(2);
}

int main(int argc, char **argv) {
	static const struct option opts[] = {
		{ "encoding", required_argument, NULL, 'e' },
		{ "no-peers", no_argument, NULL, 'n' },
		{ "repeat", required_argument, NULL, 'r' },
		{ "peers-script", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 't' },
		{ "shuffle", required_argument, NULL, 'S' },
		{ 0 },
	};
	const char *enc = "cl100k_base", *script = NULL;
	bool peers = true;
	int repeat = 3, threads = 0, c;
	unsigned long long shuffle = 0;
	struct tok *t = NULL;
	char *error = NULL;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) >= 0)
		switch (c) {
		case 'e': enc = optarg; break;
		case 'n': peers = false; break;
		case 'r': repeat = atoi(optarg); break;
		case 's': script = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'S': shuffle = strtoull(optarg, NULL, 10); break;
		default: return 2;
		}

	_tok_cleanup_free_ char *rpath = test_data_path(rank_file(enc));
	_tok_cleanup_free_ char *cpath = test_data_path("corpus.txt");
	_tok_cleanup_free_ char *ipath = test_data_path("corpus.idx");
	size_t len, ilen, n_docs = 0, off = 0, n_ids1 = 0, n_ids2 = 0, pieces = 0;
	_tok_cleanup_free_ char *text = test_read_file(cpath, &len);
	_tok_cleanup_free_ char *idx = test_read_file(ipath, &ilen);
	_tok_cleanup_free_ struct doc *docs = calloc(ilen / 2 + 1, sizeof(*docs));

	for (char *p = idx, *e; *p; p = e) {
		size_t n = strtoull(p, &e, 10);
		if (e == p)
			break;
		if (off + n > len) {
			fprintf(stderr, "corpus.idx does not match corpus.txt\n");
			return 1;
		}
		docs[n_docs++] = (struct doc) { text + off, n };
		off += n;
	}
	if (off != len) {
		fprintf(stderr, "corpus.idx does not match corpus.txt\n");
		return 1;
	}
	/* --shuffle SEED: the documents in a random order, as a shuffled feed visits them. */
	for (size_t i = n_docs; shuffle && i > 1; i--) {
		shuffle = shuffle * 6364136223846793005ull + 1442695040888963407ull;
		size_t j = (size_t) ((shuffle >> 33) % i);
		struct doc d = docs[i - 1];
		docs[i - 1] = docs[j];
		docs[j] = d;
	}
	if (tok_load_rankfile(rpath, enc, &t, &error) < 0) {
		fprintf(stderr, "%s\n", error);
		return 1;
	}

	if (threads > 0) {
		if (threads > 8) {
			fprintf(stderr, "--threads: at most 8\n");
			return 2;
		}
		for (int rep = 0; rep < repeat; rep++) {
			double c0 = cpu_now(), w = time_threads(t, docs, n_docs, len, threads, 1, &n_ids1);
			printf("threads %d seconds %.6f cpu_seconds %.6f bytes %zu ids %zu docs %zu\n", threads, w,
			       cpu_now() - c0, len, n_ids1, n_docs);
			fflush(stdout);
		}
		tok_free(t);
		return 0;
	}

	double ts = time_split(t, docs, n_docs, &pieces);
	double t1 = time_threads(t, docs, n_docs, len, 1, repeat, &n_ids1);
	double t2 = time_threads(t, docs, n_docs, len, 2, repeat, &n_ids2);
	double mb = len / 1e6, f1 = mb / t1, f2 = mb / t2;

	printf("corpus: %.1f MB, %zu documents, encoding %s\n", mb, n_docs, enc);
	printf("pcre2-jit split only     %7.1f MB/s  (%zu pieces)\n", mb / ts, pieces);
	printf("feedd 1 thread           %7.1f MB/s  (%zu ids)\n", f1, n_ids1);
	printf("feedd 2 threads          %7.1f MB/s  scaling %.2f (%ld cores online)\n", f2, f2 / (2 * f1),
	       sysconf(_SC_NPROCESSORS_ONLN));
	if (n_ids1 != n_ids2) {
		fprintf(stderr, "id counts differ between 1 and 2 threads\n");
		return 1;
	}
	if (peers) {
		char cmd[4096];
		char line[512];
		FILE *f;

		if (!script)
			script = FEEDD_SOURCE_ROOT "/bench/tok/peers.mjs";
		snprintf(cmd, sizeof(cmd), "RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node '%s' '%s' '%s'",
			 script, test_data_dir(), enc);
		fflush(stdout);
		f = popen(cmd, "r");
		if (!f) {
			perror("popen");
			return 1;
		}
		while (fgets(line, sizeof(line), f)) {
			char name[64];
			double mbps;
			size_t ids;
			if (sscanf(line, "peer %63s %lf %zu", name, &mbps, &ids) == 3)
				printf("%-24s %7.1f MB/s  (%zu ids)  feedd/peer %.1fx%s\n", name, mbps, ids, f1 / mbps,
				       ids == n_ids1 ? "" : "  [id count differs]");
			else
				fputs(line, stdout);
		}
		if (pclose(f) != 0)
			fprintf(stderr, "peers.mjs failed\n");
	}
	tok_free(t);
	free(error);
	return 0;
}
