/* SPDX-License-Identifier: MIT */
/*
 * A text feed's per-shard counts kept in cache_dir (issue #22), so that a
 * later start knows every shard's N_s (and so the windows' starts k_w, the
 * totals in status, V') without reading a shard before its window comes
 * up. One small file per feed ("counts" files: creating one file per shard
 * was most of a cold load on ext4), named from a hash of the feed's shard
 * list and its indexing settings, little-endian:
 *
 *   struct counts_header
 *   struct counts_record[n]   one per shard counted, keyed by the hash of its
 *                             canonical path and its file identity (size,
 *                             mtime, inode, device, ctime): a shard rewritten
 *                             since is counted again
 *   u64 FNV-1a of everything before it
 *
 * A truncated shard is not recorded (it is indexed again, and its bad record
 * counted, at every start, as its index was never cached). The file is
 * written whole (a temporary file, then rename) when the feed is freed and
 * when its last shard is counted, and pinned (daemon/cache/cache.h) while
 * the feed lives, so the cache's eviction leaves it alone. A file that does
 * not check out is ignored: the shards are counted again.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/ioprio.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/cache/cache.h"
#include "daemon/feed/feed.h"
#include "daemon/format/text.h"
#include "daemon/log/log.h"
#include "proto/macro.h"

#define COUNTS_MAGIC "FDTXCNT1"

struct counts_header {
	char magic[8];
	uint64_t n;
	uint64_t settings; /* hash of format, text_key, max_document_bytes */
	uint64_t reserved;
};

struct counts_record {
	uint64_t path_hash;
	uint64_t size, mtime_ns, ino, dev, ctime_ns;
	uint64_t bytes;   /* of text */
	uint32_t n_docs;
	uint32_t flags;   /* 0 */
};
_Static_assert(sizeof(struct counts_record) == 64, "counts record layout");

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * UINT64_C(0x100000001b3);
	return h;
}

