/* SPDX-License-Identifier: MIT */
/*
 * Text shard indexes (text.h). The cache file, little-endian:
 *
 *   struct text_index_header
 *   u64 offsets[n_docs]
 *   u64 lines[n_docs]          only when has_lines
 *   u32 lengths[n_docs]
 *
 * then the block checksums of everything before them (daemon/io/sums.h, a
 * trailer), so a torn, foreign or damaged file is rebuilt rather than
 * trusted. The decompressed copies carry the same trailer and are read
 * through a source that checks every block (source_set_sums); they are
 * built, pinned while served and evicted through daemon/cache/cache.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "daemon/cache/cache.h"
#include "daemon/format/format.h"
#include "daemon/format/text.h"
#include "daemon/io/sums.h"
#include "daemon/order/order.h"
#include "proto/macro.h"

#define INDEX_MAGIC "FDTXIDX2"
#define BLOCK (8u << 20) /* bytes per read while indexing */

struct text_index_header {
	char magic[8];
	uint64_t src_size;
	int64_t mtime_sec, mtime_nsec;
	uint64_t ino, dev;
	uint32_t kind, codec;
	uint64_t data_bytes;
	uint64_t n_docs;
	uint64_t has_lines;
	uint64_t max_doc_bytes;
	uint64_t ctime_ns; /* the source's ctime: a rewrite that put size, inode and mtime back rebuilds it */
};
_Static_assert(sizeof(struct text_index_header) == 96, "index header layout");

enum text_codec text_codec_of(const char *path)
{
	size_t n = strlen(path);
	if (n > 3 && strcmp(path + n - 3, ".gz") == 0)
		return TEXT_CODEC_GZIP;
	if (n > 4 && strcmp(path + n - 4, ".zst") == 0)
		return TEXT_CODEC_ZSTD;
	return TEXT_CODEC_NONE;
}

static const char *codec_name(enum text_codec c)
{
	return c == TEXT_CODEC_GZIP ? "gzip" : c == TEXT_CODEC_ZSTD ? "zstd" : "plain";
}

static uint64_t hash_words(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (; n >= 8; n -= 8, b += 8) {
		uint64_t w;
		memcpy(&w, b, 8);
		h = order_mix(h ^ w) + 1;
	}
	for (; n; n--, b++)
		h = order_mix(h ^ *b) + 1;
	return h;
}

/* ---- building: documents as lines ---------------------------------------- */

struct builder {
	struct text_shard *s;
	uint64_t max_doc_bytes;
	uint64_t pos;         /* data offset of the next byte scanned */
	uint64_t line;        /* 1-based line being scanned */
	uint64_t line_start;
	bool content;         /* the line so far holds a non-whitespace byte */
	size_t cap;
	bool need_lines;      /* some line was blank, so lines[] is needed */
	uint8_t *mem;         /* non-NULL: the copy is written here, not to the cache ... */
	uint64_t mem_cap;     /* ... and holds at most this many bytes */
};

static int add_doc(struct builder *b, uint64_t offset, uint64_t len)
{
	struct text_shard *s = b->s;
	if (s->n_docs == UINT32_MAX - 1)
		return -E2BIG;
	if (s->n_docs == b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 1024;
		uint64_t *o = realloc(s->offsets, cap * sizeof(*o));
		if (o)
			s->offsets = o;
		uint64_t *l = realloc(s->lines, cap * sizeof(*l));
		if (l)
			s->lines = l;
		uint32_t *n = realloc(s->lengths, cap * sizeof(*n));
		if (n)
			s->lengths = n;
		if (!o || !l || !n)
			return -ENOMEM;
		b->cap = cap;
	}
	s->offsets[s->n_docs] = offset;
	s->lengths[s->n_docs] = (uint32_t)MIN(len, b->max_doc_bytes + 1);
	s->lines[s->n_docs] = b->line;
	if (b->line != (uint64_t)s->n_docs + 1)
		b->need_lines = true;
	s->n_docs++;
	return 0;
}

