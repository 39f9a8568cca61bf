/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/pack/bestfit.h"
#include "proto/macro.h"

/*
 * The open rows, ordered by (remaining space, row index), as a treap whose
 * keys are remaining << 32 | row. Best fit is then one lower-bound search:
 * the smallest key >= length << 32 is the row with the least room that still
 * fits, and of those the oldest. Each row is in the set at most once, so the
 * node of row i is nodes[i + 1] and node 0 is "none". The priorities only
 * shape the tree, never the answer.
 */
struct treap_node {
	uint64_t key;
	uint64_t prio;
	uint32_t left, right;
};

struct treap {
	struct treap_node *nodes;
	uint32_t root;
};

static uint64_t treap_prio(uint32_t node)
{
	uint64_t x = (uint64_t)node * UINT64_C(0x9E3779B97F4A7C15);
	x ^= x >> 31;
	x *= UINT64_C(0xBF58476D1CE4E5B9);
	return x ^ (x >> 29);
}

/* Splits t into keys < key (*l) and keys >= key (*r). */
static void treap_split(struct treap_node *n, uint32_t t, uint64_t key, uint32_t *l, uint32_t *r)
{
	if (!t) {
		*l = *r = 0;
	} else if (n[t].key < key) {
		treap_split(n, n[t].right, key, &n[t].right, r);
		*l = t;
	} else {
		treap_split(n, n[t].left, key, l, &n[t].left);
		*r = t;
	}
}

/* Joins l and r, every key of l below every key of r. */
static uint32_t treap_merge(struct treap_node *n, uint32_t l, uint32_t r)
{
	if (!l || !r)
		return l ? l : r;
	if (n[l].prio > n[r].prio) {
		n[l].right = treap_merge(n, n[l].right, r);
		return l;
	}
	n[r].left = treap_merge(n, l, n[r].left);
	return r;
}

static void treap_insert(struct treap *t, uint32_t node, uint64_t key)
{
	uint32_t l, r;
	t->nodes[node] = (struct treap_node){ .key = key, .prio = treap_prio(node) };
	treap_split(t->nodes, t->root, key, &l, &r);
	t->root = treap_merge(t->nodes, treap_merge(t->nodes, l, node), r);
}

static void treap_erase(struct treap *t, uint64_t key)
{
	uint32_t l, mid, r;
	treap_split(t->nodes, t->root, key, &l, &r);
	treap_split(t->nodes, r, key + 1, &mid, &r);
	t->root = treap_merge(t->nodes, l, r);
}

/* The node with the smallest key >= key, or 0. */
static uint32_t treap_lower_bound(const struct treap *t, uint64_t key)
{
	uint32_t best = 0;
	for (uint32_t x = t->root; x;) {
		if (t->nodes[x].key >= key) {
			best = x;
			x = t->nodes[x].left;
		} else {
			x = t->nodes[x].right;
		}
	}
	return best;
}

/* Decreasing length; equal lengths keep their buffer order (the item's index). */
static int cmp_items(const void *a, const void *b, void *ctx)
{
	const struct bestfit_item *items = ctx;
	uint32_t i = *(const uint32_t *)a, j = *(const uint32_t *)b;
	if (items[i].length != items[j].length)
		return items[i].length > items[j].length ? -1 : 1;
	return (i > j) - (i < j);
}

void bestfit_packing_clear(struct bestfit_packing *p)
{
	free(p->items);
	free(p->rows);
	*p = (struct bestfit_packing){ 0 };
}

