/* SPDX-License-Identifier: MIT */
/* The private half of text.c (text.h): what text.c and text_build.c share. */
#pragma once

#include <stdint.h>

#include "daemon/format/text.h"

/* "gzip", "zstd" or "plain", for messages. */
const char *text_codec_name(enum text_codec c);

/*
 * Indexes the shard s (its source open as src) in one streaming pass: n_docs,
 * offsets, lengths, lines, bytes and truncated of s. A compressed or Parquet
 * shard's copy is written on the way to the cache entry data_path (with its
 * checksums, within o->cache_max_bytes), or into mem (at most mem_cap bytes),
 * or nowhere (both NULL: the index only). Returns 0 or a negative errno with
 * a message naming the file in err.
 */
int text_build_index(struct text_shard *s, struct source *src, const struct text_open_opts *o, const char *data_path,
		     uint8_t *mem, uint64_t mem_cap, struct source_reader *io, char *err, size_t errlen);
