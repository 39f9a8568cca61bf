/* SPDX-License-Identifier: MIT */
/*
 * Megatron .idx validation and token widening. Every check that can fail
 * names the file, the field and the index, so an operator can find the bad
 * entry without a hex editor. The .idx is mapped, never copied: its arrays
 * are read in place (unaligned, little-endian) by megatron_seq() and
 * megatron_doc_start(), validated whole in one streaming pass
 * (megatron_scan) at open when small, else later, and each document's
 * entries are checked whenever its count is asked for.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/format/format.h"
#include "daemon/format/megatron.h"
#include "daemon/source/mapguard.h"
#include "proto/macro.h"

#define IDX_MAGIC "MMIDIDX\0\0"
#define IDX_HEADER 34

static const struct {
	const char *name;
	unsigned size;
	bool integer;
} dtypes[] = {
	[1] = { "u8", 1, true },   [2] = { "i8", 1, true },  [3] = { "i16", 2, true },
	[4] = { "i32", 4, true },  [5] = { "i64", 8, true }, [6] = { "f64", 8, false },
	[7] = { "f32", 4, false }, [8] = { "u16", 2, true },
};

const char *megatron_dtype_name(uint8_t dtype)
{
	return dtype < ARRAY_SIZE(dtypes) ? dtypes[dtype].name : NULL;
}

static int fail(char *err, size_t errlen, int code, const char *fmt, ...) _printf_(4, 5);
static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return code;
}

static uint64_t rd64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

struct megatron_shard *megatron_free(struct megatron_shard *s)
{
	if (!s)
		return NULL;
	source_close(s->bin);
	megatron_cold_free(s);
	if (s->idx_mapped)
		source_unmap(s->idx, s->idx_len);
	else
		free((void *)s->idx);
	free(s->idx_path);
	free(s->bin_path);
	free(s);
	return NULL;
}

/* Header fields and the exact .idx size. */
static int check_header(struct megatron_shard *s, const uint8_t *p, uint64_t idx_size, uint64_t *ret_D, char *err,
			size_t errlen)
{
	const char *path = s->idx_path;
	if (memcmp(p, IDX_MAGIC, 9) != 0)
		return fail(err, errlen, -EBADMSG, "%s: bad magic (not a Megatron MMIDIDX index)", path);
	uint64_t version = rd64(p + 9);
	if (version != 1)
		return fail(err, errlen, -EBADMSG, "%s: version %" PRIu64 " at offset 9, only version 1 is supported",
			    path, version);
	s->dtype = p[17];
	if (s->dtype >= ARRAY_SIZE(dtypes) || !dtypes[s->dtype].name)
		return fail(err, errlen, -EBADMSG, "%s: unknown dtype code %u at offset 17", path, s->dtype);
	if (!dtypes[s->dtype].integer)
		return fail(err, errlen, -EBADMSG, "%s: dtype %s (code %u, offset 17) is not an integer token type",
			    path, dtypes[s->dtype].name, s->dtype);
	s->itemsize = dtypes[s->dtype].size;

	uint64_t S = rd64(p + 18), D = rd64(p + 26);
	/* Bound S and D by the file size first so the size formula cannot overflow. */
	if (S > idx_size / 12 || D > idx_size / 8)
		return fail(err, errlen, -EBADMSG,
			    "%s: sequence count S=%" PRIu64 " (offset 18) / document-index count D=%" PRIu64
			    " (offset 26) exceed the file size %" PRIu64,
			    path, S, D, idx_size);
	uint64_t want = IDX_HEADER + 12 * S + 8 * D;
	if (idx_size != want && idx_size != want + S)
		return fail(err, errlen, -EBADMSG,
			    "%s: size %" PRIu64 " does not match S=%" PRIu64 " D=%" PRIu64 ": expected %" PRIu64
			    " (or %" PRIu64 " with mode bytes)",
			    path, idx_size, S, D, want, want + S);
	if (D < 1)
		return fail(err, errlen, -EBADMSG, "%s: document index is empty (D=0; it must hold at least [0])", path);
	if (D - 1 > UINT32_MAX)
		return fail(err, errlen, -EBADMSG, "%s: %" PRIu64 " documents; at most %u are supported", path, D - 1,
			    UINT32_MAX);
	s->n_seqs = S;
	s->n_docs = (uint32_t)(D - 1);
	*ret_D = D;
	return 0;
}

