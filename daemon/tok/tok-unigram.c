/* SPDX-License-Identifier: MIT */
/*
 * The Unigram model (SentencePiece's, as HF tokenizers' models/unigram runs
 * it): each pre-token is cut into the pieces whose scores sum highest
 * (Viterbi, encode_optimized), exactly as HF does:
 *   - pieces are found with a byte trie, shortest first; a later candidate
 *     replaces the best path into a position only if strictly better, so
 *     ties keep the earlier start and the shorter piece;
 *   - where no piece covers the next character alone, that character may
 *     be unknown, scored min(score) - 10; with no unk_id that is an error;
 *   - adjacent unknowns are fused into one string (fuse_unk, always on in
 *     HF's Unigram), which is looked up again in the vocabulary, then with
 *     byte_fallback spelled as <0xXX> pieces if all exist, else unk_id.
 * The struct is read-only after tok_unigram_finish(); a scratch (the
 * Viterbi arrays) is per thread.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"
#include "tok-model.h"

#define UNK_PENALTY 10.0
#define NONE UINT32_MAX

/* Trie node; the children of a node are consecutive (breadth-first
 * layout), so finding one scans a few bytes of labels[]. */
struct tok_node {
	uint32_t first;         /* index of the first child */
	uint32_t term;          /* piece id ending here, or NONE */
	uint16_t n_children;
	uint32_t dense;         /* many children: their table in dense[], + 1; else 0 */
};

/* A node with more children than this gets a 256-entry table (the few
 * nodes after "▁" and common first bytes, where a scan would be long). */
#define DENSE_MIN 8

struct tok_unigram {
	struct tok_strmap map;  /* piece -> id */
	double *scores;         /* by id */
	size_t n, cap;
	double min_score;
	int64_t unk_id;
	bool byte_fallback;
	int32_t byte_ids[256];  /* id of "<0xXX>", or -1 */

	/* Byte trie: node 0 is the root, whose children are also indexed
	 * by byte in root[] (0 = none). */
	struct tok_node *nodes;
	uint8_t *labels;        /* byte leading to each node */
	size_t n_nodes;
	uint32_t root[256];
	uint32_t *dense;        /* 256 child indices (0 = none) per dense node */
	size_t n_dense;
};

int tok_unigram_new(size_t n_pieces, struct tok_unigram **ret) {
	struct tok_unigram *u = calloc(1, sizeof(*u));

	if (!u)
		return -ENOMEM;
	u->cap = n_pieces ? n_pieces : 16;
	u->scores = malloc(u->cap * sizeof(double));
	if (!u->scores) {
		free(u);
		return -ENOMEM;
	}
	u->min_score = __builtin_inf();
	u->unk_id = -1;
	*ret = u;
	return 0;
}

struct tok_unigram *tok_unigram_free(struct tok_unigram *u) {
	if (!u)
		return NULL;
	tok_strmap_clear(&u->map);
	free(u->scores);
	free(u->nodes);
	free(u->labels);
	free(u->dense);
	free(u);
	return NULL;
}

int tok_unigram_add(struct tok_unigram *u, const char *piece, size_t len, double score) {
	int r;

	if (u->n >= INT32_MAX)
		return -E2BIG;
	if (u->n == u->cap) {
		double *s = realloc(u->scores, u->cap * 2 * sizeof(double));
		if (!s)
			return -ENOMEM;
		u->scores = s;
		u->cap *= 2;
	}
	r = tok_strmap_add(&u->map, piece, len, (uint32_t) u->n);
	if (r < 0)
		return r;
	u->scores[u->n++] = score;
	if (score < u->min_score)
		u->min_score = score;
	return 0;
}

static inline uint32_t trie_child(const struct tok_unigram *u, uint32_t node, uint8_t b) {
	if (node == 0)
		return u->root[b];
	const struct tok_node *nd = &u->nodes[node];
	if (nd->dense)
		return u->dense[(size_t) (nd->dense - 1) * 256 + b];
	for (uint32_t k = nd->first, e = nd->first + nd->n_children; k < e; k++)
		if (u->labels[k] == b)
			return k;
	return 0;
}

