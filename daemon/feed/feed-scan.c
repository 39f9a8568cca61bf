/* SPDX-License-Identifier: MIT */
/*
 * A stored-token feed's index work that is proportional to the corpus, kept
 * off the load path and off the main loop (issue #22):
 *
 *   - at open, a format validates whole only the shards that fit the feed's
 *     scan budget (FEED_SCAN_AT_LOAD index entries: milliseconds); the
 *     others are mapped and their header checked, nothing more;
 *   - a scanner thread then validates those in one streaming pass each
 *     (format->scan: no copy, the mapping is read in place) and counts
 *     their tokens and non-empty documents; feed_scan_poll() (main thread,
 *     from feed_check, once a second) folds the counts into the feed, or
 *     fails the feed with the first fault;
 *   - meanwhile every document is still checked before it is used
 *     (format_doc_tokens, through feed_doc_tokens), and the attach check
 *     "at least `world` non-empty documents" asks only as far as it needs
 *     (feed_nonempty_at_least).
 *
 * A text feed's scanner writes the line indexes that load built to
 * cache_dir (format->store, for shards with store_pending): a file per
 * shard, which at thousands of shards was most of the load's time (issue
 * #22). An index that cannot be written is only not cached: logged, never
 * fatal.
 */
#include <errno.h>
#include <inttypes.h>
#include <linux/ioprio.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "daemon/feed/feed.h"
#include "daemon/format/text.h"
#include "daemon/source/source.h"
#include "daemon/log/log.h"
#include "proto/macro.h"

struct feed_scan {
	pthread_t thread;
	bool started;
	struct shard **shards; /* the feed's, immutable while the thread runs */
	uint32_t n_shards;

	/* the thread's results, published by the release store of done */
	int stop, done;
	uint64_t tokens, bytes, nonempty;
	uint32_t shards_done; /* relaxed: progress for status */
	int error;
	char err[512];
	uint32_t store_failed; /* text indexes not written to cache_dir, the last one's reason in store_err */
	char store_err[512];
	bool folded; /* main thread: the results are in the feed */

	/* main thread: how far feed_nonempty_at_least() looked */
	uint32_t at_shard, at_doc;
	uint64_t found;
};

static void *scan_main(void *userdata)
{
	struct feed_scan *sc = userdata;
	/*
	 * Background work: at idle I/O priority its streaming reads never queue
	 * ahead of a client's (a cold shuffled first batch waits on random
	 * .idx pages). Where the scheduler has no classes this changes nothing.
	 */
	(void)syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_IDLE, 0));
	for (uint32_t i = 0; i < sc->n_shards; i++) {
		if (__atomic_load_n(&sc->stop, __ATOMIC_RELAXED))
			break;
		const struct shard *s = sc->shards[i];
		if (s->store_pending && s->format->store) {
			char err[512];
			if (s->format->store(s, err, sizeof(err)) < 0) {
				sc->store_failed++;
				memcpy(sc->store_err, err, sizeof(err));
			}
			__atomic_store_n(&sc->shards_done, i + 1, __ATOMIC_RELAXED);
			continue;
		}
		if (s->counted || !s->format->scan)
			continue;
		uint64_t tokens;
		uint32_t nonempty;
		int r = s->format->scan(s, &sc->stop, &tokens, &nonempty, sc->err, sizeof(sc->err));
		if (r < 0) {
			sc->error = r;
			break;
		}
		sc->tokens += tokens;
		sc->bytes += tokens * s->itemsize;
		sc->nonempty += nonempty;
		__atomic_store_n(&sc->shards_done, i + 1, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&sc->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

int feed_scan_start(struct feed *f)
{
	bool pending = false;
	for (uint32_t i = 0; i < f->n_shards && !pending; i++)
		pending = (!f->shards[i]->counted && f->shards[i]->format->scan) || f->shards[i]->store_pending;
	if (!pending)
		return 0;
	struct feed_scan *sc = calloc(1, sizeof(*sc));
	if (!sc)
		return -ENOMEM;
	sc->shards = f->shards;
	sc->n_shards = f->n_shards;
	/* The daemon's signals stay with the main thread. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int r = pthread_create(&sc->thread, NULL, scan_main, sc);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r != 0) {
		free(sc);
		return -r;
	}
	sc->started = true;
	f->scan = sc;
	return 0;
}

void feed_scan_poll(struct feed *f)
{
	int lazy = __atomic_load_n(&f->lazy_code, __ATOMIC_ACQUIRE);
	if (lazy < 0 && f->state == FEED_READY) {
		/* A shard indexed off the main loop failed (read-ahead): its window fails with it. */
		feed_fail(f, lazy, f->lazy_err);
		return;
	}
	/* Text: every shard counted once (epoch 0 walked): the counts kept for the next start, once. */
	if (f->kind == FEED_TEXT && f->counts_stored != f->n_shards &&
	    __atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE) == f->n_shards && feed_counts_store(f) < 0)
		f->counts_stored = f->n_shards; /* not again every second; feed_unref() tries once more */
	struct feed_scan *sc = f->scan;
	if (!sc || sc->folded || !__atomic_load_n(&sc->done, __ATOMIC_ACQUIRE))
		return;
	sc->folded = true;
	if (sc->started)
		pthread_join(sc->thread, NULL);
	sc->started = false;
	if (sc->error < 0) {
		/* A file changed under the scan (-ESTALE: truncated, rewritten) withdraws what was read from it. */
		feed_fail(f, sc->error == -ESTALE ? -ESTALE : -EBADMSG, sc->err);
		return;
	}
	if (sc->store_failed)
		log_warning("feed %s: %" PRIu32 " text indexes not kept in cache_dir (they are built again at the next load); the last: %s",
			    f->name, sc->store_failed, sc->store_err);
	if (f->kind == FEED_TEXT)
		return;
	f->n_tokens += sc->tokens;
	f->n_bytes += sc->bytes;
	f->n_nonempty += sc->nonempty;
	log_info("feed %s: index validated: %" PRIu64 " documents, %" PRIu64 " tokens", f->name, f->n_docs, f->n_tokens);
}