/*
 * Sequence q on its own and against the end of sequence q - 1 (*end: where
 * that one ends; the caller keeps it). The same checks, in the same words,
 * whether the whole index is scanned or one document is checked before use.
 */
static int check_seq(const struct megatron_shard *s, uint64_t q, uint64_t *end, uint64_t *ret_len, char *err,
		     size_t errlen)
{
	const char *path = s->idx_path;
	int32_t len;
	int64_t ptr;
	megatron_seq(s, q, &len, &ptr);
	if (len < 0)
		return fail(err, errlen, -EBADMSG, "%s: lengths[%" PRIu64 "] = %" PRId32 " is negative", path, q, len);
	if (ptr < 0 || (uint64_t)ptr % s->itemsize != 0)
		return fail(err, errlen, -EBADMSG, "%s: pointers[%" PRIu64 "] = %" PRId64 " is negative or not a multiple of %u",
			    path, q, ptr, s->itemsize);
	/* Sequences must lie in order, without overlap: what Megatron writes. */
	if ((uint64_t)ptr < *end)
		return fail(err, errlen, -EBADMSG,
			    "%s: pointers[%" PRIu64 "] = %" PRId64 " overlaps the previous sequence (ends at %" PRIu64 ")",
			    path, q, ptr, *end);
	*end = (uint64_t)ptr + (uint64_t)len * s->itemsize;
	if (*end > s->bin_size)
		return fail(err, errlen, -EBADMSG,
			    "%s: sequence %" PRIu64 " (pointer %" PRId64 ", length %" PRId32 ") ends at byte %" PRIu64
			    ", past the end of %s (%" PRIu64 " bytes)",
			    path, q, ptr, len, *end, s->bin_path, s->bin_size);
	if (ret_len)
		*ret_len = (uint64_t)len;
	return 0;
}

/* Document-index entry d + 1 against entry d. */
static int check_doc_entry(const struct megatron_shard *s, uint64_t d, int64_t a, int64_t b, char *err, size_t errlen)
{
	if (b < a || (uint64_t)b > s->n_seqs)
		return fail(err, errlen, -EBADMSG,
			    "%s: doc_idx[%" PRIu64 "] = %" PRId64 " is outside doc_idx[%" PRIu64 "] = %" PRId64
			    " .. S = %" PRIu64 " (must be monotone)",
			    s->idx_path, d + 1, b, d, a, s->n_seqs);
	return 0;
}

/* The ends of the document index: O(1), at open whatever the size. */
static int check_doc_ends(const struct megatron_shard *s, char *err, size_t errlen)
{
	int64_t first = megatron_doc_start(s, 0), last = megatron_doc_start(s, s->n_docs);
	if (first != 0)
		return fail(err, errlen, -EBADMSG, "%s: doc_idx[0] = %" PRId64 ", must be 0", s->idx_path, first);
	if ((uint64_t)last != s->n_seqs)
		return fail(err, errlen, -EBADMSG, "%s: doc_idx[%" PRIu32 "] = %" PRId64 ", must equal S = %" PRIu64,
			    s->idx_path, s->n_docs, last, s->n_seqs);
	return 0;
}

static int doc_too_long(const struct megatron_shard *s, uint64_t d, uint64_t tokens, char *err, size_t errlen)
{
	return fail(err, errlen, -EBADMSG, "%s: document %" PRIu64 " has %" PRIu64 " tokens; at most %u are supported",
		    s->idx_path, d, tokens, UINT32_MAX);
}

/* A mapping read after the file was truncated (SIGBUS, caught by the guard), or entries changed after validation. */
static int stale(const struct megatron_shard *s, char *err, size_t errlen)
{
	return fail(err, errlen, -ESTALE, "%s: changed while serving (truncated or rewritten under the daemon)",
		    s->idx_path);
}

/* Sequences a .. b - 1 of a document: a range of the index (re-read entries are never trusted). */
static bool doc_in_range(const struct megatron_shard *s, int64_t a, int64_t b)
{
	return a >= 0 && a <= b && (uint64_t)b <= s->n_seqs;
}

#define STOP_EVERY 65536 /* entries between looks at the stop flag: well under a millisecond */

