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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"
#include "tok-model.h"

#define UNK_PENALTY 10.0
#define NONE UINT32_MAX

struct tok_edge {
	uint64_t key;           /* parent << 8 | byte; UINT64_MAX = empty */
	uint32_t child;
};

struct tok_unigram {
	struct tok_strmap map;  /* piece -> id */
	double *scores;         /* by id */
	size_t n, cap;
	double min_score;
	int64_t unk_id;
	bool byte_fallback;
	int32_t byte_ids[256];  /* id of "<0xXX>", or -1 */

	/* Byte trie: node 0 is the root; term[node] = piece id or NONE. */
	uint32_t *term;
	size_t n_nodes;
	uint32_t root[256];     /* child of the root by byte, 0 = none */
	struct tok_edge *edges;
	uint64_t edge_mask;
};

struct tok_unigram_scratch {
	double *best;
	uint32_t *start, *id;
	uint32_t *seg_end, *seg_id;
	size_t cap;
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
	free(u->term);
	free(u->edges);
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

static inline uint64_t edge_hash(uint64_t key) {
	return (key * 0x9e3779b97f4a7c15ull) >> 17;
}

static inline uint32_t trie_child(const struct tok_unigram *u, uint32_t node, uint8_t b) {
	if (node == 0)
		return u->root[b];
	uint64_t key = (uint64_t) node << 8 | b;
	for (uint64_t i = edge_hash(key) & u->edge_mask;; i = (i + 1) & u->edge_mask) {
		if (u->edges[i].key == key)
			return u->edges[i].child;
		if (u->edges[i].key == UINT64_MAX)
			return 0;
	}
}

static void trie_set_child(struct tok_unigram *u, uint32_t node, uint8_t b, uint32_t child) {
	if (node == 0) {
		u->root[b] = child;
		return;
	}
	uint64_t key = (uint64_t) node << 8 | b;
	for (uint64_t i = edge_hash(key) & u->edge_mask;; i = (i + 1) & u->edge_mask)
		if (u->edges[i].key == UINT64_MAX) {
			u->edges[i] = (struct tok_edge) { .key = key, .child = child };
			return;
		}
}

int tok_unigram_finish(struct tok_unigram *u, int64_t unk_id, bool byte_fallback) {
	size_t max_nodes = u->map.n_bytes + 1, size = 16;
	int r;

	if (unk_id >= 0 && (size_t) unk_id >= u->n)
		return -EINVAL;
	u->unk_id = unk_id;
	u->byte_fallback = byte_fallback;
	r = tok_strmap_finish(&u->map);
	if (r < 0)
		return r;
	while (size < max_nodes * 2)
		size *= 2;
	u->edges = malloc(size * sizeof(*u->edges));
	u->term = malloc(max_nodes * sizeof(*u->term));
	if (!u->edges || !u->term)
		return -ENOMEM;
	for (size_t i = 0; i < size; i++)
		u->edges[i].key = UINT64_MAX;
	u->edge_mask = size - 1;
	u->n_nodes = 1;
	u->term[0] = NONE;
	for (size_t i = 0; i < u->map.n_ents; i++) {
		const struct tok_strent *e = &u->map.ents[i];
		const uint8_t *s = (const uint8_t *) u->map.bytes + e->off;
		uint32_t node = 0;
		for (size_t k = 0; k < e->len; k++) {
			uint32_t c = trie_child(u, node, s[k]);
			if (!c) {
				c = (uint32_t) u->n_nodes++;
				u->term[c] = NONE;
				trie_set_child(u, node, s[k], c);
			}
			node = c;
		}
		if (node != 0)
			u->term[node] = e->id;
	}
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof(name), "<0x%02X>", b);
		u->byte_ids[b] = (int32_t) tok_strmap_find(&u->map, (const uint8_t *) name, 6);
	}
	return 0;
}

size_t tok_unigram_size(const struct tok_unigram *u) {
	return u->n;
}

const char *tok_unigram_piece(const struct tok_unigram *u, uint32_t id, size_t *ret_len) {
	if (id >= u->n)
		return NULL;
	/* Entries are in id order. */
	*ret_len = u->map.ents[id].len;
	return u->map.bytes + u->map.ents[id].off;
}

int64_t tok_unigram_find(const struct tok_unigram *u, const uint8_t *s, size_t n) {
	return tok_strmap_find(&u->map, s, n);
}

