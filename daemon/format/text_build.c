/* SPDX-License-Identifier: MIT */
/*
 * Building a text shard's index, and its copy (text_build.c): documents
 * found as lines (or the whole file) in one streaming pass over the source,
 * decompressed on the way when the shard is compressed. The private half
 * of text.c, for text.c and text_build.c only.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>
#include <zstd.h>

#include "daemon/cache/cache.h"
#include "daemon/format/text-internal.h"
#include "daemon/format/text.h"
#include "daemon/io/sums.h"
#include "proto/macro.h"

#define BLOCK (8u << 20) /* bytes per read while indexing */

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
	bool count_only;      /* text_count(): documents counted, nothing per document kept */
	const bool *cancel;   /* set: given up between blocks (-ECANCELED) */
	struct text_keep *keep; /* the index pass keeps its copy too (text_keep), while it can */
	struct cache_build *kdst; /* keep: the copy spilled to its cache entry (past TEXT_MEM_MAX) */
	size_t kcap;          /* keep: bytes allocated at keep->mem */
};

static int add_doc(struct builder *b, uint64_t offset, uint64_t len)
{
	struct text_shard *s = b->s;
	if (s->n_docs == UINT32_MAX - 1)
		return -E2BIG;
	if (b->count_only) {
		s->n_docs++;
		return 0;
	}
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

/*
 * The index pass's copy (text_keep): the bytes in memory while they fit in
 * TEXT_MEM_MAX, then moved to the cache entry keep->data_path and written
 * there. Any failure (no memory, no room under cache_max_bytes, the entry
 * there already) gives the copy up, never the index: the copy is then made
 * by the old path, when the shard is read (text_acquire).
 */
static void keep_drop(struct builder *b)
{
	free(b->keep->mem);
	b->keep->mem = NULL;
	b->kdst = cache_build_abort(b->kdst);
	b->keep = NULL;
}

static void keep_write(struct builder *b, const uint8_t *data, size_t n)
{
	struct text_keep *k = b->keep;
	char why[256];
	if (!b->kdst && b->pos + n <= TEXT_MEM_MAX) {
		if (b->pos + n > b->kcap) {
			size_t cap = (size_t)MIN(MAX(b->pos + n, (uint64_t)b->kcap * 2), (uint64_t)TEXT_MEM_MAX);
			uint8_t *m = realloc(k->mem, MAX(cap, (size_t)1));
			if (!m) {
				keep_drop(b);
				return;
			}
			k->mem = m;
			b->kcap = cap;
		}
		memcpy(k->mem + b->pos, data, n);
		return;
	}
	if (!b->kdst) {
		/* Larger than a memory copy: into the cache, as text_build_copy() would write it (what came so far first). */
		if (!k->data_path || !k->cache_dir ||
		    cache_build_begin(k->cache_dir, k->cache_max_bytes, k->data_path, SUMS_BLOCK_DEFAULT, &b->kdst, why,
				      sizeof(why)) < 0 ||
		    (b->pos && cache_build_write(b->kdst, k->mem, (size_t)b->pos, why, sizeof(why)) < 0)) {
			keep_drop(b);
			return;
		}
		free(k->mem);
		k->mem = NULL;
		b->kcap = 0;
	}
	if (cache_build_write(b->kdst, data, n, why, sizeof(why)) < 0)
		keep_drop(b);
}

/* Appends decompressed bytes to the copy in the cache and indexes them. */
static int emit(struct builder *b, struct cache_build *out, const uint8_t *data, size_t n, char *err, size_t errlen)
{
	if (!n)
		return 0;
	/* A count given up (its feed is freed): between output blocks too, a large compressed input block takes long. */
	if (b->count_only && b->cancel && __atomic_load_n(b->cancel, __ATOMIC_ACQUIRE))
		return -ECANCELED;
	/* No copy (out NULL): load only indexes; the copy is made when the shard is read (text_acquire). */
	int r = out ? cache_build_write(out, data, n, err, errlen) : 0;
	if (r == 0 && b->keep)
		keep_write(b, data, n);
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
	struct builder *b = ctx;
	if (b->cancel && __atomic_load_n(b->cancel, __ATOMIC_ACQUIRE))
		return -ECANCELED;
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
 * A test hook (tests/integration/test_text_counts.py): FEEDD_TEXT_SLOW_INDEX
 * = "PART:MS" makes every pass over a shard whose path holds PART take MS
 * milliseconds more, standing for a large or slow shard, so that tests see
 * which threads wait for it (issue #22: never the main loop). Unset: nothing.
 */
static void slow_index_hook(const char *path)
{
	const char *e = getenv("FEEDD_TEXT_SLOW_INDEX");
	const char *colon = e ? strrchr(e, ':') : NULL;
	if (!colon || colon == e)
		return;
	char part[256];
	snprintf(part, sizeof(part), "%.*s", (int)MIN((size_t)(colon - e), sizeof(part) - 1), e);
	long ms = strtol(colon + 1, NULL, 10);
	if (ms > 0 && strstr(path, part))
		nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 }, NULL);
}

/*
 * Indexes the shard; a compressed or Parquet one's copy is written to the
 * cache entry data_path (with its checksums, within cache_max_bytes).
 */
int text_build_index(struct text_shard *s, struct source *src, const struct text_open_opts *o, const char *data_path,
		     uint8_t *mem, uint64_t mem_cap, struct text_keep *keep, struct source_reader *io, char *err,
		     size_t errlen)
{
	struct builder b = { .s = s, .max_doc_bytes = o->max_doc_bytes, .line = 1, .mem = mem, .mem_cap = mem_cap,
			     .count_only = o->count_only, .cancel = o->cancel };
	slow_index_hook(s->path);
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
		if (keep && !dst && !mem && !o->count_only) {
			*keep = (struct text_keep){ .data_path = keep->data_path, .cache_dir = keep->cache_dir,
						    .cache_max_bytes = keep->cache_max_bytes };
			b.keep = keep;
		}
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
				 s->path, text_codec_name(s->codec), (uint64_t)s->id.size, b.line, s->n_docs);
			b.content = false;
		}
		if (r == 0)
			r = scan_end(&b);
		decoder_done(&d);
		if (b.keep && r < 0)
			keep_drop(&b);
		if (b.keep && b.kdst) {
			/* The copy written on the way: in place, as text_build_copy() would have left it. */
			char why[256];
			keep->file = cache_build_commit(TAKE_PTR(b.kdst), why, sizeof(why)) == 0;
		}
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

