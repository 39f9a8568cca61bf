/* SPDX-License-Identifier: MIT */
/*
 * Vocabulary and merge tables of a struct tok, and the BPE merge itself.
 *
 * Tokens are byte strings with ids.  Both file formats reduce to the same
 * model: a table (left id, right id) -> (priority, merged id) and the rule
 * "merge the adjacent pair with the lowest priority, leftmost first, until
 * no pair merges".  For a tiktoken rank file every split of a token into two
 * tokens is a pair whose priority is the token's rank, which is exactly
 * tiktoken's rule (it looks up the rank of the joined bytes); for HF the
 * priority is the index in model.merges.  Integer pairs hash faster than
 * joined byte strings.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>

#include "tok-internal.h"

int tok_errorf(char **ret_error, int r, const char *fmt, ...) {
	if (ret_error) {
		va_list ap;
		char *s = NULL;

		va_start(ap, fmt);
		if (vasprintf(&s, fmt, ap) < 0)
			s = NULL;
		va_end(ap);
		free(*ret_error);
		*ret_error = s;
	}
	return r;
}

struct tok *tok_new(const char *path) {
	struct tok *t = calloc(1, sizeof(*t));
	const char *base;

	if (!t)
		return NULL;
	base = strrchr(path, '/');
	t->name = strdup(base ? base + 1 : path);
	if (!t->name)
		return tok_free(t);
	return t;
}

int tok_vocab_add(struct tok *t, uint32_t id, const uint8_t *bytes, size_t len, uint32_t line) {
	if (len == 0 || len > UINT32_MAX || t->n_bytes + len > UINT32_MAX || id >= INT32_MAX)
		return -EINVAL;
	if (t->n_ents == t->cap_ents) {
		size_t cap = t->cap_ents ? t->cap_ents * 2 : 4096;
		struct tok_ent *e = realloc(t->ents, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		t->ents = e;
		t->cap_ents = cap;
	}
	if (t->n_bytes + len > t->cap_bytes) {
		size_t cap = t->cap_bytes ? t->cap_bytes : 65536;
		while (cap < t->n_bytes + len)
			cap *= 2;
		uint8_t *b = realloc(t->bytes, cap);
		if (!b)
			return -ENOMEM;
		t->bytes = b;
		t->cap_bytes = cap;
	}
	memcpy(t->bytes + t->n_bytes, bytes, len);
	t->ents[t->n_ents++] = (struct tok_ent) { .id = id, .off = (uint32_t) t->n_bytes, .len = (uint32_t) len, .line = line };
	t->n_bytes += len;
	return 0;
}

static void tok_where(const struct tok *t, uint32_t line, char *buf, size_t size) {
	if (line > 0)
		snprintf(buf, size, "%s:%u", t->name, line);
	else
		snprintf(buf, size, "%s: model.vocab", t->name);
}

int64_t tok_vocab_find(const struct tok *t, const uint8_t *s, size_t n) {
	const struct tok_slot *sl = tok_vocab_slot(t, s, n, tok_hash_bytes(s, n));
	return sl ? (int64_t) sl->id : -1;
}

static int tok_pairs_grow(struct tok *t, uint64_t nslots) {
	struct tok_pair *old = t->pairs;
	uint64_t oldn = old ? t->pair_mask + 1 : 0;
	unsigned bits = 0;

	while ((1ull << bits) < nslots)
		bits++;
	t->pairs = malloc(nslots * sizeof(*t->pairs));
	if (!t->pairs) {
		t->pairs = old;
		return -ENOMEM;
	}
	memset(t->pairs, 0xff, nslots * sizeof(*t->pairs));
	t->pair_mask = nslots - 1;
	t->pair_shift = 64 - bits;
	for (uint64_t j = 0; j < oldn; j++) {
		if (old[j].key == UINT64_MAX)
			continue;
		uint64_t i = (old[j].key * 0x9e3779b97f4a7c15ull) >> t->pair_shift;
		while (t->pairs[i].key != UINT64_MAX)
			i = (i + 1) & t->pair_mask;
		t->pairs[i] = old[j];
	}
	free(old);
	return 0;
}

int tok_pair_add(struct tok *t, uint32_t left, uint32_t right, uint32_t prio, uint32_t merged) {
	uint64_t key = (uint64_t) left << 32 | right;
	int r;

	if (!t->pairs || (t->n_pairs + 1) * 2 > t->pair_mask + 1) {
		r = tok_pairs_grow(t, t->pairs ? (t->pair_mask + 1) * 2 : 1024);
		if (r < 0)
			return r;
	}
	for (uint64_t i = (key * 0x9e3779b97f4a7c15ull) >> t->pair_shift;; i = (i + 1) & t->pair_mask) {
		struct tok_pair *p = &t->pairs[i];
		if (p->key == key) {
			p->prio = prio;
			p->merged = merged;
			return 0;
		}
		if (p->key == UINT64_MAX) {
			*p = (struct tok_pair) { .key = key, .prio = prio, .merged = merged };
			t->n_pairs++;
			return 0;
		}
	}
}

static int tok_ent_cmp(const void *a, const void *b) {
	const struct tok_ent *x = a, *y = b;
	if (x->id != y->id)
		return x->id < y->id ? -1 : 1;
	return x->line < y->line ? -1 : x->line > y->line;
}

int tok_vocab_finish(struct tok *t, char **ret_error) {
	char where[256];
	uint8_t *bytes;
	uint32_t n_ids = 0, nslots = 1024;
	size_t pos = 0;

	qsort(t->ents, t->n_ents, sizeof(*t->ents), tok_ent_cmp);
	for (size_t i = 0; i < t->n_ents; i++) {
		if (i > 0 && t->ents[i].id == t->ents[i - 1].id) {
			tok_where(t, t->ents[i].line, where, sizeof(where));
			return tok_errorf(ret_error, -EINVAL, "%s: id %u given twice", where, t->ents[i].id);
		}
		n_ids = t->ents[i].id + 1;
	}
	/*
	 * Tables are indexed by id: a file naming id 2^31 - 1 among a handful of
	 * tokens would make gigabytes of them. Real vocabularies are dense (ranks
	 * 0..N-1, a few reserved ids), so ids must stay below 2N + 65536.
	 */
	if (t->n_ents && (uint64_t) n_ids > 2 * (uint64_t) t->n_ents + 65536) {
		tok_where(t, t->ents[t->n_ents - 1].line, where, sizeof(where));
		return tok_errorf(ret_error, -EINVAL, "%s: id %u is far past the %zu tokens given (ids must stay below %" PRIu64 ")",
				  where, n_ids - 1, t->n_ents, 2 * (uint64_t) t->n_ents + 65536);
	}
	t->n_ids = n_ids;
	t->off = calloc((size_t) n_ids + 1, sizeof(*t->off));
	bytes = malloc(t->n_bytes ? t->n_bytes : 1);
	while (nslots < 2 * (size_t) t->n_ents)
		nslots *= 2;
	t->slots = malloc((size_t) nslots * sizeof(*t->slots));
	t->whole_ok = calloc(n_ids ? n_ids : 1, 1);
	if (!t->off || !bytes || !t->slots || !t->whole_ok) {
		free(bytes);
		return -ENOMEM;
	}
	/* Lay tokens out by id so off[] gives each id's bytes; absent ids are
	 * empty ranges. */
	for (size_t i = 0, id = 0; id <= n_ids; id++) {
		t->off[id] = (uint32_t) pos;
		if (i < t->n_ents && t->ents[i].id == id) {
			if (t->ents[i].len > t->max_len)
				t->max_len = t->ents[i].len;
			memcpy(bytes + pos, t->bytes + t->ents[i].off, t->ents[i].len);
			pos += t->ents[i].len;
			i++;
		}
	}
	free(t->bytes);
	t->bytes = bytes;
	memset(t->slots, 0xff, (size_t) nslots * sizeof(*t->slots));
	t->slot_mask = nslots - 1;
	for (size_t i = 0; i < t->n_ents; i++) {
		uint32_t id = t->ents[i].id;
		const uint8_t *s = t->bytes + t->off[id];
		size_t n = t->off[id + 1] - t->off[id];
		int64_t other = tok_vocab_find(t, s, n);
		uint64_t h;

		if (other >= 0) {
			tok_where(t, t->ents[i].line, where, sizeof(where));
			return tok_errorf(ret_error, -EINVAL, "%s: id %u has the same bytes as id %u",
					  where, id, (uint32_t) other);
		}
		h = tok_hash_bytes(s, n);
		for (uint32_t j = (uint32_t) h & t->slot_mask;; j = (j + 1) & t->slot_mask)
			if (t->slots[j].id == UINT32_MAX) {
				t->slots[j] = (struct tok_slot) { .id = id, .len = (uint32_t) n,
								  .head = tok_load_head(s, n) };
				break;
			}
	}
	for (unsigned b = 0; b < 256 && !t->unicode_vocab; b++) {
		uint8_t c = (uint8_t) b;
		int64_t id = tok_vocab_find(t, &c, 1);
		if (id < 0)
			return tok_errorf(ret_error, -EINVAL,
					  "%s: byte 0x%02x has no token; not a byte-level vocabulary",
					  t->name, b);
		t->byte_id[b] = (uint32_t) id;
		t->whole_ok[id] = 1;
	}
	free(t->ents);
	t->ents = NULL;
	t->n_ents = t->cap_ents = 0;
	t->cap_bytes = t->n_bytes;
	return tok_pairs_grow(t, 1024);
}