static bool stopped(const int *stop, uint64_t i)
{
	return stop && (i % STOP_EVERY) == 0 && __atomic_load_n(stop, __ATOMIC_RELAXED);
}

static int scan_mapped(const struct megatron_shard *s, const int *stop, uint64_t *ret_tokens, uint32_t *ret_nonempty,
		       char *err, size_t errlen)
{
	uint64_t end = 0;
	for (uint64_t q = 0; q < s->n_seqs; q++) {
		if (stopped(stop, q))
			return -ECANCELED;
		int r = check_seq(s, q, &end, NULL, err, errlen);
		if (r < 0)
			return r;
	}
	int r = check_doc_ends(s, err, errlen);
	if (r < 0)
		return r;
	/* Bounds before use: every entry is a sequence index, so it must lie in 0..S and never decrease. */
	int64_t a = 0;
	for (uint64_t d = 0; d < s->n_docs; d++) {
		if (stopped(stop, d))
			return -ECANCELED;
		int64_t b = megatron_doc_start(s, d + 1);
		if ((r = check_doc_entry(s, d, a, b, err, errlen)) < 0)
			return r;
		a = b;
	}
	uint64_t total = 0;
	uint32_t nonempty = 0;
	a = 0;
	for (uint64_t d = 0; d < s->n_docs; d++) {
		if (stopped(stop, d))
			return -ECANCELED;
		/* Read again: the file may have been rewritten in place since the pass above. */
		int64_t b = megatron_doc_start(s, d + 1);
		if (!doc_in_range(s, a, b))
			return stale(s, err, errlen);
		uint64_t tokens = 0;
		for (int64_t q = a; q < b; q++) {
			int32_t len;
			int64_t ptr;
			megatron_seq(s, (uint64_t)q, &len, &ptr);
			if (len < 0)
				return stale(s, err, errlen);
			tokens += (uint64_t)len;
		}
		if (tokens > UINT32_MAX)
			return doc_too_long(s, d, tokens, err, errlen);
		total += tokens;
		nonempty += tokens > 0;
		a = b;
	}
	*ret_tokens = total;
	*ret_nonempty = nonempty;
	return 0;
}

int megatron_scan(const struct megatron_shard *s, const int *stop, uint64_t *ret_tokens, uint32_t *ret_nonempty,
		  char *err, size_t errlen)
{
	struct mapguard g;
	mapguard_prepare(&g, s->idx, s->idx_len);
	if (sigsetjmp(g.env, 0) != 0)
		return stale(s, err, errlen);
	mapguard_arm(&g);
	int r = scan_mapped(s, stop, ret_tokens, ret_nonempty, err, errlen);
	mapguard_disarm(&g);
	return r;
}

static int doc_tokens_mapped(const struct megatron_shard *s, uint32_t doc, uint64_t *ret, char *err, size_t errlen)
{
	int64_t a = megatron_doc_start(s, doc), b = megatron_doc_start(s, (uint64_t)doc + 1);
	if (__atomic_load_n(&s->validated, __ATOMIC_ACQUIRE)) {
		/* Checked whole already: the count alone, each entry used still bounded (a rewrite in place). */
		if (!doc_in_range(s, a, b))
			return stale(s, err, errlen);
		uint64_t tokens = 0;
		for (int64_t q = a; q < b; q++) {
			int32_t len;
			int64_t ptr;
			megatron_seq(s, (uint64_t)q, &len, &ptr);
			if (len < 0)
				return stale(s, err, errlen);
			tokens += (uint64_t)len;
		}
		if (tokens > UINT32_MAX)
			return stale(s, err, errlen);
		*ret = tokens;
		return 0;
	}
	int r = check_doc_entry(s, doc, a, b, err, errlen);
	if (r < 0)
		return r;
	if (a < 0)
		return fail(err, errlen, -EBADMSG, "%s: doc_idx[%" PRIu32 "] = %" PRId64 " is negative", s->idx_path, doc, a);
	if (a == b) {
		*ret = 0;
		return 0;
	}
	/* The overlap check needs where the sequence before ends: check that one on its own first. */
	uint64_t end = 0, tokens = 0;
	if (a > 0 && (r = check_seq(s, (uint64_t)a - 1, &end, NULL, err, errlen)) < 0)
		return r;
	for (int64_t q = a; q < b; q++) {
		uint64_t len;
		if ((r = check_seq(s, (uint64_t)q, &end, &len, err, errlen)) < 0)
			return r;
		tokens += len; /* the checked read's length, never a second read of the entry */
	}
	if (tokens > UINT32_MAX)
		return doc_too_long(s, doc, tokens, err, errlen);
	*ret = tokens;
	return 0;
}

