/* SPDX-License-Identifier: MIT */
/*
 * A text shard's copy in cache_dir opened for serving (text.h,
 * text_open_copy): pinned while open (daemon/cache/cache.h), its checksum
 * trailer (daemon/io/sums.h) attached to the source, so that every block a
 * worker reads is checked, and the first time after load every block
 * checked once, so that a damaged copy is made again rather than served.
 *
 * Copies are opened on use (text_acquire, issue #22): by the worker that
 * reads a shard's documents, made from the source first when the cache has
 * none (never made, or evicted). A shard no read uses any more stays open
 * on the process's idle list, at most IDLE_MAX of them, most recently used
 * last, so that the shards of the windows being read are not reopened for
 * every chunk (IDLE_MAX counts file copies, which hold a pin; memory copies,
 * below, are bounded by their bytes only: a rank's 1,024 virtual streams
 * read a document or two of each of hundreds of small shards in turn, and
 * 64 of them in all had them made again and again); older ones are closed and unpinned, and so become the cache's
 * to evict (LRU under cache_max_bytes). A build that finds no room closes
 * every idle copy and tries once more.
 *
 * The walk of documents handed to the workers names the shards of the
 * windows it enters and a few after (format_prefetch, session-text.c):
 * text_prepare() queues them for the process's copy maker thread, which
 * makes their copies ahead of the workers and leaves them open on the idle
 * list. A small shard's copy (s->mem, TEXT_MEM_MAX) is a buffer in memory,
 * not a file in cache_dir (which costs milliseconds on a busy ext4): it has
 * no pin, and the idle list also keeps idle memory copies under
 * TEXT_MEM_IDLE_BYTES. A repair the maker makes (a damaged file copy made
 * again) is kept in the shard for the next reader to log.
 *
 * Locks: a shard's own lock, then the idle list's; a shard met on the idle
 * list is only ever try-locked, so the order never inverts.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/cache/cache.h"
#include "daemon/format/text-internal.h"
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
	struct source *data = NULL;
	int r = cache_pin(data_path, &s->pin);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot open its cache copy %s: %s", s->path, data_path, strerror(-r));
		return r;
	}
	r = source_open(data_path, &data, err, errlen);
	if (r == 0)
		source_set_cache_entry(data);
	if (r == 0)
		r = sums_load(cache_pin_fd(s->pin), source_size(data), false, data_path, &sums, err, errlen);
	if (r == -ENODATA)
		snprintf(err, errlen, "%s: no checksum trailer", data_path);
	if (r == 0 && sums->data_size != s->bytes) {
		snprintf(err, errlen, "%s: holds %" PRIu64 " bytes of text, its index %" PRIu64, data_path, sums->data_size,
			 s->bytes);
		r = -EBADMSG;
	}
	if (r == 0)
		r = source_set_sums(data, sums);
	if (r < 0) {
		sums_free(sums);
		source_close(data);
		return r == -ENODATA ? -EBADMSG : r;
	}
	if (verify_all) {
		r = check_all(io, data, s->bytes);
		if (r == -EUCLEAN)
			snprintf(err, errlen, "%s", source_reader_error(io));
		else if (r < 0)
			snprintf(err, errlen, "%s: cannot read: %s", data_path, strerror(-r));
		if (r < 0) {
			source_close(data);
			return r;
		}
	}
	/* Published whole: doc_read() loads it without the shard's lock (text_view.c). */
	__atomic_store_n(&s->data, data, __ATOMIC_RELEASE);
	return 0;
}

#define IDLE_MAX 64 /* open file copies no read uses, per process */

static pthread_mutex_t idle_lock = PTHREAD_MUTEX_INITIALIZER;
static struct text_shard *idle_head, *idle_tail;
static unsigned n_idle; /* idle file copies (memory copies: idle_mem_bytes) */
static uint64_t idle_mem_bytes; /* of the idle memory copies (TEXT_MEM_IDLE_BYTES) */

/* idle_lock held. */
static void idle_unlink(struct text_shard *s)
{
	if (!s->idle)
		return;
	if (s->idle_prev)
		s->idle_prev->idle_next = s->idle_next;
	else
		idle_head = s->idle_next;
	if (s->idle_next)
		s->idle_next->idle_prev = s->idle_prev;
	else
		idle_tail = s->idle_prev;
	s->idle_prev = s->idle_next = NULL;
	s->idle = false;
	if (s->mem)
		idle_mem_bytes -= s->bytes;
	else
		n_idle--;
}