int feed_scan_fold(struct feed *f)
{
	for (uint32_t i = 0; i < f->n_sources && f->state == FEED_READY; i++)
		if (feed_scan_fold(f->sources[i]) < 0) {
			char err[512];
			snprintf(err, sizeof(err), "source %s: %.400s", f->conf.mix->names[i], f->sources[i]->error);
			feed_fail(f, f->sources[i]->error_code, err);
		}
	if (f->state == FEED_READY)
		feed_scan_poll(f);
	return f->state == FEED_READY ? 0 : f->error_code;
}

/*
 * Waits for the scanner thread to finish, reporting progress to the calling
 * thread's hook (source_set_progress: the loader's) each time a shard is
 * done, so that a reload waiting for a long, healthy scan is told from a
 * stuck one by load_timeout_s (per shard: one shard's scan must fit in it).
 */
static void wait_reporting(const struct feed_scan *sc)
{
	uint32_t seen = UINT32_MAX;
	while (!__atomic_load_n(&sc->done, __ATOMIC_ACQUIRE)) {
		uint32_t at = __atomic_load_n(&sc->shards_done, __ATOMIC_RELAXED);
		if (at != seen && at < sc->n_shards) {
			seen = at;
			source_progress(sc->shards[at]->name);
		}
		nanosleep(&(struct timespec){ .tv_nsec = 20000000 }, NULL);
	}
}

/* A mixture fails with its first failed source. Returns 0, or the feed's error code once FAILED. */
static int sources_failed(struct feed *f)
{
	for (uint32_t i = 0; i < f->n_sources && f->state == FEED_READY; i++)
		if (f->sources[i]->state != FEED_READY) {
			char err[512];
			snprintf(err, sizeof(err), "source %s: %.400s", f->conf.mix->names[i], f->sources[i]->error);
			feed_fail(f, f->sources[i]->error_code, err);
		}
	return f->state == FEED_READY ? 0 : f->error_code;
}

int feed_scan_wait(struct feed *f)
{
	for (uint32_t i = 0; i < f->n_sources; i++)
		feed_scan_wait(f->sources[i]);
	if (f->scan && !f->scan->folded) {
		if (f->scan->started) {
			wait_reporting(f->scan);
			pthread_join(f->scan->thread, NULL);
		}
		f->scan->started = false;
		__atomic_store_n(&f->scan->done, 1, __ATOMIC_RELEASE);
		feed_scan_poll(f);
	}
	return sources_failed(f);
}

