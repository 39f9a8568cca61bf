/* SPDX-License-Identifier: MIT */
/*
 * Parquet pages of one BYTE_ARRAY column chunk (parquet.h). A chunk is a
 * sequence of (PageHeader, payload); the PageHeader fields read here
 * (parquet.thrift):
 *   PageHeader            1 type, 2 uncompressed_page_size,
 *                         3 compressed_page_size, 5 data_page_header,
 *                         7 dictionary_page_header, 8 data_page_header_v2
 *   DataPageHeader        1 num_values, 2 encoding, 3 definition_level_encoding
 *   DictionaryPageHeader  1 num_values, 2 encoding
 *   DataPageHeaderV2      1 num_values, 2 num_nulls, 3 num_rows, 4 encoding,
 *                         5 definition_levels_byte_length,
 *                         6 repetition_levels_byte_length, 7 is_compressed
 * v1 pages compress levels and values together, the levels prefixed by a
 * u32 length; v2 pages keep the levels uncompressed, in front, sized by the
 * header. PLAIN BYTE_ARRAY values are u32 length + bytes; dictionary indexes
 * are one byte of bit width, then the RLE/bit-packed hybrid;
 * DELTA_LENGTH_BYTE_ARRAY (DuckDB's v2 pages) is the lengths as
 * DELTA_BINARY_PACKED, then the bytes; DELTA_BYTE_ARRAY (arrow-rs's v2
 * pages) adds the lengths of prefixes shared with the previous value.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "daemon/format/parquet.h"
#include "daemon/format/parquet_enc.h"
#include "daemon/format/thrift.h"
#include "proto/macro.h"

#define WINDOW (64u << 10)      /* first read of a page: its header, and all of a small page */
#define WINDOW_MAX (16u << 20)  /* the longest page header accepted */

enum { PAGE_DATA = 0, PAGE_INDEX = 1, PAGE_DICT = 2, PAGE_DATA_V2 = 3 };
enum { ENC_PLAIN = 0, ENC_PLAIN_DICT = 2, ENC_RLE = 3, ENC_DELTA_LENGTH = 6, ENC_DELTA_BYTES = 7, ENC_RLE_DICT = 8 };

struct page_header {
	int32_t type, uncompressed, compressed;
	int32_t n_values, encoding, def_encoding;
	int32_t n_nulls, n_rows, def_len, rep_len;
	bool is_compressed, have_sizes, have_sub;
};

static int read_sub(struct thrift *t, uint8_t type, struct page_header *h, int kind)
{
	int r = thrift_struct_begin(t, type);
	if (r < 0)
		return r;
	h->have_sub = true;
	int16_t last = 0, id;
	uint8_t ft;
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		if (id == 1)
			r = thrift_i32(t, ft, &h->n_values);
		else if (kind != PAGE_DATA_V2 && id == 2)
			r = thrift_i32(t, ft, &h->encoding);
		else if (kind == PAGE_DATA && id == 3)
			r = thrift_i32(t, ft, &h->def_encoding);
		else if (kind == PAGE_DATA_V2 && id == 2)
			r = thrift_i32(t, ft, &h->n_nulls);
		else if (kind == PAGE_DATA_V2 && id == 3)
			r = thrift_i32(t, ft, &h->n_rows);
		else if (kind == PAGE_DATA_V2 && id == 4)
			r = thrift_i32(t, ft, &h->encoding);
		else if (kind == PAGE_DATA_V2 && id == 5)
			r = thrift_i32(t, ft, &h->def_len);
		else if (kind == PAGE_DATA_V2 && id == 6)
			r = thrift_i32(t, ft, &h->rep_len);
		else if (kind == PAGE_DATA_V2 && id == 7)
			r = thrift_bool(t, ft, &h->is_compressed);
		else
			r = thrift_skip(t, ft);
		if (r < 0)
			break;
	}
	thrift_struct_end(t);
	return r < 0 ? r : 0;
}