int megatron_doc_tokens(const struct megatron_shard *s, uint32_t doc, uint64_t *ret, char *err, size_t errlen)
{
	struct mapguard g;
	mapguard_prepare(&g, s->idx, s->idx_len);
	if (sigsetjmp(g.env, 0) != 0)
		return stale(s, err, errlen);
	mapguard_arm(&g);
	int r = doc_tokens_mapped(s, doc, ret, err, errlen);
	mapguard_disarm(&g);
	return r;
}

/*
 * A document reached soon from a random place (a window permuted per use,
 * docs/sample-order.md section 3.1): stage 0 prefetches its doc_idx
 * entries; stage 1, later, reads the first of them (cached by then; a
 * truncated mapping is caught) and prefetches that sequence's length and
 * pointer. doc_tokens then mostly hits the cache instead of three misses.
 */
void megatron_doc_prefetch(const struct megatron_shard *s, uint32_t doc, unsigned stage)
{
	const uint8_t *dx = s->idx + MEGATRON_IDX_HEADER + 12 * s->n_seqs;
	if (doc >= s->n_docs)
		return;
	if (stage == 0) {
		/* A cold mapping: its page read now, many in flight, rather than faulted in at stage 1. */
		megatron_cold_want(s, (uint64_t)(dx - s->idx) + 8 * (uint64_t)doc, 16);
		__builtin_prefetch(dx + 8 * (uint64_t)doc);
		return;
	}
	struct mapguard g;
	mapguard_prepare(&g, s->idx, s->idx_len);
	if (sigsetjmp(g.env, 0) != 0)
		return; /* doc_tokens meets it and says so */
	mapguard_arm(&g);
	int64_t q = megatron_doc_start(s, doc);
	if (q >= 0 && (uint64_t)q < s->n_seqs) {
		/* The sequence before too: its end is checked against this one's start before validation. */
		uint64_t q0 = q > 0 ? (uint64_t)q - 1 : 0;
		megatron_cold_want(s, MEGATRON_IDX_HEADER + 4 * q0, 8);
		megatron_cold_want(s, MEGATRON_IDX_HEADER + 4 * s->n_seqs + 8 * q0, 16);
		__builtin_prefetch(s->idx + MEGATRON_IDX_HEADER + 4 * (uint64_t)q);
		__builtin_prefetch(s->idx + MEGATRON_IDX_HEADER + 4 * s->n_seqs + 8 * (uint64_t)q);
	}
	mapguard_disarm(&g);
}

static int doc_ends_guarded(const struct megatron_shard *s, char *err, size_t errlen)
{
	struct mapguard g;
	mapguard_prepare(&g, s->idx, s->idx_len);
	if (sigsetjmp(g.env, 0) != 0)
		return stale(s, err, errlen);
	mapguard_arm(&g);
	int r = check_doc_ends(s, err, errlen);
	mapguard_disarm(&g);
	return r;
}

/* The .idx's bytes: mapped, or read into one buffer where the source cannot map. */
static int load_idx(struct megatron_shard *s, struct source *idx, struct source_reader *io, char *err, size_t errlen)
{
	const void *p;
	size_t len;
	int r = source_map(idx, &p, &len);
	if (r == 0) {
		s->idx = p;
		s->idx_len = len;
		s->idx_mapped = true;
		return 0;
	}
	if (r != -EOPNOTSUPP)
		return fail(err, errlen, r, "%s: cannot map: %s", s->idx_path, strerror(-r));
	uint64_t size = source_size(idx);
	uint8_t *buf = size <= SIZE_MAX ? malloc((size_t)size) : NULL;
	if (!buf)
		return fail(err, errlen, -ENOMEM, "%s: out of memory for %" PRIu64 " bytes", s->idx_path, size);
	struct source_read req = { .src = idx, .offset = 0, .len = (size_t)size, .dst = buf };
	r = source_read(io, &req, 1, NULL);
	if (r < 0) {
		free(buf);
		return fail(err, errlen, r, "%s: cannot read: %s", s->idx_path, strerror(-r));
	}
	s->idx = buf;
	s->idx_len = (size_t)size;
	return 0;
}

