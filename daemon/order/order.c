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

void order_epoch_clear(struct order_epoch *ep)
{
	if (ep->perm_ref)
		perm_put(ep->perm_ref);
	free(ep->win_start);
	*ep = (struct order_epoch){ 0 };
}

/* Extends ep's known starts past win_hi while the counts are known (ask: by p->count) up to window `upto`. */
static int extend(const struct order_params *p, struct order_epoch *ep, uint32_t upto, bool ask)
{
	while (ep->win_hi < MIN(upto, ep->n_windows)) {
		uint32_t w = ep->win_hi;
		uint64_t k = ep->win_start[w];
		uint32_t end = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
		for (uint32_t i = w * p->window; i < end; i++) {
			uint32_t n;
			if (!ask && !order_shard_docs_known(p, ep->perm[i], &n))
				return 0;
			int r = order_shard_docs(p, ep->perm[i], &n);
			if (r < 0)
				return r;
			k += n;
		}
		ep->win_start[w + 1] = k;
		ep->win_hi = w + 1;
	}
	return 0;
}

int order_epoch_build(const struct order_params *p, uint64_t e, struct order_epoch *ep)
{
	uint32_t n_windows = (uint32_t)(((uint64_t)p->n_shards + p->window - 1) / p->window);
	_cleanup_free_ uint64_t *win_start = malloc(((size_t)n_windows + 1) * sizeof(*win_start));
	if (!win_start)
		return -ENOMEM;
	uint64_t key = order_mix(p->seed ^ order_mix(e + 1));
	struct shared_perm *sp = perm_get(p, e, key);
	if (!sp)
		return -ENOMEM;
	win_start[0] = 0;

	order_epoch_clear(ep);
	*ep = (struct order_epoch){
		.epoch = e,
		.key = key,
		.n_windows = n_windows,
		.perm = sp->perm,
		.perm_ref = sp,
		.win_start = TAKE_PTR(win_start),
	};
	/* As far as the counts are known: all of it for stored tokens. */
	return extend(p, ep, n_windows, false);
}

int order_epoch_window(const struct order_params *p, struct order_epoch *ep, uint32_t w)
{
	if (w >= ep->n_windows)
		return -EINVAL;
	if (!order_epoch_has(ep, w)) {
		if (w < ep->win_lo) {
			/* Before a seeded start: counted from the epoch's start (what a cursor's k_w spares). */
			ep->win_lo = ep->win_hi = 0;
			ep->win_start[0] = 0;
		}
		int r = extend(p, ep, w + 1, true);
		if (r < 0)
			return r;
	}
	/* The window's own shards made ready for reading (p->count: indexed again if its index was let go). */
	uint32_t end = (uint32_t)MIN((uint64_t)(w + 1) * p->window, (uint64_t)p->n_shards);
	for (uint32_t i = w * p->window; p->count && i < end; i++) {
		uint32_t n;
		int r = p->count(p->count_ctx, ep->perm[i], &n);
		if (r < 0)
			return r;
	}
	return 0;
}

int order_epoch_seed(struct order_epoch *ep, uint32_t w, uint64_t k)
{
	if (w >= ep->n_windows)
		return -EINVAL;
	if (ep->win_lo <= w && w <= ep->win_hi)
		return ep->win_start[w] == k ? 0 : -EINVAL;
	ep->win_lo = ep->win_hi = w;
	ep->win_start[w] = k;
	ep->seed_w = w;
	ep->seed_at = 0;
	ep->seed_sum = 0;
	return 0;
}

int order_epoch_check_seed(const struct order_params *p, struct order_epoch *ep, uint64_t *ret_k)
{
	if (!ep->seed_w)
		return 0;
	if (ep->win_lo != ep->seed_w) {
		ep->seed_w = 0; /* counted from the epoch's start since (order_epoch_window): nothing seeded is left */
		return 0;
	}
	const uint32_t end = (uint32_t)MIN((uint64_t)ep->seed_w * p->window, (uint64_t)p->n_shards);
	for (uint32_t n; ep->seed_at < end && order_shard_docs_known(p, ep->perm[ep->seed_at], &n); ep->seed_at++)
		ep->seed_sum += n;
	if (ep->seed_at < end)
		return 0;
	if (ep->seed_sum != ep->win_start[ep->seed_w]) {
		*ret_k = ep->seed_sum;
		return -ERANGE;
	}
	ep->seed_w = 0;
	return 1;
}

void order_epoch_shift(struct order_epoch *ep, uint64_t delta)
{
	for (uint32_t w = ep->win_lo; w <= ep->win_hi && w <= ep->n_windows; w++)
		ep->win_start[w] += delta;
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
		if (ws && win.n > 0 && win.n <= UINT32_MAX &&
		    (win.shared = ws->get(ws->ctx, ep, w, &win.counts_ref, &win.handle))) {
			/* Built ahead and shared by every rank walking it: dealt by stride, nothing copied. */
			win.src = ws;
		} else if (win.n <= UINT32_MAX) {
			uint32_t *all;
			uint64_t n;
			int r = order_window_shuffle(p, ep, w, &all, &n);
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
