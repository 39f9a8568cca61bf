/* SPDX-License-Identifier: MIT */
/*
 * Experiment 4 of #10, the padding tax: how many of a batch's positions hold
 * real tokens under naive padding ("pad", one document per row), "concat"
 * (the spine's packing) and "bestfit" (Best-Fit-Decreasing over a buffer),
 * and how fast each packs, all in one run on the same documents.
 *
 *   padding [--tokdata DIR] [--seq-len 4096] [--batch 32] [--seconds 1.5]
 *   padding [--tokdata DIR] --write-docs DIR
 *
 * --write-docs writes both distributions' documents (tokens without eos) as
 * DIR/NAME.tok (int32, back to back) and DIR/NAME.len (uint32 per document)
 * and exits: bench/padding/run.py turns them into shards and measures each
 * packing mode end to end through a real feedd and client.
 *
 * Documents: the Debian docs corpus of scripts/fetch-tok-data.sh (linux-doc-6.1
 * and python3.11-doc reST sources), tokenized with feedd's own tokenizer
 * (cl100k_base), each contribution ending in <|endoftext|> as eos. Two length
 * distributions from the same text:
 *   paragraphs  every file split at blank lines (instruction-sized documents),
 *   files       whole files (their paragraphs' tokens, concatenated).
 * Order: the feed contract with shuffle on (seed 1, one shard), walked by
 * the daemon's own stream (daemon/order/stream.c); concat batches come from
 * pack_plan/pack_fill, pad and bestfit batches from pad_plan/bestfit_plan and
 * pad_fill, exactly the calls a session makes.
 *
 * Efficiency, truncation and cut documents are counted over one whole epoch
 * (planning only). Throughput is real tokens per second of plan + reading
 * tokens into the batch + fill, on one thread, per CPU-second of that thread
 * (the machine may be shared), for --seconds of CPU per mode; the
 * ratio column compares each mode with concat measured in the same run.
 * Exit 77 when the corpus is missing.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/order/stream.h"
#include "daemon/pack/bestfit.h"
#include "daemon/pack/pack.h"
#include "daemon/pack/pad.h"
#include "daemon/tok/tok.h"
#include "proto/macro.h"

#ifndef FEEDD_TOKDATA_DEFAULT
#define FEEDD_TOKDATA_DEFAULT "build/tokdata"
#endif

/* One length distribution: documents as runs of a flat token array (eos included). */
struct corpus {
	const char *name;
	int32_t *tok;      /* all contributions back to back */
	uint64_t *start;   /* start[d]: first position of document d in tok */
	uint32_t *tokens;  /* tokens[d]: its token count without eos (the stream adds eos) */
	uint32_t n_docs;
	uint64_t n_tok, cap_tok, cap_docs;
};

static void die(const char *what)
{
	fprintf(stderr, "padding: %s\n", what);
	exit(1);
}

static void corpus_add(struct corpus *c, const int32_t *ids, size_t n, int32_t eos)
{
	if (c->n_tok + n + 1 > c->cap_tok) {
		c->cap_tok = MAX(c->cap_tok * 2, c->n_tok + n + 1 + (1u << 20));
		c->tok = realloc(c->tok, c->cap_tok * sizeof(int32_t));
	}
	if (c->n_docs == c->cap_docs) {
		c->cap_docs = MAX(c->cap_docs * 2, (uint64_t)4096);
		c->start = realloc(c->start, c->cap_docs * sizeof(uint64_t));
		c->tokens = realloc(c->tokens, c->cap_docs * sizeof(uint32_t));
	}
	if (!c->tok || !c->start || !c->tokens)
		die("out of memory");
	c->start[c->n_docs] = c->n_tok;
	c->tokens[c->n_docs++] = (uint32_t)n;
	memcpy(c->tok + c->n_tok, ids, n * sizeof(int32_t));
	c->n_tok += n;
	c->tok[c->n_tok++] = eos;
}