static int read_header(struct thrift *t, struct page_header *h)
{
	*h = (struct page_header){ .type = -1, .n_values = -1, .encoding = -1, .def_encoding = ENC_RLE,
				   .is_compressed = true };
	int16_t last = 0, id;
	uint8_t ft;
	int r;
	bool have[3] = { false };
	while ((r = thrift_field(t, &last, &ft, &id)) > 0) {
		switch (id) {
		case 1: r = thrift_i32(t, ft, &h->type); have[0] = true; break;
		case 2: r = thrift_i32(t, ft, &h->uncompressed); have[1] = true; break;
		case 3: r = thrift_i32(t, ft, &h->compressed); have[2] = true; break;
		case 5: r = h->type == PAGE_DATA ? read_sub(t, ft, h, PAGE_DATA) : thrift_skip(t, ft); break;
		case 7: r = h->type == PAGE_DICT ? read_sub(t, ft, h, PAGE_DICT) : thrift_skip(t, ft); break;
		case 8: r = h->type == PAGE_DATA_V2 ? read_sub(t, ft, h, PAGE_DATA_V2) : thrift_skip(t, ft); break;
		default: r = thrift_skip(t, ft); break;
		}
		if (r < 0)
			return r;
	}
	if (r < 0)
		return r;
	if (!have[0] || !have[1] || !have[2])
		return thrift_fail(t, "page header without its type or sizes");
	return 0;
}

/* ---- decompression -------------------------------------------------------- */

static int inflate_all(const uint8_t *in, size_t n, uint8_t *out, size_t want, const char **why)
{
	z_stream z = { 0 };
	if (inflateInit2(&z, 15 + 32) != Z_OK)
		return -ENOMEM;
	z.next_in = (Bytef *)in;
	z.avail_in = (uInt)n;
	z.next_out = out;
	z.avail_out = (uInt)want;
	int zr;
	for (;;) {
		zr = inflate(&z, Z_FINISH);
		/* Concatenated members continue the output. */
		if (zr == Z_STREAM_END && z.avail_in > 0 && inflateReset(&z) == Z_OK)
			continue;
		break;
	}
	size_t got = want - z.avail_out;
	inflateEnd(&z);
	if (zr != Z_STREAM_END) {
		*why = zr == Z_BUF_ERROR && got == want ? "gzip page inflates to more than its header says" :
		       "corrupt gzip page";
		return -EBADMSG;
	}
	if (got != want) {
		*why = "gzip page inflates to fewer bytes than its header says";
		return -EBADMSG;
	}
	return 0;
}

static int decompress(int32_t codec, const uint8_t *in, size_t n, uint8_t *out, size_t want, const char **why)
{
	switch (codec) {
	case PQ_SNAPPY: {
		size_t len;
		if (snappy_uncompressed_length((const char *)in, n, &len) != SNAPPY_OK || len != want) {
			*why = "snappy page's length differs from its header's uncompressed_page_size";
			return -EBADMSG;
		}
		if (snappy_uncompress((const char *)in, n, (char *)out, &len) != SNAPPY_OK || len != want) {
			*why = "corrupt snappy page";
			return -EBADMSG;
		}
		return 0;
	}
	case PQ_GZIP:
		return inflate_all(in, n, out, want, why);
	case PQ_ZSTD: {
		size_t got = ZSTD_decompress(out, want, in, n);
		if (ZSTD_isError(got) || got != want) {
			*why = ZSTD_isError(got) ? "corrupt zstd page (or larger than its header says)" :
			       "zstd page decompresses to fewer bytes than its header says";
			return -EBADMSG;
		}
		return 0;
	}
	default:
		*why = "unsupported codec";
		return -ENOTSUP;
	}
}

/* ---- a column chunk ------------------------------------------------------- */

struct chunk_reader {
	const struct parquet_file *f;
	int32_t codec;
	bool optional;
	uint8_t *page;        /* decompressed data page, reused */
	size_t page_cap;
	uint8_t *dict_buf;    /* decompressed dictionary page (NULL when it is used in place) */
	const uint8_t *dict;  /* the dictionary page's values */
	uint32_t dict_n;
	uint32_t *dict_off, *dict_len;
	bool have_dict;
	uint8_t *value[2];    /* DELTA_BYTE_ARRAY: the previous value and the one being built */
	size_t value_cap[2];
	parquet_value_fn fn;
	void *ctx;
	uint64_t row;
};

