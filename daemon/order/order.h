/* SPDX-License-Identifier: MIT */
/*
 * The sample-order contract (docs/sample-order.md): which documents an epoch
 * visits, in what order, and which rank owns each. Pure functions of the
 * feed's shard list, seed, shuffle flag and shuffle window; no I/O.
 *
 * Documents are named by packed 64-bit ids: shard << 32 | document.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/order/permute.h"
#include "daemon/order/rng.h"

#define ORDER_DOC(s, d) (((uint64_t)(s) << 32) | (uint64_t)(d))
#define ORDER_DOC_SHARD(id) ((uint32_t)((id) >> 32))
#define ORDER_DOC_INDEX(id) ((uint32_t)(id))

/* The contract's shuffle (Fisher-Yates from the top, j = below(i + 1)). */
void order_shuffle_u32(uint32_t *a, size_t n, struct order_rng *rng);
void order_shuffle_u64(uint64_t *a, size_t n, struct order_rng *rng);

struct order_windows;

/*
 * A shard whose document count is not known yet (a text shard not indexed
 * yet, issue #22): order_params.count finds it when the order needs it.
 */
#define ORDER_DOCS_UNKNOWN UINT32_MAX

/* What the order depends on. shard_docs[s] = documents in shard s. */
struct order_params {
	uint64_t seed;
	bool shuffle;
	uint32_t window; /* shards per shuffle window, >= 1 */
	uint32_t n_shards;
	/*
	 * Read with atomic loads: with count set, an entry may be
	 * ORDER_DOCS_UNKNOWN until count() (any thread) has stored it.
	 */
	const uint32_t *shard_docs;
	/*
	 * NULL: every count is in shard_docs. Else called for a shard whose
	 * entry is ORDER_DOCS_UNKNOWN, when the order reaches the first window
	 * that needs it (that window, or one after it): finds the count
	 * (indexes the shard, blocking), stores it in shard_docs and returns
	 * it. Also called for every shard of a window a walk enters
	 * (order_epoch_window), known or not, so that the shard is ready to
	 * be read. 0 or a negative errno (the caller's walk fails with it).
	 */
	int (*count)(void *ctx, uint32_t shard, uint32_t *ret);
	void *count_ctx;
	/*
	 * NULL, or told (count_ctx) when a walk enters (on) and leaves a window
	 * of shard `shard`, so that what the shard holds for reading (a text
	 * shard's line index) lives while some walk is in one of its windows.
	 */
	void (*hold)(void *ctx, uint32_t shard, bool on);
	const struct order_windows *windows; /* where walks get shuffled windows (shared, built ahead); NULL: build their own */
	uint64_t list_max; /* shuffle: a window of more documents is permuted by the bijection (section 3.1); 0: never */
};

/* Whether a shuffled window of n documents is permuted by the bijection instead of Fisher-Yates. */
static inline bool order_window_permuted(const struct order_params *p, uint64_t n)
{
	return p->shuffle && p->list_max && n > p->list_max;
}

/*
 * Whether some window of some epoch can be permuted by the bijection: the
 * W shards with the most documents together hold more than list_max.
 * O(32 S), no allocation.
 */
bool order_may_permute(const struct order_params *p);

/* Shard s's document count when known, without asking p->count: true and *ret. */
static inline bool order_shard_docs_known(const struct order_params *p, uint32_t s, uint32_t *ret)
{
	uint32_t n = __atomic_load_n(&p->shard_docs[s], __ATOMIC_ACQUIRE);
	if (n == ORDER_DOCS_UNKNOWN && p->count)
		return false;
	*ret = n;
	return true;
}

/* Shard s's document count, found by p->count when unknown (blocking). 0 or a negative errno. */
static inline int order_shard_docs(const struct order_params *p, uint32_t s, uint32_t *ret)
{
	if (order_shard_docs_known(p, s, ret))
		return 0;
	return p->count(p->count_ctx, s, ret);
}

/*
 * One epoch's shard permutation and where each window starts in the epoch's
 * order. With counts not known yet (order_params.count) the starts are
 * known only over a range of windows: k_w is a prefix sum of the counts of
 * the shards before window w (section 3), so window w's start needs every
 * earlier shard counted, or k_w given (order_epoch_seed: a cursor's).
 */