static uint64_t ns_of(struct timespec t)
{
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static struct counts_record record_of(const struct shard *s, const struct text_shard *t)
{
	const struct source_id *id = s->ids[0];
	return (struct counts_record){ .path_hash = fnv(UINT64_C(0xcbf29ce484222325), s->name, strlen(s->name)),
				       .size = id->size, .mtime_ns = ns_of(id->mtime), .ino = id->ino, .dev = id->dev,
				       .ctime_ns = ns_of(id->ctime), .bytes = t->bytes, .n_docs = t->n_docs };
}

static uint64_t settings_of(const struct feed *f)
{
	uint64_t h = fnv(UINT64_C(0xcbf29ce484222325), f->conf.format, strlen(f->conf.format) + 1);
	h = fnv(h, f->conf.text_key, strlen(f->conf.text_key) + 1);
	return fnv(h, &f->conf.max_document_bytes, sizeof(f->conf.max_document_bytes));
}

/* cache_dir/counts-HASH: the hash of every shard's path, in list order, and the settings. NULL: none (no memory). */
static char *counts_path(const struct feed *f)
{
	uint64_t h = settings_of(f);
	for (uint32_t i = 0; i < f->n_shards; i++)
		h = fnv(h, f->shards[i]->name, strlen(f->shards[i]->name) + 1);
	char *out;
	return asprintf(&out, "%s/counts-%016" PRIx64, f->conf.cache_dir, h) < 0 ? NULL : out;
}

static int record_cmp(const void *a, const void *b)
{
	const struct counts_record *x = a, *y = b;
	return x->path_hash < y->path_hash ? -1 : x->path_hash > y->path_hash;
}

int feed_counts_load(struct feed *f)
{
	if (f->kind != FEED_TEXT || !f->conf.cache_dir || f->n_sources)
		return 0;
	_cleanup_free_ char *path = counts_path(f);
	if (!path)
		return -ENOMEM;
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	off_t size = lseek(fd, 0, SEEK_END);
	struct counts_header h;
	if (size < (off_t)(sizeof(h) + 8) || (uint64_t)size > (UINT64_C(64) << 20))
		return 0;
	_cleanup_free_ uint8_t *buf = malloc((size_t)size);
	if (!buf)
		return -ENOMEM;
	if (pread(fd, buf, (size_t)size, 0) != size)
		return 0;
	uint64_t sum;
	memcpy(&sum, buf + size - 8, 8);
	memcpy(&h, buf, sizeof(h));
	if (memcmp(h.magic, COUNTS_MAGIC, 8) != 0 || h.settings != settings_of(f) ||
	    h.n != ((uint64_t)size - sizeof(h) - 8) / sizeof(struct counts_record) ||
	    (uint64_t)size != sizeof(h) + h.n * sizeof(struct counts_record) + 8 ||
	    fnv(UINT64_C(0xcbf29ce484222325), buf, (size_t)size - 8) != sum)
		return 0;
	struct counts_record *rec = (struct counts_record *)(buf + sizeof(h));
	qsort(rec, (size_t)h.n, sizeof(*rec), record_cmp);
	uint32_t found = 0;
	for (uint32_t i = 0; i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		if (!s->deferred || f->shard_docs[i] != ORDER_DOCS_UNKNOWN)
			continue;
		struct counts_record want = record_of(s, s->impl);
		struct counts_record *r = bsearch(&want, rec, (size_t)h.n, sizeof(*rec), record_cmp);
		if (!r || r->size != want.size || r->mtime_ns != want.mtime_ns || r->ino != want.ino || r->dev != want.dev ||
		    r->ctime_ns != want.ctime_ns || r->n_docs >= UINT32_MAX - 1)
			continue;
		f->shard_docs[i] = r->n_docs;
		((struct text_shard *)s->impl)->bytes = r->bytes; /* its index, when built, finds the same */
		f->n_docs += r->n_docs;
		f->n_nonempty += r->n_docs;
		f->n_bytes += r->bytes;
		f->n_indexed++;
		found++;
	}
	f->counts_loaded = found;
	f->counts_stored = f->n_indexed;
	if (cache_pin(path, &f->counts_pin) < 0)
		f->counts_pin = NULL;
	return (int)MIN(found, (uint32_t)INT32_MAX);
}

int feed_counts_store(struct feed *f)
{
	if (f->kind != FEED_TEXT || !f->conf.cache_dir || f->n_sources || f->state != FEED_READY)
		return 0;
	uint32_t n = __atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE);
	if (n == f->counts_stored)
		return 0;
	_cleanup_free_ char *path = counts_path(f), *tmp = NULL;
	if (!path || asprintf(&tmp, "%s.tmp-%010u%d", path, 0u, (int)getpid()) < 0)
		return -ENOMEM;
	struct counts_header h = { .settings = settings_of(f) };
	memcpy(h.magic, COUNTS_MAGIC, 8);
	size_t cap = sizeof(h) + (size_t)f->n_shards * sizeof(struct counts_record) + 8;
	_cleanup_free_ uint8_t *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	struct counts_record *rec = (struct counts_record *)(buf + sizeof(h));
	for (uint32_t i = 0; i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		uint32_t docs = __atomic_load_n(&f->shard_docs[i], __ATOMIC_ACQUIRE);
		const struct text_shard *t = s->impl;
		/* Counted here from its index (a truncated one is not kept), or read from the file at load. */
		if (docs == ORDER_DOCS_UNKNOWN || !s->deferred || (s->truncated && s->truncated[0]))
			continue;
		struct counts_record r = record_of(s, t);
		r.n_docs = docs;
		rec[h.n++] = r;
	}
	memcpy(buf, &h, sizeof(h));
	size_t len = sizeof(h) + (size_t)h.n * sizeof(struct counts_record);
	uint64_t sum = fnv(UINT64_C(0xcbf29ce484222325), buf, len);
	memcpy(buf + len, &sum, 8);
	len += 8;
	_cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	int r = write(fd, buf, len) == (ssize_t)len ? 0 : -EIO;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		return r;
	}
	f->counts_stored = n;
	if (!f->counts_pin && cache_pin(path, &f->counts_pin) < 0)
		f->counts_pin = NULL;
	return 0;
}

