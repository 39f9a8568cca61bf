/* SPDX-License-Identifier: MIT */
/*
 * feedctl prep: raw text to a Megatron indexed dataset (.bin + .idx), what
 * Megatron's tools/preprocess_data.py does, with feedd's own tokenizer,
 * reader and thread pool. It opens the inputs with the library a text feed
 * uses (source/, format/, tok/, tokenize/; never feed/ or server/), tokenizes
 * runs of documents on the pool, and writes them strictly in input order,
 * one sequence per document. A bad
 * record under on_bad_record = skip becomes an empty document, exactly as a
 * text feed serves it, so the prepared shards give the same stream as the
 * text they came from.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/feedctl/feedctl.h"
#include <sys/stat.h>

#include "daemon/cache/cache.h"
#include "daemon/format/format.h"
#include "daemon/io/sums.h"
#include "daemon/order/order.h"
#include "daemon/pool/pool.h"
#include "daemon/source/source.h"
#include "daemon/tok/tok.h"
#include "daemon/tokenize/tokenize.h"
#include "proto/macro.h"

#define CHUNK_BYTES (1u << 20)

struct prep {
	pthread_mutex_t lock;
	pthread_cond_t done;
	struct tokenize_params params;
	enum io_engine engine;
	unsigned threads;
};

struct prep_chunk {
	struct pool_job job;
	struct tokenize_chunk c;
	uint64_t *docs;
	struct prep *prep;
	int result;
	bool finished;
};

/* What each pool thread owns. */
struct prep_thread {
	struct source_reader *io;
	struct tokenize_scratch tk;
};

static void *ctx_new(unsigned i, void *arg)
{
	struct prep *p = arg;
	struct prep_thread *t = calloc(1, sizeof(*t));
	if (t && source_reader_new(p->engine, 64, &t->io) < 0) {
		free(t);
		return NULL;
	}
	return t;
}

static void ctx_free(void *ctx)
{
	struct prep_thread *t = ctx;
	if (!t)
		return;
	source_reader_free(t->io);
	tokenize_scratch_done(&t->tk);
	free(t);
}

static void chunk_run(struct pool_job *job, void *ctx)
{
	struct prep_chunk *pc = (struct prep_chunk *)((char *)job - offsetof(struct prep_chunk, job));
	struct prep *p = pc->prep;
	struct prep_thread *t = ctx;
	pc->result = tokenize_read(&t->tk, t->io, &p->params, &pc->c);
	if (pc->result == 0)
		pc->result = tokenize_encode(&t->tk, &p->params, &pc->c);
	pthread_mutex_lock(&p->lock);
	pc->finished = true;
	pthread_cond_broadcast(&p->done);
	pthread_mutex_unlock(&p->lock);
}

static void chunk_clear(struct prep_chunk *pc)
{
	tokenize_chunk_done(&pc->c);
	free(pc->docs);
	*pc = (struct prep_chunk){ 0 };
}

struct out {
	FILE *bin;
	uint8_t dtype;       /* 8 (u16) or 4 (i32) */
	int32_t *lengths;    /* per document */
	size_t n, cap;
	uint64_t tokens;
	void *buf;
	size_t buf_cap;
};

static int out_doc(struct out *o, const int32_t *ids, size_t n)
{
	if (n > INT32_MAX)
		return -E2BIG;
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 4096;
		int32_t *l = realloc(o->lengths, cap * sizeof(*l));
		if (!l)
			return -ENOMEM;
		o->lengths = l;
		o->cap = cap;
	}
	o->lengths[o->n++] = (int32_t)n;
	o->tokens += n;
	if (o->dtype == 4)
		return fwrite(ids, 4, n, o->bin) == n ? 0 : -EIO;
	if (n * 2 > o->buf_cap) {
		void *b = realloc(o->buf, n * 2);
		if (!b)
			return -ENOMEM;
		o->buf = b;
		o->buf_cap = n * 2;
	}
	uint16_t *u = o->buf;
	for (size_t i = 0; i < n; i++)
		u[i] = (uint16_t)ids[i];
	return fwrite(u, 2, n, o->bin) == n ? 0 : -EIO;
}

