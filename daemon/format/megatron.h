/* SPDX-License-Identifier: MIT */
/*
 * Megatron indexed datasets (.idx + .bin), validated at open.
 *
 * .idx: magic "MMIDIDX\0\0", u64 version 1, u8 dtype, u64 S (sequences),
 * u64 D (document-index entries), i32[S] lengths, i64[S] byte pointers,
 * i64[D] document indices; optionally S mode bytes. .bin: bare tokens.
 * Document d = sequences doc_idx[d] .. doc_idx[d+1]-1.
 *
 * A shard owns its .bin source and the .idx arrays (read through the source
 * layer); both are immutable after open, so any thread may read them. The
 * identity of both files is recorded; megatron_check() tells whether they
 * changed since. The feed reaches a shard through the format layer
 * (format.h, `format_megatron`), never through these calls.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "daemon/source/source.h"

struct megatron_shard {
	char *idx_path;
	char *bin_path;
	struct source *bin;
	struct source_id idx_id, bin_id;

	uint8_t dtype;       /* Megatron dtype code */
	unsigned itemsize;   /* bytes per token in .bin */
	uint64_t n_seqs;     /* S */
	uint32_t n_docs;     /* D - 1 */
	int32_t *lengths;      /* S entries */
	int64_t *pointers;     /* S entries */
	int64_t *doc_idx;      /* D entries */
	uint32_t *doc_tokens;  /* tokens per document */
	uint64_t n_tokens;
	uint32_t n_nonempty;   /* documents with at least one token */
	uint64_t sums_digest;  /* the checksum sidecar's digest (megatron_sums.c); 0: no sidecar */
	uint32_t sums_block;   /* its block size */
};

/*
 * Opens and validates the shard whose .idx is `idx_path` (the .bin beside it).
 * Returns 0, or a negative errno with a message naming the file and the
 * offending field/index in err (always NUL-terminated).
 */
int megatron_open(const char *idx_path, struct source_reader *io, struct megatron_shard **ret, char *err,
		  size_t errlen);
struct megatron_shard *megatron_free(struct megatron_shard *s);

/*
 * Checks that neither file changed since open (by path: replaced, truncated,
 * rewritten). Returns 0, or -ESTALE with a message in err.
 */
int megatron_check(const struct megatron_shard *s, char *err, size_t errlen);

/* Name of a dtype code ("u16"), or NULL when unknown. */
const char *megatron_dtype_name(uint8_t dtype);

/*
 * Byte ranges in .bin holding `count` tokens of document `doc` starting at
 * token `offset`. Calls emit(ctx, byte_offset, n_tokens) per contiguous run,
 * in order; stops and returns its first negative result.
 */
int megatron_doc_ranges(const struct megatron_shard *s, uint32_t doc, uint64_t offset, uint64_t count,
			int (*emit)(void *ctx, uint64_t byte_offset, uint64_t n_tokens), void *ctx);

/*
 * Widens `n` tokens of the shard's dtype at src to int32 at dst. Returns 0,
 * or -ERANGE with *ret_bad the index of a token outside [0, INT32_MAX].
 */
int megatron_widen(uint8_t dtype, const void *src, size_t n, int32_t *dst, size_t *ret_bad);

/* X.bin.sums for bin_path X.bin (caller frees), or NULL. */
char *megatron_sums_path(const char *bin_path);
/*
 * Loads the shard's checksum sidecar when there is one (megatron_sums.c):
 * checks it against the .bin's size and the .idx's hash, and attaches it to
 * the .bin source so that every read is checked. Returns 0 (also without a
 * sidecar), or a negative errno with a message naming the file in err.
 */
int megatron_sums_attach(struct megatron_shard *s, char *err, size_t errlen);
/* The sidecar's digest (a content identity of .bin and .idx), or 0 when the shard has none. */
uint64_t megatron_sums_digest(const struct megatron_shard *s);