struct tok_unigram_scratch *tok_unigram_scratch_free(struct tok_unigram_scratch *s) {
	if (!s)
		return NULL;
	free(s->best);
	free(s->start);
	free(s->id);
	free(s->seg_end);
	free(s->seg_id);
	free(s);
	return NULL;
}

static int scratch_reserve(struct tok_unigram_scratch **ps, size_t n) {
	struct tok_unigram_scratch *s = *ps;

	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s)
			return -ENOMEM;
		*ps = s;
	}
	if (n + 1 > s->cap) {
		size_t cap = n + 1 < 256 ? 256 : (n + 1) * 2;
		double *b = realloc(s->best, cap * sizeof(*b));
		if (b)
			s->best = b;
		uint32_t *st = realloc(s->start, cap * sizeof(*st));
		if (st)
			s->start = st;
		uint32_t *id = realloc(s->id, cap * sizeof(*id));
		if (id)
			s->id = id;
		uint32_t *se = realloc(s->seg_end, cap * sizeof(*se));
		if (se)
			s->seg_end = se;
		uint32_t *si = realloc(s->seg_id, cap * sizeof(*si));
		if (si)
			s->seg_id = si;
		if (!b || !st || !id || !se || !si)
			return -ENOMEM;
		s->cap = cap;
	}
	return 0;
}

/* The ids of a string the Viterbi path made of fused unknowns. */
static int unk_ids(const struct tok_unigram *u, const uint8_t *s, size_t n, struct tok_u32s *out) {
	int64_t id = tok_strmap_find(&u->map, s, n);
	int r;

	if (id >= 0)
		return tok_u32s_push(out, (uint32_t) id);
	if (u->byte_fallback) {
		bool all = true;
		for (size_t i = 0; i < n && all; i++)
			all = u->byte_ids[s[i]] >= 0;
		if (all) {
			for (size_t i = 0; i < n; i++) {
				r = tok_u32s_push(out, (uint32_t) u->byte_ids[s[i]]);
				if (r < 0)
					return r;
			}
			return 0;
		}
	}
	return tok_u32s_push(out, (uint32_t) u->unk_id);
}

static int viterbi(const struct tok_unigram *u, struct tok_unigram_scratch *sc, const uint8_t *s, size_t n,
		   struct tok_u32s *out) {
	const double unk_score = u->min_score - UNK_PENALTY;
	double *best = sc->best;
	uint32_t *start = sc->start, *idv = sc->id;
	int r;

	for (size_t i = 0; i <= n; i++) {
		start[i] = NONE;
		best[i] = 0.0;
	}
	for (size_t i = 0; i < n;) {
		const double base = best[i];
		const size_t mblen = tok_utf8_len(s[i]);
		bool single = false;
		uint32_t node = 0;

		for (size_t j = i; j < n; j++) {
			node = trie_child(u, node, s[j]);
			if (!node)
				break;
			uint32_t id = u->term[node];
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
				if (u->unk_id < 0)
					return -EINVAL;
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
	uint32_t *seg_end = sc->seg_end, *seg_id = sc->seg_id;
	while (end > 0) {
		size_t st = start[end];
		bool unk = u->unk_id >= 0 && idv[end] == (uint32_t) u->unk_id;
		if (unk && n_seg > 0 && seg_id[n_seg - 1] == NONE)
			; /* extends the fused run: its start moves down */
		else {
			seg_end[n_seg] = (uint32_t) end;
			seg_id[n_seg] = unk ? NONE : idv[end];
			n_seg++;
		}
		end = st;
	}
	for (size_t k = n_seg; k-- > 0;) {
		size_t e = seg_end[k], b = k + 1 < n_seg ? seg_end[k + 1] : 0;
		r = seg_id[k] == NONE ? unk_ids(u, s + b, e - b, out) : tok_u32s_push(out, seg_id[k]);
		if (r < 0)
			return r;
	}
	return 0;
}

int tok_unigram_encode(const struct tok_unigram *u, struct tok_unigram_scratch **scratch, const uint8_t *s, size_t n,
		       struct tok_u32s *out) {
	int r;

	if (n == 0)
		return 0;
	r = scratch_reserve(scratch, n);
	if (r < 0)
		return r;
	return viterbi(u, *scratch, s, n, out);
}
