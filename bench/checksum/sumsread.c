/* SPDX-License-Identifier: MIT */
/*
 * bench/checksum's precise half: the reads a path makes, timed with and
 * without checksums in one process, on the CPU clock of the thread doing
 * them (the workers' own clock), so the cost is measured apart from the
 * tokenizer and from the machine's other load.
 *
 *   sumsread jsonl CACHE_DIR ROUNDS SHARD...   every document of text shards
 *            (their checksummed cache copies), in a shuffled order, in runs
 *            of about 1 MiB as tokenize_read() reads them;
 *   sumsread megatron - ROUNDS SHARD.idx...    every document of Megatron
 *            shards (their .bin.sums sidecars), shuffled, in batches of
 *            16384 tokens of reads as a worker submits them.
 *
 * Each round reads everything once unchecked and once checked (the shards
 * opened a second time with FEEDD_BENCH_NO_VERIFY=1 set, so their sources
 * carry no sums). Prints one JSON line: bytes and documents per round and
 * the lowest CPU seconds of the rounds for each side.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/format/format.h"
#include "daemon/source/source.h"
#include "proto/macro.h"

struct doc_read {
	struct source_read q;
};

static double thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct list {
	struct source_read *v;
	size_t n, cap;
};

static void push(struct list *l, struct source_read q)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 1024;
		l->v = realloc(l->v, l->cap * sizeof(*l->v));
		if (!l->v)
			abort();
	}
	l->v[l->n++] = q;
}

static int emit(void *ctx, struct source *src, uint64_t off, uint64_t n_tokens)
{
	struct list *l = ctx;
	push(l, (struct source_read){ .src = src, .offset = off, .len = (size_t)n_tokens * 2 });
	return 0;
}

/* Every document's reads, in a shuffled order of documents. */
static void plan(struct shard **sh, size_t n_sh, bool text, struct list *out)
{
	struct list docs = { 0 };
	for (size_t s = 0; s < n_sh; s++)
		for (uint32_t d = 0; d < sh[s]->n_docs; d++) {
			struct source_read q = { .offset = s, .len = d }; /* placeholder: shard, doc */
			push(&docs, q);
		}
	uint64_t x = 88172645463325252ull;
	for (size_t i = docs.n; i > 1; i--) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t j = (size_t)(x % i);
		struct source_read t = docs.v[i - 1];
		docs.v[i - 1] = docs.v[j];
		docs.v[j] = t;
	}
	for (size_t i = 0; i < docs.n; i++) {
		struct shard *s = sh[docs.v[i].offset];
		uint32_t d = (uint32_t)docs.v[i].len;
		if (text) {
			struct source_read q;
			format_doc_read(s, d, &q);
			if (q.len)
				push(out, q);
		} else {
			uint64_t tokens = 0;
			char err[256];
			if (format_doc_tokens(s, d, &tokens, err, sizeof(err)) < 0) {
				fprintf(stderr, "sumsread: %s\n", err);
				exit(1);
			}
			if (tokens)
				format_doc_ranges(s, d, 0, tokens, emit, out);
		}
	}
	free(docs.v);
}

/* Reads the list in batches of about `batch` bytes; returns CPU seconds. */
static double run(struct source_reader *io, struct list *l, size_t batch, uint8_t *buf)
{
	double t0 = thread_cpu();
	for (size_t i = 0; i < l->n;) {
		size_t j = i, bytes = 0;
		while (j < l->n && (bytes == 0 || bytes + l->v[j].len <= batch)) {
			l->v[j].dst = buf + bytes;
			bytes += l->v[j].len;
			j++;
		}
		size_t failed;
		if (source_read(io, l->v + i, j - i, &failed) < 0) {
			fprintf(stderr, "sumsread: %s\n", source_reader_error(io));
			exit(1);
		}
		i = j;
	}
	return thread_cpu() - t0;
}

static void open_all(const char *fmt, const char *cache, char **paths, size_t n, struct source_reader *io,
		     struct shard **out)
{
	struct format_opts o = { .cache_dir = strcmp(cache, "-") ? cache : NULL, .max_doc_bytes = UINT32_MAX - 1,
				 .text_key = "text" };
	char err[512];
	for (size_t i = 0; i < n; i++)
		/* A text copy is made on use (format_acquire): held for the whole run. */
		if (format_open(format_find(fmt), paths[i], &o, io, &out[i], err, sizeof(err)) < 0 ||
		    format_acquire(out[i], io, err, sizeof(err), err, sizeof(err)) < 0) {
			fprintf(stderr, "sumsread: %s\n", err);
			exit(1);
		}
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: sumsread jsonl|megatron CACHE_DIR|- ROUNDS SHARD...\n");
		return 2;
	}
	const bool text = strcmp(argv[1], "jsonl") == 0;
	const int rounds = atoi(argv[3]);
	const size_t n = (size_t)(argc - 4);
	struct source_reader *io = NULL;
	if (source_reader_new(IO_ENGINE_AUTO, 64, &io) < 0)
		return 1;
	struct shard **on = calloc(n, sizeof(*on)), **off = calloc(n, sizeof(*off));
	unsetenv("FEEDD_BENCH_NO_VERIFY");
	open_all(argv[1], argv[2], argv + 4, n, io, on);
	setenv("FEEDD_BENCH_NO_VERIFY", "1", 1);
	open_all(argv[1], argv[2], argv + 4, n, io, off);
	struct list l_on = { 0 }, l_off = { 0 };
	plan(on, n, text, &l_on);
	plan(off, n, text, &l_off);
	const size_t batch = text ? (1u << 20) : 16384 * 2;
	uint64_t bytes = 0, max = 0;
	for (size_t i = 0; i < l_on.n; i++) {
		bytes += l_on.v[i].len;
		max = MAX(max, (uint64_t)l_on.v[i].len);
	}
	uint8_t *buf = malloc(MAX((size_t)max, batch) * 2);
	double best_on = 1e9, best_off = 1e9;
	for (int r = 0; r < rounds; r++) {
		best_off = MIN(best_off, run(io, &l_off, batch, buf));
		best_on = MIN(best_on, run(io, &l_on, batch, buf));
	}
	printf("{\"reads\": %zu, \"bytes\": %" PRIu64 ", \"unchecked_cpu_s\": %.6f, \"checked_cpu_s\": %.6f}\n", l_on.n,
	       bytes, best_off, best_on);
	for (size_t i = 0; i < n; i++) {
		format_close(on[i]);
		format_close(off[i]);
	}
	free(on);
	free(off);
	free(l_on.v);
	free(l_off.v);
	free(buf);
	source_reader_free(io);
	return 0;
}