int tok_pairs_from_ranks(struct tok *t) {
	for (uint32_t id = 0; id < t->n_ids; id++) {
		const uint8_t *s = t->bytes + t->off[id];
		size_t n = t->off[id + 1] - t->off[id];

		if (n == 0)
			continue;
		t->whole_ok[id] = 1;
		for (size_t i = 1; i < n; i++) {
			int64_t l = tok_vocab_find(t, s, i), r;
			if (l < 0)
				continue;
			r = tok_vocab_find(t, s + i, n - i);
			if (r < 0)
				continue;
			int k = tok_pair_add(t, (uint32_t) l, (uint32_t) r, id, id);
			if (k < 0)
				return k;
		}
	}
	return tok_pairs_finish(t);
}

int tok_compute_whole_ok(struct tok *t) {
	size_t cap = 0;
	uint32_t *out = NULL;
	void *scratch = NULL;
	int r = 0;

	for (uint32_t id = 0; id < t->n_ids; id++) {
		size_t n = t->off[id + 1] - t->off[id];
		if (n == 0 || (n < 2 && !t->model))
			continue;
		if (n > cap) {
			cap = n * 2;
			free(out);
			free(scratch);
			out = malloc(cap * sizeof(*out));
			scratch = malloc(tok_model_scratch_size(t, cap));
			if (!out || !scratch) {
				r = -ENOMEM;
				break;
			}
		}
		t->whole_ok[id] = tok_model_encode(t, t->bytes + t->off[id], n, out, scratch) == 1 && out[0] == id;
	}
	free(out);
	free(scratch);
	return r;
}