static inline bool json_space(uint8_t c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Scans decompressed bytes data[0..n) that sit at b->pos in the data file. */
static int scan(struct builder *b, const uint8_t *data, size_t n)
{
	const uint8_t *p = data, *end = data + n;
	while (p < end) {
		const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
		const uint8_t *stop = nl ? nl : end;
		for (const uint8_t *q = p; !b->content && q < stop; q++)
			b->content = !json_space(*q);
		if (!nl)
			break;
		uint64_t at = b->pos + (uint64_t)(nl - data);
		if (b->content) {
			int r = add_doc(b, b->line_start, at - b->line_start);
			if (r < 0)
				return r;
		}
		b->line++;
		b->line_start = at + 1;
		b->content = false;
		p = nl + 1;
	}
	b->pos += n;
	return 0;
}

/* The last line, when the data does not end with a newline. */
static int scan_end(struct builder *b)
{
	if (!b->content)
		return 0;
	b->content = false;
	return add_doc(b, b->line_start, b->pos - b->line_start);
}

/* ---- decompression into the cache ----------------------------------------- */

struct decoder {
	enum text_codec codec;
	z_stream z;
	bool z_init;
	bool z_member_done; /* the last gzip member ended; anything after must start another */
	ZSTD_DStream *zs;
	size_t zs_last;     /* ZSTD_decompressStream's last hint: 0 = at a frame boundary */
};

/*
 * A zstd stream per thread, kept between shards: creating one took a tenth
 * of a worker's time when thousands of small shards are copied on use. One
 * that grew past ZSTD_KEEP_MAX (a large frame window) is not kept.
 */
#define ZSTD_KEEP_MAX (1u << 20)
static pthread_key_t zs_key;
static pthread_once_t zs_once = PTHREAD_ONCE_INIT;

static void zs_free(void *p)
{
	ZSTD_freeDStream(p);
}

static void zs_key_init(void)
{
	if (pthread_key_create(&zs_key, zs_free) != 0)
		zs_key = (pthread_key_t)-1;
}

static void decoder_done(struct decoder *d)
{
	if (d->z_init)
		inflateEnd(&d->z);
	if (d->zs && zs_key != (pthread_key_t)-1 && !pthread_getspecific(zs_key) &&
	    ZSTD_sizeof_DStream(d->zs) <= ZSTD_KEEP_MAX && pthread_setspecific(zs_key, d->zs) == 0)
		return;
	ZSTD_freeDStream(d->zs);
}

static int decoder_init(struct decoder *d, enum text_codec codec)
{
	*d = (struct decoder){ .codec = codec, .zs_last = 0 };
	if (codec == TEXT_CODEC_GZIP) {
		if (inflateInit2(&d->z, 15 + 16) != Z_OK)
			return -ENOMEM;
		d->z_init = true;
		return 0;
	}
	pthread_once(&zs_once, zs_key_init);
	if (zs_key != (pthread_key_t)-1 && (d->zs = pthread_getspecific(zs_key)))
		pthread_setspecific(zs_key, NULL);
	else
		d->zs = ZSTD_createDStream();
	if (!d->zs || ZSTD_isError(ZSTD_initDStream(d->zs)))
		return -ENOMEM;
	return 0;
}

/* Appends decompressed bytes to the copy in the cache and indexes them. */
static int emit(struct builder *b, struct cache_build *out, const uint8_t *data, size_t n, char *err, size_t errlen)
{
	if (!n)
		return 0;
	/* No copy (out NULL): load only indexes; the copy is made when the shard is read (text_acquire). */
	int r = out ? cache_build_write(out, data, n, err, errlen) : 0;
	if (r == 0 && b->mem) {
		if (b->pos + n > b->mem_cap) /* more than at load: the source changed */
			return -ESTALE;
		memcpy(b->mem + b->pos, data, n);
	}
	return r < 0 ? r : scan(b, data, n);
}

/*
 * Decompresses in[0..n) (compressed bytes from `in_pos` on), appending the
 * output to the cache entry dst and scanning it. Returns 0 or a negative
 * errno with a message.
 */
static int decode(struct decoder *d, struct builder *b, const uint8_t *in, size_t n, uint64_t in_pos,
		  struct cache_build *dst, uint8_t *out, size_t out_cap, char *err, size_t errlen)
{
	int r;
	const char *path = b->s->path;
	if (d->codec == TEXT_CODEC_GZIP) {
		size_t used = 0;
		while (used < n) {
			if (d->z_member_done) {
				/* Concatenated members, as gzip(1) writes with cat a.gz b.gz. */
				if (inflateReset(&d->z) != Z_OK)
					return -ENOMEM;
				d->z_member_done = false;
			}
			d->z.next_in = (Bytef *)(in + used);
			d->z.avail_in = (uInt)MIN(n - used, (size_t)UINT32_MAX);
			size_t before = d->z.avail_in;
			int zr;
			do {
				d->z.next_out = out;
				d->z.avail_out = (uInt)out_cap;
				zr = inflate(&d->z, Z_NO_FLUSH);
				if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
					snprintf(err, errlen, "%s: corrupt gzip data near compressed byte %" PRIu64 ": %s", path,
						 in_pos + used + (before - d->z.avail_in), d->z.msg ? d->z.msg : "inflate failed");
					return -EBADMSG;
				}
				if ((r = emit(b, dst, out, out_cap - d->z.avail_out, err, errlen)) < 0)
					return r;
			} while (zr == Z_OK && d->z.avail_out == 0);
			used += before - d->z.avail_in;
			if (zr == Z_STREAM_END)
				d->z_member_done = true;
			else if (before == d->z.avail_in)
				break; /* needs more input */
		}
		return 0;
	}

	ZSTD_inBuffer ib = { .src = in, .size = n, .pos = 0 };
	bool full = false;
	/* Until the input is used up and the decoder has no more output for it. */
	while (ib.pos < ib.size || full) {
		ZSTD_outBuffer ob = { .dst = out, .size = out_cap, .pos = 0 };
		size_t at = ib.pos;
		size_t zr = ZSTD_decompressStream(d->zs, &ob, &ib);
		if (ZSTD_isError(zr)) {
			snprintf(err, errlen, "%s: corrupt zstd data near compressed byte %" PRIu64 ": %s", path,
				 in_pos + at, ZSTD_getErrorName(zr));
			return -EBADMSG;
		}
		/* A call that moved nothing says nothing about frames (after one ends it hints at the next). */
		if (ob.pos || ib.pos != at)
			d->zs_last = zr;
		full = ob.pos == ob.size;
		if ((r = emit(b, dst, out, ob.pos, err, errlen)) < 0)
			return r;
	}
	return 0;
}

