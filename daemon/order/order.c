/* SPDX-License-Identifier: MIT */
/*
 * Implementation of the contract's epoch order. Building an epoch is O(S);
 * building a window's document list is O(documents in the window), which is
 * what makes resuming from a cursor independent of how far into the epoch it is.
 */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/order/order.h"
#include "proto/macro.h"

/*
 * The contract's shuffle, with the random accesses of a large list
 * overlapped: step i's j depends only on the generator's counter, so the
 * j of the next SHUFFLE_AHEAD steps are drawn ahead (in the same order, so
 * the same values) and their entries prefetched, while the swaps stay in
 * order. The result is the plain Fisher-Yates's; a window of tens of
 * millions of documents shuffles several times faster than one cache miss
 * per step.
 */
#define SHUFFLE_AHEAD 16
#define SHUFFLE(type)                                                                        \
	do {                                                                                 \
		if (n < 2)                                                                   \
			return;                                                              \
		size_t ring[SHUFFLE_AHEAD], steps = n - 1, pre = MIN(steps, (size_t)SHUFFLE_AHEAD); \
		for (size_t k = 0; k < pre; k++) {                                           \
			ring[k] = (size_t)(order_rng_next(rng) % (uint64_t)(n - k));         \
			__builtin_prefetch(&a[ring[k]], 1);                                  \
		}                                                                            \
		for (size_t k = 0; k < steps; k++) {                                         \
			size_t i = n - 1 - k, j = ring[k % SHUFFLE_AHEAD];                   \
			if (k + pre < steps) {                                               \
				size_t j2 = (size_t)(order_rng_next(rng) % (uint64_t)(n - k - pre)); \
				ring[(k + pre) % SHUFFLE_AHEAD] = j2;                        \
				__builtin_prefetch(&a[j2], 1);                               \
			}                                                                    \
			type t = a[i];                                                       \
			a[i] = a[j];                                                         \
			a[j] = t;                                                            \
		}                                                                            \
	} while (0)

void order_shuffle_u32(uint32_t *a, size_t n, struct order_rng *rng)
{
	SHUFFLE(uint32_t);
}

void order_shuffle_u64(uint64_t *a, size_t n, struct order_rng *rng)
{
	SHUFFLE(uint64_t);
}

/*
 * Epoch permutations shared by every walk that holds one (issue #22): P
 * depends only on the seed, shuffle, S and e, and every rank's walk, every
 * virtual stream's (1,024 by default) and the window builder hold the
 * epoch they are in: one copy of 4 S bytes instead of one per walk (at
 * 30,000 shards, 120 MB and a shuffle of S per stream at attach). Freed
 * with its last holder.
 */
struct shared_perm {
	struct shared_perm *next;
	uint64_t seed, epoch;
	uint32_t n;
	bool shuffle;
	unsigned refs;
	uint32_t perm[];
};

static pthread_mutex_t perm_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared_perm *perms;

static struct shared_perm *perm_get(const struct order_params *p, uint64_t e, uint64_t key)
{
	pthread_mutex_lock(&perm_lock);
	for (struct shared_perm *x = perms; x; x = x->next)
		if (x->seed == p->seed && x->epoch == e && x->n == p->n_shards && x->shuffle == p->shuffle) {
			x->refs++;
			pthread_mutex_unlock(&perm_lock);
			return x;
		}
	pthread_mutex_unlock(&perm_lock);
	/* Built outside the lock (O(S)); a racing builder's copy is simply a second entry. */
	struct shared_perm *x = malloc(sizeof(*x) + MAX(p->n_shards, 1u) * sizeof(uint32_t));
	if (!x)
		return NULL;
	*x = (struct shared_perm){ .seed = p->seed, .epoch = e, .n = p->n_shards, .shuffle = p->shuffle, .refs = 1 };
	for (uint32_t s = 0; s < p->n_shards; s++)
		x->perm[s] = s;
	if (p->shuffle) {
		struct order_rng rng = order_rng_init(key);
		order_shuffle_u32(x->perm, p->n_shards, &rng);
	}
	pthread_mutex_lock(&perm_lock);
	x->next = perms;
	perms = x;
	pthread_mutex_unlock(&perm_lock);
	return x;
}

