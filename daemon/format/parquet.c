/* SPDX-License-Identifier: MIT */
/*
 * Parquet footer (parquet.h). A file is
 *
 *   "PAR1" | column chunks ... | FileMetaData (Thrift compact) | u32 len | "PAR1"
 *
 * ("PARE" at the end: an encrypted footer, refused). The metadata's fields
 * read here, by Thrift field id (parquet.thrift):
 *   FileMetaData   1 version, 2 schema list<SchemaElement>, 3 num_rows,
 *                  4 row_groups list<RowGroup>, 6 created_by,
 *                  8 encryption_algorithm (refused)
 *   SchemaElement  1 type, 3 repetition_type, 4 name, 5 num_children,
 *                  6 converted_type, 10 logicalType (union)
 *   RowGroup       1 columns list<ColumnChunk>, 2 total_byte_size, 3 num_rows
 *   ColumnChunk    1 file_path (refused), 3 meta_data,
 *                  8 crypto_metadata, 9 encrypted_column_metadata (refused)
 *   ColumnMetaData 1 type, 2 encodings, 4 codec, 5 num_values,
 *                  6 total_uncompressed_size, 7 total_compressed_size,
 *                  9 data_page_offset, 11 dictionary_page_offset
 * Everything else is skipped.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/format/parquet.h"
#include "daemon/format/thrift.h"
#include "proto/macro.h"

#define MAX_FOOTER (64u << 20)

static const char *const type_names[] = { "BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY",
					  "FIXED_LEN_BYTE_ARRAY" };
static const char *const codec_names[] = { "UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW" };
static const char *const encoding_names[] = { "PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
					      "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
					      "RLE_DICTIONARY", "BYTE_STREAM_SPLIT" };

const char *parquet_type_name(int32_t t)
{
	return t >= 0 && (size_t)t < ARRAY_SIZE(type_names) ? type_names[t] : t == -1 ? "group" : "unknown";
}

const char *parquet_codec_name(int32_t c)
{
	return c >= 0 && (size_t)c < ARRAY_SIZE(codec_names) ? codec_names[c] : "unknown";
}

const char *parquet_encoding_name(int32_t e)
{
	return e >= 0 && (size_t)e < ARRAY_SIZE(encoding_names) ? encoding_names[e] : "unknown";
}

int parquet_read_fd(void *ctx, uint64_t offset, size_t len, void *dst)
{
	int fd = (int)(intptr_t)ctx;
	uint8_t *p = dst;
	while (len > 0) {
		ssize_t n = pread(fd, p, MIN(len, (size_t)1 << 30), (off_t)offset);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;
		p += n;
		len -= (size_t)n;
		offset += (uint64_t)n;
	}
	return 0;
}

struct parquet_file *parquet_free(struct parquet_file *f)
{
	if (!f)
		return NULL;
	for (uint32_t i = 0; f->schema && i < f->n_schema; i++)
		free(f->schema[i].name);
	free(f->schema);
	for (uint32_t i = 0; f->row_groups && i < f->n_row_groups; i++)
		free(f->row_groups[i].chunks);
	free(f->row_groups);
	free(f->leaf_schema);
	free(f->created_by);
	free(f->name);
	free(f);
	return NULL;
}

static char *strndup_bytes(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1);
	if (s) {
		memcpy(s, p, n);
		s[n] = 0;
	}
	return s;
}

/* The union LogicalType: which of its members is set (1 STRING, ...). */
static int read_logical(struct thrift *t, uint8_t type, int32_t *ret)
{
	int r = thrift_struct_begin(t, type);
	if (r < 0)
		return r;
	int16_t last = 0, id;
	uint8_t ft;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		*ret = id;
		if ((r = thrift_skip(t, ft)) < 0)
			break;
	}
	thrift_struct_end(t);
	return r < 0 ? r : 0;
}