/* Bytes of a page with `want` bytes uncompressed: in place, or decompressed into *buf. */
static int page_bytes(struct chunk_reader *c, const uint8_t *in, size_t n, size_t want, bool compressed,
		      uint8_t **buf, size_t *cap, const uint8_t **ret, const char **why)
{
	if (!compressed || c->codec == PQ_UNCOMPRESSED) {
		if (n != want) {
			*why = "uncompressed page whose two sizes differ";
			return -EBADMSG;
		}
		*ret = in;
		return 0;
	}
	if (want > *cap || !*buf) {
		uint8_t *b = realloc(*buf, MAX(want, (size_t)1));
		if (!b)
			return -ENOMEM;
		*buf = b;
		*cap = MAX(want, (size_t)1);
	}
	int r = decompress(c->codec, in, n, *buf, want, why);
	if (r < 0)
		return r;
	*ret = *buf;
	return 0;
}

static int read_dict(struct chunk_reader *c, const struct page_header *h, const uint8_t *p, size_t n, const char **why)
{
	if (c->have_dict) {
		*why = "a second dictionary page, or one after data pages";
		return -EBADMSG;
	}
	if (h->encoding != ENC_PLAIN && h->encoding != ENC_PLAIN_DICT) {
		*why = "dictionary page encoding is not PLAIN";
		return -ENOTSUP;
	}
	if (h->n_values < 0 || (uint64_t)h->n_values > n / 4) {
		*why = "dictionary page claims more values than its bytes can hold";
		return -EBADMSG;
	}
	c->have_dict = true;
	c->dict = p;
	c->dict_n = (uint32_t)h->n_values;
	c->dict_off = malloc(MAX(c->dict_n, 1u) * sizeof(uint32_t));
	c->dict_len = malloc(MAX(c->dict_n, 1u) * sizeof(uint32_t));
	if (!c->dict_off || !c->dict_len)
		return -ENOMEM;
	size_t at = 0;
	for (uint32_t i = 0; i < c->dict_n; i++) {
		if (n - at < 4) {
			*why = "dictionary page ends before its values";
			return -EBADMSG;
		}
		uint32_t len;
		memcpy(&len, p + at, 4);
		len = le32toh(len);
		at += 4;
		if (len > n - at) {
			*why = "dictionary value longer than its page";
			return -EBADMSG;
		}
		c->dict_off[i] = (uint32_t)at;
		c->dict_len[i] = len;
		at += len;
	}
	return 0;
}

/* Counts the defined values among the n levels of a copy of def. */
static int count_defined(const struct rle *def, int32_t n, uint64_t *ret, const char **why)
{
	struct rle d = *def;
	uint64_t k = 0;
	for (int32_t i = 0; i < n; i++) {
		uint32_t level;
		int r = rle_next(&d, &level, why);
		if (r < 0)
			return r;
		k += level == 1;
	}
	*ret = k;
	return 0;
}