static void perm_put(struct shared_perm *x)
{
	pthread_mutex_lock(&perm_lock);
	if (--x->refs == 0) {
		for (struct shared_perm **pp = &perms; *pp; pp = &(*pp)->next)
			if (*pp == x) {
				*pp = x->next;
				break;
			}
		free(x);
	}
	pthread_mutex_unlock(&perm_lock);
}

/*
 * Window starts shared by every walk of a feed's epoch (issue #22): k_w is
 * a prefix sum of the counts over P, the same for every rank's walk, every
 * virtual stream's and the builder's, so they read one array of
 * n_windows + 1 entries instead of holding one each (60 MB for 1,024
 * streams at 30,000 shards and W = 4). Keyed by the feed's counts array
 * (shard_docs: one per feed, alive while a walk of it is), W, and P's key.
 * start[0 .. hi] are known and never written again: hi is published with
 * a release store after the entries, under starts_lock (a walk that finds
 * it behind writes the next entry; the counting itself is never under the
 * lock). Freed with its last holder.
 */
struct shared_starts {
	struct shared_starts *next;
	const uint32_t *docs;
	uint64_t seed, epoch;
	uint32_t n, window;
	bool shuffle;
	unsigned refs;
	uint32_t hi;
	uint64_t start[];
};

static pthread_mutex_t starts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared_starts *starts;

static struct shared_starts *starts_get(const struct order_params *p, uint64_t e, uint32_t n_windows)
{
	pthread_mutex_lock(&starts_lock);
	for (struct shared_starts *x = starts; x; x = x->next)
		if (x->docs == p->shard_docs && x->seed == p->seed && x->epoch == e && x->n == p->n_shards &&
		    x->window == p->window && x->shuffle == p->shuffle) {
			x->refs++;
			pthread_mutex_unlock(&starts_lock);
			return x;
		}
	struct shared_starts *x = malloc(sizeof(*x) + ((size_t)n_windows + 1) * sizeof(uint64_t));
	if (x) {
		*x = (struct shared_starts){ .next = starts, .docs = p->shard_docs, .seed = p->seed, .epoch = e,
					     .n = p->n_shards, .window = p->window, .shuffle = p->shuffle, .refs = 1 };
		x->start[0] = 0;
		starts = x;
	}
	pthread_mutex_unlock(&starts_lock);
	return x;
}

static void starts_put(struct shared_starts *x)
{
	pthread_mutex_lock(&starts_lock);
	if (--x->refs == 0) {
		for (struct shared_starts **pp = &starts; *pp; pp = &(*pp)->next)
			if (*pp == x) {
				*pp = x->next;
				break;
			}
		free(x);
	}
	pthread_mutex_unlock(&starts_lock);
}

/* How far the shared starts are known (acquire: the entries up to it are). */
static uint32_t starts_hi(const struct shared_starts *x)
{
	return __atomic_load_n(&x->hi, __ATOMIC_ACQUIRE);
}

