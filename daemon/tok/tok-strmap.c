/* SPDX-License-Identifier: MIT */
/*
 * A string -> id hash map (open addressing, linear probing) for the
 * vocabularies of the Unigram and WordPiece models.  Read-only, and so
 * shareable between threads, after tok_strmap_finish().
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tok-internal.h"
#include "tok-model.h"

int tok_strmap_add(struct tok_strmap *m, const char *s, size_t n, uint32_t id) {
	if (n >= UINT32_MAX / 2 || m->n_bytes + n + 1 >= UINT32_MAX || m->n_ents >= UINT32_MAX / 4)
		return -E2BIG;
	if (m->n_bytes + n + 1 > m->cap_bytes) {
		size_t cap = m->cap_bytes ? m->cap_bytes * 2 : 4096;
		while (cap < m->n_bytes + n + 1)
			cap *= 2;
		char *b = realloc(m->bytes, cap);
		if (!b)
			return -ENOMEM;
		m->bytes = b;
		m->cap_bytes = cap;
	}
	if (m->n_ents == m->cap_ents) {
		size_t cap = m->cap_ents ? m->cap_ents * 2 : 1024;
		struct tok_strent *e = realloc(m->ents, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		m->ents = e;
		m->cap_ents = cap;
	}
	memcpy(m->bytes + m->n_bytes, s, n);
	m->bytes[m->n_bytes + n] = 0;
	m->ents[m->n_ents++] = (struct tok_strent) {
		.off = (uint32_t) m->n_bytes,
		.len = (uint32_t) n,
		.id = id,
		.hash = (uint32_t) tok_hash_bytes((const uint8_t *) s, n),
	};
	m->n_bytes += n + 1;
	if (n > m->max_len)
		m->max_len = n;
	return 0;
}

int tok_strmap_finish(struct tok_strmap *m) {
	size_t size = 16;

	while (size < m->n_ents * 2)
		size *= 2;
	free(m->slots);
	m->slots = calloc(size, sizeof(*m->slots));
	if (!m->slots)
		return -ENOMEM;
	m->mask = (uint32_t) (size - 1);
	for (size_t i = 0; i < m->n_ents; i++) {
		const struct tok_strent *e = &m->ents[i];
		for (uint32_t k = e->hash & m->mask;; k = (k + 1) & m->mask) {
			uint32_t *sl = &m->slots[k];
			if (*sl == 0) {
				*sl = (uint32_t) i + 1;
				break;
			}
			const struct tok_strent *o = &m->ents[*sl - 1];
			if (o->hash == e->hash && o->len == e->len &&
			    memcmp(m->bytes + o->off, m->bytes + e->off, e->len) == 0) {
				*sl = (uint32_t) i + 1;
				break;
			}
		}
	}
	return 0;
}

void tok_strmap_clear(struct tok_strmap *m) {
	free(m->bytes);
	free(m->ents);
	free(m->slots);
	*m = (struct tok_strmap) { 0 };
}

const struct tok_strent *tok_strmap_get(const struct tok_strmap *m, const uint8_t *s, size_t n) {
	uint32_t h = (uint32_t) tok_hash_bytes(s, n);

	if (!m->slots)
		return NULL;
	for (uint32_t k = h & m->mask;; k = (k + 1) & m->mask) {
		uint32_t sl = m->slots[k];
		if (sl == 0)
			return NULL;
		const struct tok_strent *e = &m->ents[sl - 1];
		if (e->hash == h && e->len == n && memcmp(m->bytes + e->off, s, n) == 0)
			return e;
	}
}