/* The values of a data page: n_values slots, defined ones from vals[0..vn). */
static int read_values(struct chunk_reader *c, const struct page_header *h, struct rle *def, const uint8_t *vals,
		       size_t vn, const char **why)
{
	int r;
	bool dict = h->encoding == ENC_PLAIN_DICT || h->encoding == ENC_RLE_DICT;
	bool dlba = h->encoding == ENC_DELTA_LENGTH, dba = h->encoding == ENC_DELTA_BYTES;
	if (!dict && !dlba && !dba && h->encoding != ENC_PLAIN) {
		*why = "values in an unsupported encoding";
		return -ENOTSUP;
	}
	struct rle idx;
	struct delta lens, prefixes;
	size_t at = 0, prev_len = 0;
	unsigned cur = 0;
	if (dlba || dba) {
		/*
		 * DELTA_LENGTH_BYTE_ARRAY: the lengths, then the bytes.
		 * DELTA_BYTE_ARRAY: the lengths of the prefixes shared with the
		 * previous value, then the suffixes as DELTA_LENGTH_BYTE_ARRAY.
		 * A first pass over the lengths finds where the bytes start.
		 */
		uint64_t count = (uint64_t)h->n_values;
		const uint8_t *q = vals, *data;
		if (c->optional && (r = count_defined(def, h->n_values, &count, why)) < 0)
			return r;
		if (dba && ((r = delta_end(vals, vn, count, &q, why)) < 0 ||
			    (r = delta_init(&prefixes, vals, vn, count, why)) < 0))
			return r;
		if ((r = delta_end(q, vn - (size_t)(q - vals), count, &data, why)) < 0 ||
		    (r = delta_init(&lens, q, vn - (size_t)(q - vals), count, why)) < 0)
			return r;
		at = (size_t)(data - vals);
	}
	if (dict) {
		if (!c->have_dict) {
			*why = "dictionary-encoded page without a dictionary page";
			return -EBADMSG;
		}
		if (vn < 1 || vals[0] > 32) {
			*why = "dictionary index bit width missing or over 32";
			return -EBADMSG;
		}
		rle_init(&idx, vals + 1, vn - 1, vals[0]);
	}
	for (int32_t i = 0; i < h->n_values; i++) {
		if (c->optional) {
			uint32_t level;
			if ((r = rle_next(def, &level, why)) < 0)
				return r;
			if (level > 1) {
				*why = "definition level over the column's maximum (1)";
				return -EBADMSG;
			}
			if (level == 0) {
				if ((r = c->fn(c->ctx, c->row++, NULL, 0, true)) < 0)
					return r;
				continue;
			}
		}
		const uint8_t *p;
		uint32_t len;
		if (dict) {
			uint32_t k;
			if ((r = rle_next(&idx, &k, why)) < 0)
				return r;
			if (k >= c->dict_n) {
				*why = "dictionary index out of range";
				return -EBADMSG;
			}
			p = c->dict + c->dict_off[k];
			len = c->dict_len[k];
		} else if (dlba || dba) {
			int64_t l, pre = 0;
			if ((r = delta_next(&lens, &l, why)) < 0 || (dba && (r = delta_next(&prefixes, &pre, why)) < 0))
				return r;
			if (l < 0 || (uint64_t)l > vn - at) {
				*why = "DELTA_LENGTH_BYTE_ARRAY length negative or past its page";
				return -EBADMSG;
			}
			p = vals + at;
			len = (uint32_t)l;
			at += len;
			if (dba) {
				if (pre < 0 || (uint64_t)pre > prev_len) {
					*why = "DELTA_BYTE_ARRAY prefix longer than the previous value";
					return -EBADMSG;
				}
				/* Both parts come from the page, so a value is never longer than it. */
				size_t n = (size_t)pre + len;
				if (n > c->value_cap[cur]) {
					uint8_t *b = realloc(c->value[cur], n);
					if (!b)
						return -ENOMEM;
					c->value[cur] = b;
					c->value_cap[cur] = n;
				}
				if (pre)
					memcpy(c->value[cur], c->value[!cur], (size_t)pre);
				if (len)
					memcpy(c->value[cur] + pre, p, len);
				p = c->value[cur];
				len = (uint32_t)n;
				prev_len = n;
				cur = !cur;
			}
		} else {
			if (vn - at < 4) {
				*why = "page ends before its values";
				return -EBADMSG;
			}
			memcpy(&len, vals + at, 4);
			len = le32toh(len);
			at += 4;
			if (len > vn - at) {
				*why = "value longer than the rest of its page";
				return -EBADMSG;
			}
			p = vals + at;
			at += len;
		}
		if ((r = c->fn(c->ctx, c->row++, p, len, false)) < 0)
			return r;
	}
	return 0;
}

