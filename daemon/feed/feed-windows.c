/* SPDX-License-Identifier: MIT */
/*
 * A feed's shuffled windows, built ahead on a thread of the feed's own and
 * shared by every walk (issue #22; docs/sample-order.md, "What is done
 * when"). A walk entering window w of epoch e gets the window from here
 * (order_params.windows) and asks for the one after it (prefetch), which the
 * builder thread shuffles while the rank still reads window w: the main
 * loop then only takes a pointer when it crosses into the next window. The
 * main loop never builds a window nor waits for one: a walk there
 * (feed_count_never_blocks) that finds its window not READY (the first
 * one a session reaches, at attach; one prefetch did not keep up with) is
 * told -EAGAIN, the window is queued for the builder and noted as wanted
 * (a per-thread set); its session has the set built on the pool
 * (session-window.c, feed_window_make: built there, or waited for there
 * while the builder builds it) and pinned until a walk took it
 * (feed_window_unpin), then walks on. A walk on any other thread (an
 * explanation's, tests') builds a window nobody built itself, as before.
 *
 * An entry lives while a walk holds it (refs) or while it waits, built
 * ahead, for its first walk. When its last walk leaves it, it is kept, most
 * recently used first, while the windows kept so hold at most KEEP_MAX
 * entries and KEEP_BYTES bytes: the V' virtual streams of a rank
 * (docs/sample-order.md, section 17) walk the same windows one after the
 * other, each taking a document or two from each window, and a window freed
 * by the walk that left it was shuffled again by the next (hundreds of
 * thousands of builds for a few hundred windows); a client that reattaches
 * where it left finds its window kept too. At most 2 entries wait unused,
 * or MAX_AHEAD while those built hold less than AHEAD_BYTES (one in steady
 * state for a rank's walk; seven for a walk that crosses windows fast, a
 * virtual stream with a few documents in each: stream.c; a prefetch of
 * the next window makes room by dropping the oldest built one no walk
 * took, and those older than every window walked now; one further ahead
 * only takes free room, never a nearer one's), so memory is bounded by
 * the windows walked now, plus two ahead (or 16 MiB of them), plus what is
 * kept: 4 bytes per document of each, 6 with the counts of stored tokens,
 * and a window has at most shuffle_list_max documents (a larger one is
 * permuted per use, never built here), plus the windows pinned for walks
 * that wait (at most FEED_WINDOW_WANTS per job, 4 times that per session).
 * get() and put() are called by walks (on the main loop, except an
 * explanation's or a test's); the builder thread and the pool's window
 * jobs build; feed_window_unpin() is the main loop's.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/feed/feed.h"
#include "proto/macro.h"

#define MAX_AHEAD 8
#define AHEAD_BYTES (UINT64_C(16) << 20) /* past 2 waiting, more only while those built hold less */
#define KEEP_MAX 1024                    /* windows no walk holds, kept for the next walk */
#define KEEP_BYTES (UINT64_C(8) << 20)   /* and their bytes */
#define HASH_SIZE 4096

/*
 * COUNTING: the builder counts (and indexes) the window's shards, which can
 * take long (a large or compressed text shard): a walk off the main loop
 * that needs the window meanwhile builds it itself, as if QUEUED; the
 * builder then leaves it. BUILDING: shuffling, bounded by the window's
 * documents: walks off the main loop and window jobs wait for it. The
 * main loop's walks wait for neither: they are told -EAGAIN (issue #22).
 */
enum entry_state { QUEUED, COUNTING, BUILDING, READY, FAILED };

struct entry {
	struct entry *next;
	struct entry *hnext; /* in fw->hash[hash_of(epoch, w)] */
	uint64_t last_get;   /* fw->gets when a walk last got it: kept ones leave least recent first */
	uint64_t epoch;
	uint32_t w;
	uint64_t k;     /* its start k_w, from the walk that asked (a window ahead is never counted from the epoch's start) */
	bool has_k;
	enum entry_state state;
	unsigned refs;
	bool used;      /* a walk got it once: freed when the last one leaves */
	bool want_counts; /* built on demand without counts: the builder computes them next */
	uint32_t *list; /* the window's shuffled positions */
	uint16_t *counts; /* stored tokens: their documents' token counts (ORDER_COUNT_UNKNOWN above 65534) */
	uint64_t n;
};