/* Pieces up to this many bytes merge in flat arrays, O(n^2) but with tiny
 * constants; longer ones use a heap, O(n log n). */
#define TOK_BPE_SMALL 48

size_t tok_bpe_scratch_size(size_t n) {
	return n * (4 + 4 + 4 + 3 * 8) + 64;
}

/* From bytes s (byte-level) or from symbols init (s NULL). */
static size_t tok_bpe_small(const struct tok *t, const uint8_t *s, const uint32_t *init, size_t n, uint32_t *ids,
			    void *scratch) {
	uint32_t *prio = scratch;
	uint32_t *merged = prio + n;
	size_t m = n;

	if (s) {
		for (size_t i = 0; i < n; i++)
			ids[i] = t->byte_id[s[i]];
		for (size_t i = 0; i + 1 < m; i++) {
			const struct tok_pair2 *p = &t->pair2[(unsigned) s[i] << 8 | s[i + 1]];
			prio[i] = p->prio;
			merged[i] = p->merged;
		}
	} else {
		memcpy(ids, init, n * sizeof(*ids));
		for (size_t i = 0; i + 1 < m; i++)
			prio[i] = tok_pair_find(t, ids[i], ids[i + 1], &merged[i]);
	}
	while (m > 1) {
		uint32_t best = UINT32_MAX;
		size_t bi = 0;

		for (size_t i = 0; i + 1 < m; i++)
			if (prio[i] < best) {
				best = prio[i];
				bi = i;
			}
		if (best == UINT32_MAX)
			break;
		ids[bi] = merged[bi];
		m--;
		memmove(ids + bi + 1, ids + bi + 2, (m - bi - 1) * sizeof(*ids));
		memmove(prio + bi + 1, prio + bi + 2, (m > bi + 2 ? m - bi - 2 : 0) * sizeof(*prio));
		memmove(merged + bi + 1, merged + bi + 2, (m > bi + 2 ? m - bi - 2 : 0) * sizeof(*merged));
		if (bi > 0)
			prio[bi - 1] = tok_pair_find(t, ids[bi - 1], ids[bi], &merged[bi - 1]);
		if (bi + 1 < m)
			prio[bi] = tok_pair_find(t, ids[bi], ids[bi + 1], &merged[bi]);
	}
	return m;
}

static void tok_heap_push(uint64_t *heap, size_t *n, uint64_t v) {
	size_t i = (*n)++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (heap[p] <= v)
			break;
		heap[i] = heap[p];
		i = p;
	}
	heap[i] = v;
}