/* Whether the stream stopped inside a gzip member or zstd frame. */
static bool decoder_truncated(const struct decoder *d, bool saw_input)
{
	if (d->codec == TEXT_CODEC_GZIP)
		return saw_input ? !d->z_member_done : true;
	return d->zs_last != 0 || !saw_input;
}

/* ---- the cache ------------------------------------------------------------ */

static char *cache_name(const char *cache_dir, const char *path, const char *suffix)
{
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	uint64_t h = hash_words(UINT64_C(0x6665656464), path, strlen(path));
	char *out;
	return asprintf(&out, "%s/%016" PRIx64 "-%.64s%s", cache_dir, h, base, suffix) < 0 ? NULL : out;
}

static struct text_index_header header_of(const struct text_shard *s, uint64_t max_doc_bytes)
{
	struct text_index_header h = {
		.src_size = (uint64_t)s->id.size,
		.mtime_sec = s->id.mtime.tv_sec,
		.mtime_nsec = s->id.mtime.tv_nsec,
		.ino = (uint64_t)s->id.ino,
		.dev = (uint64_t)s->id.dev,
		.kind = s->kind,
		.codec = s->codec,
		.data_bytes = s->bytes,
		.n_docs = s->n_docs,
		.has_lines = s->lines != NULL,
		.max_doc_bytes = max_doc_bytes,
		.ctime_ns = (uint64_t)s->id.ctime.tv_sec * 1000000000u + (uint64_t)s->id.ctime.tv_nsec,
	};
	memcpy(h.magic, INDEX_MAGIC, 8);
	return h;
}

/* Writes the index with its checksums, atomically (cache_build: temporary file, then rename). */
static int cache_store(const struct text_shard *s, const char *idx_path, const struct text_open_opts *o, char *err,
		       size_t errlen)
{
	struct cache_build *b = NULL;
	int r = cache_build_begin(o->cache_dir, o->cache_max_bytes, idx_path, SUMS_BLOCK_DEFAULT, &b, err, errlen);
	if (r < 0)
		return r;
	struct text_index_header h = header_of(s, o->max_doc_bytes);
	r = cache_build_write(b, &h, sizeof(h), err, errlen);
	if (r == 0)
		r = cache_build_write(b, s->offsets, (size_t)s->n_docs * 8, err, errlen);
	if (r == 0 && s->lines)
		r = cache_build_write(b, s->lines, (size_t)s->n_docs * 8, err, errlen);
	if (r == 0)
		r = cache_build_write(b, s->lengths, (size_t)s->n_docs * 4, err, errlen);
	if (r < 0) {
		cache_build_abort(b);
		return r;
	}
	return cache_build_commit(b, err, errlen);
}