struct feed_windows {
	struct order_windows iface;
	struct feed *feed;
	const struct order_params *params;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	bool started, stop;
	struct entry *head;      /* newest first */
	struct entry *hash[HASH_SIZE]; /* the same entries by (epoch, window): find() in O(1) for thousands */
	uint64_t gets;
	uint64_t max_epoch;      /* the latest epoch a window was added for */
	unsigned n_kept;         /* entries walked once, no walk holds now */
	uint64_t kept_bytes;
	struct order_epoch ep; /* the builder's last epoch (builder thread only) */
	struct feed_windows_stats stats;
};

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct entry **bucket(struct feed_windows *fw, uint64_t epoch, uint32_t w)
{
	return &fw->hash[(w + epoch * 0x9e3779b1u) % HASH_SIZE];
}

static struct entry *find(struct feed_windows *fw, uint64_t epoch, uint32_t w)
{
	for (struct entry *e = *bucket(fw, epoch, w); e; e = e->hnext)
		if (e->epoch == epoch && e->w == w)
			return e;
	return NULL;
}

static void unlink_free(struct feed_windows *fw, struct entry *x);
static bool kept(const struct entry *e);

/*
 * The first window of a new epoch E (lock held): the kept windows of the
 * epochs before E - 1 and before every epoch a walk holds now go (walks go
 * forward), so that what is kept over many epochs of a small feed is about
 * two epochs' windows, not KEEP_BYTES.
 */
static void drop_old_epochs(struct feed_windows *fw, uint64_t epoch)
{
	uint64_t keep_from = epoch ? epoch - 1 : 0;
	for (struct entry *x = fw->head; x; x = x->next)
		if (x->refs)
			keep_from = MIN(keep_from, x->epoch);
	for (struct entry *x = fw->head, *next; x; x = next) {
		next = x->next;
		if (kept(x) && x->epoch < keep_from)
			unlink_free(fw, x);
	}
}

/* A new entry of (epoch, w), newest, in the list and the hash (lock held). */
static struct entry *add(struct feed_windows *fw, uint64_t epoch, uint32_t w, enum entry_state state)
{
	if (epoch > fw->max_epoch) {
		fw->max_epoch = epoch;
		drop_old_epochs(fw, epoch);
	}
	struct entry *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	struct entry **b = bucket(fw, epoch, w);
	*e = (struct entry){ .next = fw->head, .hnext = *b, .epoch = epoch, .w = w, .state = state };
	fw->head = e;
	*b = e;
	return e;
}

static bool kept(const struct entry *e)
{
	return e->used && !e->refs && e->state == READY;
}

static uint64_t entry_bytes(const struct entry *e)
{
	return e->n * (sizeof(*e->list) + (e->counts ? sizeof(*e->counts) : 0));
}

static void unlink_free(struct feed_windows *fw, struct entry *x)
{
	for (struct entry **pp = &fw->head; *pp; pp = &(*pp)->next)
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	for (struct entry **pp = bucket(fw, x->epoch, x->w); *pp; pp = &(*pp)->hnext)
		if (*pp == x) {
			*pp = x->hnext;
			break;
		}
	if (x->state == READY)
		fw->stats.bytes -= entry_bytes(x);
	if (kept(x)) {
		fw->n_kept--;
		fw->kept_bytes -= entry_bytes(x);
	}
	free(x->list);
	free(x->counts);
	free(x);
}

/*
 * For stored tokens, computes e's documents' token counts in shuffled
 * order, checking each document's index entries: the per-document work of
 * a window, done once for every rank and off the main loop (the builder
 * thread, or the pool's window job: issue #22; a window a thread that may
 * wait built on demand skips them: its walk counts each document when it
 * reaches it, until the builder has them). The index is read in its own
 * order, shard by shard, then the counts dealt in shuffled order: on a
 * cold page cache the kernel reads ahead instead of faulting a page per
 * document at random (2 more bytes per document, transiently). The lock is
 * not held. A damaged entry fails it: the window is then served without
 * counts, and its walks meet the fault themselves.
 */