static const struct tok_unigram *sort_u;

static int piece_cmp(const void *a, const void *b) {
	const struct tok_strent *x = &sort_u->map.ents[*(const uint32_t *) a];
	const struct tok_strent *y = &sort_u->map.ents[*(const uint32_t *) b];
	size_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(sort_u->map.bytes + x->off, sort_u->map.bytes + y->off, n);
	if (c)
		return c;
	return x->len < y->len ? -1 : x->len > y->len;
}

struct range {
	uint32_t lo, hi, depth, node;
};

/* Builds the trie breadth first from the pieces sorted by bytes: a node is
 * a range of pieces sharing depth bytes; its children, the sub-ranges by
 * the next byte, are appended together.  A piece given twice ends at one
 * node, which holds the id the vocabulary map gives the string (the later
 * one), as HF's token_to_ids does. */
static int trie_build(struct tok_unigram *u) {
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	const size_t n = u->map.n_ents, max_nodes = u->map.n_bytes + 1;
	_tok_cleanup_free_ uint32_t *order = malloc((n + 1) * sizeof(*order));
	_tok_cleanup_free_ struct range *queue = malloc(max_nodes * sizeof(*queue));
	size_t head = 0, tail = 0;

	u->nodes = calloc(max_nodes, sizeof(*u->nodes));
	u->labels = calloc(max_nodes, 1);
	if (!order || !queue || !u->nodes || !u->labels)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		order[i] = (uint32_t) i;
	/* qsort has no context argument; loading is rare, so a lock is fine. */
	pthread_mutex_lock(&lock);
	sort_u = u;
	if (n > 1)
		qsort(order, n, sizeof(*order), piece_cmp);
	sort_u = NULL;
	pthread_mutex_unlock(&lock);
	u->n_nodes = 1;
	queue[tail++] = (struct range) { 0, (uint32_t) n, 0, 0 };
	while (head < tail) {
		struct range r = queue[head++];
		struct tok_node *nd = &u->nodes[r.node];
		uint32_t lo = r.lo;
		nd->term = NONE;
		while (lo < r.hi && u->map.ents[order[lo]].len == r.depth) {
			const struct tok_strent *e = &u->map.ents[order[lo]];
			if (r.depth > 0)
				nd->term = (uint32_t) tok_strmap_find(&u->map, (const uint8_t *) u->map.bytes + e->off, e->len);
			lo++;
		}
		nd->first = (uint32_t) u->n_nodes;
		while (lo < r.hi) {
			uint8_t b = (uint8_t) u->map.bytes[u->map.ents[order[lo]].off + r.depth];
			uint32_t hi = lo + 1;
			while (hi < r.hi && (uint8_t) u->map.bytes[u->map.ents[order[hi]].off + r.depth] == b)
				hi++;
			uint32_t child = (uint32_t) u->n_nodes++;
			u->labels[child] = b;
			if (r.node == 0)
				u->root[b] = child;
			u->nodes[r.node].n_children++;
			queue[tail++] = (struct range) { lo, hi, r.depth + 1, child };
			lo = hi;
		}
	}
	for (size_t i = 1; i < u->n_nodes; i++)
		if (u->nodes[i].n_children > DENSE_MIN)
			u->n_dense++;
	u->dense = calloc(u->n_dense * 256 + 1, sizeof(*u->dense));
	if (!u->dense)
		return -ENOMEM;
	for (size_t i = 1, k = 0; i < u->n_nodes; i++) {
		struct tok_node *nd = &u->nodes[i];
		if (nd->n_children <= DENSE_MIN)
			continue;
		for (uint32_t c = nd->first; c < nd->first + nd->n_children; c++)
			u->dense[k * 256 + u->labels[c]] = c;
		nd->dense = (uint32_t) ++k;
	}
	return 0;
}