/* Forgets an index that turned out unusable, so it is built afresh. */
static void drop_index(struct text_shard *s)
{
	free(s->offsets);
	free(s->lines);
	free(s->lengths);
	s->offsets = NULL;
	s->lines = NULL;
	s->lengths = NULL;
	s->n_docs = 0;
}

/*
 * Loads a cached index if it describes this very source (identity, kind,
 * codec, document size limit) and is intact. Returns 1 when loaded, 0 when
 * there is none to use (a damaged one: s->cache_note says where).
 */
static int cache_load(struct text_shard *s, const char *idx_path, struct source_reader *io, uint64_t max_doc_bytes)
{
	struct source *file = NULL;
	char why[256];
	if (source_open(idx_path, &file, why, sizeof(why)) < 0)
		return 0;
	_cleanup_free_ void *buf = NULL;
	int r = source_read_all(io, file, &buf);
	int64_t size = r < 0 ? r : sums_check_buffer(buf, source_size(file), idx_path, why, sizeof(why));
	source_close(file);
	if (size == -EBADMSG)
		snprintf(s->cache_note, sizeof(s->cache_note), "%s; rebuilt", why);
	if (size < (int64_t)sizeof(struct text_index_header))
		return 0;
	struct text_index_header h;
	memcpy(&h, buf, sizeof(h));
	struct text_index_header want = header_of(s, max_doc_bytes);
	want.data_bytes = h.data_bytes;
	want.n_docs = h.n_docs;
	want.has_lines = h.has_lines;
	if (memcmp(&h, &want, sizeof(h)) != 0 || h.n_docs >= UINT32_MAX || h.has_lines > 1)
		return 0;
	uint64_t per = 8 + 4 + (h.has_lines ? 8 : 0);
	if ((uint64_t)size != sizeof(h) + h.n_docs * per)
		return 0;
	size_t n = (size_t)h.n_docs;
	const uint8_t *p = (const uint8_t *)buf + sizeof(h);
	uint64_t *offsets = malloc(MAX(n, 1u) * 8), *lines = h.has_lines ? malloc(MAX(n, 1u) * 8) : NULL;
	uint32_t *lengths = malloc(MAX(n, 1u) * 4);
	if (!offsets || !lengths || (h.has_lines && !lines)) {
		free(offsets);
		free(lines);
		free(lengths);
		return 0;
	}
	memcpy(offsets, p, n * 8);
	p += n * 8;
	if (lines) {
		memcpy(lines, p, n * 8);
		p += n * 8;
	}
	memcpy(lengths, p, n * 4);
	s->offsets = offsets;
	s->lines = lines;
	s->lengths = lengths;
	s->n_docs = (uint32_t)n;
	s->bytes = h.data_bytes;
	bool ok = true;
	/* Documents must lie inside the data, in order, as the builder made them. */
	for (size_t i = 0; ok && i < n; i++) {
		uint64_t len = MIN((uint64_t)lengths[i], max_doc_bytes);
		ok = offsets[i] <= h.data_bytes && len <= h.data_bytes - offsets[i] &&
		     (i == 0 || offsets[i] >= offsets[i - 1]);
	}
	if (!ok) {
		drop_index(s);
		return 0;
	}
	return 1;
}

/* ---- open ----------------------------------------------------------------- */

/* Reads the whole of src (size bytes) in large blocks, handing each to fn. */
static int read_blocks(struct source_reader *io, struct source *src, uint64_t size, uint8_t *buf,
		       int (*fn)(void *ctx, const uint8_t *p, size_t n, uint64_t at), void *ctx)
{
	for (uint64_t at = 0; at < size;) {
		size_t n = (size_t)MIN((uint64_t)BLOCK, size - at);
		struct source_read req = { .src = src, .offset = at, .len = n, .dst = buf };
		size_t failed;
		int r = source_read(io, &req, 1, &failed);
		if (r < 0)
			return r;
		r = fn(ctx, buf, n, at);
		if (r < 0)
			return r;
		at += n;
	}
	return 0;
}