static int read_schema(struct thrift *t, uint8_t type, struct parquet_schema *e)
{
	*e = (struct parquet_schema){ .type = -1, .repetition = -1, .converted = -1, .leaf = -1 };
	int r = thrift_struct_begin(t, type);
	if (r < 0)
		return r;
	int16_t last = 0, id;
	uint8_t ft;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		const uint8_t *p;
		size_t n;
		switch (id) {
		case 1: r = thrift_i32(t, ft, &e->type); break;
		case 3: r = thrift_i32(t, ft, &e->repetition); break;
		case 4:
			r = thrift_binary(t, ft, &p, &n);
			if (r == 0) {
				free(e->name);
				if (!(e->name = strndup_bytes(p, n)))
					r = -ENOMEM;
			}
			break;
		case 5: r = thrift_i32(t, ft, &e->n_children); break;
		case 6: r = thrift_i32(t, ft, &e->converted); break;
		case 10: r = read_logical(t, ft, &e->logical); break;
		default: r = thrift_skip(t, ft); break;
		}
		if (r < 0)
			break;
	}
	thrift_struct_end(t);
	if (r == 0 && !e->name)
		r = thrift_fail(t, "schema element without a name");
	return r < 0 ? r : 0;
}

static int read_column_meta(struct thrift *t, uint8_t type, struct parquet_chunk *c)
{
	int r = thrift_struct_begin(t, type);
	if (r < 0)
		return r;
	c->has_meta = true;
	int16_t last = 0, id;
	uint8_t ft;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		switch (id) {
		case 1: r = thrift_i32(t, ft, &c->type); break;
		case 2: {
			uint8_t et;
			uint32_t n;
			r = thrift_list(t, ft, &et, &n);
			for (uint32_t i = 0; i < n && r == 0; i++) {
				int32_t e;
				r = thrift_i32(t, et, &e);
				if (r == 0 && e >= 0 && e < 32)
					c->encodings |= 1u << e;
			}
			break;
		}
		case 4: r = thrift_i32(t, ft, &c->codec); break;
		case 5: r = thrift_i64(t, ft, &c->n_values); break;
		case 6: r = thrift_i64(t, ft, &c->uncompressed); break;
		case 7: r = thrift_i64(t, ft, &c->compressed); break;
		case 9: r = thrift_i64(t, ft, &c->data_page); break;
		case 11: r = thrift_i64(t, ft, &c->dict_page); break;
		default: r = thrift_skip(t, ft); break;
		}
		if (r < 0)
			break;
	}
	thrift_struct_end(t);
	return r < 0 ? r : 0;
}

static int read_chunk(struct thrift *t, uint8_t type, struct parquet_chunk *c)
{
	*c = (struct parquet_chunk){ .type = -1, .codec = -1, .dict_page = -1, .data_page = -1 };
	int r = thrift_struct_begin(t, type);
	if (r < 0)
		return r;
	int16_t last = 0, id;
	uint8_t ft;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		switch (id) {
		case 1: c->external = true; r = thrift_skip(t, ft); break;
		case 3: r = read_column_meta(t, ft, c); break;
		case 8:
		case 9: c->encrypted = true; r = thrift_skip(t, ft); break;
		default: r = thrift_skip(t, ft); break;
		}
		if (r < 0)
			break;
	}
	thrift_struct_end(t);
	return r < 0 ? r : 0;
}

static int read_row_group(struct thrift *t, uint8_t type, struct parquet_row_group *g, uint32_t n_leaves)
{
	int r = thrift_struct_begin(t, type);
	if (r < 0)
		return r;
	bool have_cols = false, have_rows = false;
	int16_t last = 0, id;
	uint8_t ft;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		switch (id) {
		case 1: {
			uint8_t et;
			uint32_t n;
			if ((r = thrift_list(t, ft, &et, &n)) < 0)
				break;
			if (have_cols || n != n_leaves) {
				r = thrift_fail(t, "row group's column count differs from the schema's leaf count");
				break;
			}
			have_cols = true;
			g->chunks = calloc(MAX(n, 1u), sizeof(*g->chunks));
			if (!g->chunks)
				return -ENOMEM;
			for (uint32_t i = 0; i < n && r == 0; i++)
				r = read_chunk(t, et, &g->chunks[i]);
			break;
		}
		case 2: r = thrift_i64(t, ft, &g->total_bytes); break;
		case 3: r = thrift_i64(t, ft, &g->n_rows); have_rows = true; break;
		default: r = thrift_skip(t, ft); break;
		}
		if (r < 0)
			break;
	}
	thrift_struct_end(t);
	if (r == 0 && (!have_cols || !have_rows))
		r = thrift_fail(t, "row group without columns or num_rows");
	if (r == 0 && g->n_rows < 0)
		r = thrift_fail(t, "row group with a negative num_rows");
	return r < 0 ? r : 0;
}