struct order_epoch {
	uint64_t epoch;
	uint64_t key;        /* K = mix(seed ^ mix(e + 1)) */
	uint32_t n_windows;
	const uint32_t *perm; /* n_shards entries: P (shared by every epoch of the same order, read only) */
	void *perm_ref;       /* the shared copy's hold, given back by order_epoch_clear */
	/*
	 * n_windows + 1 entries: k of each window's first document, valid for
	 * win_lo .. win_hi (read only outside order.c). Counted from the
	 * epoch's start (win_lo = 0) they are the same for every walk of the
	 * feed's epoch, so they are one array shared by all of them
	 * (starts_ref, order.c; 8 bytes per window instead of that per walk,
	 * issue #22); a walk placed by a cursor's k_w (order_epoch_seed) holds
	 * a copy of its own until the shared starts reach its window.
	 */
	const uint64_t *win_start;
	uint64_t *own_start; /* the walk's own copy (win_start points to it), or NULL */
	void *starts_ref;    /* the shared starts' hold, given back by order_epoch_clear */
	uint32_t win_lo, win_hi;
};

/*
 * Fills *ep for epoch e (freeing what it held), the windows' starts as far
 * as the counts are known (never asking p->count). Returns 0 or -ENOMEM.
 */
int order_epoch_build(const struct order_params *p, uint64_t e, struct order_epoch *ep);
void order_epoch_clear(struct order_epoch *ep);

/* Whether window w's start and end (win_start[w], win_start[w + 1]) are known. */
static inline bool order_epoch_has(const struct order_epoch *ep, uint32_t w)
{
	return w < ep->n_windows && ep->win_lo <= w && w + 1 <= ep->win_hi;
}

/*
 * Makes window w's start and end known, counting (p->count) the shards of
 * window w and of the windows between the known range and w, and, when w
 * is before the range (a seeded start), every shard before w; then asks
 * p->count for each of window w's shards (ready to read). 0 or a negative
 * errno from p->count; its -EAGAIN (a thread that must not count, issue
 * #22) only after p->count was asked for every shard those windows miss,
 * so that the caller has them all counted at once.
 */
int order_epoch_window(const struct order_params *p, struct order_epoch *ep, uint32_t w);

/*
 * Sets window w's start to k (a cursor's k_w), when it is not known: the
 * known range becomes window w alone, until order_epoch_window() extends
 * it. 0; -EINVAL when it is known and not k (the cursor is not of this
 * order).
 */
int order_epoch_seed(struct order_epoch *ep, uint32_t w, uint64_t k);

/*
 * A walk placed by a cursor's k_w (order_epoch_seed) whose window the
 * starts shared by every walk of the epoch have reached (the shards before
 * it counted, by another walk or the count pass) with another start than
 * the seeded one: -ERANGE, *ret_seeded the seeded start and *ret_k the
 * right one; nothing changed. 0: nothing to check yet, or it was right
 * (order_epoch_window has then taken the walk back to the shared starts).
 * Counts nothing (O(1)).
 */
int order_epoch_check_seed(struct order_epoch *ep, uint64_t *ret_seeded, uint64_t *ret_k);

/* The walk reads the shared starts from now on, its own copy (a seeded start found wrong) let go. */
void order_epoch_adopt_shared(struct order_epoch *ep);

/*
 * The documents of window w that belong to `rank` of `world`, in epoch order:
 * window index i_first, i_first + world, ... Returns 0 and a malloc'd array
 * (caller frees) with its length, the window index of its first entry, and
 * the window's total document count; -ENOMEM.
 */
int order_window_rank_docs(const struct order_params *p, const struct order_epoch *ep, uint32_t w,
			   uint32_t rank, uint32_t world, uint64_t **ret_docs, size_t *ret_n,
			   uint64_t *ret_first_index, uint64_t *ret_window_docs);

/*
 * One window of an epoch as one rank walks it, without materialising more
 * than the contract needs (issue #22): its shards with the window index of
 * each one's first document, and, with shuffle, the rank's entries of the
 * shuffled list as positions in the unshuffled one (4 bytes each while the
 * window holds fewer than 2^32 documents). Without shuffle, and for a window
 * over list_max (the bijection, section 3.1), nothing per document is held:
 * the rank's m-th document is computed. Built when the
 * window is reached, freed when the walk leaves it.
 */