static int sink(const int32_t *ids, size_t n, void *userdata)
{
	struct tok_ids *out = userdata;
	if (out->n + n > out->cap) {
		out->cap = MAX(out->cap * 2, out->n + n + 4096);
		out->ids = realloc(out->ids, out->cap * sizeof(int32_t));
		if (!out->ids)
			return -ENOMEM;
	}
	memcpy(out->ids + out->n, ids, n * sizeof(int32_t));
	out->n += n;
	return 0;
}

static char *slurp(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return NULL;
	struct stat st;
	if (fstat(fileno(f), &st) < 0) {
		fclose(f);
		return NULL;
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf || fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
		fclose(f);
		free(buf);
		return NULL;
	}
	fclose(f);
	buf[st.st_size] = 0;
	*ret_len = (size_t)st.st_size;
	return buf;
}

static bool blank_line(const char *a, const char *b)
{
	for (; a < b; a++)
		if (*a != ' ' && *a != '\t' && *a != '\r')
			return false;
	return true;
}

/* Tokenizes every file paragraph by paragraph into both distributions. */
static void load(const char *dir, struct corpus *paras, struct corpus *files)
{
	char path[4096];
	size_t len, idx_len;
	snprintf(path, sizeof(path), "%s/corpus.txt", dir);
	char *text = slurp(path, &len);
	snprintf(path, sizeof(path), "%s/corpus.idx", dir);
	char *idx = slurp(path, &idx_len);
	snprintf(path, sizeof(path), "%s/ranks/cl100k_base.tiktoken", dir);
	if (!text || !idx || access(path, R_OK) < 0) {
		printf("padding: SKIP: no corpus in %s (run scripts/fetch-tok-data.sh %s)\n", dir, dir);
		exit(77);
	}
	struct tok *t;
	char *error = NULL;
	if (tok_load_rankfile(path, "cl100k_base", &t, &error) < 0) {
		fprintf(stderr, "padding: %s\n", error ? error : path);
		exit(1);
	}
	int32_t eos = tok_special_id(t, "<|endoftext|>");
	struct tok_state *st;
	if (eos < 0 || tok_state_new(t, &st) < 0)
		die("cannot set up the tokenizer");

	struct tok_ids para = { 0 }, file = { 0 };
	size_t at = 0;
	for (char *line = idx, *end; *line && at < len; line = end) {
		size_t size = strtoull(line, &end, 10);
		if (end == line)
			break;
		size = MIN(size, len - at);
		const char *p = text + at, *fend = text + at + size;
		at += size;
		file.n = 0;
		/* Paragraphs: runs of non-blank lines. */
		while (p < fend) {
			const char *a = p;
			while (a < fend) {
				const char *nl = memchr(a, '\n', (size_t)(fend - a));
				const char *e = nl ? nl : fend;
				if (!blank_line(a, e))
					break;
				a = nl ? nl + 1 : fend;
			}
			const char *b = a;
			while (b < fend) {
				const char *nl = memchr(b, '\n', (size_t)(fend - b));
				const char *e = nl ? nl : fend;
				if (blank_line(b, e))
					break;
				b = nl ? nl + 1 : fend;
			}
			if (b > a) {
				para.n = 0;
				if (tok_encode_stream(t, st, a, (size_t)(b - a), 0, sink, &para, NULL) < 0)
					die("tokenizing failed");
				if (para.n) {
					corpus_add(paras, para.ids, para.n, eos);
					sink(para.ids, para.n, &file);
				}
			}
			p = b;
		}
		if (file.n)
			corpus_add(files, file.ids, file.n, eos);
	}
	free(para.ids);
	free(file.ids);
	tok_state_free(st);
	tok_free(t);
	free(text);
	free(idx);
}