/* Numbers the leaves depth-first and checks that the children counts describe one tree. */
static int build_tree(struct parquet_file *f, struct thrift *t)
{
	if (f->n_schema == 0)
		return thrift_fail(t, "empty schema");
	uint32_t stack[THRIFT_MAX_DEPTH];
	uint32_t top = 0;
	f->leaf_schema = calloc(f->n_schema, sizeof(*f->leaf_schema));
	if (!f->leaf_schema)
		return -ENOMEM;
	for (uint32_t i = 0; i < f->n_schema; i++) {
		struct parquet_schema *e = &f->schema[i];
		if (i > 0 && top == 0)
			return thrift_fail(t, "schema has elements after its root's children");
		e->depth = top;
		if (top > 0)
			stack[top - 1]--;
		if (e->n_children < 0)
			return thrift_fail(t, "schema element with a negative num_children");
		if (e->n_children > 0 || i == 0) {
			if (top == THRIFT_MAX_DEPTH)
				return thrift_fail(t, "schema nested too deep");
			stack[top++] = (uint32_t)e->n_children;
		} else {
			e->leaf = (int32_t)f->n_leaves;
			f->leaf_schema[f->n_leaves++] = i;
		}
		while (top > 0 && stack[top - 1] == 0)
			top--;
	}
	if (top != 0)
		return thrift_fail(t, "schema's num_children claim more elements than it lists");
	return 0;
}

static int read_metadata(struct parquet_file *f, struct thrift *t)
{
	bool have_schema = false, have_groups = false;
	int16_t last = 0, id;
	uint8_t ft;
	int r;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		uint8_t et;
		uint32_t n;
		const uint8_t *p;
		size_t len;
		switch (id) {
		case 1: r = thrift_i32(t, ft, &f->version); break;
		case 2:
			if ((r = thrift_list(t, ft, &et, &n)) < 0)
				break;
			if (have_schema) {
				r = thrift_fail(t, "two schema lists");
				break;
			}
			have_schema = true;
			f->schema = calloc(MAX(n, 1u), sizeof(*f->schema));
			if (!f->schema)
				return -ENOMEM;
			for (uint32_t i = 0; i < n && r == 0; i++) {
				r = read_schema(t, et, &f->schema[i]);
				f->n_schema = i + 1;
			}
			if (r == 0)
				r = build_tree(f, t);
			break;
		case 3: r = thrift_i64(t, ft, &f->n_rows); break;
		case 4:
			if ((r = thrift_list(t, ft, &et, &n)) < 0)
				break;
			if (!have_schema || have_groups) {
				r = thrift_fail(t, "row groups before the schema, or twice");
				break;
			}
			have_groups = true;
			f->row_groups = calloc(MAX(n, 1u), sizeof(*f->row_groups));
			if (!f->row_groups)
				return -ENOMEM;
			for (uint32_t i = 0; i < n && r == 0; i++) {
				r = read_row_group(t, et, &f->row_groups[i], f->n_leaves);
				f->n_row_groups = i + 1;
			}
			break;
		case 6:
			r = thrift_binary(t, ft, &p, &len);
			if (r == 0 && !f->created_by && !(f->created_by = strndup_bytes(p, len)))
				return -ENOMEM;
			break;
		case 8: return -ENOTSUP;
		default: r = thrift_skip(t, ft); break;
		}
		if (r < 0)
			return r;
	}
	if (r < 0)
		return r;
	if (!have_schema || !have_groups)
		return thrift_fail(t, "file metadata without a schema or row groups");
	return 0;
}

/* Offsets and counts the footer gives, checked against the file. */
static int check_layout(struct parquet_file *f, char *err, size_t errlen)
{
	uint64_t sum = 0;
	for (uint32_t g = 0; g < f->n_row_groups; g++) {
		struct parquet_row_group *rg = &f->row_groups[g];
		rg->first_row = sum;
		if ((uint64_t)rg->n_rows > UINT32_MAX || sum + (uint64_t)rg->n_rows > UINT32_MAX) {
			snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": row group %u: num_rows %" PRId64
				 " is more than one shard may hold", f->name, f->footer_offset, g, rg->n_rows);
			return -EBADMSG;
		}
		sum += (uint64_t)rg->n_rows;
	}
	if (f->n_rows >= 0 && (uint64_t)f->n_rows != sum) {
		snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": num_rows %" PRId64 " but its row groups hold %" PRIu64,
			 f->name, f->footer_offset, f->n_rows, sum);
		return -EBADMSG;
	}
	f->n_rows = (int64_t)sum;
	return 0;
}