static int scan_block(void *ctx, const uint8_t *p, size_t n, uint64_t at)
{
	return scan(ctx, p, n);
}

struct decode_ctx {
	struct decoder *d;
	struct builder *b;
	struct cache_build *dst;
	uint8_t *out;
	size_t out_cap;
	char *err;
	size_t errlen;
	const bool *cancel; /* set: the copy is no longer wanted (its shard is being freed) */
};

static int decode_block(void *ctx, const uint8_t *p, size_t n, uint64_t at)
{
	struct decode_ctx *c = ctx;
	if (c->cancel && __atomic_load_n(c->cancel, __ATOMIC_ACQUIRE)) {
		snprintf(c->err, c->errlen, "%s: its copy was given up (the shard is no longer served)", c->b->s->path);
		return -ECANCELED;
	}
	return decode(c->d, c->b, p, n, at, c->dst, c->out, c->out_cap, c->err, c->errlen);
}

/*
 * Indexes the shard; a compressed or Parquet one's copy is written to the
 * cache entry data_path (with its checksums, within cache_max_bytes).
 */
static int build_index(struct text_shard *s, struct source *src, const struct text_open_opts *o, const char *data_path,
		       uint8_t *mem, uint64_t mem_cap, struct source_reader *io, char *err, size_t errlen)
{
	struct builder b = { .s = s, .max_doc_bytes = o->max_doc_bytes, .line = 1, .mem = mem, .mem_cap = mem_cap };
	/* A small shard gets small buffers: thousands of them are indexed at load, and copied on use. */
	const uint64_t size = (uint64_t)s->id.size;
	_cleanup_free_ uint8_t *buf = malloc((size_t)MAX(MIN((uint64_t)BLOCK, size), UINT64_C(1)));
	if (!buf)
		return -ENOMEM;
	int r;
	struct cache_build *dst = NULL;
	if (data_path && (r = cache_build_begin(o->cache_dir, o->cache_max_bytes, data_path, SUMS_BLOCK_DEFAULT, &dst,
						err, errlen)) < 0)
		return r;
	if (s->kind == TEXT_PARQUET) {
		r = text_parquet_build(s, src, io, o->text_key ? o->text_key : "text", o->max_doc_bytes, dst, err, errlen);
		return r < 0 ? (cache_build_abort(dst), r) : cache_build_commit(dst, err, errlen);
	} else if (s->kind == TEXT_PLAIN && s->codec == TEXT_CODEC_NONE) {
		/* The whole file is the document; nothing to scan. */
		b.pos = (uint64_t)s->id.size;
		r = add_doc(&b, 0, b.pos);
	} else if (s->codec == TEXT_CODEC_NONE) {
		r = read_blocks(io, src, (uint64_t)s->id.size, buf, scan_block, &b);
		if (r == 0)
			r = scan_end(&b);
		if (r < 0 && r != -ENOMEM && r != -E2BIG)
			snprintf(err, errlen, "%s: cannot read: %s", s->path, strerror(-r));
	} else {
		const size_t out_cap = size < (1u << 20) ? 256u << 10 : BLOCK;
		_cleanup_free_ uint8_t *out = malloc(out_cap);
		struct decoder d;
		r = out ? decoder_init(&d, s->codec) : -ENOMEM;
		if (r < 0) {
			cache_build_abort(dst);
			return r;
		}
		err[0] = 0;
		struct decode_ctx c = { .d = &d, .b = &b, .dst = dst, .out = out, .out_cap = out_cap, .err = err,
					.errlen = errlen, .cancel = o->cancel };
		r = read_blocks(io, src, (uint64_t)s->id.size, buf, decode_block, &c);
		if (r < 0 && !err[0] && r != -ENOMEM && r != -E2BIG)
			snprintf(err, errlen, "%s: cannot read: %s", s->path, strerror(-r));
		if (r == 0 && decoder_truncated(&d, s->id.size > 0)) {
			/* Keep what is whole; the line cut short is not a document. */
			snprintf(s->truncated, sizeof(s->truncated),
				 "%s: %s stream ends early (truncated after %" PRIu64 " compressed bytes, line %" PRIu64
				 "); the %" PRIu32 " documents before the cut are served",
				 s->path, codec_name(s->codec), (uint64_t)s->id.size, b.line, s->n_docs);
			b.content = false;
		}
		if (r == 0)
			r = scan_end(&b);
		decoder_done(&d);
		if (r == 0 && s->kind == TEXT_PLAIN) {
			/* A compressed text file is still one document: everything that decompressed. */
			s->n_docs = 0;
			b.line = 1;
			r = add_doc(&b, 0, b.pos);
		}
		r = r < 0 || !dst ? (cache_build_abort(dst), r) : cache_build_commit(dst, err, errlen);
	}
	if (r == -E2BIG)
		snprintf(err, errlen, "%s: more than %u documents in one shard; split it", s->path, UINT32_MAX - 2);
	if (r < 0)
		return r;
	s->bytes = b.pos;
	if (!b.need_lines) {
		free(s->lines);
		s->lines = NULL;
	}
	return 0;
}

