/* SPDX-License-Identifier: MIT */
/*
 * feedctl parquet-info: a Parquet shard's schema and row-group layout, read
 * with feedd's own reader (daemon/format/parquet.h), so what it prints is
 * what feedd sees; --rows decodes a text column and prints each row as a
 * JSON string (null for a null), for comparing with another reader.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/feedctl/feedctl.h"
#include "daemon/format/parquet.h"
#include "proto/macro.h"

static void print_schema(const struct parquet_file *f, FILE *out)
{
	static const char *const rep[] = { "required", "optional", "repeated" };
	fprintf(out, "schema (%" PRIu32 " elements, %" PRIu32 " columns):\n", f->n_schema, f->n_leaves);
	for (uint32_t i = 0; i < f->n_schema; i++) {
		const struct parquet_schema *e = &f->schema[i];
		fprintf(out, "  %*s%s: %s", (int)e->depth * 2, "", e->name, parquet_type_name(e->type));
		if (e->repetition >= 0 && e->repetition <= 2)
			fprintf(out, " %s", rep[e->repetition]);
		if (e->converted == 0 || e->logical == 1)
			fprintf(out, " (string)");
		if (e->leaf >= 0)
			fprintf(out, " [column %" PRId32 "]", e->leaf);
		else if (i > 0)
			fprintf(out, " (%" PRId32 " children)", e->n_children);
		fputc('\n', out);
	}
}

static void print_layout(const struct parquet_file *f, FILE *out)
{
	fprintf(out, "row groups: %" PRIu32 "\n", f->n_row_groups);
	for (uint32_t g = 0; g < f->n_row_groups; g++) {
		const struct parquet_row_group *rg = &f->row_groups[g];
		fprintf(out, "  row group %" PRIu32 ": rows %" PRIu64 "..%" PRIu64 " (%" PRId64 "), %" PRId64 " bytes uncompressed\n",
			g, rg->first_row, rg->first_row + (uint64_t)rg->n_rows, rg->n_rows, rg->total_bytes);
		for (uint32_t c = 0; c < f->n_leaves; c++) {
			const struct parquet_chunk *ch = &rg->chunks[c];
			fprintf(out, "    %-16s %-10s %-12s at %" PRId64 ", %" PRId64 " -> %" PRId64 " bytes, encodings",
				f->schema[f->leaf_schema[c]].name, parquet_type_name(ch->type), parquet_codec_name(ch->codec),
				ch->dict_page > 0 && ch->dict_page < ch->data_page ? ch->dict_page : ch->data_page,
				ch->compressed, ch->uncompressed);
			for (int e = 0; e < 32; e++)
				if (ch->encodings & (1u << e))
					fprintf(out, " %s", parquet_encoding_name(e));
			fputc('\n', out);
		}
	}
}

static int print_row(void *ctx, uint64_t row, const uint8_t *p, size_t n, bool null)
{
	FILE *out = ctx;
	if (null) {
		fputs("null\n", out);
		return 0;
	}
	fputc('"', out);
	for (size_t i = 0; i < n; i++) {
		uint8_t c = p[i];
		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c < 0x20)
			fprintf(out, "\\u%04x", c);
		else
			fputc(c, out);
	}
	fputs("\"\n", out);
	return 0;
}

int cmd_parquet_info(int argc, char **argv)
{
	const char *column = NULL;
	static const struct option opts[] = {
		{ "rows", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int o;
	optind = 1;
	while ((o = getopt_long(argc, argv, "r:h", opts, NULL)) != -1) {
		if (o == 'r') {
			column = optarg;
		} else {
			fprintf(o == 'h' ? stdout : stderr,
				"usage: feedctl parquet-info [--rows COLUMN] FILE\n"
				"  prints FILE's schema and row groups; --rows prints each row of COLUMN as a JSON string\n");
			return o == 'h' ? 0 : 2;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, "feedctl parquet-info: expected one FILE\n");
		return 2;
	}
	const char *path = argv[optind];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		fprintf(stderr, "feedctl parquet-info: %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 1;
	}
	struct parquet_source src = { .name = path, .size = (uint64_t)st.st_size, .read = parquet_read_fd,
				      .ctx = (void *)(intptr_t)fd };
	struct parquet_file *f = NULL;
	char err[512];
	int r = parquet_open(&src, &f, err, sizeof(err));
	if (r == 0 && column) {
		int col = parquet_text_column(f, column, err, sizeof(err));
		r = col < 0 ? col : 0;
		for (uint32_t g = 0; r == 0 && g < f->n_row_groups; g++)
			r = parquet_read_column(f, g, (uint32_t)col, print_row, stdout, err, sizeof(err));
	} else if (r == 0) {
		printf("%s: %" PRIu64 " bytes, %" PRId64 " rows, format version %" PRId32 ", footer at byte %" PRIu64
		       " (%" PRIu32 " bytes)%s%s\n", path, (uint64_t)st.st_size, f->n_rows, f->version, f->footer_offset,
		       f->footer_len, f->created_by ? ", created by " : "", f->created_by ? f->created_by : "");
		print_schema(f, stdout);
		print_layout(f, stdout);
	}
	parquet_free(f);
	close(fd);
	if (r < 0) {
		fprintf(stderr, "feedctl parquet-info: %s\n", err);
		return 1;
	}
	return 0;
}
