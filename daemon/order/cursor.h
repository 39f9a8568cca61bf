/* SPDX-License-Identifier: MIT */
/*
 * Cursors: the printable name of a place in a rank's stream, from which the
 * daemon resumes in O(1). Format (docs/sample-order.md):
 *
 *   fc1-<fingerprint>-<world>-<rank>-<batch>-<epoch>-<window>-<index>-<offset>-<check>
 *
 * every field lower-case hex, <fingerprint> 16 digits, <check> 8 digits of a
 * hash over everything before it. Only [0-9a-f-] and "fc1": safe in any shell.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/order/stream.h"

struct cursor {
	uint64_t fingerprint; /* the feed's identity */
	uint32_t world, rank;
	uint64_t batch;       /* index of the next batch to deliver */
	struct stream_pos pos;
};

/* Writes the cursor text into buf. Returns its length or -ENOBUFS. */
int cursor_format(const struct cursor *c, char *buf, size_t cap);

/* Parses a cursor. Returns 0 or -EINVAL (malformed, or the check does not match). */
int cursor_parse(const char *text, struct cursor *ret);