/* Window w's end k, found by a walk that knew start[0 .. w]: published if nobody did meanwhile. */
static void starts_publish(struct shared_starts *x, uint32_t w, uint64_t k)
{
	pthread_mutex_lock(&starts_lock);
	if (x->hi == w) {
		x->start[w + 1] = k;
		__atomic_store_n(&x->hi, w + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&starts_lock);
}

void order_epoch_clear(struct order_epoch *ep)
{
	if (ep->perm_ref)
		perm_put(ep->perm_ref);
	if (ep->starts_ref)
		starts_put(ep->starts_ref);
	free(ep->own_start);
	*ep = (struct order_epoch){ 0 };
}

/* A walk with a copy of its own goes back to the shared starts (known from 0 to hi). */
static void use_shared(struct order_epoch *ep, uint32_t hi)
{
	struct shared_starts *x = ep->starts_ref;
	free(ep->own_start);
	ep->own_start = NULL;
	ep->win_start = x->start;
	ep->win_lo = 0;
	ep->win_hi = hi;
}

/*
 * The counts of window w's shards added to k (ask: by p->count). 0; 1: one
 * is not known (ask false); < 0: p->count's. -EAGAIN (p->count's "not on
 * this thread") only once every shard of the window was asked: a caller
 * that waits for the pool has them all counted in one round, not one shard
 * per round.
 */
static int window_end(const struct order_params *p, const struct order_epoch *ep, uint32_t w, bool ask, uint64_t *k)
{
	uint32_t end = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
	int wait = 0;
	for (uint32_t i = w * p->window; i < end; i++) {
		uint32_t n;
		if (!ask && !order_shard_docs_known(p, ep->perm[i], &n))
			return 1;
		int r = order_shard_docs(p, ep->perm[i], &n);
		if (r == -EAGAIN) {
			wait = r;
			continue;
		}
		if (r < 0)
			return r;
		*k += n;
	}
	return wait;
}

/*
 * Extends the shared starts with the counts known now (never asking
 * p->count), up to window `upto`, then lets a walk with a copy of its own
 * whose start they reach go back to them (its k_w checked: a cursor's that
 * does not match keeps its copy, as before it was checked).
 */
static void extend_shared_known(const struct order_params *p, struct order_epoch *ep, uint32_t upto)
{
	struct shared_starts *x = ep->starts_ref;
	if (!x)
		return;
	for (uint32_t hi = starts_hi(x); hi < MIN(upto, ep->n_windows); hi = starts_hi(x)) {
		uint64_t k = x->start[hi];
		if (window_end(p, ep, hi, false, &k) != 0)
			break;
		starts_publish(x, hi, k);
	}
	uint32_t hi = starts_hi(x);
	if (!ep->own_start || ep->win_lo > hi || x->start[ep->win_lo] != ep->own_start[ep->win_lo])
		return;
	/* Its k_w checked: what it found past the shared ones is theirs too. */
	for (uint32_t w = hi; w < ep->win_hi; w++)
		starts_publish(x, w, ep->own_start[w + 1]);
	use_shared(ep, starts_hi(x));
}

/* Extends ep's known starts past win_hi while the counts are known (ask: by p->count) up to window `upto`. */
static int extend(const struct order_params *p, struct order_epoch *ep, uint32_t upto, bool ask)
{
	struct shared_starts *x = ep->own_start ? NULL : ep->starts_ref;
	while (ep->win_hi < MIN(upto, ep->n_windows)) {
		uint32_t w = ep->win_hi;
		if (x) {
			/* Found by another walk meanwhile: taken as they are. */
			uint32_t hi = starts_hi(x);
			if (hi > w) {
				ep->win_hi = hi;
				continue;
			}
		}
		uint64_t k = ep->win_start[w];
		int r = window_end(p, ep, w, ask, &k);
		if (r == -EAGAIN) {
			/* The windows after it up to `upto` are asked for too (their starts need them all). */
			for (uint32_t v = w + 1; v < MIN(upto, ep->n_windows); v++) {
				uint64_t unused = 0;
				int e = window_end(p, ep, v, true, &unused);
				if (e < 0 && e != -EAGAIN)
					break; /* an error the walk meets when it gets there */
			}
		}
		if (r != 0)
			return MIN(r, 0);
		if (x)
			starts_publish(x, w, k);
		else
			ep->own_start[w + 1] = k;
		ep->win_hi = w + 1;
	}
	return 0;
}

int order_epoch_build(const struct order_params *p, uint64_t e, struct order_epoch *ep)
{
	uint32_t n_windows = (uint32_t)(((uint64_t)p->n_shards + p->window - 1) / p->window);
	uint64_t key = order_mix(p->seed ^ order_mix(e + 1));
	struct shared_perm *sp = perm_get(p, e, key);
	if (!sp)
		return -ENOMEM;
	struct shared_starts *ss = starts_get(p, e, n_windows);
	if (!ss) {
		perm_put(sp);
		return -ENOMEM;
	}

	order_epoch_clear(ep);
	*ep = (struct order_epoch){
		.epoch = e,
		.key = key,
		.n_windows = n_windows,
		.perm = sp->perm,
		.perm_ref = sp,
		.win_start = ss->start,
		.starts_ref = ss,
		.win_hi = starts_hi(ss),
	};
	/* As far as the counts are known: all of it for stored tokens. */
	return extend(p, ep, n_windows, false);
}

int order_epoch_window(const struct order_params *p, struct order_epoch *ep, uint32_t w)
{
	if (w >= ep->n_windows)
		return -EINVAL;
	/* A walk placed by a cursor goes back to the shared starts once they reach it (the counts known now). */
	if (ep->own_start)
		extend_shared_known(p, ep, ep->win_lo);
	if (!order_epoch_has(ep, w)) {
		if (w < ep->win_lo) /* before a seeded start: counted from the epoch's start (what a cursor's k_w spares) */
			use_shared(ep, starts_hi(ep->starts_ref));
		int r = extend(p, ep, w + 1, true);
		if (r < 0)
			return r;
	}
	/*
	 * The window's own shards made ready for reading (p->count: indexed
	 * again if its index was let go); on -EAGAIN, every one is asked.
	 */
	uint32_t end = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
	int wait = 0;
	for (uint32_t i = w * p->window; p->count && i < end; i++) {
		uint32_t n;
		int r = p->count(p->count_ctx, ep->perm[i], &n);
		if (r == -EAGAIN)
			wait = r;
		else if (r < 0)
			return r;
	}
	return wait;
}

int order_epoch_seed(struct order_epoch *ep, uint32_t w, uint64_t k)
{
	if (w >= ep->n_windows)
		return -EINVAL;
	if (ep->win_lo <= w && w <= ep->win_hi)
		return ep->win_start[w] == k ? 0 : -EINVAL;
	/* Not known: a copy of the walk's own, the known range window w alone, until the shared starts reach it. */
	if (!ep->own_start) {
		ep->own_start = malloc(((size_t)ep->n_windows + 1) * sizeof(*ep->own_start));
		if (!ep->own_start)
			return -ENOMEM;
	}
	ep->own_start[w] = k;
	ep->win_start = ep->own_start;
	ep->win_lo = ep->win_hi = w;
	return 0;
}

int order_epoch_check_seed(struct order_epoch *ep, uint64_t *ret_seeded, uint64_t *ret_k)
{
	const struct shared_starts *x = ep->starts_ref;
	if (!ep->own_start || !x || ep->win_lo > starts_hi(x))
		return 0;
	/* extend_shared_known (order_epoch_window) took the walk back to the shared starts when they matched. */
	*ret_seeded = ep->own_start[ep->win_lo];
	*ret_k = x->start[ep->win_lo];
	return -ERANGE;
}

void order_epoch_adopt_shared(struct order_epoch *ep)
{
	if (ep->own_start && ep->starts_ref)
		use_shared(ep, starts_hi(ep->starts_ref));
}

int order_window_rank_docs(const struct order_params *p, const struct order_epoch *ep, uint32_t w,
			   uint32_t rank, uint32_t world, uint64_t **ret_docs, size_t *ret_n,
			   uint64_t *ret_first_index, uint64_t *ret_window_docs)
{
	uint64_t k0 = ep->win_start[w];
	uint64_t n = ep->win_start[w + 1] - k0;
	/* First window index i with (k0 + i) mod world == rank. */
	uint64_t first = (rank + world - k0 % world) % world;
	size_t mine = first < n ? (size_t)((n - first + world - 1) / world) : 0;

	_cleanup_free_ uint64_t *docs = NULL;
	if (order_window_permuted(p, n)) {
		/* The bijection: each of the rank's positions computed on its own (section 3.1). */
		struct order_window win;
		int r = order_window_build(p, ep, w, rank, world, &win);
		if (r < 0)
			return r;
		docs = malloc(MAX(mine, 1u) * sizeof(*docs));
		if (!docs) {
			order_window_clear(&win);
			return -ENOMEM;
		}
		for (size_t m = 0; m < mine; m++)
			docs[m] = order_window_doc(&win, m);
		order_window_clear(&win);
	} else if (p->shuffle) {
		/* The whole window must be shuffled before it is dealt out. */
		_cleanup_free_ uint64_t *all = malloc(MAX(n, 1u) * sizeof(*all));
		if (!all)
			return -ENOMEM;
		size_t j = 0;
		uint32_t end = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
		for (uint32_t i = w * p->window; i < end; i++) {
			uint32_t s = ep->perm[i];
			uint32_t nd = 0;
			order_shard_docs_known(p, s, &nd); /* known: the window is (order_epoch_has) */
			for (uint32_t d = 0; d < nd; d++)
				all[j++] = ORDER_DOC(s, d);
		}
		struct order_rng rng = order_rng_init(order_mix(ep->key ^ order_mix((uint64_t)w + 1)));
		order_shuffle_u64(all, n, &rng);
		for (size_t m = 0; m < mine; m++)
			all[m] = all[first + m * world];
		docs = realloc(all, MAX(mine, 1u) * sizeof(*docs));
		if (!docs)
			return -ENOMEM;
		all = NULL;
	} else {
		/* Unshuffled: deal directly, without materialising the window. */
		docs = malloc(MAX(mine, 1u) * sizeof(*docs));
		if (!docs)
			return -ENOMEM;
		uint64_t i = 0, next = first;
		size_t m = 0;
		uint32_t end = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
		for (uint32_t pi = w * p->window; pi < end && m < mine; pi++) {
			uint32_t s = ep->perm[pi], nd = 0;
			order_shard_docs_known(p, s, &nd);
			while (next < i + nd && m < mine) {
				docs[m++] = ORDER_DOC(s, next - i);
				next += world;
			}
			i += nd;
		}
	}

	*ret_docs = TAKE_PTR(docs);
	*ret_n = mine;
	*ret_first_index = first;
	*ret_window_docs = n;
	return 0;
}

static void window_free(struct order_window *win, bool keep)
{
	if (win->handle)
		win->src->put(win->src->ctx, win->handle, keep);
	free(win->shard);
	free(win->start);
	free(win->list32);
	free(win->list64);
	*win = (struct order_window){ 0 };
}

void order_window_clear(struct order_window *win)
{
	window_free(win, true);
}

void order_window_leave(struct order_window *win)
{
	window_free(win, false);
}

int order_window_build(const struct order_params *p, const struct order_epoch *ep, uint32_t w, uint32_t rank,
		       uint32_t world, struct order_window *ret)
{
	assert(order_epoch_has(ep, w));
	struct order_window win = { .world = world };
	uint64_t k0 = ep->win_start[w];
	win.n = ep->win_start[w + 1] - k0;
	/* First window index i with (k0 + i) mod world == rank. */
	win.first = (rank + world - k0 % world) % world;
	win.mine = win.first < win.n ? (size_t)((win.n - win.first + world - 1) / world) : 0;
	if (win.mine == 0) {
		/*
		 * None of the window's documents is this rank's (a virtual
		 * stream of world 1,024 has none in most windows of a few
		 * hundred documents): no list to get, nothing to shuffle.
		 */
		*ret = win;
		return 0;
	}

	uint32_t lo = w * p->window, hi = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
	win.n_shards = hi - lo;
	win.shard = malloc(MAX(win.n_shards, 1u) * sizeof(*win.shard));
	win.start = malloc(((size_t)win.n_shards + 1) * sizeof(*win.start));
	if (!win.shard || !win.start)
		goto oom;
	uint64_t at = 0;
	for (uint32_t i = 0; i < win.n_shards; i++) {
		uint32_t nd = 0;
		win.shard[i] = ep->perm[lo + i];
		win.start[i] = at;
		order_shard_docs_known(p, win.shard[i], &nd); /* known: the window is (order_epoch_has) */
		at += nd;
	}
	win.start[win.n_shards] = at;

	if (order_window_permuted(p, win.n)) {
		/* Too large a window for a list: the bijection, evaluated per use (section 3.1). */
		win.permuted = true;
		order_perm_init(&win.perm, win.n, order_mix(ep->key ^ order_mix((uint64_t)w + 1)));
	} else if (p->shuffle) {
		/*
		 * The whole window must be shuffled before it is dealt out. The
		 * list of (shard, document) pairs in window order is the list of
		 * their positions 0 .. n-1, so shuffling the positions shuffles
		 * the pairs: the same draws, half the bytes of document ids.
		 */
		const struct order_windows *ws = p->windows;
		int r = ws && win.n > 0 && win.n <= UINT32_MAX ? ws->get(ws->ctx, ep, w, &win.shared, &win.counts_ref, &win.handle)
							       : -ENOENT;
		if (r == 0) {
			/* Built ahead and shared by every rank walking it: dealt by stride, nothing copied. */
			win.src = ws;
		} else if (r == -EAGAIN) {
			/*
			 * Not built yet, and this thread (the main loop) must not
			 * build it (issue #22): the walk stops here and enters the
			 * window again once it is built. Never our own shuffle here.
			 */
			order_window_clear(&win);
			return -EAGAIN;
		} else if (win.n <= UINT32_MAX) {
			uint32_t *all;
			uint64_t n;
			r = order_window_shuffle(p, ep, w, &all, &n);
			if (r < 0)
				goto oom;
			for (size_t m = 0; m < win.mine; m++)
				all[m] = all[win.first + m * world];
			win.list32 = realloc(all, MAX(win.mine, 1u) * sizeof(*all));
			if (!win.list32) {
				free(all);
				goto oom;
			}
		} else {
			struct order_rng rng = order_rng_init(order_mix(ep->key ^ order_mix((uint64_t)w + 1)));
			uint64_t *all = malloc(win.n * sizeof(*all));
			if (!all)
				goto oom;
			for (uint64_t i = 0; i < win.n; i++)
				all[i] = i;
			order_shuffle_u64(all, win.n, &rng);
			for (size_t m = 0; m < win.mine; m++)
				all[m] = all[win.first + m * world];
			win.list64 = realloc(all, MAX(win.mine, 1u) * sizeof(*all));
			if (!win.list64) {
				free(all);
				goto oom;
			}
		}
	}
	*ret = win;
	return 0;
oom:
	order_window_clear(&win);
	return -ENOMEM;
}

int order_window_shuffle(const struct order_params *p, const struct order_epoch *ep, uint32_t w, uint32_t **ret,
			 uint64_t *ret_n)
{
	/*
	 * The list of (shard, document) pairs in window order is the list of
	 * their positions 0 .. n-1, so shuffling the positions shuffles the
	 * pairs: the same draws, half the bytes of document ids.
	 */
	assert(order_epoch_has(ep, w));
	uint64_t n = ep->win_start[w + 1] - ep->win_start[w];
	if (order_window_permuted(p, n))
		return -EOVERFLOW;
	if (n > UINT32_MAX)
		return -E2BIG;
	uint32_t *all = malloc(MAX(n, 1u) * sizeof(*all));
	if (!all)
		return -ENOMEM;
	for (uint64_t i = 0; i < n; i++)
		all[i] = (uint32_t)i;
	struct order_rng rng = order_rng_init(order_mix(ep->key ^ order_mix((uint64_t)w + 1)));
	order_shuffle_u32(all, n, &rng);
	*ret = all;
	*ret_n = n;
	return 0;
}

uint64_t order_window_doc(const struct order_window *win, size_t m)
{
	uint64_t pos = win->permuted ? order_perm_at(&win->perm, win->first + (uint64_t)m * win->world)
		       : win->shared ? win->shared[win->first + (uint64_t)m * win->world]
		       : win->list32 ? win->list32[m] : win->list64 ? win->list64[m]
				     : win->first + (uint64_t)m * win->world;
	/* The last shard starting at or before pos (empty shards start where the next one does). */
	uint32_t lo = 0, hi = win->n_shards;
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (win->start[mid] <= pos)
			lo = mid;
		else
			hi = mid;
	}
	return ORDER_DOC(win->shard[lo], pos - win->start[lo]);
}

bool order_may_permute(const struct order_params *p)
{
	if (!p->shuffle || !p->list_max)
		return false;
	uint32_t k = (uint32_t)MIN((uint64_t)p->window, (uint64_t)p->n_shards);
	if (k == 0)
		return false;
	/* t: the k-th largest shard size, the largest t with at least k shards of t or more (no allocation). */
	uint64_t lo = 0, hi = UINT32_MAX;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo + 1) / 2;
		uint32_t at_least = 0;
		for (uint32_t s = 0; s < p->n_shards && at_least < k; s++)
			at_least += p->shard_docs[s] >= mid;
		if (at_least >= k)
			lo = mid;
		else
			hi = mid - 1;
	}
	/* The k largest: every size above t, and t for the rest. */
	uint64_t sum = 0;
	uint32_t above = 0;
	for (uint32_t s = 0; s < p->n_shards; s++)
		if (p->shard_docs[s] > lo) {
			sum += p->shard_docs[s];
			above++;
		}
	sum += (uint64_t)(k - above) * lo;
	return sum > p->list_max;
}