static int read_data(struct chunk_reader *c, const struct page_header *h, const uint8_t *in, size_t n,
		     const char **why)
{
	if (!h->have_sub || h->n_values < 0) {
		*why = "data page without its data page header";
		return -EBADMSG;
	}
	const uint8_t *p;
	const uint8_t *levels = NULL;
	size_t levels_n = 0, vn;
	int r;
	if (h->type == PAGE_DATA) {
		if ((r = page_bytes(c, in, n, (size_t)h->uncompressed, true, &c->page, &c->page_cap, &p, why)) < 0)
			return r;
		vn = (size_t)h->uncompressed;
		if (c->optional) {
			if (h->def_encoding != ENC_RLE) {
				*why = "definition levels not RLE-encoded (BIT_PACKED is not supported)";
				return -ENOTSUP;
			}
			uint32_t len;
			if (vn < 4) {
				*why = "page ends before its definition levels";
				return -EBADMSG;
			}
			memcpy(&len, p, 4);
			len = le32toh(len);
			if (len > vn - 4) {
				*why = "definition levels longer than their page";
				return -EBADMSG;
			}
			levels = p + 4;
			levels_n = len;
			p += 4 + len;
			vn -= 4 + (size_t)len;
		}
	} else {
		if (h->def_len < 0 || h->rep_len < 0 || (uint64_t)h->def_len + (uint64_t)h->rep_len > n ||
		    (uint64_t)h->def_len + (uint64_t)h->rep_len > (uint64_t)h->uncompressed) {
			*why = "level lengths do not fit the page";
			return -EBADMSG;
		}
		if (h->rep_len > 0) {
			*why = "repetition levels in a column that is not repeated";
			return -EBADMSG;
		}
		if (h->n_rows != h->n_values && h->n_rows != -1) {
			*why = "num_rows differs from num_values in a flat column";
			return -EBADMSG;
		}
		levels = in;
		levels_n = (size_t)h->def_len;
		size_t skip = (size_t)h->def_len;
		vn = (size_t)h->uncompressed - skip;
		if ((r = page_bytes(c, in + skip, n - skip, vn, h->is_compressed, &c->page, &c->page_cap, &p, why)) < 0)
			return r;
	}
	struct rle def;
	rle_init(&def, levels, levels_n, 1);
	return read_values(c, h, &def, p, vn, why);
}