static int write_idx(const char *path, const struct out *o)
{
	FILE *f = fopen(path, "we");
	if (!f)
		return -errno;
	uint64_t version = 1, s = o->n, d = o->n + 1;
	fwrite("MMIDIDX\0\0", 1, 9, f);
	fwrite(&version, 8, 1, f);
	fwrite(&o->dtype, 1, 1, f);
	fwrite(&s, 8, 1, f);
	fwrite(&d, 8, 1, f);
	fwrite(o->lengths, 4, o->n, f);
	int64_t ptr = 0, size = o->dtype == 4 ? 4 : 2;
	for (size_t i = 0; i < o->n; i++) {
		fwrite(&ptr, 8, 1, f);
		ptr += (int64_t)o->lengths[i] * size;
	}
	for (int64_t i = 0; i <= (int64_t)o->n; i++)
		fwrite(&i, 8, 1, f);
	int bad = ferror(f);
	return fclose(f) != 0 || bad ? -EIO : 0;
}

static void usage_prep(FILE *out)
{
	fprintf(out,
		"Usage: feedctl prep --tokenizer FILE [--preset NAME] --out PREFIX [OPTIONS] INPUT...\n"
		"Tokenize text shards into a Megatron dataset PREFIX.bin + PREFIX.idx, one sequence per\n"
		"document, documents in input order (each INPUT may be a glob).\n\n"
		"  -t, --tokenizer FILE      tiktoken rank file or HF tokenizer.json\n"
		"  -p, --preset NAME         rank files: gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, llama3\n"
		"  -o, --out PREFIX          output prefix\n"
		"  -f, --format FMT          jsonl (default), text (one document per file) or parquet\n"
		"  -k, --text-key KEY        jsonl member or parquet column holding the text (default: text)\n"
		"  -e, --append-eos TOKEN    append this id or special token to every non-empty document\n"
		"      --on-bad-record P     skip (default: an empty document, counted) or fail\n"
		"      --encode-special-tokens  special tokens in the text become their ids\n"
		"  -j, --threads N           tokenizer threads (default: all CPUs)\n"
		"      --cache-dir DIR       keep indexes and decompressed copies here (default: a temporary directory)\n"
		"      --no-sums             do not write PREFIX.bin.sums (block checksums feedd verifies on every read)\n");
}

static void progress(bool tty, uint64_t docs, uint64_t total, uint64_t bytes, uint64_t t0, bool final)
{
	double s = (double)(now_ns() - t0) / 1e9;
	if (!tty && !final)
		return;
	fprintf(stderr, "%sprep: %" PRIu64 "/%" PRIu64 " documents, %.1f MB, %.1f MB/s%s", tty ? "\r" : "", docs, total,
		(double)bytes / 1e6, s > 0 ? (double)bytes / 1e6 / s : 0.0, final || !tty ? "\n" : "   ");
}

/* Removes the temporary cache directory prep made: only its own index and data files (and .lock) are in it. */
static void remove_cache(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		for (struct dirent *e; (e = readdir(d));)
			if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
				unlinkat(dirfd(d), e->d_name, 0);
		closedir(d);
	}
	rmdir(dir);
}

