/* SPDX-License-Identifier: MIT */
/*
 * Experiment 1's read driver: the daemon's own io_reader and shard code
 * (feedd-core), run without the rest of the daemon, so the read path's cost
 * can be told apart from widening, packing and delivery.
 *
 *   io docs seq|shuffle SEED BATCH_TOKENS DEPTH IDX...
 *       every document of the shards once, in shard order or shuffled
 *       (Fisher-Yates over all documents), grouped into batches of at least
 *       BATCH_TOKENS tokens; per batch one io_req per document range, all
 *       submitted with io_reader_run(), exactly as a worker does
 *       (daemon/feed/worker.c);
 *   io chunks MIB DEPTH BIN...
 *       the .bin files front to back in requests of MIB MiB (the reader
 *       splits them into 1 MiB reads, DEPTH in flight): the reader's limit
 *       with large sequential reads;
 *   io files LIST
 *       the files named in LIST (one path a line), each opened, read with
 *       read(2) and closed, one after another: the "one file per sample"
 *       loader.
 *
 * Each prints one JSON object: bytes, seconds, MB/s, reads. The caller makes
 * the cache cold first (bench/io/run.py).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/format/megatron.h"
#include "daemon/io/reader.h"
#include "daemon/source/source.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void report(const char *mode, uint64_t bytes, double secs, uint64_t reads, const char *engine)
{
	printf("{\"mode\": \"%s\", \"bytes\": %" PRIu64 ", \"seconds\": %.6f, \"mb_per_s\": %.2f, \"reads\": %" PRIu64
	       ", \"engine\": \"%s\"}\n",
	       mode, bytes, secs, (double)bytes / secs / 1e6, reads, engine ? engine : "read(2)");
}

struct doc_ref {
	uint32_t shard;
	uint32_t doc;
};

struct batch {
	struct source_read *reqs;
	size_t n, cap;
	uint8_t *buf;
	size_t used, buf_cap;
	struct source *src;
	unsigned itemsize;
};

static int emit(void *userdata, uint64_t byte_offset, uint64_t n_tokens)
{
	struct batch *b = userdata;
	if (b->n == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 1024;
		struct source_read *q = realloc(b->reqs, cap * sizeof(*q));
		if (!q)
			return -ENOMEM;
		b->reqs = q;
		b->cap = cap;
	}
	size_t len = n_tokens * b->itemsize;
	if (b->used + len > b->buf_cap)
		return -ENOBUFS;
	b->reqs[b->n++] = (struct source_read){ .src = b->src, .offset = byte_offset, .len = len, .dst = b->buf + b->used };
	b->used += len;
	return 0;
}

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64: a fixed, seedable permutation source; the order only has to be random, not feedd's. */
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static int run_docs(int argc, char **argv)
{
	if (argc < 7) {
		fprintf(stderr, "usage: io docs seq|shuffle SEED BATCH_TOKENS DEPTH IDX...\n");
		return 2;
	}
	int shuffle = strcmp(argv[2], "shuffle") == 0;
	uint64_t seed = strtoull(argv[3], NULL, 10);
	uint64_t batch_tokens = strtoull(argv[4], NULL, 10);
	unsigned depth = (unsigned)atoi(argv[5]);
	size_t n_shards = (size_t)(argc - 6);

	struct source_reader *io;
	int r = source_reader_new(IO_ENGINE_URING, depth, &io);
	if (r < 0) {
		fprintf(stderr, "io: io_uring setup failed: %s\n", strerror(-r));
		return 1;
	}
	struct megatron_shard **shards = calloc(n_shards, sizeof(*shards));
	size_t n_docs = 0;
	uint64_t max_doc = 0;
	for (size_t i = 0; i < n_shards; i++) {
		char err[512];
		r = megatron_open(argv[6 + i], io, &shards[i], err, sizeof(err));
		if (r < 0) {
			fprintf(stderr, "io: %s\n", err);
			return 1;
		}
		n_docs += shards[i]->n_docs;
		for (uint32_t d = 0; d < shards[i]->n_docs; d++) {
			uint64_t t = 0;
			megatron_doc_tokens(shards[i], d, &t, err, sizeof(err));
			max_doc = t > max_doc ? t : max_doc;
		}
	}
	struct doc_ref *docs = malloc(n_docs * sizeof(*docs));
	size_t k = 0;
	for (size_t i = 0; i < n_shards; i++)
		for (uint32_t d = 0; d < shards[i]->n_docs; d++)
			docs[k++] = (struct doc_ref){ .shard = (uint32_t)i, .doc = d };
	if (shuffle)
		for (size_t i = n_docs; i > 1; i--) {
			size_t j = rng_next(&seed) % i;
			struct doc_ref t = docs[i - 1];
			docs[i - 1] = docs[j];
			docs[j] = t;
		}

	struct batch b = { .buf_cap = (batch_tokens + max_doc) * 8 };
	b.buf = malloc(b.buf_cap);
	if (!docs || !b.buf)
		return 1;
	uint64_t bytes = 0, reads = 0;
	double t0 = now();
	for (size_t i = 0; i < n_docs;) {
		b.n = 0;
		b.used = 0;
		uint64_t tokens = 0;
		while (i < n_docs && tokens < batch_tokens) {
			const struct megatron_shard *s = shards[docs[i].shard];
			b.src = s->bin;
			b.itemsize = s->itemsize;
			uint64_t len = 0;
			char err[512];
			megatron_doc_tokens(s, docs[i].doc, &len, err, sizeof(err)); /* validated whole at open */
			if (len) {
				r = megatron_doc_ranges(s, docs[i].doc, 0, len, emit, &b);
				if (r < 0) {
					fprintf(stderr, "io: %s: document %" PRIu32 ": %s\n", s->idx_path, docs[i].doc,
						strerror(-r));
					return 1;
				}
			}
			tokens += len;
			i++;
		}
		size_t failed;
		r = source_read(io, b.reqs, b.n, &failed);
		if (r < 0) {
			fprintf(stderr, "io: read at byte %" PRIu64 " failed: %s\n", b.reqs[failed].offset, strerror(-r));
			return 1;
		}
		bytes += b.used;
		reads += b.n;
	}
	report(shuffle ? "docs-shuffle" : "docs-seq", bytes, now() - t0, reads, source_reader_engine(io));
	for (size_t i = 0; i < n_shards; i++)
		megatron_free(shards[i]);
	free(shards);
	free(docs);
	free(b.reqs);
	free(b.buf);
	source_reader_free(io);
	return 0;
}