static int build_counts(struct feed_windows *fw, const uint32_t *perm, struct entry *e, uint16_t **ret)
{
	const struct order_params *p = fw->params;
	_cleanup_free_ uint16_t *plain = malloc(MAX(e->n, 1u) * sizeof(*plain));
	_cleanup_free_ uint16_t *counts = malloc(MAX(e->n, 1u) * sizeof(*counts));
	if (!plain || !counts)
		return -ENOMEM;
	uint32_t lo = e->w * p->window, hi = (uint32_t)MIN((uint64_t)(e->w + 1) * p->window, (uint64_t)p->n_shards);
	char err[512];
	uint64_t pos = 0;
	for (uint32_t i = lo; i < hi; i++) {
		uint32_t nd = 0;
		order_shard_docs_known(p, perm[i], &nd); /* known: the window is */
		for (uint32_t d = 0; d < nd && pos < e->n; d++, pos++) {
			/* A feed being freed waits for its builder: let it stop early. */
			if (pos % 65536 == 0 && __atomic_load_n(&fw->stop, __ATOMIC_RELAXED))
				return -ECANCELED;
			uint64_t t;
			int r = feed_doc_tokens(fw->feed, ORDER_DOC(perm[i], d), &t, err, sizeof(err));
			if (r < 0)
				return r;
			plain[pos] = t < ORDER_COUNT_UNKNOWN ? (uint16_t)t : ORDER_COUNT_UNKNOWN;
		}
	}
	if (pos != e->n)
		return -EIO; /* the window's documents are not the shards' (cannot happen: both from shard_docs) */
	for (uint64_t m = 0; m < e->n; m++)
		counts[m] = plain[e->list[m]];
	*ret = TAKE_PTR(counts);
	return 0;
}

/*
 * A test hook (tests/integration/test_window_async.py): FEEDD_SLOW_WINDOW_BUILD_MS=N
 * makes every window build take N ms longer, wherever it runs, so that a
 * test sees what waits for a build and what does not.
 */
static void slow_build_hook(void)
{
	const char *v = getenv("FEEDD_SLOW_WINDOW_BUILD_MS");
	long ms = v ? strtol(v, NULL, 10) : 0;
	if (ms > 0)
		nanosleep(&(struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 }, NULL);
}

static int build(struct feed_windows *fw, const struct order_epoch *ep, struct entry *e, bool counts)
{
	slow_build_hook();
	int r = order_window_shuffle(fw->params, ep, e->w, &e->list, &e->n);
	if (r < 0 || !counts || fw->feed->kind != FEED_MEGATRON)
		return r;
	r = build_counts(fw, ep->perm, e, &e->counts);
	/*
	 * A damaged index entry: the window is served without counts, and
	 * its walks meet the fault themselves (stored_doc names it and fails
	 * the feed), as they did when a failed window was shuffled by each.
	 */
	return r == -ECANCELED || r == -ENOMEM ? r : 0;
}

/* Frees kept windows, least recently got first, until KEEP_MAX and KEEP_BYTES hold. Lock held. */
static void trim_kept(struct feed_windows *fw)
{
	while (fw->n_kept > KEEP_MAX || fw->kept_bytes > KEEP_BYTES) {
		struct entry *victim = NULL;
		for (struct entry *x = fw->head; x; x = x->next)
			if (kept(x) && (!victim || x->last_get < victim->last_get))
				victim = x;
		if (!victim)
			return;
		unlink_free(fw, victim);
	}
}

/* A walk (or the builder) takes e (lock held): a kept window is kept no more. */
static void hold(struct feed_windows *fw, struct entry *e)
{
	if (kept(e)) {
		fw->n_kept--;
		fw->kept_bytes -= entry_bytes(e);
	}
	e->refs++;
}

/* e's last walk left it (lock held): kept for the next walk (trim_kept), unless it has no list. */
static void release(struct feed_windows *fw, struct entry *e)
{
	if (e->state != READY || !e->used) {
		unlink_free(fw, e);
		return;
	}
	fw->n_kept++;
	fw->kept_bytes += entry_bytes(e);
	trim_kept(fw);
}

/*
 * The counts of a window built on demand, computed while its readers walk
 * it (they ask per document until the counts appear). The builder holds a
 * reference meanwhile; a fault leaves the window without counts (its walks
 * meet the fault themselves). Lock held on entry and exit.
 */