int parquet_read_column(const struct parquet_file *f, uint32_t rg, uint32_t col, parquet_value_fn fn, void *ctx,
			char *err, size_t errlen)
{
	if (rg >= f->n_row_groups || col >= f->n_leaves)
		return -EINVAL;
	const struct parquet_row_group *g = &f->row_groups[rg];
	const struct parquet_chunk *ch = &g->chunks[col];
	const struct parquet_schema *e = &f->schema[f->leaf_schema[col]];
	int64_t start = ch->dict_page > 0 && ch->dict_page < ch->data_page ? ch->dict_page : ch->data_page;
	if (ch->codec != PQ_UNCOMPRESSED && ch->codec != PQ_SNAPPY && ch->codec != PQ_GZIP && ch->codec != PQ_ZSTD) {
		snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": row group %u: column '%s': codec %s is not supported "
			 "(UNCOMPRESSED, SNAPPY, GZIP, ZSTD are)", f->name, f->footer_offset, rg, e->name,
			 parquet_codec_name(ch->codec));
		return -ENOTSUP;
	}
	if (start < 4 || ch->compressed < 0 || (uint64_t)start > f->footer_offset ||
	    (uint64_t)ch->compressed > f->footer_offset - (uint64_t)start || ch->n_values != g->n_rows) {
		snprintf(err, errlen, "%s: footer at byte %" PRIu64 ": row group %u: column '%s': chunk at byte %" PRId64
			 " of %" PRId64 " bytes and %" PRId64 " values does not fit the file or its %" PRId64 " rows",
			 f->name, f->footer_offset, rg, e->name, start, ch->compressed, ch->n_values, g->n_rows);
		return -EBADMSG;
	}
	size_t len = (size_t)ch->compressed;
	struct chunk_reader c = { .f = f, .codec = ch->codec, .optional = e->repetition == 1, .fn = fn, .ctx = ctx };
	/*
	 * Page by page: a window holds the header (and the payload when it is
	 * small); a larger payload is read on its own. Memory is a page, not
	 * the chunk, whatever the writer's row-group size.
	 */
	uint8_t *win = NULL, *pay = NULL;
	size_t pay_cap = 0;
	size_t pos = 0;
	const char *why = NULL;
	uint64_t page_at = (uint64_t)start;
	size_t win_cap = MIN(len, (size_t)WINDOW);
	int r = (win = malloc(MAX(win_cap, (size_t)1))) ? 0 : -ENOMEM;
	while (r == 0 && c.row < (uint64_t)g->n_rows) {
		page_at = (uint64_t)start + pos;
		if (pos >= len) {
			why = "column chunk ends before its last row";
			r = -EBADMSG;
			break;
		}
		struct thrift t = { 0 };
		struct page_header h;
		size_t w = MIN(len - pos, (size_t)WINDOW), got = 0;
		for (;;) {
			/* A header longer than the window (statistics can be large): read more, up to WINDOW_MAX. */
			if (w > win_cap) {
				uint8_t *b = realloc(win, w);
				if (!b) {
					r = -ENOMEM;
					break;
				}
				win = b;
				win_cap = w;
			}
			if ((r = f->src.read(f->src.ctx, page_at + got, w - got, win + got)) < 0)
				break;
			got = w;
			thrift_init(&t, win, w, page_at);
			if ((r = read_header(&t, &h)) == 0 || w == MIN(len - pos, (size_t)WINDOW_MAX))
				break;
			w = MIN(len - pos, MIN(w * 4, (size_t)WINDOW_MAX));
		}
		if (r == -ENOMEM)
			break;
		if (r < 0 && !t.error) {
			snprintf(err, errlen, "%s: cannot read column '%s' of row group %u at byte %" PRIu64 ": %s", f->name,
				 e->name, rg, page_at, strerror(-r));
			break;
		}
		if (r < 0) {
			why = t.error;
			page_at = t.error_at;
			break;
		}
		size_t hlen = (size_t)(t.p - win);
		pos += hlen;
		if (h.compressed < 0 || h.uncompressed < 0 || (size_t)h.compressed > len - pos ||
		    (uint32_t)h.uncompressed > PARQUET_MAX_PAGE || (uint32_t)h.compressed > PARQUET_MAX_PAGE) {
			why = "page sizes do not fit its column chunk (or exceed 256 MiB)";
			r = -EBADMSG;
			break;
		}
		size_t n = (size_t)h.compressed;
		const uint8_t *in = win + hlen;
		if (hlen + n > got) {
			if (n > pay_cap) {
				uint8_t *b = realloc(pay, n);
				if (!b) {
					r = -ENOMEM;
					break;
				}
				pay = b;
				pay_cap = n;
			}
			if ((r = f->src.read(f->src.ctx, (uint64_t)start + pos, n, pay)) < 0) {
				snprintf(err, errlen, "%s: cannot read column '%s' of row group %u at byte %" PRIu64 ": %s",
					 f->name, e->name, rg, (uint64_t)start + pos, strerror(-r));
				break;
			}
			in = pay;
		}
		pos += n;
		if (h.type == PAGE_DICT) {
			const uint8_t *p;
			if (!h.have_sub) {
				why = "dictionary page without its header";
				r = -EBADMSG;
			} else if (c.row > 0 || c.have_dict) {
				why = "dictionary page after data pages, or a second one";
				r = -EBADMSG;
			} else if ((r = page_bytes(&c, in, n, (size_t)h.uncompressed, true, &c.dict_buf, &(size_t){ 0 }, &p,
						   &why)) == 0) {
				/* The dictionary outlives its page's buffer: keep a copy when it was used in place. */
				if (p == in) {
					c.dict_buf = malloc(MAX(n, (size_t)1));
					if (!c.dict_buf) {
						r = -ENOMEM;
						break;
					}
					memcpy(c.dict_buf, in, n);
					p = c.dict_buf;
				}
				r = read_dict(&c, &h, p, (size_t)h.uncompressed, &why);
			}
		} else if (h.type == PAGE_DATA || h.type == PAGE_DATA_V2) {
			if (h.n_values > 0 && (uint64_t)h.n_values > (uint64_t)g->n_rows - c.row) {
				why = "page holds more values than its row group has rows left";
				r = -EBADMSG;
			} else {
				r = read_data(&c, &h, in, n, &why);
			}
		} else if (h.type != PAGE_INDEX) {
			why = "unknown page type";
			r = -EBADMSG;
		}
	}
	if (r < 0 && why)
		snprintf(err, errlen, "%s: byte %" PRIu64 ": row group %u, column '%s' (%s): %s", f->name, page_at, rg,
			 e->name, parquet_codec_name(ch->codec), why);
	free(win);
	free(pay);
	free(c.page);
	free(c.dict_buf);
	free(c.dict_off);
	free(c.dict_len);
	free(c.value[0]);
	free(c.value[1]);
	return r;
}