/* s->lock held: closes the copy and lets the cache have it. */
static void copy_close(struct text_shard *s)
{
	struct source *data = s->data;
	if (!data)
		return;
	__atomic_store_n(&s->data, NULL, __ATOMIC_RELEASE);
	source_close(data);
	s->pin = cache_unpin(s->pin);
	__atomic_store_n(&s->open_now, false, __ATOMIC_RELAXED);
}

/*
 * idle_lock held: closes idle copies, oldest first, until at most keep file
 * copies and mem_bytes of memory copies are left (except: never).
 */
static void idle_trim(unsigned keep, uint64_t mem_bytes, const struct text_shard *except)
{
	for (struct text_shard *v = idle_head, *next; v && (n_idle > keep || idle_mem_bytes > mem_bytes); v = next) {
		next = v->idle_next;
		if (v == except || (v->mem ? idle_mem_bytes <= mem_bytes : n_idle <= keep) ||
		    pthread_mutex_trylock(&v->lock) != 0)
			continue;
		idle_unlink(v);
		if (!v->users)
			copy_close(v);
		pthread_mutex_unlock(&v->lock);
	}
}

void text_idle_flush(void)
{
	pthread_mutex_lock(&idle_lock);
	idle_trim(0, 0, NULL);
	pthread_mutex_unlock(&idle_lock);
}

static void maker_forget(struct text_shard *s);

void text_idle_forget(struct text_shard *s)
{
	maker_forget(s);
	pthread_mutex_lock(&idle_lock);
	idle_unlink(s);
	pthread_mutex_unlock(&idle_lock);
}

/* s->lock held: builds the copy, making room by closing idle copies when the cache has none. */
static int copy_build(struct text_shard *s, struct source_reader *io, char *err, size_t errlen)
{
	int r = text_build_copy(s, io, err, errlen);
	if (r == -ENOSPC) {
		text_idle_flush();
		r = text_build_copy(s, io, err, errlen);
	}
	if (r == 0)
		__atomic_fetch_add(&s->copies_made, 1, __ATOMIC_RELAXED);
	return r;
}

/* s->lock held: opens the copy, made first when missing, made again when damaged. */
static int copy_open(struct text_shard *s, struct source_reader *io, char *note, size_t notelen, char *err,
		     size_t errlen)
{
	char why[384];
	if (s->mem) {
		struct source *data = NULL;
		int r = text_build_mem(s, io, &data, err, errlen);
		if (r < 0)
			return r;
		__atomic_fetch_add(&s->copies_made, 1, __ATOMIC_RELAXED);
		__atomic_store_n(&s->data, data, __ATOMIC_RELEASE);
		__atomic_store_n(&s->open_now, true, __ATOMIC_RELAXED);
		return 0;
	}
	int r = text_open_copy(s, s->data_path, io, !s->verified, why, sizeof(why));
	if (r < 0) {
		s->pin = cache_unpin(s->pin);
		if (r != -ENOENT)
			snprintf(note, notelen, "%s; rebuilt", why);
		/*
		 * A build's entry is unlocked from its rename until this open
		 * pins it: another build's eviction can take it in between
		 * (everything older pinned, a tight cache_max_bytes). Made
		 * again then, a few times at most.
		 */
		for (unsigned attempt = 0;; attempt++) {
			if ((r = copy_build(s, io, err, errlen)) < 0)
				return r;
			r = text_open_copy(s, s->data_path, io, false, err, errlen);
			if (r == 0)
				break;
			s->pin = cache_unpin(s->pin);
			if (r != -ENOENT || attempt == 2)
				return r;
		}
	}
	s->verified = true;
	__atomic_store_n(&s->open_now, true, __ATOMIC_RELAXED);
	return 0;
}