static void fill_counts(struct feed_windows *fw, struct entry *e)
{
	e->want_counts = false;
	hold(fw, e);
	pthread_mutex_unlock(&fw->lock);
	int r = 0;
	if (!fw->ep.perm || fw->ep.epoch != e->epoch)
		r = order_epoch_build(fw->params, e->epoch, &fw->ep);
	if (r == 0)
		r = order_epoch_window(fw->params, &fw->ep, e->w);
	uint16_t *counts = NULL;
	if (r == 0)
		r = build_counts(fw, fw->ep.perm, e, &counts);
	pthread_mutex_lock(&fw->lock);
	if (r == 0) {
		__atomic_store_n(&e->counts, counts, __ATOMIC_RELEASE);
		fw->stats.bytes += e->n * sizeof(*counts);
	}
	if (--e->refs == 0)
		release(fw, e);
}

/* Records a finished build (lock held). */
static void finish(struct feed_windows *fw, struct entry *e, int r, uint64_t t0)
{
	e->state = r < 0 ? FAILED : READY;
	if (r == 0) {
		fw->stats.bytes += entry_bytes(e);
		fw->stats.builds++;
		fw->stats.last_build_ns = mono_ns() - t0;
		fw->stats.docs_built += e->n;
	}
	pthread_cond_broadcast(&fw->cond);
}

static void *builder(void *userdata)
{
	struct feed_windows *fw = userdata;
	feed_off_main_thread();
	pthread_mutex_lock(&fw->lock);
	for (;;) {
		struct entry *e = NULL, *fill = NULL;
		for (struct entry *x = fw->head; x; x = x->next) {
			if (x->state == QUEUED && !e)
				e = x;
			if (x->state == READY && x->want_counts && !fill)
				fill = x;
		}
		if (fw->stop)
			break;
		if (fill) {
			/* The window being read first: its walks go faster with its counts. */
			fill_counts(fw, fill);
			continue;
		}
		if (!e) {
			pthread_cond_wait(&fw->cond, &fw->lock);
			continue;
		}
		e->state = COUNTING;
		hold(fw, e); /* a walk may take it over meanwhile, and let it go */
		pthread_mutex_unlock(&fw->lock);
		uint64_t t0 = mono_ns();
		int r = 0;
		if (!fw->ep.perm || fw->ep.epoch != e->epoch)
			r = order_epoch_build(fw->params, e->epoch, &fw->ep);
		/* Text: the window's shards indexed here, one window ahead of the walks (issue #22). */
		if (r == 0 && e->has_k && !order_epoch_has(&fw->ep, e->w))
			r = order_epoch_seed(&fw->ep, e->w, e->k);
		if (r == 0)
			r = order_epoch_window(fw->params, &fw->ep, e->w);
		pthread_mutex_lock(&fw->lock);
		e->refs--;
		if (e->state != COUNTING) {
			/* A walk built it itself meanwhile (its counts were known): it is the walk's now. */
			if (!e->refs && e->state != BUILDING)
				release(fw, e);
			continue;
		}
		e->state = BUILDING;
		if (r == 0) {
			pthread_mutex_unlock(&fw->lock);
			r = build(fw, &fw->ep, e, true);
			pthread_mutex_lock(&fw->lock);
		}
		if (r == -EOVERFLOW && !e->refs) {
			/* A window over shuffle_list_max: walks compute it per use, nothing to hold (section 3.1). */
			unlink_free(fw, e);
			pthread_cond_broadcast(&fw->cond);
			continue;
		}
		finish(fw, e, r, t0);
	}
	pthread_mutex_unlock(&fw->lock);
	return NULL;
}

