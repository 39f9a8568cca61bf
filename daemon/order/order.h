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

/* What the order depends on. shard_docs[s] = documents in shard s. */
struct order_params {
	uint64_t seed;
	bool shuffle;
	uint32_t window; /* shards per shuffle window, >= 1 */
	uint32_t n_shards;
	const uint32_t *shard_docs;
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

/* One epoch's shard permutation and where each window starts in the epoch's order. */
struct order_epoch {
	uint64_t epoch;
	uint64_t key;        /* K = mix(seed ^ mix(e + 1)) */
	uint32_t n_windows;
	uint32_t *perm;      /* n_shards entries: P */
	uint64_t *win_start; /* n_windows + 1 entries: k of each window's first document */
	/* Set: perm and win_start are shared (stream.c's walks), order_epoch_clear() calls release(shared). */
	void (*release)(void *shared);
	void *shared;
};

/* Fills *ep for epoch e (freeing what it held). Returns 0 or -ENOMEM. */
int order_epoch_build(const struct order_params *p, uint64_t e, struct order_epoch *ep);
void order_epoch_clear(struct order_epoch *ep);

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
 * time and 4 bytes per document transiently with shuffle, O(W) without).
 * Returns 0 or -ENOMEM.
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
 * walk asks for window w of epoch ep; get() returns the whole window's
 * shuffled positions (n entries, as order_window_shuffle makes them) and a
 * handle to give back with put(), waiting while it is being built, or NULL
 * (the walk then builds its own); *ret_counts_ref gets where the
 * documents' token counts, in the same order, appear once the provider has
 * computed them (stored tokens: computed and checked off the walk's thread;
 * read with an acquire load, NULL until then), or NULL. prefetch() asks for a window the walk
 * will reach next. Called on the thread that walks.
 */
#define ORDER_COUNT_UNKNOWN UINT16_MAX
struct order_windows {
	const uint32_t *(*get)(void *ctx, const struct order_epoch *ep, uint32_t w,
			       const uint16_t *const **ret_counts_ref, void **ret_handle);
	void (*put)(void *ctx, void *handle, bool keep); /* keep: the walk ends here (it may come back) */
	void (*prefetch)(void *ctx, uint64_t epoch, uint32_t w);
	void *ctx;
};

/*
 * Window w of ep shuffled, as positions in its unshuffled list: a malloc'd
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