static int run_chunks(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: io chunks MIB DEPTH BIN...\n");
		return 2;
	}
	size_t req = (size_t)atoi(argv[2]) << 20;
	unsigned depth = (unsigned)atoi(argv[3]);
	struct io_reader *io;
	int r = io_reader_new(IO_ENGINE_URING, depth, &io);
	if (r < 0) {
		fprintf(stderr, "io: io_uring setup failed: %s\n", strerror(-r));
		return 1;
	}
	/* Several requests at once so that `depth` 1 MiB reads can be in flight. */
	const size_t per_run = 16;
	uint8_t *buf = malloc(req * per_run);
	struct io_req reqs[16];
	uint64_t bytes = 0, reads = 0;
	double t0 = now();
	for (int i = 4; i < argc; i++) {
		int fd = open(argv[i], O_RDONLY | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0) {
			fprintf(stderr, "io: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		for (uint64_t off = 0; off < (uint64_t)st.st_size;) {
			size_t n = 0;
			for (; n < per_run && off < (uint64_t)st.st_size; n++) {
				size_t len = (size_t)((uint64_t)st.st_size - off < req ? (uint64_t)st.st_size - off : req);
				reqs[n] = (struct io_req){ .fd = fd, .offset = off, .len = len, .dst = buf + n * req };
				off += len;
				bytes += len;
			}
			size_t failed;
			r = io_reader_run(io, reqs, n, &failed);
			if (r < 0) {
				fprintf(stderr, "io: %s: read at byte %" PRIu64 " failed: %s\n", argv[i],
					reqs[failed].offset, strerror(-r));
				return 1;
			}
			reads += n;
		}
		close(fd);
	}
	report("chunks", bytes, now() - t0, reads, io_reader_engine(io));
	free(buf);
	io_reader_free(io);
	return 0;
}

static int run_files(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: io files LIST\n");
		return 2;
	}
	FILE *list = fopen(argv[2], "re");
	if (!list) {
		fprintf(stderr, "io: %s: %s\n", argv[2], strerror(errno));
		return 1;
	}
	static uint8_t buf[1 << 16];
	char path[4096];
	uint64_t bytes = 0, reads = 0;
	double t0 = now();
	while (fgets(path, sizeof(path), list)) {
		path[strcspn(path, "\n")] = 0;
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			fprintf(stderr, "io: %s: %s\n", path, strerror(errno));
			return 1;
		}
		ssize_t k;
		while ((k = read(fd, buf, sizeof(buf))) > 0)
			bytes += (uint64_t)k;
		if (k < 0) {
			fprintf(stderr, "io: %s: %s\n", path, strerror(errno));
			return 1;
		}
		close(fd);
		reads++;
	}
	report("files", bytes, now() - t0, reads, NULL);
	fclose(list);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "docs") == 0)
		return run_docs(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "chunks") == 0)
		return run_chunks(argc, argv);
	if (argc >= 2 && strcmp(argv[1], "files") == 0)
		return run_files(argc, argv);
	fprintf(stderr, "usage: io docs|chunks|files ...\n");
	return 2;
}