/* Starts the builder thread if it is not running, and wakes it (lock held). Returns whether it runs. */
static bool start_builder(struct feed_windows *fw)
{
	if (!fw->started) {
		/* The daemon's signals stay with the main thread. */
		sigset_t all, old;
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		fw->started = pthread_create(&fw->thread, NULL, builder, fw) == 0;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (fw->started)
		pthread_cond_broadcast(&fw->cond);
	return fw->started;
}

/* ---- windows wanted by the main loop's walks (issue #22) ---------------- */

/*
 * A walk on a thread that must not block (feed_count_never_blocks: the
 * main loop's sessions) that finds its window not built is told -EAGAIN
 * and the window is noted here; the session hands the set to the pool
 * (session-window.c), which builds each one (feed_window_make) and pins
 * it until the walk took it.
 */
static __thread struct feed_window_want wanted[FEED_WINDOW_WANTS];
static __thread unsigned n_wanted;

static void want(struct feed *f, uint64_t epoch, uint32_t w, uint64_t k, uint64_t gets)
{
	for (unsigned i = 0; i < n_wanted; i++)
		if (wanted[i].feed == f && wanted[i].epoch == epoch && wanted[i].w == w)
			return;
	/* Full: this walk asks again when it is pumped next (the set's windows are built meanwhile). */
	if (n_wanted < FEED_WINDOW_WANTS)
		wanted[n_wanted++] = (struct feed_window_want){ .feed = f, .epoch = epoch, .w = w, .k = k, .gets = gets };
}

unsigned feed_windows_wanted(struct feed_window_want *ret, unsigned max)
{
	unsigned n = MIN(n_wanted, max);
	if (n)
		memcpy(ret, wanted, n * sizeof(*ret));
	n_wanted = 0;
	return n;
}

/*
 * The never-block side of get() (lock held): e (maybe NULL) is not READY.
 * Queued for the builder if nobody asked for it yet, so that it may be
 * built before the session's job even starts; noted as wanted.
 */
static int get_not_yet(struct feed_windows *fw, const struct order_epoch *ep, uint32_t w, struct entry *e)
{
	if (e && e->state == FAILED && !e->refs) {
		unlink_free(fw, e); /* built again by the job: it says why when it fails again */
		e = NULL;
	}
	if (!e && (e = add(fw, ep->epoch, w, QUEUED))) {
		e->k = ep->win_start[w];
		e->has_k = true;
		start_builder(fw); /* without a thread the job builds it */
	}
	fw->stats.not_ready++;
	want(fw->feed, ep->epoch, w, ep->win_start[w], fw->gets);
	return -EAGAIN;
}

static int windows_get(void *ctx, const struct order_epoch *ep, uint32_t w, const uint32_t **ret_list,
		       const uint16_t *const **ret_counts_ref, void **ret_handle)
{
	struct feed_windows *fw = ctx;
	pthread_mutex_lock(&fw->lock);
	struct entry *e = find(fw, ep->epoch, w);
	if ((!e || e->state != READY) && feed_count_never_blocks()) {
		/* The main loop neither builds a window nor waits for one (issue #22). */
		int r = get_not_yet(fw, ep, w, e);
		pthread_mutex_unlock(&fw->lock);
		return r;
	}
	if (!e || e->state == QUEUED || e->state == COUNTING) {
		/* Nobody built it yet: the asker does, and everyone shares it. */
		if (!e && !(e = add(fw, ep->epoch, w, QUEUED))) {
			pthread_mutex_unlock(&fw->lock);
			return -ENOMEM;
		}
		e->state = BUILDING;
		fw->stats.built_on_demand++;
		pthread_mutex_unlock(&fw->lock);
		uint64_t t0 = mono_ns();
		/* A reader waits for this one: its counts come later, from the builder (asked per document till then). */
		int r = build(fw, ep, e, false);
		pthread_mutex_lock(&fw->lock);
		finish(fw, e, r, t0);
		if (r == 0 && fw->feed->kind == FEED_MEGATRON) {
			e->want_counts = true;
			start_builder(fw);
		}
	} else if (e->state == READY && !e->used) {
		fw->stats.ready_ahead++;
	}
	while (e->state == BUILDING)
		pthread_cond_wait(&fw->cond, &fw->lock);
	if (e->state == FAILED) {
		if (!e->refs)
			unlink_free(fw, e);
		pthread_mutex_unlock(&fw->lock);
		return -EIO;
	}
	hold(fw, e);
	e->used = true;
	e->last_get = ++fw->gets;
	pthread_mutex_unlock(&fw->lock);
	*ret_handle = e;
	*ret_counts_ref = (const uint16_t *const *)&e->counts;
	*ret_list = e->list;
	return 0;
}

int feed_window_make(struct feed *f, const struct feed_window_want *want, struct feed_window_pin *ret, char *err,
		     size_t errlen)
{
	struct feed_windows *fw = f->windows;
	if (!fw) {
		snprintf(err, errlen, "feed %s builds no shared windows", f->name);
		return -ENOENT;
	}
	struct order_epoch ep = { 0 };
	int r = order_epoch_build(fw->params, want->epoch, &ep);
	if (r == 0 && want->w >= ep.n_windows)
		r = -ERANGE; /* not a window of this feed's: a want of no use */
	if (r < 0) {
		order_epoch_clear(&ep);
		snprintf(err, errlen, "feed %s: window %u of epoch %" PRIu64 ": %s", f->name, want->w, want->epoch,
			 strerror(-r));
		return r;
	}
	pthread_mutex_lock(&fw->lock);
	bool built = false;
again:;
	struct entry *e = find(fw, want->epoch, want->w);
	if (e && e->state == FAILED && !e->refs) {
		unlink_free(fw, e);
		e = NULL;
	}
	if (!e && !(e = add(fw, want->epoch, want->w, QUEUED))) {
		pthread_mutex_unlock(&fw->lock);
		order_epoch_clear(&ep);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	hold(fw, e); /* the pin: kept from eviction until the walk took it (feed_window_unpin) */
	if (e->state == QUEUED) {
		/* Nobody builds it yet: this worker does (the builder may be busy ahead of other walks). */
		built = true;
		e->state = BUILDING;
		fw->stats.built_on_demand++;
		pthread_mutex_unlock(&fw->lock);
		uint64_t t0 = mono_ns();
		/* The walk's k_w: nothing before the window is counted (text). */
		if (!order_epoch_has(&ep, want->w))
			r = order_epoch_seed(&ep, want->w, want->k);
		if (r == 0)
			r = order_epoch_window(fw->params, &ep, want->w);
		if (r == 0)
			r = build(fw, &ep, e, true);
		order_epoch_clear(&ep); /* not under the lock: the shared permutation has its own */
		pthread_mutex_lock(&fw->lock);
		finish(fw, e, r, t0);
	}
	/* The builder has it (counting its shards, or shuffling): wait here, on the pool, not on the main loop. */
	while (e->state == BUILDING || e->state == COUNTING)
		pthread_cond_wait(&fw->cond, &fw->lock);
	if (e->state != READY && !built && !__atomic_load_n(&fw->stop, __ATOMIC_RELAXED)) {
		/* The builder's attempt failed (its own epoch, its counting): this worker tries once itself. */
		if (--e->refs == 0)
			release(fw, e);
		built = true;
		pthread_mutex_unlock(&fw->lock);
		order_epoch_clear(&ep);
		r = order_epoch_build(fw->params, want->epoch, &ep);
		pthread_mutex_lock(&fw->lock);
		if (r == 0)
			goto again;
		e = NULL;
	}
	if (!e || e->state != READY) {
		if (e && --e->refs == 0)
			release(fw, e);
		pthread_mutex_unlock(&fw->lock);
		order_epoch_clear(&ep);
		r = r < 0 ? r : -EIO;
		snprintf(err, errlen, "feed %s: cannot shuffle window %u of epoch %" PRIu64 ": %s", f->name, want->w,
			 want->epoch, f->lazy_code ? f->lazy_err : strerror(-r));
		return r;
	}
	*ret = (struct feed_window_pin){ .entry = e, .gets = want->gets };
	pthread_mutex_unlock(&fw->lock);
	order_epoch_clear(&ep);
	return 0;
}

bool feed_window_unpin(struct feed *f, const struct feed_window_pin *pin, bool force)
{
	struct feed_windows *fw = f->windows;
	struct entry *e = pin->entry;
	pthread_mutex_lock(&fw->lock);
	/* Not taken by a walk since one was refused it: kept for the walk that waits for it. */
	bool drop = force || e->last_get > pin->gets;
	if (drop && --e->refs == 0)
		release(fw, e);
	pthread_mutex_unlock(&fw->lock);
	return drop;
}

static void windows_put(void *ctx, void *handle, bool keep)
{
	struct feed_windows *fw = ctx;
	struct entry *e = handle;
	pthread_mutex_lock(&fw->lock);
	(void)keep; /* every window is kept now (trim_kept), not only a detached client's last */
	if (--e->refs == 0)
		release(fw, e);
	pthread_mutex_unlock(&fw->lock);
}

static bool before(const struct entry *a, const struct entry *b)
{
	return a->epoch < b->epoch || (a->epoch == b->epoch && a->w < b->w);
}

/* A window built ahead (or failed) that no walk took and none holds: it may go. */
static bool evictable(const struct entry *x)
{
	return !x->used && !x->refs && (x->state == READY || x->state == FAILED);
}

/* Whether one more window may wait unused, past `waiting` holding `bytes`. */
static bool room_ahead(unsigned waiting, uint64_t bytes)
{
	return waiting < 2 || (waiting < MAX_AHEAD && bytes < AHEAD_BYTES);
}

/*
 * Makes room for a window ahead (lock held): the unused windows older than
 * every window a walk holds now are dropped (walks go forward: none takes
 * them), then, while no more may wait (room_ahead), the oldest built one (a
 * client that detached right after its prefetch leaves one behind each
 * time: kept, they would fill the room and stop prefetch for good). Never
 * one QUEUED or BUILDING. Returns whether there is room for one more.
 */
static bool make_room(struct feed_windows *fw, bool deep)
{
	const struct entry *oldest_held = NULL;
	for (struct entry *x = fw->head; x; x = x->next)
		if (x->refs && (!oldest_held || before(x, oldest_held)))
			oldest_held = x;
	for (struct entry *x = fw->head, *next; x && oldest_held; x = next) {
		next = x->next;
		if (evictable(x) && before(x, oldest_held))
			unlink_free(fw, x);
	}
	for (;;) {
		unsigned waiting = 0;
		uint64_t bytes = 0;
		struct entry *victim = NULL;
		for (struct entry *x = fw->head; x; x = x->next) {
			waiting += !x->used;
			bytes += !x->used && x->state == READY ? entry_bytes(x) : 0;
			if (evictable(x)) /* the list is newest first: the last one found is the oldest */
				victim = x;
		}
		/* A window asked for further ahead takes only free room: it would push out one needed sooner. */
		if (room_ahead(waiting, bytes) || !victim || deep)
			return room_ahead(waiting, bytes);
		fw->stats.evicted++;
		unlink_free(fw, victim);
	}
}

static void windows_prefetch(void *ctx, uint64_t epoch, uint32_t w, uint64_t k, bool deep)
{
	struct feed_windows *fw = ctx;
	pthread_mutex_lock(&fw->lock);
	struct entry *e = NULL;
	if (!find(fw, epoch, w) && make_room(fw, deep) && (e = add(fw, epoch, w, QUEUED))) {
		e->k = k;
		e->has_k = true;
		if (!start_builder(fw))
			unlink_free(fw, e); /* no thread: walks build their own */
	}
	pthread_mutex_unlock(&fw->lock);
}

int feed_windows_new(struct feed *f)
{
	struct feed_windows *fw = calloc(1, sizeof(*fw));
	if (!fw)
		return -ENOMEM;
	fw->feed = f;
	fw->params = &f->params;
	fw->iface = (struct order_windows){ .get = windows_get, .put = windows_put, .prefetch = windows_prefetch,
					    .ctx = fw };
	pthread_mutex_init(&fw->lock, NULL);
	pthread_cond_init(&fw->cond, NULL);
	f->windows = fw;
	f->params.windows = &fw->iface;
	return 0;
}

void feed_windows_free(struct feed *f)
{
	struct feed_windows *fw = f->windows;
	if (!fw)
		return;
	pthread_mutex_lock(&fw->lock);
	__atomic_store_n(&fw->stop, true, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&fw->cond);
	pthread_mutex_unlock(&fw->lock);
	if (fw->started)
		pthread_join(fw->thread, NULL);
	while (fw->head)
		unlink_free(fw, fw->head);
	order_epoch_clear(&fw->ep);
	pthread_mutex_destroy(&fw->lock);
	pthread_cond_destroy(&fw->cond);
	free(fw);
	f->windows = NULL;
	f->params.windows = NULL;
}

void feed_windows_stats(const struct feed *f, struct feed_windows_stats *ret)
{
	struct feed_windows *fw = f->windows;
	*ret = (struct feed_windows_stats){ 0 };
	if (!fw)
		return;
	pthread_mutex_lock(&fw->lock);
	*ret = fw->stats;
	for (struct entry *e = fw->head; e; e = e->next) {
		ret->held += e->state == READY && e->used && e->refs;
		ret->ahead += e->state == READY && !e->used;
		ret->building += e->state == BUILDING || e->state == QUEUED || e->state == COUNTING;
	}
	pthread_mutex_unlock(&fw->lock);
}