int tok_unigram_finish(struct tok_unigram *u, int64_t unk_id, bool byte_fallback) {
	int r;

	if (unk_id >= 0 && (size_t) unk_id >= u->n)
		return -EINVAL;
	u->unk_id = unk_id;
	u->byte_fallback = byte_fallback;
	r = tok_strmap_finish(&u->map);
	if (r < 0)
		return r;
	r = trie_build(u);
	if (r < 0)
		return r;
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof(name), "<0x%02X>", b);
		u->byte_ids[b] = (int32_t) tok_strmap_find(&u->map, (const uint8_t *) name, 6);
	}
	return 0;
}

size_t tok_unigram_scratch_size(size_t n) {
	/* best (double), then start, id, seg_end, seg_id (u32), n + 1 each */
	return (n + 1) * (sizeof(double) + 4 * sizeof(uint32_t));
}

/* The ids of a string the Viterbi path made of fused unknowns. */
static size_t unk_ids(const struct tok_unigram *u, const uint8_t *s, size_t n, uint32_t *out) {
	int64_t id = tok_strmap_find(&u->map, s, n);

	if (id >= 0) {
		out[0] = (uint32_t) id;
		return 1;
	}
	if (u->byte_fallback) {
		bool all = true;
		for (size_t i = 0; i < n && all; i++)
			all = u->byte_ids[s[i]] >= 0;
		if (all) {
			for (size_t i = 0; i < n; i++)
				out[i] = (uint32_t) u->byte_ids[s[i]];
			return n;
		}
	}
	out[0] = (uint32_t) u->unk_id;
	return 1;
}

size_t tok_unigram_encode(const struct tok_unigram *u, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	const double unk_score = u->min_score - UNK_PENALTY;
	double *best = scratch;
	uint32_t *start = (uint32_t *) (best + n + 1), *idv = start + n + 1;
	uint32_t *seg_end = idv + n + 1, *seg_id = seg_end + n + 1;
	size_t m = 0;

	for (size_t i = 0; i <= n; i++) {
		start[i] = NONE;
		best[i] = 0.0;
	}
	for (size_t i = 0; i < n;) {
		const double base = best[i];
		const size_t mblen = tok_utf8_len(s[i]) <= n - i ? tok_utf8_len(s[i]) : n - i;
		bool single = false;
		uint32_t node = 0;

		for (size_t j = i; j < n; j++) {
			node = trie_child(u, node, s[j]);
			if (!node)
				break;
			uint32_t id = u->nodes[node].term;
			if (id == NONE)
				continue;
			size_t kp = j + 1;
			double cand = u->scores[id] + base;
			if (start[kp] == NONE || cand > best[kp]) {
				best[kp] = cand;
				start[kp] = (uint32_t) i;
				idv[kp] = id;
			}
			if (kp - i == mblen)
				single = true;
		}
		if (!single) {
			size_t kp = i + mblen;
			double cand = unk_score + base;
			if (start[kp] == NONE || cand > best[kp]) {
				best[kp] = cand;
				start[kp] = (uint32_t) i;
				idv[kp] = (uint32_t) u->unk_id;
			}
		}
		i += mblen;
	}
	/* Walk back, recording the path's pieces last first (a fused run of
	 * unknowns is one entry, id NONE), then emit them in text order. */
	size_t end = n, n_seg = 0;
	while (end > 0) {
		size_t st = start[end];
		bool unk = idv[end] == (uint32_t) u->unk_id;
		if (!(unk && n_seg > 0 && seg_id[n_seg - 1] == NONE)) {
			seg_end[n_seg] = (uint32_t) end;
			seg_id[n_seg] = unk ? NONE : idv[end];
			n_seg++;
		}
		end = st;
	}
	for (size_t k = n_seg; k-- > 0;) {
		size_t e = seg_end[k], b = k + 1 < n_seg ? seg_end[k + 1] : 0;
		if (seg_id[k] == NONE)
			m += unk_ids(u, s + b, e - b, out + m);
		else
			out[m++] = seg_id[k];
	}
	return m;
}
