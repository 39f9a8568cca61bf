/* SPDX-License-Identifier: MIT */
/*
 * Cursors: the printable name of a place in a rank's stream, from which the
 * daemon resumes without replaying it. Formats (docs/sample-order.md,
 * sections 7.1, 12.5 and 14.4):
 *
 *   fc1-<fingerprint>-<world>-<rank>-<batch>-<epoch>-<window>-<index>-<offset>[-<data>[-<kw>]]-<check>
 *   fc2-<fingerprint>-<world>-<rank>-<batch>-<k>-<offset>-<row>-<n>{-<epoch>-<window>-<index>}xn[-<data>[{-<kw>}xn]]-<check>
 *
 * fc1 names a place in one stream (with packing bestfit or pad, <offset>
 * carries the row inside the packed buffer); fc2 a place in a mixture of n
 * streams. Every field lower-case hex, <fingerprint> 16 digits, <check> 8
 * digits of a hash over everything before it. Only [0-9a-f-] and "fc1" /
 * "fc2": safe in any shell. <data> (16 digits, issue #16) is the feed's data
 * identity when the cursor was made; cursors from before it have none.
 * <kw> (issue #22) is k_w, the documents of the epoch before the cursor's
 * window, so that a resume does not count the shards before it; cursors
 * from before it have none (pos.has_k false). fc2 carries one per source
 * (every source's, src[i].has_k) when some source's counts may be unknown.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/order/mix.h"
#include "daemon/order/stream.h"

struct cursor {
	uint64_t fingerprint; /* the feed's identity */
	uint64_t data;        /* the feed's data identity (feed/integrity.h), when has_data */
	bool has_data;        /* false: a cursor made before cursors carried it */
	uint32_t world, rank;
	uint64_t batch;       /* index of the next batch to deliver */
	struct stream_pos pos; /* fc1 */

	/* fc2: a mixture's position (n_sources > 0) */
	uint32_t n_sources;
	uint64_t k;           /* the mixed document the position is in */
	uint64_t offset;      /* position inside document k's contribution */
	uint64_t row;         /* bestfit: the row inside the packing of the buffer that starts at k */
	struct stream_pos src[MIX_MAX_SOURCES]; /* per source: document k (its source) or its next one; offset 0 */
};

/* Writes the cursor text (fc2 when n_sources > 0) into buf. Returns its length or -ENOBUFS. */
int cursor_format(const struct cursor *c, char *buf, size_t cap);

/* Parses a cursor (fc1 or fc2). Returns 0 or -EINVAL (malformed, or the check does not match). */
int cursor_parse(const char *text, struct cursor *ret);