int megatron_open_budget(const char *idx_path, struct source_reader *io, uint64_t *scan_budget,
			 struct megatron_shard **ret, char *err, size_t errlen)
{
	int r;
	struct source *idx = NULL;
	uint64_t D = 0;
	err[0] = 0;
	struct megatron_shard *s = calloc(1, sizeof(*s));
	if (!s)
		return fail(err, errlen, -ENOMEM, "%s: out of memory", idx_path);

	size_t n = strlen(idx_path);
	s->idx_path = strdup(idx_path);
	s->bin_path = malloc(n + 1);
	if (!s->idx_path || !s->bin_path) {
		r = fail(err, errlen, -ENOMEM, "%s: out of memory", idx_path);
		goto out;
	}
	if (n < 4 || strcmp(idx_path + n - 4, ".idx") != 0) {
		r = fail(err, errlen, -EINVAL, "%s: not a .idx file", idx_path);
		goto out;
	}
	memcpy(s->bin_path, idx_path, n - 4);
	strcpy(s->bin_path + n - 4, ".bin");

	r = source_open(idx_path, &idx, err, errlen);
	if (r == 0)
		r = source_open(s->bin_path, &s->bin, err, errlen);
	if (r == -EINVAL)
		r = fail(err, errlen, -EINVAL, "%s: .idx and .bin must be regular files", idx_path);
	if (r < 0)
		goto out;
	s->idx_id = *source_identity(idx);
	s->bin_id = *source_identity(s->bin);
	s->bin_size = (uint64_t)s->bin_id.size;

	uint64_t idx_size = source_size(idx);
	if (idx_size < IDX_HEADER) {
		r = fail(err, errlen, -EBADMSG, "%s: truncated header (%" PRIu64 " bytes, need %d)", idx_path, idx_size,
			 IDX_HEADER);
		goto out;
	}
	uint8_t header[IDX_HEADER];
	struct source_read hreq = { .src = idx, .offset = 0, .len = IDX_HEADER, .dst = header };
	r = source_read(io, &hreq, 1, NULL);
	if (r < 0) {
		r = fail(err, errlen, r, "%s: cannot read header: %s", idx_path, strerror(-r));
		goto out;
	}
	r = check_header(s, header, idx_size, &D, err, errlen);
	if (r < 0)
		goto out;
	r = load_idx(s, idx, io, err, errlen);
	if (r < 0)
		goto out;
	r = megatron_sums_attach(s, err, errlen);
	if (r < 0)
		goto out;

	uint64_t entries = s->n_seqs + D;
	if (!scan_budget || *scan_budget >= entries) {
		/* Small enough to validate whole now: faults are then load errors, as they always were. */
		r = megatron_scan(s, NULL, &s->n_tokens, &s->n_nonempty, err, errlen);
		if (r < 0)
			goto out;
		s->scanned = true;
		s->validated = true;
		if (scan_budget)
			*scan_budget -= entries;
	} else {
		/* Read at random places before the scanner's pass reaches it: pages asked for ahead (megatron_cold.c). */
		megatron_cold_init(s);
		/*
		 * doc_idx's two ends, checked now: their pages asked for alone. A
		 * fault on a cold mapping reads the kernel's read-around (8 MiB on
		 * this VM): 640 MB before READY at 40 shards of 25 M documents.
		 */
		const uint64_t dx = MEGATRON_IDX_HEADER + 12 * s->n_seqs;
		megatron_cold_want(s, dx, 8);
		megatron_cold_want(s, dx + 8 * (uint64_t)s->n_docs, 8);
		r = doc_ends_guarded(s, err, errlen);
		if (r < 0)
			goto out;
	}

	/*
	 * A mapped .idx (a local file) is checked after every read of the
	 * .bin: a rewrite of it in place fails those reads, as a change to the
	 * .bin does (source_check_with: on its descriptor while the daemon holds
	 * few files, else by name). A copy (an object in storage, pinned by its
	 * ETag) needs no such check.
	 */
	if (s->idx_mapped) {
		r = source_check_with(s->bin, TAKE_PTR(idx));
		if (r < 0) {
			snprintf(err, errlen, "%s: out of memory", s->idx_path);
			goto out;
		}
	}
	source_close(idx);
	*ret = TAKE_PTR(s);
	return 0;
out:
	source_close(idx);
	megatron_free(s);
	return r;
}

