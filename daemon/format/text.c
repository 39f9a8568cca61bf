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

#include "daemon/cache/cache.h"
#include "daemon/format/format.h"
#include "daemon/format/text-internal.h"
#include "daemon/format/text.h"
#include "daemon/io/sums.h"
#include "daemon/order/order.h"
#include "proto/macro.h"

#define INDEX_MAGIC "FDTXIDX2"

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

const char *text_codec_name(enum text_codec c)
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
		if (!s->cache_note && asprintf(&s->cache_note, "%s; rebuilt", why) < 0)
			s->cache_note = NULL;
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
static void unheld_forget(struct text_shard *s);

struct text_shard *text_free(struct text_shard *s)
{
	if (!s)
		return NULL;
	text_idle_forget(s);
	unheld_forget(s);
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
	free(s->maker_note);
	free(s->index_err);
	free(s->cache_note);
	pthread_mutex_destroy(&s->lock);
	free(s);
	return NULL;
}

static void source_closep(struct source **s)
{
	source_close(*s);
}

/*
 * The copy the index pass kept (text_keep), made the shard's: a memory copy
 * opened as text_build_mem() would open it; a file copy is in the cache, built
 * and so checked whole (verified), for text_acquire() to open and pin.
 */
static void keep_open(struct text_shard *s, struct text_keep *k, bool at_load)
{
	_cleanup_free_ uint8_t *mem = TAKE_PTR(k->mem);
	if (mem && s->mem) {
		struct source *data = NULL;
		char why[256];
		if (source_open_mem(s->path, TAKE_PTR(mem), (size_t)s->bytes, &data, why, sizeof(why)) < 0)
			return;
		__atomic_fetch_add(&s->copies_made, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&s->data, data, __ATOMIC_RELEASE);
		__atomic_store_n(&s->open_now, true, __ATOMIC_RELAXED);
		/* Made long before its read, maybe: the read checks the source first, as a copy made then would. */
		s->copy_unchecked = at_load;
	} else if (k->file && !s->mem) {
		__atomic_fetch_add(&s->copies_made, 1, __ATOMIC_RELAXED);
		s->verified = true;
	}
}

/*
 * Indexes s (s->lock held, or s not shared yet): its cached index if one
 * describes this very source, else a pass over it. src: the source opened
 * already (load), or NULL (deferred: opened now, after checking that it is
 * the file load saw). store_now: write an index built here to cache_dir at
 * once (deferred: this runs off the load path) rather than leave it pending.
 */