/* ---- the background count pass (issue #22) -------------------------------- */

struct feed_count_pass {
	struct feed *feed; /* not a reference: the feed joins the thread before it frees anything */
	pthread_t thread;
	bool stop;         /* atomic: the feed is being freed */
	bool running;      /* atomic */
	uint32_t counted;  /* atomic: shards this pass counted (the others were counted by walks, or read at load) */
};

static void *pass_main(void *userdata)
{
	struct feed_count_pass *cp = userdata;
	struct feed *f = cp->feed;
	/*
	 * Background work, behind everything that serves a batch: nice 19
	 * (this thread only: Linux applies it per thread) gives it about 1.5 %
	 * of a CPU the workers want (SCHED_IDLE, a fifth of that, could leave
	 * a daemon's stop waiting seconds for it to see the stop between
	 * blocks on a busy machine, and an unprivileged thread cannot leave
	 * it), and
	 * idle I/O priority keeps its streaming reads behind the workers'
	 * (where the I/O scheduler has no classes this changes nothing). One
	 * shard at a time, nothing of it kept: memory is one shard's read and
	 * decompression buffers (at most 16 MiB), whatever the corpus.
	 */
	(void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
	(void)syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0));
	struct source_reader *io = NULL;
	struct order_epoch ep = { 0 };
	if (source_reader_new(IO_ENGINE_PREAD, 1, &io) < 0 || order_epoch_build(&f->params, 0, &ep) < 0)
		goto out;
	/* Epoch 0's order: the windows the walks reach next are counted first. */
	for (uint32_t i = 0; i < f->n_shards && !__atomic_load_n(&cp->stop, __ATOMIC_RELAXED); i++) {
		uint32_t s = ep.perm[i];
		const struct shard *sh = f->shards[s];
		if (__atomic_load_n(&f->shard_docs[s], __ATOMIC_ACQUIRE) != ORDER_DOCS_UNKNOWN || !sh->deferred)
			continue;
		struct text_shard *t = sh->impl;
		uint32_t n;
		uint64_t bytes;
		bool truncated;
		char err[512];
		if (text_count(t, io, &cp->stop, &n, &bytes, &truncated, err, sizeof(err)) < 0 || truncated)
			continue; /* for its window's walk to meet (and fail or skip by the policy), as before */
		/* Its index, when built, finds the same bytes (the counts file records them, as at load). */
		if (!text_indexed(t))
			__atomic_store_n(&t->bytes, bytes, __ATOMIC_RELAXED);
		if (feed_count_record(f, s, n, bytes))
			__atomic_add_fetch(&cp->counted, 1, __ATOMIC_RELAXED);
	}
out:
	order_epoch_clear(&ep);
	source_reader_free(io);
	__atomic_store_n(&cp->running, false, __ATOMIC_RELEASE);
	return NULL;
}

int feed_count_pass_start(struct feed *f)
{
	if (f->kind != FEED_TEXT || f->n_sources || !f->conf.count_ahead ||
	    __atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE) == f->n_shards)
		return 0;
	struct feed_count_pass *cp = calloc(1, sizeof(*cp));
	if (!cp)
		return -ENOMEM;
	*cp = (struct feed_count_pass){ .feed = f, .running = true };
	/* The daemon's signals stay with the main thread. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int r = pthread_create(&cp->thread, NULL, pass_main, cp);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		free(cp);
		return -r;
	}
	f->count_pass = cp;
	return 0;
}

void feed_count_pass_free(struct feed *f)
{
	struct feed_count_pass *cp = f->count_pass;
	if (!cp)
		return;
	__atomic_store_n(&cp->stop, true, __ATOMIC_RELEASE);
	pthread_join(cp->thread, NULL);
	free(cp);
	f->count_pass = NULL;
}

uint32_t feed_count_pass_stats(const struct feed *f, bool *ret_running)
{
	const struct feed_count_pass *cp = f->count_pass;
	*ret_running = cp && __atomic_load_n(&cp->running, __ATOMIC_ACQUIRE);
	return cp ? __atomic_load_n(&cp->counted, __ATOMIC_RELAXED) : 0;
}