int bestfit_pack(const uint64_t *lengths, size_t n, uint32_t seq_len, struct bestfit_packing *ret)
{
	if (seq_len == 0)
		return -EINVAL;
	uint64_t n_items = 0;
	for (size_t i = 0; i < n; i++) {
		if (lengths[i] == 0)
			return -EINVAL;
		n_items += lengths[i] / seq_len + (lengths[i] % seq_len != 0);
		if (n_items >= UINT32_MAX)
			return -EOVERFLOW;
	}

	size_t m = (size_t)n_items;
	_cleanup_free_ struct bestfit_item *items = malloc(MAX(m, (size_t)1) * sizeof(*items));
	_cleanup_free_ struct bestfit_item *placed = malloc(MAX(m, (size_t)1) * sizeof(*placed));
	_cleanup_free_ uint32_t *order = malloc(MAX(m, (size_t)1) * sizeof(*order));
	_cleanup_free_ uint32_t *row_of = malloc(MAX(m, (size_t)1) * sizeof(*row_of));
	_cleanup_free_ uint32_t *room = malloc(MAX(m, (size_t)1) * sizeof(*room));
	_cleanup_free_ struct treap_node *nodes = calloc(m + 1, sizeof(*nodes));
	_cleanup_free_ struct bestfit_row *rows = calloc(MAX(m, (size_t)1), sizeof(*rows));
	if (!items || !placed || !order || !row_of || !room || !nodes || !rows)
		return -ENOMEM;

	/* Items in buffer order: each document, or its chunks of L and the rest. */
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		for (uint64_t off = 0; off < lengths[i]; off += seq_len)
			items[k++] = (struct bestfit_item){
				.doc = (uint32_t)i, .length = (uint32_t)MIN(lengths[i] - off, (uint64_t)seq_len), .offset = off,
			};
	if (seq_len <= 4 * (uint64_t)m + 65536) {
		/*
		 * Counting sort by length, longest first: stable, so equal lengths
		 * keep their buffer order, and O(items + L) where a comparison
		 * sort was a tenth of the packer's time (bench/padding).
		 */
		_cleanup_free_ size_t *at_len = calloc((size_t)seq_len + 2, sizeof(*at_len));
		if (!at_len)
			return -ENOMEM;
		for (size_t i = 0; i < m; i++)
			at_len[seq_len - items[i].length + 1]++;
		for (uint32_t l = 1; l <= seq_len; l++)
			at_len[l] += at_len[l - 1];
		for (uint32_t i = 0; i < m; i++)
			order[at_len[seq_len - items[i].length]++] = i;
	} else {
		for (uint32_t i = 0; i < m; i++)
			order[i] = i;
		qsort_r(order, m, sizeof(*order), cmp_items, items);
	}

	struct treap open = { .nodes = nodes };
	uint32_t n_rows = 0;
	for (size_t i = 0; i < m; i++) {
		uint32_t len = items[order[i]].length, row;
		uint32_t x = treap_lower_bound(&open, (uint64_t)len << 32);
		if (x) {
			row = x - 1;
			treap_erase(&open, nodes[x].key);
		} else {
			row = n_rows++;
			room[row] = seq_len;
		}
		room[row] -= len;
		if (room[row] > 0)
			treap_insert(&open, row + 1, (uint64_t)room[row] << 32 | row);
		row_of[order[i]] = row;
		rows[row].n_items++;
	}

	/* Group the items by row, each row's in the order they were placed. */
	size_t at = 0;
	for (uint32_t r = 0; r < n_rows; r++) {
		rows[r].first = at;
		rows[r].used = seq_len - room[r];
		at += rows[r].n_items;
		rows[r].n_items = 0;
	}
	for (size_t i = 0; i < m; i++) {
		struct bestfit_row *r = &rows[row_of[order[i]]];
		placed[r->first + r->n_items++] = items[order[i]];
	}

	bestfit_packing_clear(ret);
	*ret = (struct bestfit_packing){
		.seq_len = seq_len, .items = TAKE_PTR(placed), .n_items = m, .rows = TAKE_PTR(rows), .n_rows = n_rows,
	};
	return 0;
}

int bestfit_init(struct bestfit *bf, uint32_t seq_len, uint64_t buffer_tokens)
{
	if (seq_len == 0 || buffer_tokens < BESTFIT_BUFFER_MIN || buffer_tokens > BESTFIT_BUFFER_MAX)
		return -EINVAL;
	*bf = (struct bestfit){ .seq_len = seq_len, .buffer_tokens = buffer_tokens };
	return 0;
}

void bestfit_clear(struct bestfit *bf)
{
	free(bf->docs);
	free(bf->lengths);
	bestfit_packing_clear(&bf->packing);
	*bf = (struct bestfit){ 0 };
}

/* Takes the next buffer from src and packs it; bf->row = 0. */
static int gather(struct bestfit *bf, const struct pack_source *src)
{
	if (src->mark)
		src->mark(src->userdata);
	bf->n_docs = 0;
	for (uint64_t total = 0; total < bf->buffer_tokens;) {
		struct pack_doc doc;
		int r = src->next(src->userdata, &doc);
		if (r < 0)
			return r;
		if (doc.length == 0)
			return -EINVAL;
		if (bf->n_docs == bf->cap) {
			size_t cap = MAX(bf->cap * 2, (size_t)256);
			struct pack_doc *d = realloc(bf->docs, cap * sizeof(*d));
			if (!d)
				return -ENOMEM;
			bf->docs = d;
			uint64_t *l = realloc(bf->lengths, cap * sizeof(*l));
			if (!l)
				return -ENOMEM;
			bf->lengths = l;
			bf->cap = cap;
		}
		bf->docs[bf->n_docs] = doc;
		bf->lengths[bf->n_docs++] = doc.length;
		total += doc.length;
	}
	int r = bestfit_pack(bf->lengths, bf->n_docs, bf->seq_len, &bf->packing);
	if (r < 0)
		return r;
	bf->row = 0;
	bf->buffers++;
	return 0;
}

int bestfit_plan(struct bestfit *bf, const struct pack_source *src, uint32_t batch_size, uint64_t batch_index,
		 struct pad_batch *plan)
{
	pad_batch_reset(plan, batch_size, bf->seq_len, batch_index);
	for (uint32_t r = 0; r < batch_size; r++) {
		if (bf->row == bf->packing.n_rows) {
			int e = gather(bf, src);
			if (e < 0)
				return e;
		}
		const struct bestfit_row *row = &bf->packing.rows[bf->row++];
		for (uint32_t i = 0; i < row->n_items; i++) {
			const struct bestfit_item *it = &bf->packing.items[row->first + i];
			const struct pack_doc *doc = &bf->docs[it->doc];
			int e = pad_batch_push(plan, doc, it->offset, it->length, r);
			if (e < 0)
				return e;
			plan->counts.cut_docs += it->offset == 0 && it->length < doc->length;
		}
	}
	return 0;
}

int bestfit_resume(struct bestfit *bf, const struct pack_source *src, uint64_t row)
{
	bestfit_packing_clear(&bf->packing);
	bf->row = 0;
	if (row == 0)
		return 0;
	int r = gather(bf, src);
	if (r < 0)
		return r;
	if (row >= bf->packing.n_rows)
		return -EINVAL;
	bf->row = (size_t)row;
	return 0;
}