bool feed_scan_pending(const struct feed *f)
{
	return f->scan && !f->scan->folded;
}

uint32_t feed_scan_shards_left(const struct feed *f)
{
	const struct feed_scan *sc = f->scan;
	if (!sc || sc->folded)
		return 0;
	uint32_t pending = 0;
	for (uint32_t i = __atomic_load_n(&sc->shards_done, __ATOMIC_RELAXED); i < sc->n_shards; i++)
		pending += (!sc->shards[i]->counted && sc->shards[i]->format->scan) || sc->shards[i]->store_pending;
	return pending;
}

static void text_copies(const struct feed *f, uint64_t *open, uint64_t *made, uint64_t *decompressions)
{
	/* A mixture's n_shards counts its sources' shards; it holds none itself. */
	for (uint32_t i = 0; f->shards && !f->n_sources && i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		if (s->lazy) {
			const struct text_shard *t = s->impl;
			*open += __atomic_load_n(&t->open_now, __ATOMIC_RELAXED);
			*made += __atomic_load_n(&t->copies_made, __ATOMIC_RELAXED);
			*decompressions += __atomic_load_n(&t->decompressions, __ATOMIC_RELAXED);
		}
	}
	for (uint32_t i = 0; i < f->n_sources; i++)
		text_copies(f->sources[i], open, made, decompressions);
}

uint64_t feed_text_cached(const struct feed *f, uint64_t *ret_in_memory)
{
	uint64_t n = 0, mem = 0;
	for (uint32_t i = 0; f->shards && !f->n_sources && i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		const struct text_shard *t = s->impl;
		/* relaxed: for status (cached is set before indexed is published) */
		bool in = s->deferred && text_indexed(t);
		n += in && __atomic_load_n(&t->cached, __ATOMIC_RELAXED);
		mem += in;
	}
	if (ret_in_memory)
		*ret_in_memory = mem;
	return n;
}

void feed_text_copies(const struct feed *f, uint64_t *ret_open, uint64_t *ret_made, uint64_t *ret_decompressions)
{
	*ret_open = *ret_made = *ret_decompressions = 0;
	text_copies(f, ret_open, ret_made, ret_decompressions);
}

void feed_scan_free(struct feed *f)
{
	struct feed_scan *sc = f->scan;
	if (!sc)
		return;
	if (sc->started) {
		__atomic_store_n(&sc->stop, 1, __ATOMIC_RELAXED);
		pthread_join(sc->thread, NULL);
	}
	free(sc);
	f->scan = NULL;
}

int feed_doc_tokens(struct feed *f, uint64_t doc, uint64_t *ret, char *err, size_t errlen)
{
	return format_doc_tokens(f->shards[ORDER_DOC_SHARD(doc)], ORDER_DOC_INDEX(doc), ret, err, errlen);
}

int feed_nonempty_at_least(struct feed *f, uint64_t want)
{
	feed_scan_poll(f);
	if (f->state != FEED_READY)
		return f->error_code < 0 ? f->error_code : -EIO;
	struct feed_scan *sc = f->scan;
	if (f->kind == FEED_TEXT)
		return feed_count_until(f, want);
	if (!sc || sc->folded || f->kind != FEED_MEGATRON)
		return f->n_nonempty >= want;
	/* The shards counted at open, then as far into the others as the question needs (usually `want` documents). */
	char err[512];
	while (f->n_nonempty + sc->found < want && sc->at_shard < f->n_shards) {
		const struct shard *s = f->shards[sc->at_shard];
		if (s->counted || sc->at_doc >= s->n_docs) {
			sc->at_shard++;
			sc->at_doc = 0;
			continue;
		}
		uint64_t t;
		int r = format_doc_tokens(s, sc->at_doc, &t, err, sizeof(err));
		if (r < 0) {
			feed_fail(f, r, err);
			return r;
		}
		sc->found += t > 0;
		sc->at_doc++;
	}
	return f->n_nonempty + sc->found >= want;
}

/* ---- text shards counted when their window comes up (issue #22) ---------- */