struct text_shard *text_free(struct text_shard *s)
{
	if (!s)
		return NULL;
	if (s->lazy)
		text_idle_forget(s);
	source_close(s->data);
	cache_unpin(s->pin);
	free(s->text_key);
	free(s->offsets);
	free(s->lengths);
	free(s->lines);
	free(s->data_path);
	free(s->path);
	free(s->cache_dir);
	free(s->idx_path);
	if (s->lazy)
		pthread_mutex_destroy(&s->lock);
	free(s);
	return NULL;
}

static void source_closep(struct source **s)
{
	source_close(*s);
}

int text_open(const char *path, const struct text_open_opts *o, struct source_reader *io, struct text_shard **ret,
	      char *err, size_t errlen)
{
	int r;
	struct text_shard *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->kind = o->kind;
	s->codec = text_codec_of(path);
	s->path = strdup(path);
	s->text_key = strdup(o->text_key ? o->text_key : "text");
	if (!s->path || !s->text_key) {
		text_free(s);
		return -ENOMEM;
	}
	_cleanup_(source_closep) struct source *src = NULL;
	r = source_open(path, &src, err, errlen);
	if (r < 0) {
		text_free(s);
		return r;
	}
	s->id = *source_identity(src);

	_cleanup_free_ char *idx_path = NULL, *data_path = NULL;
	const bool copy = s->codec != TEXT_CODEC_NONE || s->kind == TEXT_PARQUET;
	/* A Parquet shard's copy holds one column: the column is part of its name. */
	char sfx_idx[40] = ".idx", sfx_data[40] = ".data";
	if (s->kind == TEXT_PARQUET) {
		const char *col = o->text_key ? o->text_key : "text";
		uint64_t h = hash_words(UINT64_C(0x7071), col, strlen(col));
		snprintf(sfx_idx, sizeof(sfx_idx), ".%016" PRIx64 ".idx", h);
		snprintf(sfx_data, sizeof(sfx_data), ".%016" PRIx64 ".data", h);
	}
	if (o->cache_dir) {
		idx_path = cache_name(o->cache_dir, path, sfx_idx);
		if (copy)
			data_path = cache_name(o->cache_dir, path, sfx_data);
		if (!idx_path || (copy && !data_path)) {
			text_free(s);
			return -ENOMEM;
		}
	} else if (copy) {
		snprintf(err, errlen, "%s: a %s shard is served from a decompressed copy, and there is no cache_dir to keep it in",
			 path, s->kind == TEXT_PARQUET ? "Parquet" : codec_name(s->codec));
		text_free(s);
		return -EINVAL;
	}

	if (idx_path && cache_load(s, idx_path, io, o->max_doc_bytes) == 1)
		s->cached = true;
	if (!s->cached) {
		/*
		 * A compressed shard is only indexed here: its copy is made when it
		 * is read (text_acquire). A Parquet column is decoded into its copy
		 * now, in the same pass; the cache may evict it until it is read.
		 */
		r = build_index(s, src, o, s->kind == TEXT_PARQUET ? data_path : NULL, NULL, 0, io, err, errlen);
		if (r < 0) {
			text_free(s);
			return r;
		}
		/*
		 * A truncated stream is not cached: it says so again on every load.
		 * Nor is a small shard's index at load (TEXT_STORE_MIN).
		 */
		if (idx_path && o->defer_store && s->kind != TEXT_PARQUET && s->bytes < TEXT_STORE_MIN) {
			/* indexed again at the next start */
		} else if (idx_path && !s->truncated[0] && o->defer_store && s->kind != TEXT_PARQUET) {
			/* Written after load, off the load path (the feed's scanner thread): a file per shard costs. */
			s->store_pending = true;
			s->idx_path = TAKE_PTR(idx_path);
		} else if (idx_path && !s->truncated[0]) {
			r = cache_store(s, idx_path, o, err, errlen);
			if (r < 0 && data_path) {
				unlink(data_path);
				text_free(s);
				return r;
			}
			/* A plain shard still works with its index in memory only. */
		}
		s->verified = s->kind == TEXT_PARQUET;
	}

	if (o->cache_dir) {
		s->cache_dir = strdup(o->cache_dir);
		if (!s->cache_dir) {
			text_free(s);
			return -ENOMEM;
		}
		s->cache_max_bytes = o->cache_max_bytes;
		s->max_doc_bytes = o->max_doc_bytes;
	}
	if (data_path) {
		pthread_mutex_init(&s->lock, NULL);
		s->lazy = true;
		s->mem = s->kind != TEXT_PARQUET && s->bytes <= TEXT_MEM_MAX;
		s->data_path = TAKE_PTR(data_path);
	} else {
		s->data_path = strdup(path);
		if (!s->data_path) {
			text_free(s);
			return -ENOMEM;
		}
		s->data = TAKE_PTR(src);
	}
	*ret = s;
	return 0;
}

