/* SPDX-License-Identifier: MIT */
/*
 * feedctl verify: checks Megatron shards the way feedd opens them (the .idx
 * validated against the .bin), and their checksum sidecars X.bin.sums
 * (docs/checksums.md) block by block. --write-sums makes the sidecar for a
 * shard another tool wrote, so that feedd checks every block it reads from
 * then on. Needs no daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/feedctl/feedctl.h"
#include "daemon/format/megatron.h"
#include "daemon/io/sums.h"
#include "daemon/source/source.h"
#include "proto/macro.h"

static void usage_verify(FILE *out)
{
	fprintf(out,
		"Usage: feedctl verify [--write-sums] [--block-size N] SHARD...\n"
		"Check Megatron shards (PREFIX, PREFIX.idx or PREFIX.bin) as feedd opens them, and every block\n"
		"of PREFIX.bin against its checksum sidecar PREFIX.bin.sums when there is one.\n\n"
		"      --write-sums      write PREFIX.bin.sums (block sums of .bin, the hash of .idx) where missing\n"
		"      --block-size N    bytes per checksum block for --write-sums (a power of two, default %u)\n",
		SUMS_BLOCK_DEFAULT);
}

/* PREFIX.idx for any of PREFIX, PREFIX.idx, PREFIX.bin. */
static char *idx_of(const char *arg)
{
	size_t n = strlen(arg);
	char *p;
	if (n > 4 && (strcmp(arg + n - 4, ".idx") == 0 || strcmp(arg + n - 4, ".bin") == 0))
		return asprintf(&p, "%.*s.idx", (int)(n - 4), arg) < 0 ? NULL : p;
	return asprintf(&p, "%s.idx", arg) < 0 ? NULL : p;
}

/* Reads the whole .bin through its checked source: every block against the sidecar. */
static int check_blocks(struct megatron_shard *s, struct source_reader *io, char *err, size_t errlen)
{
	const size_t cap = 8u << 20;
	_cleanup_free_ uint8_t *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	uint64_t size = source_size(s->bin);
	for (uint64_t at = 0; at < size; at += cap) {
		struct source_read q = { .src = s->bin, .offset = at, .len = (size_t)MIN((uint64_t)cap, size - at), .dst = buf };
		int r = source_read(io, &q, 1, NULL);
		if (r == -EUCLEAN) {
			snprintf(err, errlen, "%s", source_reader_error(io));
			return r;
		}
		if (r < 0) {
			source_read_error(err, errlen, r, s->bin_path, ".idx", at, q.len);
			return r;
		}
	}
	return 0;
}

static int verify_one(const char *arg, bool write, uint32_t block, struct source_reader *io)
{
	char err[768] = "";
	_cleanup_free_ char *idx = idx_of(arg);
	if (!idx)
		return -ENOMEM;
	struct megatron_shard *s = NULL;
	int r = megatron_open(idx, io, &s, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "feedctl verify: %s\n", err);
		return r;
	}
	_cleanup_free_ char *side = megatron_sums_path(s->bin_path);
	if (!side) {
		megatron_free(s);
		return -ENOMEM;
	}
	if (!s->sums_digest && write) {
		r = sums_write_sidecar(side, s->bin_path, s->idx_path, block, err, sizeof(err));
		megatron_free(s);
		s = NULL;
		if (r == 0)
			r = megatron_open(idx, io, &s, err, sizeof(err));
		if (r < 0) {
			fprintf(stderr, "feedctl verify: %s\n", err);
			return r;
		}
		printf("%s: wrote %s\n", s->bin_path, side);
	}
	if (!s->sums_digest) {
		printf("%s: ok (%" PRIu32 " documents, %" PRIu64 " tokens; no checksums: feedctl verify --write-sums makes them)\n",
		       s->idx_path, s->n_docs, s->n_tokens);
		megatron_free(s);
		return 0;
	}
	r = check_blocks(s, io, err, sizeof(err));
	if (r < 0)
		fprintf(stderr, "feedctl verify: %s\n", err);
	else
		printf("%s: ok (%" PRIu32 " documents, %" PRIu64 " tokens; every %u-byte block and the .idx match %s, digest %016" PRIx64 ")\n",
		       s->idx_path, s->n_docs, s->n_tokens, s->sums_block, side, s->sums_digest);
	megatron_free(s);
	return r;
}

int cmd_verify(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "write-sums", no_argument, NULL, 'w' },
		{ "block-size", required_argument, NULL, 'b' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool write = false;
	uint32_t block = SUMS_BLOCK_DEFAULT;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) >= 0) {
		switch (c) {
		case 'w': write = true; break;
		case 'b': {
			char *end;
			unsigned long v = strtoul(optarg, &end, 10);
			if (*end || v < SUMS_BLOCK_MIN || v > SUMS_BLOCK_MAX || (v & (v - 1))) {
				fprintf(stderr, "feedctl verify: --block-size %s: expected a power of two in %u..%u\n", optarg,
					SUMS_BLOCK_MIN, SUMS_BLOCK_MAX);
				return 2;
			}
			block = (uint32_t)v;
			break;
		}
		case 'h': usage_verify(stdout); return 0;
		default: usage_verify(stderr); return 2;
		}
	}
	if (optind >= argc) {
		usage_verify(stderr);
		return 2;
	}
	struct source_reader *io = NULL;
	if (source_reader_new(IO_ENGINE_AUTO, 64, &io) < 0) {
		fprintf(stderr, "feedctl verify: out of memory\n");
		return 1;
	}
	int bad = 0;
	for (int i = optind; i < argc; i++)
		bad += verify_one(argv[i], write, block, io) < 0;
	source_reader_free(io);
	return bad ? 1 : 0;
}
