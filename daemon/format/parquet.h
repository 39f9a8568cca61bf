/* SPDX-License-Identifier: MIT */
/*
 * A Parquet file read for one text column: the footer's metadata
 * (parquet.c) and the pages of a column chunk (parquet_page.c), from the
 * apache/parquet-format specification.
 *
 * Supported: flat schemas whose chosen column is a top-level BYTE_ARRAY,
 * REQUIRED or OPTIONAL (a null is an empty value); data pages v1 and v2;
 * dictionary pages; PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY,
 * DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY values;
 * RLE/bit-packed definition levels; UNCOMPRESSED, SNAPPY, GZIP and ZSTD.
 * Refused, with the file and the field named: encryption, column chunks in
 * other files, a repeated or nested text column, other physical types, other
 * encodings and codecs. Other columns may be anything: they are never read.
 *
 * Everything in the file is untrusted: every length, offset and count is
 * checked before use, and every error names the file and the byte offset.
 * Bytes are read through a callback over byte ranges, so the reader does not
 * care where the file lives. Memory: the footer's metadata, and while a
 * column chunk is read, one page (compressed and decompressed), its header
 * window and the chunk's dictionary: bounded by the pages a writer makes, not
 * by its row-group size.
 *
 * A parquet_file is immutable after open; reading chunks of it from several
 * threads at once is safe when the callback is.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reads len bytes at offset into dst. Returns 0, or a negative errno (-ENODATA: the source is shorter). */
typedef int (*parquet_read_fn)(void *ctx, uint64_t offset, size_t len, void *dst);

struct parquet_source {
	const char *name;     /* for messages: the file's path or URL */
	uint64_t size;        /* bytes */
	parquet_read_fn read;
	void *ctx;
};

/* A parquet_read_fn over a file descriptor: ctx is the fd, as (void *)(intptr_t)fd. */
int parquet_read_fd(void *ctx, uint64_t offset, size_t len, void *dst);

enum parquet_type {
	PQ_BOOLEAN, PQ_INT32, PQ_INT64, PQ_INT96, PQ_FLOAT, PQ_DOUBLE, PQ_BYTE_ARRAY, PQ_FIXED_LEN_BYTE_ARRAY,
};

enum parquet_codec {
	PQ_UNCOMPRESSED, PQ_SNAPPY, PQ_GZIP, PQ_LZO, PQ_BROTLI, PQ_LZ4, PQ_ZSTD, PQ_LZ4_RAW,
};

/* One schema element, as the footer lists them (depth-first). */
struct parquet_schema {
	char *name;
	int32_t type;         /* enum parquet_type, or -1 for a group */
	int32_t repetition;   /* 0 required, 1 optional, 2 repeated, -1 unset (the root) */
	int32_t n_children;
	int32_t converted;    /* ConvertedType, -1 unset */
	int32_t logical;      /* LogicalType's union field id, 0 unset (1 = STRING) */
	uint32_t depth;       /* 0 for the root */
	int32_t leaf;         /* its column index when a leaf, else -1 */
};

/* A column chunk's metadata. */
struct parquet_chunk {
	int32_t type;
	int32_t codec;
	int64_t n_values;
	int64_t uncompressed;     /* total_uncompressed_size */
	int64_t compressed;       /* total_compressed_size */
	int64_t data_page;        /* data_page_offset */
	int64_t dict_page;        /* dictionary_page_offset, -1 unset */
	uint32_t encodings;       /* bit e set for each Encoding e < 32 listed */
	bool external;            /* file_path set: the chunk is in another file */
	bool encrypted;           /* crypto_metadata or encrypted_column_metadata set */
	bool has_meta;
};

struct parquet_row_group {
	int64_t n_rows;
	int64_t total_bytes;      /* total_byte_size (uncompressed) */
	uint64_t first_row;       /* of the file, the sum of the row groups before */
	struct parquet_chunk *chunks; /* n_leaves */
};

struct parquet_file {
	char *name;
	struct parquet_source src;
	uint64_t footer_offset;   /* where the metadata starts */
	uint32_t footer_len;
	int32_t version;
	int64_t n_rows;
	char *created_by;         /* NULL when unset */
	uint32_t n_schema;
	struct parquet_schema *schema;
	uint32_t n_leaves;
	uint32_t *leaf_schema;    /* n_leaves: each leaf's schema index */
	uint32_t n_row_groups;
	struct parquet_row_group *row_groups;
};

/*
 * Reads and checks the footer of src. Returns 0 with *ret set (owned by
 * the caller, parquet_free()), or a negative errno with a message naming the
 * file and offset in err (-EBADMSG malformed, -ENOTSUP a feature refused,
 * -EIO/-ENODATA from the callback, -ENOMEM).
 */
int parquet_open(const struct parquet_source *src, struct parquet_file **ret, char *err, size_t errlen);
struct parquet_file *parquet_free(struct parquet_file *f);

/*
 * The leaf column named `name` that can hold documents: top-level, BYTE_ARRAY,
 * not repeated, in no chunk encrypted or external. Returns its index, or
 * -ENOENT/-ENOTSUP with a message naming the file and the field.
 */
int parquet_text_column(const struct parquet_file *f, const char *name, char *err, size_t errlen);

const char *parquet_type_name(int32_t type);
const char *parquet_codec_name(int32_t codec);
const char *parquet_encoding_name(int32_t encoding);

/* Called once per row, in order; null rows have p = NULL, n = 0. A negative return stops the read with it. */
typedef int (*parquet_value_fn)(void *ctx, uint64_t row, const uint8_t *p, size_t n, bool null);

/*
 * Decodes column `col` (from parquet_text_column()) of row group `rg`, calling
 * fn for each of its rows in order (`row` counted in the row group). Returns
 * 0, fn's negative return, or a negative errno with a message naming the
 * file and the byte offset of the page at fault.
 */
int parquet_read_column(const struct parquet_file *f, uint32_t rg, uint32_t col, parquet_value_fn fn, void *ctx,
			char *err, size_t errlen);

/* The largest page (either size) or column chunk the reader accepts. */
#define PARQUET_MAX_PAGE (256u << 20)