int megatron_open(const char *idx_path, struct source_reader *io, struct megatron_shard **ret, char *err,
		  size_t errlen)
{
	return megatron_open_budget(idx_path, io, NULL, ret, err, errlen);
}

int megatron_check(const struct megatron_shard *s, char *err, size_t errlen)
{
	int r = source_check(s->idx_path, &s->idx_id, err, errlen);
	return r < 0 ? r : source_check(s->bin_path, &s->bin_id, err, errlen);
}

static int doc_ranges_mapped(const struct megatron_shard *s, uint32_t doc, uint64_t offset, uint64_t count,
			     int (*emit)(void *ctx, uint64_t byte_offset, uint64_t n_tokens), void *ctx)
{
	/*
	 * The document's entries were checked when its count was asked for
	 * (megatron_doc_tokens), but they are read again here: each is bounded
	 * where it is used, so a file rewritten in place since is -ESTALE,
	 * never a read outside the index or the .bin.
	 */
	int64_t a = megatron_doc_start(s, doc), end = megatron_doc_start(s, (uint64_t)doc + 1);
	if (!doc_in_range(s, a, end))
		return -ESTALE;
	for (int64_t q = a; q < end && count > 0; q++) {
		int32_t l;
		int64_t ptr;
		megatron_seq(s, (uint64_t)q, &l, &ptr);
		if (l < 0 || ptr < 0 || (uint64_t)ptr > s->bin_size ||
		    (uint64_t)l > (s->bin_size - (uint64_t)ptr) / s->itemsize)
			return -ESTALE;
		uint64_t len = (uint64_t)l;
		if (offset >= len) {
			offset -= len;
			continue;
		}
		uint64_t n = MIN(len - offset, count);
		/* emit never reads the mapping, so a fault (only ever in megatron_seq above) cannot cut it short. */
		int r = emit(ctx, (uint64_t)ptr + offset * s->itemsize, n);
		if (r < 0)
			return r;
		count -= n;
		offset = 0;
	}
	return count ? -EINVAL : 0; /* more tokens asked for than the document has */
}

int megatron_doc_ranges(const struct megatron_shard *s, uint32_t doc, uint64_t offset, uint64_t count,
			int (*emit)(void *ctx, uint64_t byte_offset, uint64_t n_tokens), void *ctx)
{
	struct mapguard g;
	mapguard_prepare(&g, s->idx, s->idx_len);
	if (sigsetjmp(g.env, 0) != 0)
		return -ESTALE;
	mapguard_arm(&g);
	int r = doc_ranges_mapped(s, doc, offset, count, emit, ctx);
	mapguard_disarm(&g);
	return r;
}

/*
 * Widening runs on every token served, so it is written to vectorise: the
 * range check is a branch-free reduction, and only a batch that fails it is
 * scanned again to name the first bad token.
 */
#define WIDEN(type, conv)                                                       \
	do {                                                                    \
		const type *in = src;                                           \
		int64_t bad = 0;                                                \
		for (size_t i = 0; i < n; i++) {                                \
			int64_t v = (int64_t)conv(in[i]);                       \
			bad |= v | (INT32_MAX - v);                             \
			dst[i] = (int32_t)v;                                    \
		}                                                               \
		if (_unlikely_(bad < 0)) {                                      \
			for (size_t i = 0; i < n; i++) {                        \
				int64_t v = (int64_t)conv(in[i]);               \
				if (v < 0 || v > INT32_MAX) {                   \
					*ret_bad = i;                           \
					return -ERANGE;                         \
				}                                               \
			}                                                       \
		}                                                               \
	} while (0)

#define ID(x) (x)
#define LE16S(x) ((int16_t)le16toh((uint16_t)(x)))
#define LE32S(x) ((int32_t)le32toh((uint32_t)(x)))
#define LE64S(x) ((int64_t)le64toh((uint64_t)(x)))