static __thread bool off_main;
static pthread_mutex_t lazy_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * The main loop's walks never count (issue #22): while never_block is set,
 * a shard whose count or index is missing is added to `wanted` and the walk
 * told -EAGAIN; its session has them counted on the pool
 * (session-count.c) and comes back. A set, not one shard: a window (or a
 * resume's streams, up to 1,024 of them) asks for all it misses at once, so
 * that one round trip to the pool counts them all.
 */
static __thread bool never_block;
static __thread struct feed_wanted wanted[FEED_WANTED_MAX];
static __thread size_t n_wanted;
/*
 * Where each is in `slots` (open addressing, 1 + its index in `wanted`; 0:
 * free): a walk asks for the same shards many times (a state's 1,024
 * streams, each asking for every window before its own when it carries no
 * <kw>), each an O(1) look-up, not a scan of the set.
 */
#define WANTED_SLOTS (4 * FEED_WANTED_MAX)
static __thread uint16_t slots[WANTED_SLOTS];
static __thread uint16_t slot_of[FEED_WANTED_MAX];

void feed_off_main_thread(void)
{
	off_main = true;
}

bool feed_count_never_block(bool on)
{
	bool was = never_block;
	never_block = on;
	return was;
}

/* Adds shard i of f to the wanted set, once; when the set is full it is asked for at the next round. */
static void want(struct feed *f, uint32_t i)
{
	if (n_wanted == FEED_WANTED_MAX)
		return;
	uint64_t h = ((uint64_t)(uintptr_t)f >> 4) * UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)i * UINT64_C(0xff51afd7ed558ccd);
	for (uint32_t at = (uint32_t)(h >> 40) % WANTED_SLOTS;; at = (at + 1) % WANTED_SLOTS) {
		if (!slots[at]) {
			slots[at] = (uint16_t)(n_wanted + 1);
			slot_of[n_wanted] = (uint16_t)at;
			wanted[n_wanted++] = (struct feed_wanted){ .feed = f, .shard = i };
			return;
		}
		const struct feed_wanted *w = &wanted[slots[at] - 1];
		if (w->feed == f && w->shard == i)
			return;
	}
}

size_t feed_count_wanted(struct feed_wanted *ret, size_t max)
{
	size_t n = MIN(n_wanted, max);
	if (n)
		memcpy(ret, wanted, n * sizeof(*ret));
	for (size_t k = 0; k < n_wanted; k++)
		slots[slot_of[k]] = 0;
	n_wanted = 0;
	return n;
}