int text_store_index(const struct text_shard *s, char *err, size_t errlen)
{
	const struct text_open_opts o = { .kind = s->kind, .cache_dir = s->cache_dir, .cache_max_bytes = s->cache_max_bytes,
					  .max_doc_bytes = s->max_doc_bytes, .text_key = s->text_key };
	return s->idx_path ? cache_store(s, s->idx_path, &o, err, errlen) : 0;
}

/* Decompresses s's source again into its cache entry, or into mem (s->bytes), checked to hold what load indexed. */
static int copy_again(struct text_shard *s, struct source_reader *io, uint8_t *mem, char *err, size_t errlen)
{
	int r = source_check(s->path, &s->id, err, errlen);
	if (r < 0)
		return r;
	_cleanup_(source_closep) struct source *src = NULL;
	if ((r = source_open(s->path, &src, err, errlen)) < 0)
		return r;
	struct text_shard t = { .path = s->path, .kind = s->kind, .codec = s->codec, .id = s->id };
	const struct text_open_opts o = { .kind = s->kind, .cache_dir = s->cache_dir, .cache_max_bytes = s->cache_max_bytes,
					  .max_doc_bytes = s->max_doc_bytes, .text_key = s->text_key, .cancel = &s->cancel };
	r = build_index(&t, src, &o, mem ? NULL : s->data_path, mem, s->bytes, io, err, errlen);
	free(t.offsets);
	free(t.lines);
	free(t.lengths);
	if (r == -ESTALE)
		snprintf(err, errlen, "%s: made again, it holds more than the %" PRIu64 " bytes it held at load", s->path,
			 s->bytes);
	else if (r == 0 && (t.n_docs != s->n_docs || t.bytes != s->bytes))
		snprintf(err, errlen, "%s: made again, it holds %" PRIu32 " documents in %" PRIu64
			 " bytes, not the %" PRIu32 " in %" PRIu64 " it held at load", s->path, t.n_docs, t.bytes, s->n_docs,
			 s->bytes);
	if (r == -ESTALE || (r == 0 && (t.n_docs != s->n_docs || t.bytes != s->bytes))) {
		if (!mem)
			unlink(s->data_path);
		r = -ESTALE;
	}
	return r;
}

int text_build_copy(struct text_shard *s, struct source_reader *io, char *err, size_t errlen)
{
	return copy_again(s, io, NULL, err, errlen);
}

int text_build_mem(struct text_shard *s, struct source_reader *io, struct source **ret, char *err, size_t errlen)
{
	_cleanup_free_ uint8_t *mem = malloc((size_t)MAX(s->bytes, UINT64_C(1)));
	if (!mem) {
		snprintf(err, errlen, "%s: out of memory for its copy (%" PRIu64 " bytes)", s->path, s->bytes);
		return -ENOMEM;
	}
	int r = copy_again(s, io, mem, err, errlen);
	return r < 0 ? r : source_open_mem(s->path, TAKE_PTR(mem), (size_t)s->bytes, ret, err, errlen);
}

int text_check(const struct text_shard *s, char *err, size_t errlen)
{
	return source_check(s->path, &s->id, err, errlen);
}
