/* SPDX-License-Identifier: MIT */
/*
 * Megatron indexed datasets (.idx + .bin), validated at open.
 *
 * .idx: magic "MMIDIDX\0\0", u64 version 1, u8 dtype, u64 S (sequences),
 * u64 D (document-index entries), i32[S] lengths, i64[S] byte pointers,
 * i64[D] document indices; optionally S mode bytes. .bin: bare tokens.
 * Document d = sequences doc_idx[d] .. doc_idx[d+1]-1.
 *
 * A shard owns its .bin source, its .idx source (kept open while mapped:
 * the .bin's reads check it too) and a read-only mapping of the .idx;
 * any thread may read them. The file under the mapping may still change:
 * every read of it runs under a map guard (a truncation is -ESTALE, not
 * SIGBUS) and every entry is bounded where it is used. Nothing proportional to the shard's documents is copied
 * or allocated: a document's token count is computed, and its index
 * entries checked, when it is asked for (issue #22). The
 * identity of both files is recorded; megatron_check() tells whether they
 * changed since. The feed reaches a shard through the format layer
 * (format.h, `format_megatron`), never through these calls.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <endian.h>
#include <stdint.h>
#include <string.h>
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
	uint64_t bin_size;

	/*
	 * The .idx itself, mapped read-only and shared (the page cache: one
	 * copy for every feed and every restart), or one read copy where the
	 * source cannot map. Its arrays are little-endian and unaligned: read
	 * them with megatron_seq() and megatron_doc_start().
	 */
	const uint8_t *idx;
	size_t idx_len;
	bool idx_mapped;

	/* Set when the whole index was validated at open (megatron_scan); else 0 and left to the caller. */
	bool scanned;
	/* The whole index is known valid (at open, or a later megatron_scan passed): per-document checks are skipped. Atomic. */
	bool validated;
	uint64_t n_tokens;
	uint32_t n_nonempty;   /* documents with at least one token */
	uint64_t sums_digest;  /* the checksum sidecar's digest (megatron_sums.c); 0: no sidecar */
	uint32_t sums_block;   /* its block size */

	/* A large mapped .idx read cold (megatron_cold.c): pages already asked for, one bit each; NULL: not used. */
	uint64_t *cold;
	uint64_t *cold_asked; /* [0] pages asked for, [1] pages probed, [2] of those cached (in the same allocation) */
	unsigned cold_page_shift;
};

#define MEGATRON_IDX_HEADER 34

/* Sequence q's length and byte pointer, as stored (not checked). */
static inline void megatron_seq(const struct megatron_shard *s, uint64_t q, int32_t *ret_len, int64_t *ret_ptr)
{
	uint32_t l;
	uint64_t p;
	memcpy(&l, s->idx + MEGATRON_IDX_HEADER + 4 * q, 4);
	memcpy(&p, s->idx + MEGATRON_IDX_HEADER + 4 * s->n_seqs + 8 * q, 8);
	*ret_len = (int32_t)le32toh(l);
	*ret_ptr = (int64_t)le64toh(p);
}

/* Document-index entry d (0 .. n_docs), as stored (not checked). */
/* Warms the index entries megatron_doc_tokens(doc) reads (stage 0: doc_idx; 1: its first sequence's). */
void megatron_doc_prefetch(const struct megatron_shard *s, uint32_t doc, unsigned stage);

/* megatron_cold.c: a large mapped .idx read at random places, its pages asked for ahead of the walk. */
void megatron_cold_init(struct megatron_shard *s);
void megatron_cold_free(struct megatron_shard *s);
void megatron_cold_want(const struct megatron_shard *s, uint64_t off, uint64_t len);

static inline int64_t megatron_doc_start(const struct megatron_shard *s, uint64_t d)
{
	uint64_t v;
	memcpy(&v, s->idx + MEGATRON_IDX_HEADER + 12 * s->n_seqs + 8 * d, 8);
	return (int64_t)le64toh(v);
}

/*
 * Opens the shard whose .idx is `idx_path` (the .bin beside it), maps the
 * .idx and checks its header, its size and the ends of its document index
 * (O(1)). When *scan_budget (NULL: unlimited) covers the index's S + D
 * entries, the whole index is validated too (megatron_scan) and the budget
 * is charged; else that is left to megatron_scan() later, and every
 * document is still checked before use (megatron_doc_tokens). Returns 0,
 * or a negative errno with a message naming the file and the offending
 * field/index in err (always NUL-terminated).
 */
int megatron_open_budget(const char *idx_path, struct source_reader *io, uint64_t *scan_budget,
			 struct megatron_shard **ret, char *err, size_t errlen);
/* megatron_open_budget() with the whole index validated at open. */
int megatron_open(const char *idx_path, struct source_reader *io, struct megatron_shard **ret, char *err,
		  size_t errlen);

/*
 * Validates the whole index in one streaming pass over the mapping (no
 * copy): every sequence's length, pointer (aligned, in order without
 * overlap, inside the .bin), the document index (from 0, monotone, up to
 * S) and every document's token count; counts the tokens and non-empty
 * documents. Any thread. *stop (NULL: never) is looked at every 64K
 * entries: -ECANCELED once set. Returns 0, or -EBADMSG with the first
 * fault in err, or -ESTALE where the mapped .idx was truncated or
 * rewritten meanwhile (the SIGBUS caught, mapguard.h).
 */
int megatron_scan(const struct megatron_shard *s, const int *stop, uint64_t *ret_tokens, uint32_t *ret_nonempty,
		  char *err, size_t errlen);

/*
 * Document doc's token count, after checking the index entries it uses:
 * its two document-index entries, and each of its sequences as
 * megatron_scan() would (the overlap check against the sequence before).
 * O(sequences of the document); any thread. Returns 0, or -EBADMSG with
 * the fault in err (the same words as megatron_scan's).
 */
int megatron_doc_tokens(const struct megatron_shard *s, uint32_t doc, uint64_t *ret, char *err, size_t errlen);
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
 * in order; stops and returns its first negative result. Every index entry
 * used is bounded again here: -ESTALE where they no longer describe the
 * document (the .idx rewritten in place since its count was asked for) or
 * the mapped .idx was truncated (the SIGBUS caught, mapguard.h).
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