static uint64_t tok_heap_pop(uint64_t *heap, size_t *n) {
	uint64_t top = heap[0], v = heap[--*n];
	size_t i = 0;

	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && heap[c + 1] < heap[c])
			c++;
		if (v <= heap[c])
			break;
		heap[i] = heap[c];
		i = c;
	}
	if (*n > 0)
		heap[i] = v;
	return top;
}

/* Lazy-deletion heap of (priority << 32 | left position).  An entry is
 * acted on only if the pair at that position still has that priority: a
 * priority names one pair (HF) or one merged token (tiktoken), so a match
 * means the pair is really there, and (priority, position) order gives the
 * lowest, leftmost merge as the flat loop does. */
static size_t tok_bpe_heap(const struct tok *t, const uint8_t *s, const uint32_t *init, size_t n, uint32_t *out,
			   void *scratch) {
	const uint32_t dead = UINT32_MAX;
	uint32_t *ids = scratch, *next = ids + n, *prev = next + n;
	uint64_t *heap = (uint64_t *) (((uintptr_t) (prev + n) + 7) & ~(uintptr_t) 7);
	size_t nh = 0, m = 0;
	uint32_t merged = 0;

	for (size_t i = 0; i < n; i++) {
		ids[i] = s ? t->byte_id[s[i]] : init[i];
		next[i] = (uint32_t) i + 1;
		prev[i] = (uint32_t) i - 1;
	}
	next[n - 1] = dead;
	for (size_t i = 0; i + 1 < n; i++) {
		uint32_t p = s ? t->pair2[(unsigned) s[i] << 8 | s[i + 1]].prio
			       : tok_pair_find(t, ids[i], init[i + 1], &merged);
		if (p != UINT32_MAX)
			tok_heap_push(heap, &nh, (uint64_t) p << 32 | i);
	}
	while (nh > 0) {
		uint64_t top = tok_heap_pop(heap, &nh);
		uint32_t prio = (uint32_t) (top >> 32), i = (uint32_t) top, j;

		if (ids[i] == dead || next[i] == dead)
			continue;
		j = next[i];
		if (tok_pair_find(t, ids[i], ids[j], &merged) != prio)
			continue;
		ids[i] = merged;
		ids[j] = dead;
		next[i] = next[j];
		if (next[i] != dead)
			prev[next[i]] = i;
		if (prev[i] != dead) {
			uint32_t p = tok_pair_find(t, ids[prev[i]], ids[i], &merged);
			if (p != UINT32_MAX)
				tok_heap_push(heap, &nh, (uint64_t) p << 32 | prev[i]);
		}
		if (next[i] != dead) {
			uint32_t p = tok_pair_find(t, ids[i], ids[next[i]], &merged);
			if (p != UINT32_MAX)
				tok_heap_push(heap, &nh, (uint64_t) p << 32 | i);
		}
	}
	for (uint32_t i = 0; i != dead; i = next[i])
		out[m++] = ids[i];
	return m;
}

int tok_pairs_finish(struct tok *t) {
	if (t->unicode_vocab)
		return 0;
	free(t->pair2);
	t->pair2 = malloc(65536 * sizeof(*t->pair2));
	if (!t->pair2)
		return -ENOMEM;
	for (unsigned i = 0; i < 65536; i++) {
		struct tok_pair2 *p = &t->pair2[i];
		p->prio = tok_pair_find(t, t->byte_id[i >> 8], t->byte_id[i & 0xff], &p->merged);
	}
	return 0;
}

size_t tok_bpe(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	if (n <= TOK_BPE_SMALL)
		return tok_bpe_small(t, s, NULL, n, out, scratch);
	return tok_bpe_heap(t, s, NULL, n, out, scratch);
}

size_t tok_bpe_ids(const struct tok *t, const uint32_t *init, size_t n, uint32_t *out, void *scratch) {
	if (n <= TOK_BPE_SMALL)
		return tok_bpe_small(t, NULL, init, n, out, scratch);
	return tok_bpe_heap(t, NULL, init, n, out, scratch);
}

size_t tok_model_encode(const struct tok *t, const uint8_t *s, size_t n, uint32_t *out, void *scratch) {
	if (t->model)
		return t->model(t, s, n, out, scratch);
	return tok_bpe(t, s, n, out, scratch);
}

size_t tok_model_scratch_size(const struct tok *t, size_t n) {
	return t->model_scratch ? t->model_scratch(t, n) : tok_bpe_scratch_size(n);
}
