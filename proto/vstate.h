/* SPDX-License-Identifier: MIT */
/*
 * Elastic states (docs/sample-order.md, section 17): the position of a
 * feed with virtual ranks, as a list of its virtual streams' own positions.
 * One definition, used by the daemon (to resume and to name the state after
 * a batch) and by libfeed and feedctl (to merge the states of all ranks).
 *
 *   fv1-<fingerprint>-<V>-<world>-<rank>-<batch>-<n>{-<v>-<ns>-<rows>-<fields>}x n[{-<kw>}x m]-<check>
 *
 * <world> 0 marks a global state (the merge of every rank's). Each entry
 * names virtual stream <v> (ascending, distinct): <ns> = 0 for a feed of
 * one stream, then <rows>-<epoch>-<window>-<index>-<offset>; <ns> = the
 * number of sources of a mixture, then <rows>-<k>-<offset>-<row> and one
 * <epoch>-<window>-<index> per source. A stream with no entry has delivered
 * no row (it is at its start). Lower-case hex, <fingerprint> 16 digits,
 * <check> 8 digits over everything before it, as cursors (section 7.1).
 *
 * The <kw> list (issue #22), when present, gives k_w of every position the
 * entries name, in entry order: one per entry of a feed of one stream, <ns>
 * per mixture entry (source order), m in all. It is all or nothing: every
 * entry has its k_w (has_kw) or none has (a state made before it, or of
 * stored tokens only: the resume then counts, as before).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VSTATE_MAX_SOURCES 8
#define VSTATE_MAX_VRANKS 65536
#define VSTATE_MAX_FIELDS (4 + 3 * VSTATE_MAX_SOURCES)

struct vstate_stream {
	uint32_t v;
	uint32_t n_sources;               /* 0: a feed of one stream */
	uint64_t f[VSTATE_MAX_FIELDS];    /* f[0] = rows delivered; then as the format says */
	bool has_kw;                      /* kw[] given (the state's <kw> list) */
	uint64_t kw[VSTATE_MAX_SOURCES];  /* k_w of the position (one stream) or of each source's (vstate_kws) */
};

static inline unsigned vstate_fields(uint32_t n_sources)
{
	return n_sources ? 4 + 3 * n_sources : 5;
}

/* The k_w values of an entry in the <kw> list: one per stream position it names. */
static inline unsigned vstate_kws(uint32_t n_sources)
{
	return n_sources ? n_sources : 1;
}

struct vstate {
	uint64_t fingerprint;
	uint32_t vranks;
	uint32_t world, rank; /* world 0: global */
	uint64_t batch;       /* the next batch's index */
	size_t n;
	struct vstate_stream *s; /* n entries, by ascending v */
};

/* The longest state of a rank serving n_streams streams of a feed of n_sources sources (0: one stream), NUL included. */
static inline size_t vstate_max_len(uint32_t n_streams, uint32_t n_sources)
{
	return 3 + 6 * 17 + 9 + 1 + (size_t)n_streams * (2 + vstate_fields(n_sources) + vstate_kws(n_sources)) * 17;
}

void vstate_clear(struct vstate *st);

/* Whether text is an elastic state (starts with "fv1-"). */
int vstate_is(const char *text);

/* Writes the text into a malloc'd string. Returns its length, -EINVAL (entries out of order), -ENOMEM. */
int vstate_format(const struct vstate *st, char **ret);

/*
 * The same text in pieces, for a writer that keeps each stream's entry and
 * changes only those that moved (a rank of 1024 streams writes a state per
 * batch): the head ("fv1-<fingerprint>-...-<n>", st->n as given), one
 * entry ("-<v>-<ns>-<fields>"), one entry's part of the <kw> list (after
 * every entry, only when every entry has_kw; "" for one without), and the
 * check appended to the whole text. Each returns the length written
 * (NUL-terminated), or -ENOBUFS.
 */
#define VSTATE_HEAD_MAX (3 + 6 * 17 + 1)
#define VSTATE_ENTRY_MAX(n_sources) ((size_t)(2 + vstate_fields(n_sources)) * 17 + 1)
#define VSTATE_KW_MAX(n_sources) ((size_t)vstate_kws(n_sources) * 17 + 1)
#define VSTATE_CHECK_LEN 9
int vstate_format_head(const struct vstate *st, char *buf, size_t cap);
int vstate_format_entry(const struct vstate_stream *e, char *buf, size_t cap);
int vstate_format_kw(const struct vstate_stream *e, char *buf, size_t cap);
int vstate_format_check(char *text, size_t n, size_t cap);

/* Parses a state. Returns 0, -EINVAL (malformed or damaged), -ENOMEM. */
/*
 * Parses one '-'-led lower-case hex field of 1 to 16 digits at *p (the
 * fields of fv1 states and of fc1/fc2 cursors, docs/sample-order.md 7.1),
 * moving *p past it. Returns 0, or -EINVAL.
 */
int vstate_hex_field(const char **p, uint64_t *ret);
int vstate_parse(const char *text, struct vstate *ret);

/*
 * Merges the states of ranks 0 .. R-1 of one world (any order, each once)
 * into a global state; a global state alone is returned as it is. batch =
 * the largest batch. Returns 0, or -EINVAL with the reason in err.
 */
int vstate_merge(const struct vstate *states, size_t n, struct vstate *ret, char *err, size_t errlen);