/* Writes c's documents for bench/padding/run.py: DIR/NAME.tok and DIR/NAME.len. */
static void write_docs(const struct corpus *c, const char *dir)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s.tok", dir, c->name);
	FILE *t = fopen(path, "we");
	snprintf(path, sizeof(path), "%s/%s.len", dir, c->name);
	FILE *l = fopen(path, "we");
	if (!t || !l)
		die("cannot create the --write-docs files");
	for (uint32_t d = 0; d < c->n_docs; d++)
		if (fwrite(c->tok + c->start[d], sizeof(int32_t), c->tokens[d], t) != c->tokens[d] ||
		    fwrite(&c->tokens[d], sizeof(uint32_t), 1, l) != 1)
			die("cannot write the --write-docs files");
	if (fclose(t) != 0 || fclose(l) != 0)
		die("cannot write the --write-docs files");
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

static void describe(const struct corpus *c, uint32_t L)
{
	uint32_t *s = malloc(c->n_docs * sizeof(*s));
	uint64_t over = 0;
	for (uint32_t i = 0; i < c->n_docs; i++) {
		s[i] = c->tokens[i] + 1;
		over += s[i] > L;
	}
	qsort(s, c->n_docs, sizeof(*s), cmp_u32);
	printf("%s: %u documents, %.2f M positions (tokens + eos); length mean %.0f, median %u, p90 %u, p99 %u, "
	       "max %u; %.2f%% longer than %u\n",
	       c->name, c->n_docs, (double)c->n_tok / 1e6, (double)c->n_tok / c->n_docs, s[c->n_docs / 2],
	       s[(size_t)(c->n_docs * 0.9)], s[(size_t)(c->n_docs * 0.99)], s[c->n_docs - 1], 100.0 * (double)over / c->n_docs, L);
	free(s);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * This thread's CPU time: the machine may be shared (2 cores, other builds),
 * so throughput is per CPU-second of the packing thread, not per wall second.
 */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the rank stream, as a session holds it ---- */

struct run {
	const struct corpus *c;
	struct order_params params;
	const uint32_t *doc_tokens[1];
	struct stream s;
	uint32_t L, B;
	int32_t *ids, *labels, *pos, *cu;
	uint8_t *is_start;
};

static void run_start(struct run *r, const struct corpus *c, uint32_t L, uint32_t B)
{
	*r = (struct run){ .c = c, .L = L, .B = B };
	r->params = (struct order_params){ .seed = 1, .shuffle = true, .window = 1, .n_shards = 1, .shard_docs = &c->n_docs };
	r->doc_tokens[0] = c->tokens;
	if (stream_init(&r->s, &r->params, r->doc_tokens, 0, 1, false, true, NULL) < 0)
		die("stream_init failed");
	size_t n = (size_t)B * L;
	r->ids = malloc(n * 4);
	r->labels = malloc(n * 4);
	r->pos = malloc(n * 4);
	r->cu = malloc((n + 1) * 4);
	r->is_start = malloc(n + 1);
	if (!r->ids || !r->labels || !r->pos || !r->cu || !r->is_start)
		die("out of memory");
}

static void run_stop(struct run *r)
{
	stream_clear(&r->s);
	free(r->ids);
	free(r->labels);
	free(r->pos);
	free(r->cu);
	free(r->is_start);
}

static int src_next(void *userdata, struct pack_doc *ret)
{
	struct run *r = userdata;
	uint64_t epoch = stream_tell(&r->s).epoch;
	struct stream_piece p;
	int e = stream_take(&r->s, UINT64_MAX, &p);
	if (e < 0)
		return e;
	*ret = (struct pack_doc){ .id = p.doc, .length = p.length, .epoch = epoch };
	return 0;
}

enum mode { PAD, CONCAT, BESTFIT };

struct result {
	struct pack_counters epoch; /* over one epoch, planning only */
	double seconds, tokens, batches;
};

/* One batch: plan, read the tokens into input_ids (what the worker does), fill. */
static int one_batch(struct run *r, enum mode m, struct bestfit *bf, struct pack_source *src, struct batch_plan *cp,
		     struct pad_batch *pb, uint64_t b, bool fill, struct pack_counters *ret)
{
	const struct corpus *c = r->c;
	uint32_t docs;
	if (m == CONCAT) {
		int e = pack_plan(&r->s, r->B, r->L, b, cp);
		if (e < 0)
			return e;
		uint64_t n = (uint64_t)r->B * r->L, q = 0, cut = 0, starts = 0;
		for (size_t i = 0; i < cp->n_pieces; i++) {
			const struct stream_piece *p = &cp->pieces[i];
			const int32_t *from = c->tok + c->start[ORDER_DOC_INDEX(p->doc)] + p->offset;
			if (p->offset == 0) {
				starts += q < n;
				cut += q < n && q % r->L + p->length > r->L;
			}
			if (fill) {
				if (q < n)
					memcpy(r->ids + q, from, p->count * sizeof(int32_t));
				memset(r->is_start + q, 0, p->count);
				r->is_start[q] = p->offset == 0;
			}
			q += p->count;
		}
		if (fill)
			pack_fill(r->ids, c->tok[c->start[ORDER_DOC_INDEX(cp->pieces[cp->n_pieces - 1].doc)] +
						 cp->pieces[cp->n_pieces - 1].offset],
				  r->is_start, r->B, r->L, r->ids, r->labels, r->pos, r->cu, &docs);
		*ret = (struct pack_counters){ .positions = n, .tokens = n, .docs = starts, .cut_docs = cut };
		return 0;
	}
	int e = m == PAD ? pad_plan(src, r->B, r->L, b, pb) : bestfit_plan(bf, src, r->B, b, pb);
	if (e < 0)
		return e;
	if (fill) {
		for (size_t i = 0; i < pb->n_pieces; i++) {
			const struct row_piece *p = &pb->pieces[i];
			memcpy(r->ids + (size_t)p->row * r->L + p->column, c->tok + c->start[ORDER_DOC_INDEX(p->doc.id)] + p->offset,
			       p->count * sizeof(int32_t));
		}
		pad_fill(pb, 0, r->ids, r->labels, r->pos, r->cu, &docs);
	}
	*ret = pb->counts;
	return 0;
}

static struct result measure(const struct corpus *c, enum mode m, uint64_t buffer, uint32_t L, uint32_t B,
			     double seconds)
{
	struct result res = { 0 };
	for (int pass = 0; pass < 2; pass++) {
		/* Pass 0: one epoch, planning only. Pass 1: timed, with reads and fills. */
		struct run r;
		run_start(&r, c, L, B);
		struct bestfit bf;
		if (m == BESTFIT && bestfit_init(&bf, L, buffer) < 0)
			die("bestfit_init failed");
		struct pack_source src = { .next = src_next, .userdata = &r };
		struct batch_plan cp = { 0 };
		struct pad_batch pb = { 0 };
		struct pack_counters sum = { 0 };
		double t0 = cpu_now(), t = t0;
		uint64_t b = 0;
		for (;; b++) {
			if (pass == 0) {
				bool done = stream_tell(&r.s).epoch >= 1;
				if (done && (m != BESTFIT || bestfit_rows_left(&bf) == 0))
					break;
			} else if ((b & 3) == 0 && (t = cpu_now()) - t0 >= seconds) {
				break;
			}
			struct pack_counters one;
			if (one_batch(&r, m, &bf, &src, &cp, &pb, b, pass == 1, &one) < 0)
				die("planning failed");
			pack_counters_add(&sum, &one);
		}
		if (pass == 0) {
			res.epoch = sum;
		} else {
			res.seconds = cpu_now() - t0;
			res.tokens = (double)sum.tokens;
			res.batches = (double)b;
		}
		pack_plan_clear(&cp);
		pad_batch_clear(&pb);
		if (m == BESTFIT)
			bestfit_clear(&bf);
		run_stop(&r);
	}
	return res;
}

static void table(const struct corpus *c, uint32_t L, uint32_t B, double seconds)
{
	describe(c, L);
	struct {
		const char *name;
		enum mode m;
		uint64_t buffer;
	} modes[] = {
		{ "pad (naive)", PAD, 0 },
		{ "concat", CONCAT, 0 },
		{ "bestfit, buffer 4 L", BESTFIT, 4 * (uint64_t)L },
		{ "bestfit, buffer 64 L", BESTFIT, 64 * (uint64_t)L },
		{ "bestfit, buffer 512 L", BESTFIT, 512 * (uint64_t)L },
	};
	struct result res[ARRAY_SIZE(modes)];
	for (size_t i = 0; i < ARRAY_SIZE(modes); i++)
		res[i] = measure(c, modes[i].m, modes[i].buffer, L, B, seconds);
	double concat = res[1].tokens / res[1].seconds;
	printf("\n| mode | efficiency | padding | truncated | docs cut | real tokens/s | batches/s | vs concat |\n");
	printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
	for (size_t i = 0; i < ARRAY_SIZE(modes); i++) {
		const struct pack_counters *e = &res[i].epoch;
		double eff = pack_counters_efficiency(e);
		double real = (double)e->tokens + (double)e->truncated;
		printf("| %s | %.2f%% | %.2f%% | %.2f%% | %.2f%% | %.1f M | %.0f | %.2fx |\n", modes[i].name, 100 * eff,
		       100 * (1 - eff), 100 * (double)e->truncated / real, 100 * (double)e->cut_docs / (double)MAX(e->docs, 1u),
		       res[i].tokens / res[i].seconds / 1e6, res[i].batches / res[i].seconds,
		       res[i].tokens / res[i].seconds / concat);
	}
	printf("\n");
}

int main(int argc, char **argv)
{
	const char *dir = getenv("FEEDD_TOKDATA") ? getenv("FEEDD_TOKDATA") : FEEDD_TOKDATA_DEFAULT;
	uint32_t L = 4096, B = 32;
	double seconds = 1.5;
	const char *docs_dir = NULL;
	static const struct option opts[] = {
		{ "tokdata", required_argument, NULL, 'd' }, { "seq-len", required_argument, NULL, 'L' },
		{ "batch", required_argument, NULL, 'B' },   { "seconds", required_argument, NULL, 's' },
		{ "write-docs", required_argument, NULL, 'w' }, { 0 },
	};
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (o) {
		case 'd': dir = optarg; break;
		case 'L': L = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'B': B = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 's': seconds = strtod(optarg, NULL); break;
		case 'w': docs_dir = optarg; break;
		default:
			fprintf(stderr, "usage: padding [--tokdata DIR] [--seq-len L] [--batch B] [--seconds S]\n");
			return 2;
		}
	}
	if (L == 0 || B == 0 || (uint64_t)L * B > INT32_MAX / 2)
		die("bad --seq-len or --batch");

	struct corpus paras = { .name = "paragraphs" }, files = { .name = "files" };
	double t0 = now();
	load(dir, &paras, &files);
	if (docs_dir) {
		write_docs(&paras, docs_dir);
		write_docs(&files, docs_dir);
		return 0;
	}
	char host[256] = "?";
	gethostname(host, sizeof(host) - 1);
	time_t now_s = time(NULL);
	char date[64];
	strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now_s));
	printf("# Padding tax: pad vs concat vs bestfit (bench/padding)\n\n");
	printf("%s, %ld CPUs online, %s; corpus %s (Debian linux-doc-6.1 + python3.11-doc reST sources, in memory), "
	       "cl100k_base via feedd's tokenizer (%.1f s), eos = <|endoftext|>; seq_len %u, batch %u; order: contract, "
	       "shuffle on, seed 1; one thread; %.1f CPU-s timed per mode\n\n",
	       host, sysconf(_SC_NPROCESSORS_ONLN), date, dir, now() - t0, L, B, seconds);
	table(&paras, L, B, seconds);
	table(&files, L, B, seconds);
	printf("efficiency = real positions / batch positions over one epoch; truncated = dropped positions / all "
	       "positions; docs cut = documents spread over more than one row; real tokens/s = non-padding positions "
	       "delivered per CPU-second of the packing thread (plan + read + fill).\n");
	return 0;
}