static int index_now(struct text_shard *s, struct source *src_in, struct source_reader *io, bool store_now,
		     bool keep_file, char *err, size_t errlen)
{
	int r;
	_cleanup_(source_closep) struct source *src = src_in;
	if (!src) {
		if ((r = source_check(s->path, &s->id, err, errlen)) < 0)
			return r;
		if ((r = source_open(s->path, &src, err, errlen)) < 0)
			return r;
	}
	const struct text_open_opts o = { .kind = s->kind, .cache_dir = s->cache_dir, .cache_max_bytes = s->cache_max_bytes,
					  .max_doc_bytes = s->max_doc_bytes, .text_key = s->text_key, .cancel = &s->cancel };
	if (s->idx_path && cache_load(s, s->idx_path, io, s->max_doc_bytes) == 1)
		s->cached = true;
	struct text_keep keep = { 0 };
	if (!s->cached) {
		/*
		 * At load a compressed shard is only indexed: its copy is made when
		 * it is read (text_acquire). When its window comes up (store_now:
		 * a walk waits for this index, and a read follows) the same pass
		 * keeps the copy too, so that the shard is decompressed once, not
		 * once for its index and again for its copy (text_keep): in memory
		 * (TEXT_MEM_MAX), or as a file when keep_file (not for the shards a
		 * feed's load counts: READY does not wait for a file; nor where the
		 * cache has one already). A Parquet column is
		 * decoded into its copy now, in the same pass; the cache may evict
		 * it until it is read.
		 */
		const bool compressed = s->kind != TEXT_PARQUET && s->codec != TEXT_CODEC_NONE;
		if (store_now && compressed && s->lazy && !s->data) {
			keep.cache_dir = s->cache_dir;
			keep.cache_max_bytes = s->cache_max_bytes;
			keep.data_path = !keep_file || access(s->data_path, F_OK) == 0 ? NULL : s->data_path;
		}
		if (compressed)
			__atomic_fetch_add(&s->decompressions, 1, __ATOMIC_RELAXED);
		r = text_build_index(s, src, &o, s->kind == TEXT_PARQUET ? s->data_path : NULL, NULL, 0,
				     keep.cache_dir ? &keep : NULL, io, err, errlen);
		if (r < 0)
			return r;
		/*
		 * A truncated stream is not cached: it says so again on every load.
		 * Nor is a small shard's index (TEXT_STORE_MIN).
		 */
		if (s->idx_path && s->defer_store && s->kind != TEXT_PARQUET && s->bytes < TEXT_STORE_MIN) {
			/* indexed again at the next start */
		} else if (s->idx_path && !s->truncated[0] && s->defer_store && s->kind != TEXT_PARQUET && !store_now) {
			/* Written after load, off the load path (the feed's scanner thread): a file per shard costs. */
			s->store_pending = true;
		} else if (s->idx_path && !s->truncated[0]) {
			r = cache_store(s, s->idx_path, &o, err, errlen);
			if (r < 0 && s->lazy && !store_now) {
				unlink(s->data_path);
				return r;
			}
			/* A plain shard still works with its index in memory only; so does a deferred one. */
		}
		s->verified = s->kind == TEXT_PARQUET;
	}
	if (s->lazy)
		s->mem = s->kind != TEXT_PARQUET && s->bytes <= TEXT_MEM_MAX;
	else if (!s->data) /* indexed again after its index was let go: the source stays the one open */
		__atomic_store_n(&s->data, TAKE_PTR(src), __ATOMIC_RELEASE);
	keep_open(s, &keep, !keep_file);
	__atomic_store_n(&s->indexed, true, __ATOMIC_RELEASE);
	if (s->data && s->lazy && !s->users)
		text_idle_add_locked(s); /* the copy kept: open for the read that comes, idle until then */
	return 0;
}

int text_open(const char *path, const struct text_open_opts *o, struct source_reader *io, struct text_shard **ret,
	      char *err, size_t errlen)
{
	int r;
	struct text_shard *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	s->kind = o->kind;
	s->codec = text_codec_of(path);
	s->path = strdup(path);
	s->text_key = strdup(o->text_key ? o->text_key : "text");
	s->defer_store = o->defer_store;
	s->max_doc_bytes = o->max_doc_bytes;
	if (!s->path || !s->text_key) {
		text_free(s);
		return -ENOMEM;
	}
	/* Deferred: the file's identity now (a stat), its text when its window comes up (text_index). */
	const bool defer = o->defer_index && !source_is_remote(path);
	_cleanup_(source_closep) struct source *src = NULL;
	if (defer) {
		r = source_identify(path, &s->id);
		if (r < 0)
			snprintf(err, errlen, "%s: %s", path, strerror(-r));
	} else {
		r = source_open(path, &src, err, errlen);
		if (r == 0)
			s->id = *source_identity(src);
	}
	if (r < 0) {
		text_free(s);
		return r;
	}

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
		s->cache_dir = strdup(o->cache_dir);
		if (!idx_path || (copy && !data_path) || !s->cache_dir) {
			text_free(s);
			return -ENOMEM;
		}
		s->cache_max_bytes = o->cache_max_bytes;
	} else if (copy) {
		snprintf(err, errlen, "%s: a %s shard is served from a decompressed copy, and there is no cache_dir to keep it in",
			 path, s->kind == TEXT_PARQUET ? "Parquet" : text_codec_name(s->codec));
		text_free(s);
		return -EINVAL;
	}
	s->idx_path = TAKE_PTR(idx_path);
	if (data_path) {
		s->lazy = true;
		s->data_path = TAKE_PTR(data_path);
	} else if (!(s->data_path = strdup(path))) {
		text_free(s);
		return -ENOMEM;
	}
	if (!defer && (r = index_now(s, TAKE_PTR(src), io, false, false, err, errlen)) < 0) {
		text_free(s);
		return r;
	}
	*ret = s;
	return 0;
}