struct order_window {
	const struct order_windows *src; /* where `shared` came from (it is given back on clear) */
	const uint32_t *shared; /* shuffle, from src: the whole window's shuffled positions, dealt by stride */
	/* from src: where its token counts (same order as shared; ORDER_COUNT_UNKNOWN: ask) appear once computed */
	const uint16_t *const *counts_ref;
	void *handle;
	uint64_t n;         /* documents in the window */
	uint64_t first;     /* window index of the rank's first document */
	uint32_t world;
	size_t mine;        /* the rank's documents in the window */
	uint32_t n_shards;  /* the window's shards, in window order */
	uint32_t *shard;    /* n_shards: their numbers */
	uint64_t *start;    /* n_shards + 1: unshuffled window index of each one's first document */
	uint32_t *list32;   /* shuffle: the rank's entries, unshuffled positions; NULL otherwise */
	uint64_t *list64;   /* the same for a window of 2^32 documents or more */
	bool permuted;      /* shuffle of a window over list_max: position i is entry perm(i), computed per use */
	struct order_perm perm;
};

/*
 * Builds window w of ep for `rank` of `world` (O(documents in the window)
 * once its start and end are known: order_epoch_has, order_epoch_window)
 * time and 4 bytes per document transiently with shuffle, O(W) without).
 * Returns 0, -ENOMEM, or -EAGAIN when p->windows has not built the
 * shuffled window yet and this thread may not build it (the main loop:
 * order_windows.get); nothing is held then.
 */
int order_window_build(const struct order_params *p, const struct order_epoch *ep, uint32_t w, uint32_t rank,
		       uint32_t world, struct order_window *ret);
void order_window_clear(struct order_window *win);
/* order_window_clear() for a walk that moves on to another window (the provider need not keep this one). */
void order_window_leave(struct order_window *win);
/* The rank's m-th document of the window (m < mine), as an ORDER_DOC id. */
uint64_t order_window_doc(const struct order_window *win, size_t m);
/*
 * Shuffled windows built ahead and shared (daemon/feed/feed-windows.c): a
 * walk asks for window w of epoch ep; get() returns 0 with the whole
 * window's shuffled positions in *ret_list (n entries, as
 * order_window_shuffle makes them) and a handle to give back with put();
 * -EAGAIN when the window is not built yet and the calling thread must not
 * build it or wait (the main loop, issue #22): the provider has noted it
 * as wanted and the walk stops there (order_window_build returns -EAGAIN,
 * and the walk enters the window again later); another negative errno
 * when it cannot give it (the walk then builds its own). On a thread that
 * may wait, get() builds the window, or waits while it is being built.
 * *ret_counts_ref gets where the documents' token counts, in the same
 * order, appear once the provider has computed them (stored tokens:
 * computed and checked off the walk's thread; read with an acquire load,
 * NULL until then), or NULL. prefetch() asks for a window the walk will
 * reach next; `deep`: not the next one but one after it, built only when
 * there is room (it never pushes out a window built ahead), so that asking
 * further ahead never drops a nearer one. Called on the thread that walks.
 */
#define ORDER_COUNT_UNKNOWN UINT16_MAX
struct order_windows {
	int (*get)(void *ctx, const struct order_epoch *ep, uint32_t w, const uint32_t **ret_list,
		   const uint16_t *const **ret_counts_ref, void **ret_handle);
	void (*put)(void *ctx, void *handle, bool keep); /* keep: the walk ends here (it may come back) */
	/* k: window w's start k_w (the walk knows it: the end of the window it entered), so nothing before it is counted */
	void (*prefetch)(void *ctx, uint64_t epoch, uint32_t w, uint64_t k, bool deep);
	void *ctx;
};

/*
 * Window w of ep (known: order_epoch_has) shuffled, as positions in its unshuffled list: a malloc'd
 * array of n entries (n < 2^32; *ret_n = n). Returns 0, -ENOMEM, -E2BIG
 * (2^32 documents or more), -EOVERFLOW (a window over list_max: never a
 * list, order_window_permuted). Any thread.
 */
int order_window_shuffle(const struct order_params *p, const struct order_epoch *ep, uint32_t w, uint32_t **ret,
			 uint64_t *ret_n);

/* The token count of the rank's m-th document when the window knows it (built ahead with counts): true and *ret. */
static inline bool order_window_count(const struct order_window *win, size_t m, uint64_t *ret)
{
	const uint16_t *counts = win->counts_ref ? __atomic_load_n(win->counts_ref, __ATOMIC_ACQUIRE) : NULL;
	if (!counts)
		return false;
	uint16_t c = counts[win->first + (uint64_t)m * win->world];
	*ret = c;
	return c != ORDER_COUNT_UNKNOWN;
}

/* Bytes the window holds (for status: work ahead). */
static inline uint64_t order_window_bytes(const struct order_window *win)
{
	return (uint64_t)win->mine * (win->list32 ? 4 : win->list64 ? 8 : 0) + (uint64_t)win->n_shards * 12;
}