/* A shard could not be counted: the feed fails now (main thread, load) or at the next poll. */
static int count_failed(struct feed *f, int r, const char *err)
{
	if (r != -ENOMEM && r != -ESTALE)
		r = -EBADMSG;
	if (!off_main) {
		feed_fail(f, r, err);
		return r;
	}
	pthread_mutex_lock(&lazy_lock);
	if (!f->lazy_code) {
		snprintf(f->lazy_err, sizeof(f->lazy_err), "%s", err);
		__atomic_store_n(&f->lazy_code, r, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&lazy_lock);
	return r;
}

bool feed_shard_readable(struct feed *f, uint32_t i)
{
	const struct shard *s = f->shards[i];
	if (!s->deferred || text_indexed(s->impl))
		return true;
	uint32_t n;
	if (!never_block) /* a thread that may wait: indexed here */
		return feed_count_shard(f, i, &n) == 0;
	want(f, i);
	return false;
}

bool feed_count_record(struct feed *f, uint32_t i, uint32_t n, uint64_t bytes)
{
	uint32_t unknown = ORDER_DOCS_UNKNOWN;
	if (!__atomic_compare_exchange_n(&f->shard_docs[i], &unknown, n, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return false;
	/* The first to count it adds it to the feed's totals (of the shards counted so far). */
	__atomic_add_fetch(&f->n_docs, n, __ATOMIC_RELAXED);
	__atomic_add_fetch(&f->n_nonempty, n, __ATOMIC_RELAXED);
	__atomic_add_fetch(&f->n_bytes, bytes, __ATOMIC_RELAXED);
	__atomic_add_fetch(&f->n_indexed, 1, __ATOMIC_RELEASE);
	return true;
}

int feed_count_shard(void *ctx, uint32_t i, uint32_t *ret)
{
	struct feed *f = ctx;
	const struct shard *s = f->shards[i];
	uint32_t n = __atomic_load_n(&f->shard_docs[i], __ATOMIC_ACQUIRE);
	char err[512];
	if (never_block && n == ORDER_DOCS_UNKNOWN) {
		/* Not on this thread: the caller waits for the pool to count it (never the shard's lock here). */
		want(f, i);
		return -EAGAIN;
	}
	if (never_block) {
		/*
		 * Counted: the walk goes on. Its line index, if let go, is built
		 * again by whoever reads first: a worker (format_acquire), or the
		 * pool for the main loop's walk that sizes documents from it
		 * (feed_shard_readable). A stream's walk must not wait here: it
		 * needs no index, and a walk stopped after its plan took a document
		 * would name no place for a cursor.
		 */
		*ret = n;
		return 0;
	}
	if (n != ORDER_DOCS_UNKNOWN) {
		/*
		 * Counted (maybe by the background count, or from cache_dir's record):
		 * its index made ready. Indexed already: nothing to wait for (the
		 * shard's lock is held by a worker making its copy, seconds for a
		 * large compressed shard, and the main loop enters windows here).
		 */
		int r = !s->deferred || text_indexed(s->impl) ? 0 : s->format->index(s, NULL, &n, err, sizeof(err));
		if (r < 0)
			return count_failed(f, r, err);
		*ret = __atomic_load_n(&f->shard_docs[i], __ATOMIC_ACQUIRE);
		return 0;
	}
	int r = s->format->index ? s->format->index(s, NULL, &n, err, sizeof(err)) : -EINVAL;
	if (r == -EINVAL && !s->format->index)
		snprintf(err, sizeof(err), "%s: not counted at load", s->name);
	if (r == 0 && s->truncated && s->truncated[0] && !f->conf.skip_bad_records) {
		/* The cut line is a bad record: the policy decides, as at load. */
		snprintf(err, sizeof(err), "%s (on_bad_record = fail)", s->truncated);
		r = -EBADMSG;
	}
	if (r < 0)
		return count_failed(f, r, err);
	const struct text_shard *t = s->impl;
	if (feed_count_record(f, i, n, __atomic_load_n(&t->bytes, __ATOMIC_RELAXED))) {
		if (s->truncated && s->truncated[0]) {
			/* on_bad_record = skip: counted once, as load did; the poll logs it. */
			pthread_mutex_lock(&lazy_lock);
			__atomic_add_fetch(&f->counters.bad_records, 1, __ATOMIC_RELAXED);
			snprintf(f->counters.last_bad, sizeof(f->counters.last_bad), "%s", s->truncated);
			pthread_mutex_unlock(&lazy_lock);
		}
	}
	*ret = n;
	return 0;
}

void feed_hold_shard(void *ctx, uint32_t i, bool on)
{
	struct feed *f = ctx;
	const struct shard *s = f->shards[i];
	if (s->deferred)
		text_hold(s->impl, on);
}

int feed_docs_known_at_least(struct feed *f, uint64_t want)
{
	if (f->state != FEED_READY)
		return f->error_code < 0 ? f->error_code : -EIO;
	if (f->kind != FEED_TEXT)
		return feed_nonempty_at_least(f, want);
	if (__atomic_load_n(&f->n_docs, __ATOMIC_RELAXED) >= want)
		return 1;
	return __atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE) == f->n_shards ? 0 : -EAGAIN;
}

int feed_count_until(struct feed *f, uint64_t want)
{
	if (f->state != FEED_READY)
		return f->error_code < 0 ? f->error_code : -EIO;
	if (f->kind != FEED_TEXT || __atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE) == f->n_shards)
		return __atomic_load_n(&f->n_docs, __ATOMIC_RELAXED) >= want;
	/* Epoch 0's order: the shards its first windows need anyway. */
	struct order_epoch ep = { 0 };
	int r = order_epoch_build(&f->params, 0, &ep);
	for (uint32_t i = 0; r == 0 && i < f->n_shards && __atomic_load_n(&f->n_docs, __ATOMIC_RELAXED) < want; i++) {
		uint32_t n;
		r = feed_count_shard(f, ep.perm[i], &n);
	}
	order_epoch_clear(&ep);
	if (r < 0)
		return r;
	return __atomic_load_n(&f->n_docs, __ATOMIC_RELAXED) >= want;
}

bool feed_count_never_blocks(void)
{
	return never_block;
}