int cmd_prep(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tokenizer", required_argument, NULL, 't' },
		{ "preset", required_argument, NULL, 'p' },
		{ "out", required_argument, NULL, 'o' },
		{ "format", required_argument, NULL, 'f' },
		{ "text-key", required_argument, NULL, 'k' },
		{ "append-eos", required_argument, NULL, 'e' },
		{ "on-bad-record", required_argument, NULL, 'b' },
		{ "encode-special-tokens", no_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 'j' },
		{ "cache-dir", required_argument, NULL, 'c' },
		{ "no-sums", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	/* What a text feed would be configured with: documents in input order, one stream. */
	struct {
		const char *format, *text_key, *tokenizer, *tokenizer_preset, *cache_dir;
		bool skip_bad_records, encode_special_tokens;
		uint64_t max_document_bytes;
	} cf = {
		.format = "jsonl",
		.text_key = "text",
		.skip_bad_records = true,
		.max_document_bytes = UINT32_MAX - 1,
	};
	const char *out_prefix = NULL, *eos = NULL;
	unsigned threads = 0;
	bool write_sums = true;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "t:p:o:f:k:e:j:h", opts, NULL)) >= 0) {
		switch (c) {
		case 't': cf.tokenizer = optarg; break;
		case 'p': cf.tokenizer_preset = optarg; break;
		case 'o': out_prefix = optarg; break;
		case 'f':
			if (strcmp(optarg, "jsonl") != 0 && strcmp(optarg, "text") != 0 && strcmp(optarg, "parquet") != 0) {
				fprintf(stderr, "feedctl prep: --format %s: expected jsonl, text or parquet\n", optarg);
				return 2;
			}
			cf.format = optarg;
			break;
		case 'k': cf.text_key = optarg; break;
		case 'e': eos = optarg; break;
		case 'b':
			if (strcmp(optarg, "skip") != 0 && strcmp(optarg, "fail") != 0) {
				fprintf(stderr, "feedctl prep: --on-bad-record %s: expected skip or fail\n", optarg);
				return 2;
			}
			cf.skip_bad_records = optarg[0] == 's';
			break;
		case 's': cf.encode_special_tokens = true; break;
		case 'j': threads = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'c': cf.cache_dir = optarg; break;
		case 'n': write_sums = false; break;
		case 'h': usage_prep(stdout); return 0;
		default: usage_prep(stderr); return 2;
		}
	}
	if (!cf.tokenizer || !out_prefix || optind >= argc) {
		usage_prep(stderr);
		return 2;
	}
	if (!tokenize_tok_is_hf(cf.tokenizer) && !cf.tokenizer_preset) {
		fprintf(stderr, "feedctl prep: %s is a tiktoken rank file: give --preset (its pattern and special tokens)\n",
			cf.tokenizer);
		return 2;
	}
	const char *const *inputs = (const char *const *)argv + optind;
	const size_t n_inputs = (size_t)(argc - optind);

	char tmpdir[] = "/tmp/feedctl-prep-XXXXXX";
	bool own_cache = !cf.cache_dir;
	if (own_cache) {
		if (!mkdtemp(tmpdir)) {
			fprintf(stderr, "feedctl prep: cannot make a temporary directory: %s\n", strerror(errno));
			return 1;
		}
		cf.cache_dir = tmpdir;
	}

	int ret = 1;
	struct source_reader *io = NULL;
	struct tok *tok = NULL;
	char **paths = NULL;
	size_t n_paths = 0;
	struct shard **shards = NULL;
	uint32_t n_shards = 0;
	uint64_t n_docs = 0;
	struct pool *pool = NULL;
	struct prep p = { .lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER, .engine = IO_ENGINE_AUTO };
	struct out o = { 0 };
	struct prep_chunk *ring = NULL;
	_cleanup_free_ char *bin_path = NULL, *idx_path = NULL, *bin_tmp = NULL, *msg = NULL;
	char err[512] = "";

	if (source_reader_new(p.engine, 64, &io) < 0) {
		fprintf(stderr, "feedctl prep: out of memory\n");
		goto out;
	}
	int r = tokenize_tok_load(cf.tokenizer, cf.tokenizer_preset, &tok, &msg);
	if (r < 0) {
		fprintf(stderr, "feedctl prep: tokenizer: %s\n", msg ? msg : strerror(-r));
		goto out;
	}
	if (source_glob(inputs, n_inputs, &paths, &n_paths, err, sizeof(err)) < 0) {
		fprintf(stderr, "feedctl prep: %s\n", err);
		goto out;
	}
	if (n_paths > UINT32_MAX - 1 || !(shards = calloc(MAX(n_paths, 1u), sizeof(*shards)))) {
		fprintf(stderr, "feedctl prep: out of memory\n");
		goto out;
	}
	/* Created if missing; what crashed builds left there removed (daemon/cache/cache.h). */
	if (cache_clean(cf.cache_dir, err, sizeof(err)) < 0) {
		fprintf(stderr, "feedctl prep: %s\n", err);
		goto out;
	}
	const struct format_opts fo = {
		.cache_dir = cf.cache_dir,
		.max_doc_bytes = cf.max_document_bytes,
		.text_key = cf.text_key,
	};
	for (size_t i = 0; i < n_paths; i++) {
		if (format_open(format_find(cf.format), paths[i], &fo, io, &shards[i], err, sizeof(err)) < 0) {
			fprintf(stderr, "feedctl prep: %s\n", err);
			goto out;
		}
		n_shards++;
		n_docs += shards[i]->n_docs;
		if (shards[i]->truncated[0]) {
			/* The cut line is a bad record, as in a text feed. */
			if (!cf.skip_bad_records) {
				fprintf(stderr, "feedctl prep: %s (on_bad_record = fail)\n", shards[i]->truncated);
				goto out;
			}
			fprintf(stderr, "prep: %s\n", shards[i]->truncated);
		}
	}
	p.params = (struct tokenize_params){
		.shards = shards,
		.tok = tok,
		.tok_generation = 1,
		.max_doc_bytes = cf.max_document_bytes,
		.encode_specials = cf.encode_special_tokens,
		.skip_bad_records = cf.skip_bad_records,
	};
	int32_t eos_id = -1;
	if (eos) {
		char *end;
		long v = strtol(eos, &end, 10);
		if (*eos && !*end && v >= 0 && v <= INT32_MAX)
			eos_id = (int32_t)v;
		else if ((eos_id = tok_special_id(tok, eos)) < 0) {
			fprintf(stderr, "feedctl prep: --append-eos %s: the tokenizer has no such special token\n", eos);
			goto out;
		}
	}
	o.dtype = tok_vocab_size(tok) <= 65536 && eos_id < 65536 ? 8 : 4;
	if (asprintf(&bin_path, "%s.bin", out_prefix) < 0 || asprintf(&idx_path, "%s.idx", out_prefix) < 0 ||
	    asprintf(&bin_tmp, "%s.bin.tmp", out_prefix) < 0)
		goto out;
	o.bin = fopen(bin_tmp, "we");
	if (!o.bin) {
		fprintf(stderr, "feedctl prep: cannot create %s: %s\n", bin_tmp, strerror(errno));
		goto out;
	}

	if (pool_new(threads, ctx_new, ctx_free, &p, &pool) < 0) {
		fprintf(stderr, "feedctl prep: cannot start the tokenizer threads\n");
		goto out;
	}
	threads = pool_threads(pool);
	const size_t window = 2 * threads + 2;
	ring = calloc(window, sizeof(*ring));
	if (!ring)
		goto out;

	/* Documents in input order: shard by shard, line by line; chunks written in submission order. */
	uint32_t shard = 0, doc = 0;
	uint64_t submitted = 0, written = 0, docs_done = 0, bytes_done = 0, skipped = 0;
	uint64_t t0 = now_ns();
	bool tty = isatty(STDERR_FILENO);
	char first_bad[512] = "";
	for (;;) {
		/* Fill the window. */
		while (submitted - written < window && shard < n_shards) {
			struct prep_chunk *pc = &ring[submitted % window];
			uint32_t cap = 256;
			pc->prep = &p;
			pc->job.run = chunk_run;
			pc->docs = malloc(cap * sizeof(uint64_t));
			if (!pc->docs)
				goto out;
			pc->c.docs = pc->docs;
			while (shard < n_shards && pc->c.bytes < CHUNK_BYTES) {
				if (doc >= shards[shard]->n_docs) {
					shard++;
					doc = 0;
					continue;
				}
				if (pc->c.n == cap) {
					uint64_t *d = realloc(pc->docs, 2 * cap * sizeof(*d));
					if (!d)
						goto out;
					pc->c.docs = pc->docs = d;
					cap *= 2;
				}
				pc->docs[pc->c.n++] = ORDER_DOC(shard, doc);
				pc->c.bytes += format_doc_bytes(shards[shard], doc);
				doc++;
			}
			if (pc->c.n == 0) {
				chunk_clear(pc);
				break;
			}
			submitted++;
			pool_submit(pool, &pc->job);
		}
		if (written == submitted)
			break;
		/* Write the oldest, in order. */
		struct prep_chunk *pc = &ring[written % window];
		pthread_mutex_lock(&p.lock);
		while (!pc->finished)
			pthread_cond_wait(&p.done, &p.lock);
		pthread_mutex_unlock(&p.lock);
		if (pc->result < 0) {
			if (tty)
				fputc('\n', stderr);
			fprintf(stderr, "feedctl prep: %s\n", pc->c.error);
			goto out;
		}
		if (pc->c.skipped && !first_bad[0])
			snprintf(first_bad, sizeof(first_bad), "%s", pc->c.error);
		skipped += pc->c.skipped;
		for (uint32_t i = 0; i < pc->c.n; i++) {
			size_t n = pc->c.start[i + 1] - pc->c.start[i];
			int32_t *ids = pc->c.ids + pc->c.start[i];
			r = out_doc(&o, ids, n);
			if (r == 0 && eos_id >= 0 && n > 0) {
				/* One sequence per document: eos joins the document's own. */
				o.lengths[o.n - 1]++;
				o.tokens++;
				r = o.dtype == 4 ? (fwrite(&eos_id, 4, 1, o.bin) == 1 ? 0 : -EIO)
						 : (fwrite(&(uint16_t){ (uint16_t)eos_id }, 2, 1, o.bin) == 1 ? 0 : -EIO);
			}
			if (r < 0) {
				fprintf(stderr, "feedctl prep: writing %s: %s\n", bin_tmp, strerror(-r));
				goto out;
			}
		}
		docs_done += pc->c.n;
		bytes_done += pc->c.bytes;
		chunk_clear(pc);
		written++;
		progress(tty, docs_done, n_docs, bytes_done, t0, false);
	}
	if (fclose(o.bin) != 0) {
		o.bin = NULL;
		fprintf(stderr, "feedctl prep: writing %s: %s\n", bin_tmp, strerror(errno));
		goto out;
	}
	o.bin = NULL;
	/* A sidecar of an earlier run must not outlive the .bin it described. */
	_cleanup_free_ char *sums_path = NULL;
	if (asprintf(&sums_path, "%s.sums", bin_path) < 0) {
		sums_path = NULL;
		goto out;
	}
	if (unlink(sums_path) < 0 && errno != ENOENT) {
		fprintf(stderr, "feedctl prep: cannot remove the old %s: %s\n", sums_path, strerror(errno));
		goto out;
	}
	r = write_idx(idx_path, &o);
	if (r == 0 && rename(bin_tmp, bin_path) < 0)
		r = -errno;
	if (r < 0) {
		fprintf(stderr, "feedctl prep: writing %s: %s\n", idx_path, strerror(-r));
		goto out;
	}
	/* Block checksums of .bin and the hash of .idx: feedd checks every block it reads (docs/checksums.md). */
	if (write_sums && sums_write_sidecar(sums_path, bin_path, idx_path, SUMS_BLOCK_DEFAULT, err, sizeof(err)) < 0) {
		fprintf(stderr, "feedctl prep: %s\n", err);
		goto out;
	}
	progress(tty, docs_done, n_docs, bytes_done, t0, true);
	fprintf(stderr, "prep: %" PRIu64 " documents, %" PRIu64 " tokens (%s), %" PRIu64 " bad records skipped, %u threads -> %s.{bin,idx%s}\n",
		docs_done, o.tokens, o.dtype == 4 ? "i32" : "u16", skipped, threads, out_prefix, write_sums ? ",bin.sums" : "");
	if (skipped)
		fprintf(stderr, "prep: first bad record: %s\n", first_bad);
	ret = 0;
out:
	pool = pool_free(pool);
	for (size_t i = 0; ring && i < 2 * threads + 2; i++)
		chunk_clear(&ring[i]);
	free(ring);
	if (o.bin) {
		fclose(o.bin);
		unlink(bin_tmp);
	}
	free(o.lengths);
	free(o.buf);
	for (uint32_t i = 0; i < n_shards; i++)
		format_close(shards[i]);
	free(shards);
	for (size_t i = 0; i < n_paths; i++)
		free(paths[i]);
	free(paths);
	tok_free(tok);
	source_reader_free(io);
	if (own_cache)
		remove_cache(tmpdir);
	return ret;
}