/* ---- indexes let go when no walk holds them (issue #22) ---------------- */

static pthread_mutex_t unheld_lock = PTHREAD_MUTEX_INITIALIZER;
static struct text_shard *unheld_head, *unheld_tail;
static unsigned n_unheld;
static uint64_t unheld_bytes, n_in_memory;

static uint64_t index_bytes(const struct text_shard *s)
{
	return (uint64_t)s->n_docs * (8 + 4 + (s->lines ? 8 : 0));
}

/* unheld_lock held. */
static void unheld_unlink(struct text_shard *s)
{
	if (!s->unheld)
		return;
	if (s->uh_prev)
		s->uh_prev->uh_next = s->uh_next;
	else
		unheld_head = s->uh_next;
	if (s->uh_next)
		s->uh_next->uh_prev = s->uh_prev;
	else
		unheld_tail = s->uh_prev;
	s->uh_prev = s->uh_next = NULL;
	__atomic_store_n(&s->unheld, false, __ATOMIC_RELAXED);
	n_unheld--;
	unheld_bytes -= index_bytes(s);
}

/*
 * TEXT_UNHELD_MAX, or FEEDD_TEXT_UNHELD_MAX from the environment: tests set
 * it to a few shards so that indexes are let go and built again while
 * windows are walked, which the default bounds reach only at corpora of
 * tens of thousands of shards (tests/integration/test_lazy_text.py).
 */
static unsigned unheld_max(void)
{
	static unsigned max;
	if (!__atomic_load_n(&max, __ATOMIC_RELAXED)) {
		const char *e = getenv("FEEDD_TEXT_UNHELD_MAX");
		char *end;
		unsigned long v = e && *e ? strtoul(e, &end, 10) : 0;
		__atomic_store_n(&max, e && *e && !*end && v < TEXT_UNHELD_MAX ? (unsigned)v + 1 : TEXT_UNHELD_MAX + 1,
				 __ATOMIC_RELAXED);
	}
	return __atomic_load_n(&max, __ATOMIC_RELAXED) - 1;
}

/* unheld_lock held: lets go of the oldest unheld indexes past the bounds (their shards only try-locked). */
static void unheld_trim(void)
{
	const unsigned max = unheld_max();
	for (struct text_shard *v = unheld_head, *next; v && (n_unheld > max || unheld_bytes > TEXT_UNHELD_BYTES);
	     v = next) {
		next = v->uh_next;
		if (pthread_mutex_trylock(&v->lock) != 0)
			continue;
		unheld_unlink(v);
		/* Nobody reads it: no walk holds it, no read has it acquired, the copy maker is not on it. */
		if (!v->holds && !v->users && !v->making && v->indexed) {
			__atomic_store_n(&v->indexed, false, __ATOMIC_RELEASE);
			drop_index(v);
			v->cached = false;
			v->truncated[0] = 0;
			n_in_memory--;
		}
		pthread_mutex_unlock(&v->lock);
	}
}

