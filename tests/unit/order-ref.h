/* SPDX-License-Identifier: MIT */
/*
 * An independent reference for the sample-order contract
 * (docs/sample-order.md), written from the contract's text and sharing no
 * code with daemon/order/: the tests compare the daemon against it.
 *
 *   mix(x):   x ^= x >> 30; x *= 0xBF58476D1CE4E5B9; x ^= x >> 27;
 *             x *= 0x94D049BB133111EB; x ^= x >> 31
 *   RNG(key): c = 0; next(): c += 1; mix(key + c * 0x9E3779B97F4A7C15);
 *             below(n) = next() mod n
 *   shuffle:  for i = len-1 down to 1: j = below(i + 1); swap a[i], a[j]
 *   epoch e:  K = mix(seed ^ mix(e + 1)); P = 0..S-1, shuffled with RNG(K);
 *             window w = shards P[wW .. wW+W-1]; its documents in shard
 *             order, shuffled with RNG(mix(K ^ mix(w + 1))); the epoch is the
 *             windows in order; the k-th document goes to rank k mod R.
 *   stream:   per epoch, per document of the rank: bos + tokens + eos
 *             (empty documents contribute nothing).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static inline uint64_t ref_mix(uint64_t x)
{
	x ^= x >> 30;
	x *= UINT64_C(0xBF58476D1CE4E5B9);
	x ^= x >> 27;
	x *= UINT64_C(0x94D049BB133111EB);
	x ^= x >> 31;
	return x;
}

struct ref_rng {
	uint64_t key, c;
};

static inline uint64_t ref_next(struct ref_rng *r)
{
	r->c += 1;
	return ref_mix(r->key + r->c * UINT64_C(0x9E3779B97F4A7C15));
}

static inline uint64_t ref_below(struct ref_rng *r, uint64_t n)
{
	return ref_next(r) % n;
}

struct ref_doc {
	uint32_t shard, doc;
};

struct ref_epoch {
	uint64_t key;
	uint32_t n_shards, window, n_windows;
	uint32_t *perm;
	size_t n_docs;
	struct ref_doc *docs;  /* the epoch's order */
	size_t *win_start;     /* n_windows + 1 entries: k of each window's first document */
};

/* Builds epoch e's whole order. Aborts on allocation failure (tests only). */
static inline void ref_epoch_build(uint64_t seed, bool shuffle, uint32_t window, uint32_t n_shards,
				   const uint32_t *shard_docs, uint64_t e, struct ref_epoch *ret)
{
	struct ref_epoch ep = { .n_shards = n_shards, .window = window };
	ep.key = ref_mix(seed ^ ref_mix(e + 1));
	ep.perm = malloc((n_shards + 1) * sizeof(*ep.perm));
	size_t total = 0;
	for (uint32_t s = 0; s < n_shards; s++) {
		ep.perm[s] = s;
		total += shard_docs[s];
	}
	if (shuffle) {
		struct ref_rng rng = { .key = ep.key };
		for (size_t i = n_shards; i-- > 1;) {
			size_t j = (size_t)ref_below(&rng, i + 1);
			uint32_t t = ep.perm[i];
			ep.perm[i] = ep.perm[j];
			ep.perm[j] = t;
		}
	}
	ep.n_windows = (n_shards + window - 1) / window;
	ep.docs = malloc((total + 1) * sizeof(*ep.docs));
	ep.win_start = malloc((ep.n_windows + 1) * sizeof(*ep.win_start));
	if (!ep.perm || !ep.docs || !ep.win_start)
		abort();
	size_t k = 0;
	for (uint32_t w = 0; w < ep.n_windows; w++) {
		ep.win_start[w] = k;
		for (uint32_t i = w * window; i < (w + 1) * window && i < n_shards; i++)
			for (uint32_t d = 0; d < shard_docs[ep.perm[i]]; d++)
				ep.docs[k++] = (struct ref_doc){ ep.perm[i], d };
		if (shuffle) {
			struct ref_rng rng = { .key = ref_mix(ep.key ^ ref_mix((uint64_t)w + 1)) };
			struct ref_doc *a = ep.docs + ep.win_start[w];
			size_t n = k - ep.win_start[w];
			for (size_t i = n; i-- > 1;) {
				size_t j = (size_t)ref_below(&rng, i + 1);
				struct ref_doc t = a[i];
				a[i] = a[j];
				a[j] = t;
			}
		}
	}
	ep.win_start[ep.n_windows] = k;
	ep.n_docs = k;
	*ret = ep;
}

static inline void ref_epoch_free(struct ref_epoch *ep)
{
	free(ep->perm);
	free(ep->docs);
	free(ep->win_start);
	*ep = (struct ref_epoch){ 0 };
}

/* One position of a rank's token stream, and where it lies. */
struct ref_pos {
	uint64_t epoch;
	uint32_t window;
	uint64_t index;  /* the document's index inside its window's order */
	uint32_t shard, doc;
	uint64_t offset; /* inside the document's contribution */
	uint64_t length; /* the contribution's length */
};

/*
 * The first `want` positions of rank's stream (fewer if the rank never gets a
 * token within max_epochs epochs). Returns the count; *ret is malloc'd.
 */
static inline size_t ref_stream(uint64_t seed, bool shuffle, uint32_t window, uint32_t n_shards,
				const uint32_t *shard_docs, const uint32_t *const *doc_tokens, uint32_t rank,
				uint32_t world, bool bos, bool eos, size_t want, uint64_t max_epochs,
				struct ref_pos **ret)
{
	struct ref_pos *out = malloc((want + 1) * sizeof(*out));
	if (!out)
		abort();
	size_t n = 0;
	for (uint64_t e = 0; e < max_epochs && n < want; e++) {
		struct ref_epoch ep;
		ref_epoch_build(seed, shuffle, window, n_shards, shard_docs, e, &ep);
		uint32_t w = 0;
		for (size_t k = 0; k < ep.n_docs && n < want; k++) {
			while (k >= ep.win_start[w + 1])
				w++;
			if (k % world != rank)
				continue;
			struct ref_doc d = ep.docs[k];
			uint64_t tokens = doc_tokens[d.shard][d.doc];
			uint64_t len = tokens ? tokens + bos + eos : 0;
			for (uint64_t off = 0; off < len && n < want; off++)
				out[n++] = (struct ref_pos){ .epoch = e, .window = w, .index = k - ep.win_start[w],
							     .shard = d.shard, .doc = d.doc, .offset = off, .length = len };
		}
		ref_epoch_free(&ep);
	}
	*ret = out;
	return n;
}