int text_count(const struct text_shard *s, struct source_reader *io, const bool *cancel, uint32_t *ret_docs,
	       uint64_t *ret_bytes, bool *ret_truncated, char *err, size_t errlen)
{
	if (s->kind == TEXT_PARQUET)
		return -EOPNOTSUPP;
	int r = source_check(s->path, &s->id, err, errlen);
	if (r < 0)
		return r;
	struct source *src = NULL;
	if ((r = source_open(s->path, &src, err, errlen)) < 0)
		return r;
	/* A shard of its own: nothing of s is touched (no lock, no index), so walks and workers never wait for it. */
	struct text_shard t = { .path = s->path, .kind = s->kind, .codec = s->codec, .id = s->id };
	const struct text_open_opts o = { .kind = s->kind, .max_doc_bytes = s->max_doc_bytes, .text_key = s->text_key,
					  .cancel = cancel, .count_only = true };
	r = text_build_index(&t, src, &o, NULL, NULL, 0, NULL, io, err, errlen);
	source_close(src);
	free(t.offsets);
	free(t.lines);
	free(t.lengths);
	if (r < 0)
		return r;
	*ret_docs = t.n_docs;
	*ret_bytes = t.bytes;
	*ret_truncated = t.truncated[0] != 0;
	return 0;
}