int megatron_widen(uint8_t dtype, const void *src, size_t n, int32_t *dst, size_t *ret_bad)
{
	switch (dtype) {
	case 1: { /* unsigned 8 and 16 bit tokens are always in range */
		const uint8_t *in = src;
		for (size_t i = 0; i < n; i++)
			dst[i] = in[i];
		break;
	}
	case 2:
		WIDEN(int8_t, ID);
		break;
	case 3:
		WIDEN(int16_t, LE16S);
		break;
	case 4:
		WIDEN(int32_t, LE32S);
		break;
	case 5:
		WIDEN(int64_t, LE64S);
		break;
	case 8: {
		const uint16_t *in = src;
		for (size_t i = 0; i < n; i++)
			dst[i] = le16toh(in[i]);
		break;
	}
	default:
		return -EINVAL;
	}
	return 0;
}

/* ---- the format layer's view (format.h) ------------------------------------ */

static int fmt_open(struct shard *sh, const char *name, const struct format_opts *o, struct source_reader *r,
		    char *err, size_t errlen)
{
	struct megatron_shard *s;
	int e = megatron_open_budget(name, r, o->scan_budget, &s, err, errlen);
	if (e < 0)
		return e;
	*sh = (struct shard){
		.format = sh->format,
		.impl = s,
		.name = s->idx_path,
		.n_docs = s->n_docs,
		.ids = { &s->idx_id, &s->bin_id },
		.n_ids = 2,
		.files = { s->idx_path, s->bin_path },
		.counted = s->scanned,
		.n_tokens = s->n_tokens,
		.n_nonempty = s->n_nonempty,
		.itemsize = s->itemsize,
		.bytes = s->scanned ? s->n_tokens * s->itemsize : s->bin_size,
		.truncated = "",
		.content_digest = megatron_sums_digest(s),
	};
	return 0;
}

static void fmt_close(struct shard *sh)
{
	megatron_free(sh->impl);
}

static int fmt_doc_tokens(const struct shard *sh, uint32_t doc, uint64_t *ret, char *err, size_t errlen)
{
	return megatron_doc_tokens(sh->impl, doc, ret, err, errlen);
}

static int fmt_scan(const struct shard *sh, const int *stop, uint64_t *ret_tokens, uint32_t *ret_nonempty, char *err,
		    size_t errlen)
{
	struct megatron_shard *s = sh->impl;
	int r = megatron_scan(s, stop, ret_tokens, ret_nonempty, err, errlen);
	if (r == 0)
		__atomic_store_n(&s->validated, true, __ATOMIC_RELEASE); /* from now on a count needs no check */
	return r;
}

static int fmt_check(const struct shard *sh, char *err, size_t errlen)
{
	return megatron_check(sh->impl, err, errlen);
}

struct ranges_ctx {
	struct source *bin;
	int (*emit)(void *ctx, struct source *src, uint64_t byte_offset, uint64_t n_tokens);
	void *ctx;
};

static int ranges_emit(void *userdata, uint64_t byte_offset, uint64_t n_tokens)
{
	struct ranges_ctx *c = userdata;
	return c->emit(c->ctx, c->bin, byte_offset, n_tokens);
}

static int fmt_doc_ranges(const struct shard *sh, uint32_t doc, uint64_t offset, uint64_t count,
			  int (*emit)(void *ctx, struct source *src, uint64_t byte_offset, uint64_t n_tokens), void *ctx)
{
	const struct megatron_shard *s = sh->impl;
	struct ranges_ctx c = { .bin = s->bin, .emit = emit, .ctx = ctx };
	return megatron_doc_ranges(s, doc, offset, count, ranges_emit, &c);
}

static void fmt_doc_prefetch(const struct shard *sh, uint32_t doc, unsigned stage)
{
	megatron_doc_prefetch(sh->impl, doc, stage);
}

static int fmt_widen(const struct shard *sh, const void *src, size_t n, int32_t *dst, size_t *ret_bad)
{
	return megatron_widen(((const struct megatron_shard *)sh->impl)->dtype, src, n, dst, ret_bad);
}

const struct format format_megatron = {
	.name = "megatron",
	.content = FORMAT_TOKENS,
	.open = fmt_open,
	.close = fmt_close,
	.check = fmt_check,
	.doc_tokens = fmt_doc_tokens,
	.doc_prefetch = fmt_doc_prefetch,
	.scan = fmt_scan,
	.doc_ranges = fmt_doc_ranges,
	.widen = fmt_widen,
};
