/* SPDX-License-Identifier: MIT */
/*
 * A text shard's copy in cache_dir opened for serving (text.h,
 * text_open_copy): pinned while the shard is open (daemon/cache/cache.h),
 * its checksum trailer (daemon/io/sums.h) attached to the source, so that
 * every block a worker reads is checked, and at load every block checked
 * once, so that a damaged copy is rebuilt rather than served.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/cache/cache.h"
#include "daemon/format/text.h"
#include "daemon/io/sums.h"
#include "proto/macro.h"

#define READ_BLOCK (8u << 20) /* bytes per read while checking a whole copy */

/* Reads every block of the copy through its checked source. */
static int check_all(struct source_reader *io, struct source *src, uint64_t size)
{
	_cleanup_free_ uint8_t *buf = malloc(READ_BLOCK);
	if (!buf)
		return -ENOMEM;
	for (uint64_t at = 0; at < size; at += READ_BLOCK) {
		struct source_read q = { .src = src, .offset = at, .len = (size_t)MIN((uint64_t)READ_BLOCK, size - at),
					 .dst = buf };
		int r = source_read(io, &q, 1, NULL);
		if (r < 0)
			return r;
	}
	return 0;
}

int text_open_copy(struct text_shard *s, const char *data_path, struct source_reader *io, bool verify_all, char *err,
		   size_t errlen)
{
	struct sums *sums = NULL;
	int r = cache_pin(data_path, &s->pin);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot open its cache copy %s: %s", s->path, data_path, strerror(-r));
		return r;
	}
	r = source_open(data_path, &s->data, err, errlen);
	if (r == 0)
		source_set_cache_entry(s->data);
	if (r == 0)
		r = sums_load(cache_pin_fd(s->pin), source_size(s->data), false, data_path, &sums, err, errlen);
	if (r == -ENODATA)
		snprintf(err, errlen, "%s: no checksum trailer", data_path);
	if (r == 0 && sums->data_size != s->bytes) {
		snprintf(err, errlen, "%s: holds %" PRIu64 " bytes of text, its index %" PRIu64, data_path, sums->data_size,
			 s->bytes);
		r = -EBADMSG;
	}
	if (r == 0)
		r = source_set_sums(s->data, sums);
	if (r < 0) {
		sums_free(sums);
		return r == -ENODATA ? -EBADMSG : r;
	}
	if (!verify_all)
		return 0;
	r = check_all(io, s->data, s->bytes);
	if (r == -EUCLEAN)
		snprintf(err, errlen, "%s", source_reader_error(io));
	else if (r < 0)
		snprintf(err, errlen, "%s: cannot read: %s", data_path, strerror(-r));
	return r;
}