int parquet_open(const struct parquet_source *src, struct parquet_file **ret, char *err, size_t errlen)
{
	const char *name = src->name ? src->name : "?";
	if (src->size < 12) {
		snprintf(err, errlen, "%s: %" PRIu64 " bytes, too short for Parquet (at least 12)", name, src->size);
		return -EBADMSG;
	}
	uint8_t tail[8], head[4];
	int r = src->read(src->ctx, 0, 4, head);
	if (r == 0)
		r = src->read(src->ctx, src->size - 8, 8, tail);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot read its footer: %s", name, strerror(-r));
		return r;
	}
	if (memcmp(tail + 4, "PARE", 4) == 0) {
		snprintf(err, errlen, "%s: byte %" PRIu64 ": encrypted footer (PARE); encryption is not supported", name,
			 src->size - 4);
		return -ENOTSUP;
	}
	if (memcmp(head, "PAR1", 4) != 0 || memcmp(tail + 4, "PAR1", 4) != 0) {
		snprintf(err, errlen, "%s: byte %" PRIu64 ": not a Parquet file (no PAR1 magic at its start and end)", name,
			 memcmp(head, "PAR1", 4) != 0 ? (uint64_t)0 : src->size - 4);
		return -EBADMSG;
	}
	uint32_t len = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 | (uint32_t)tail[3] << 24;
	if ((uint64_t)len > src->size - 12 || len > MAX_FOOTER || len == 0) {
		snprintf(err, errlen, "%s: byte %" PRIu64 ": footer length %" PRIu32 " does not fit the file's %" PRIu64
			 " bytes", name, src->size - 8, len, src->size);
		return -EBADMSG;
	}
	struct parquet_file *f = calloc(1, sizeof(*f));
	_cleanup_free_ uint8_t *buf = malloc(len);
	if (!f || !buf || !(f->name = strdup(name))) {
		parquet_free(f);
		return -ENOMEM;
	}
	f->src = *src;
	f->src.name = f->name;
	f->footer_len = len;
	f->footer_offset = src->size - 8 - len;
	f->n_rows = -1;
	r = src->read(src->ctx, f->footer_offset, len, buf);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot read its footer at byte %" PRIu64 ": %s", name, f->footer_offset,
			 strerror(-r));
		parquet_free(f);
		return r;
	}
	struct thrift t;
	thrift_init(&t, buf, len, f->footer_offset);
	r = read_metadata(f, &t);
	if (r == -ENOTSUP)
		snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": encryption_algorithm is set; encryption is not supported",
			 name, f->footer_offset);
	else if (r == -EBADMSG)
		snprintf(err, errlen, "%s: byte %" PRIu64 ": bad footer: %s", name, t.error_at, t.error);
	if (r == 0)
		r = check_layout(f, err, errlen);
	if (r < 0) {
		parquet_free(f);
		return r;
	}
	*ret = f;
	return 0;
}

int parquet_text_column(const struct parquet_file *f, const char *name, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < f->n_schema; i++) {
		const struct parquet_schema *e = &f->schema[i];
		if (e->depth != 1 || strcmp(e->name, name) != 0)
			continue;
		const char *why = NULL;
		if (e->leaf < 0)
			why = "is a group (nested columns are not supported)";
		else if (e->repetition == 2)
			why = "is repeated (lists are not supported)";
		else if (e->type != PQ_BYTE_ARRAY)
			why = "is not BYTE_ARRAY (text is a string column)";
		if (why) {
			snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": column '%s' (%s) %s", f->name, f->footer_offset,
				 name, parquet_type_name(e->type), why);
			return -ENOTSUP;
		}
		for (uint32_t g = 0; g < f->n_row_groups; g++) {
			const struct parquet_chunk *c = &f->row_groups[g].chunks[e->leaf];
			why = c->external ? "is in another file (file_path)" : c->encrypted ? "is encrypted" :
			      !c->has_meta ? "has no meta_data" : NULL;
			if (why) {
				snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": row group %u: column '%s' %s", f->name,
					 f->footer_offset, g, name, why);
				return -ENOTSUP;
			}
		}
		return e->leaf;
	}
	snprintf(err, errlen, "%s: no top-level column '%s' (text_key)", f->name, name);
	return -ENOENT;
}