void text_hold(struct text_shard *s, bool on)
{
	/*
	 * Under unheld_lock only, never s->lock: a worker holds s->lock while
	 * it indexes the shard or makes its copy (text_cache.c, acquire), I/O
	 * and decompression that the main loop, whose walks hold and let go of
	 * shards as they cross windows, must not wait for. holds and unheld
	 * change under unheld_lock, which unheld_trim() holds while it checks
	 * them (and try-locks s->lock for the rest). A shard being indexed
	 * while its last hold goes is not listed: its next hold lets it go.
	 */
	pthread_mutex_lock(&unheld_lock);
	if (on) {
		s->holds++;
		unheld_unlink(s);
	} else if (s->holds && --s->holds == 0 && !s->unheld && text_indexed(s)) {
		s->uh_prev = unheld_tail;
		s->uh_next = NULL;
		if (unheld_tail)
			unheld_tail->uh_next = s;
		else
			unheld_head = s;
		unheld_tail = s;
		__atomic_store_n(&s->unheld, true, __ATOMIC_RELAXED);
		n_unheld++;
		unheld_bytes += index_bytes(s);
		unheld_trim();
	}
	pthread_mutex_unlock(&unheld_lock);
}

uint64_t text_indexes_in_memory(void)
{
	pthread_mutex_lock(&unheld_lock);
	uint64_t n = n_in_memory;
	pthread_mutex_unlock(&unheld_lock);
	return n;
}

/* Before s is freed: off the unheld list. */
static void unheld_forget(struct text_shard *s)
{
	pthread_mutex_lock(&unheld_lock);
	unheld_unlink(s);
	if (s->indexed && s->defer_index_counted)
		n_in_memory--;
	pthread_mutex_unlock(&unheld_lock);
}

static __thread bool no_keep; /* text_index_keeps_files(false) on this thread */

bool text_index_keeps_files(bool on)
{
	bool was = !no_keep;
	no_keep = !on;
	return was;
}

int text_index(struct text_shard *s, struct source_reader *io, char *err, size_t errlen)
{
	/*
	 * Off the unheld list first, whatever happens: a shard asked for again
	 * (a window of it entered, or read ahead) is not let go until a walk
	 * that holds it lets it go.
	 */
	pthread_mutex_lock(&s->lock);
	int r = text_index_locked(s, io, err, errlen);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int text_index_locked(struct text_shard *s, struct source_reader *io, char *err, size_t errlen)
{
	/* s->unheld changes under unheld_lock (text_hold): a peek first, so that a read's acquire takes no global lock. */
	if (__atomic_load_n(&s->unheld, __ATOMIC_RELAXED)) {
		pthread_mutex_lock(&unheld_lock);
		unheld_unlink(s);
		pthread_mutex_unlock(&unheld_lock);
	}
	int r = 0;
	if (s->index_error < 0) {
		r = s->index_error;
		snprintf(err, errlen, "%s", s->index_err ? s->index_err : strerror(-r));
	} else if (!s->indexed) {
		struct source_reader *own = NULL;
		if (!io && (r = source_reader_new(IO_ENGINE_PREAD, 4, &own)) < 0)
			snprintf(err, errlen, "%s: cannot index: %s", s->path, strerror(-r));
		if (r == 0)
			r = index_now(s, NULL, io ? io : own, true, !no_keep, err, errlen);
		source_reader_free(own);
		if (r == 0) {
			pthread_mutex_lock(&unheld_lock);
			n_in_memory++;
			s->defer_index_counted = true;
			pthread_mutex_unlock(&unheld_lock);
		}
		if (r < 0) {
			drop_index(s);
			s->index_error = r;
			s->index_err = strdup(err); /* NULL: its errno is said again */
		}
	}
	return r;
}

int text_store_index(const struct text_shard *s, char *err, size_t errlen)
{
	const struct text_open_opts o = { .kind = s->kind, .cache_dir = s->cache_dir, .cache_max_bytes = s->cache_max_bytes,
					  .max_doc_bytes = s->max_doc_bytes, .text_key = s->text_key };
	return s->idx_path && s->store_pending ? cache_store(s, s->idx_path, &o, err, errlen) : 0;
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
	if (s->kind != TEXT_PARQUET && s->codec != TEXT_CODEC_NONE)
		__atomic_fetch_add(&s->decompressions, 1, __ATOMIC_RELAXED);
	r = text_build_index(&t, src, &o, mem ? NULL : s->data_path, mem, s->bytes, NULL, io, err, errlen);
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