/* maker: the copy maker's (a repair's note kept for the next reader to log). */
static int acquire(struct text_shard *s, struct source_reader *io, bool maker, char *note, size_t notelen, char *err,
		   size_t errlen)
{
	pthread_mutex_lock(&s->lock);
	char made[384] = "";
	/*
	 * Indexed under the same hold of the lock as users is counted: an index
	 * let go (text_hold) since is built again, and is not let go while used.
	 */
	int r = text_index_locked(s, io, err, errlen);
	if (r == 0 && !s->lazy) {
		s->users++;
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (r == 0 && s->data && s->copy_unchecked) {
		/* Kept by load's count (text_index_keeps_files): the source must still be the one load saw. */
		if ((r = text_check(s, err, errlen)) < 0) {
			pthread_mutex_lock(&idle_lock);
			idle_unlink(s);
			pthread_mutex_unlock(&idle_lock);
			copy_close(s);
		}
		s->copy_unchecked = false;
	}
	if (r == 0)
		r = s->data ? 0 : copy_open(s, io, maker ? made : note, maker ? sizeof(made) : notelen, err, errlen);
	if (maker && made[0] && !s->maker_note)
		s->maker_note = strdup(made); /* NULL: not said */
	if (r == 0 && !maker && s->maker_note) { /* what the copy maker repaired: for this reader to log */
		snprintf(note, notelen, "%s", s->maker_note);
		free(s->maker_note);
		s->maker_note = NULL;
	}
	if (r == 0) {
		s->users++;
		pthread_mutex_lock(&idle_lock);
		idle_unlink(s);
		pthread_mutex_unlock(&idle_lock);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

int text_acquire(struct text_shard *s, struct source_reader *io, char *note, size_t notelen, char *err,
		 size_t errlen)
{
	return acquire(s, io, false, note, notelen, err, errlen);
}

void text_release(struct text_shard *s)
{
	pthread_mutex_lock(&s->lock);
	if (!s->lazy) { /* a plain shard: only its index was held */
		s->users--;
		pthread_mutex_unlock(&s->lock);
		return;
	}
	if (--s->users == 0 && s->data)
		text_idle_add_locked(s);
	pthread_mutex_unlock(&s->lock);
}

void text_idle_add_locked(struct text_shard *s)
{
	pthread_mutex_lock(&idle_lock);
	if (!s->idle) {
		s->idle_prev = idle_tail;
		s->idle_next = NULL;
		if (idle_tail)
			idle_tail->idle_next = s;
		else
			idle_head = s;
		idle_tail = s;
		s->idle = true;
		if (s->mem)
			idle_mem_bytes += s->bytes;
		else
			n_idle++;
	}
	idle_trim(IDLE_MAX, TEXT_MEM_IDLE_BYTES, s);
	pthread_mutex_unlock(&idle_lock);
}

/* ---- the copy maker ---------------------------------------------------------- */

static pthread_mutex_t make_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t make_cond = PTHREAD_COND_INITIALIZER, made_cond = PTHREAD_COND_INITIALIZER;
static struct text_shard *make_head, *make_tail;
static bool maker_started;

static void *maker_main(void *unused)
{
	struct source_reader *io = NULL;
	if (source_reader_new(IO_ENGINE_PREAD, 4, &io) < 0)
		io = NULL;
	for (;;) {
		pthread_mutex_lock(&make_lock);
		while (!make_head)
			pthread_cond_wait(&make_cond, &make_lock);
		struct text_shard *s = make_head;
		make_head = s->make_next;
		if (!make_head)
			make_tail = NULL;
		s->make_next = NULL;
		s->make_queued = false;
		s->making = true;
		pthread_mutex_unlock(&make_lock);
		/* A deferred shard is indexed first (its window comes up); a failure stays in it for the walk to report. */
		char err[512];
		if (io && text_index(s, io, err, sizeof(err)) == 0 && s->lazy &&
		    acquire(s, io, true, NULL, 0, err, sizeof(err)) == 0)
			text_release(s);
		pthread_mutex_lock(&make_lock);
		s->making = false;
		pthread_cond_broadcast(&made_cond);
		pthread_mutex_unlock(&make_lock);
	}
	return NULL;
}

void text_prepare(struct text_shard *s)
{
	if ((!s->lazy && text_indexed(s)) || __atomic_load_n(&s->open_now, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&make_lock);
	if (!maker_started) {
		/* The daemon's signals stay with its main thread. */
		sigset_t all, old;
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		pthread_t t;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		maker_started = pthread_create(&t, &a, maker_main, NULL) == 0;
		pthread_attr_destroy(&a);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (maker_started && !s->make_queued && !s->making) {
		s->make_queued = true;
		if (make_tail)
			make_tail->make_next = s;
		else
			make_head = s;
		make_tail = s;
		pthread_cond_signal(&make_cond);
	}
	pthread_mutex_unlock(&make_lock);
}

/* Before s is freed: off the maker's queue, and not being made. */
static void maker_forget(struct text_shard *s)
{
	pthread_mutex_lock(&make_lock);
	if (s->make_queued) {
		struct text_shard **p = &make_head, *prev = NULL;
		while (*p && *p != s) {
			prev = *p;
			p = &(*p)->make_next;
		}
		if (*p) {
			*p = s->make_next;
			if (make_tail == s)
				make_tail = prev;
		}
		s->make_queued = false;
	}
	/* Not a whole build's wait on the main loop (a feed freed there): the build stops at its next block. */
	if (s->making)
		__atomic_store_n(&s->cancel, true, __ATOMIC_RELEASE);
	while (s->making)
		pthread_cond_wait(&made_cond, &make_lock);
	pthread_mutex_unlock(&make_lock);
}
