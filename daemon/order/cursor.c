/* SPDX-License-Identifier: MIT */
/* Cursor text encoding with a check value, so typos are caught, not resumed from. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "daemon/order/cursor.h"
#include "proto/macro.h"
#include "proto/vstate.h"

static uint32_t check_of(const char *s, size_t n)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * UINT64_C(0x100000001b3);
	return (uint32_t)order_mix(h);
}

/* Appends printf output at *n; false when it does not fit. */
static bool append(char *buf, size_t cap, size_t *n, const char *fmt, ...) _printf_(4, 5);
static bool append(char *buf, size_t cap, size_t *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(buf + *n, cap - *n, fmt, ap);
	va_end(ap);
	if (m < 0 || (size_t)m >= cap - *n)
		return false;
	*n += (size_t)m;
	return true;
}

int cursor_format(const struct cursor *c, char *buf, size_t cap)
{
	size_t n = 0;
	bool ok;
	if (cap < 4)
		return -ENOBUFS;
	if (c->n_sources == 0) {
		memcpy(buf, "fc1", 4);
		n = 3;
		ok = append(buf, cap, &n, "-%016" PRIx64, c->fingerprint) && append(buf, cap, &n, "-%" PRIx32, c->world) &&
		     append(buf, cap, &n, "-%" PRIx32, c->rank) && append(buf, cap, &n, "-%" PRIx64, c->batch) &&
		     append(buf, cap, &n, "-%" PRIx64, c->pos.epoch) && append(buf, cap, &n, "-%" PRIx32, c->pos.window) &&
		     append(buf, cap, &n, "-%" PRIx64, c->pos.index) && append(buf, cap, &n, "-%" PRIx64, c->pos.offset);
	} else {
		memcpy(buf, "fc2", 4);
		n = 3;
		ok = append(buf, cap, &n, "-%016" PRIx64, c->fingerprint) && append(buf, cap, &n, "-%" PRIx32, c->world) &&
		     append(buf, cap, &n, "-%" PRIx32, c->rank) && append(buf, cap, &n, "-%" PRIx64, c->batch) &&
		     append(buf, cap, &n, "-%" PRIx64, c->k) && append(buf, cap, &n, "-%" PRIx64, c->offset) &&
		     append(buf, cap, &n, "-%" PRIx64, c->row) && append(buf, cap, &n, "-%" PRIx32, c->n_sources);
		for (uint32_t i = 0; ok && i < c->n_sources && i < MIX_MAX_SOURCES; i++)
			ok = append(buf, cap, &n, "-%" PRIx64, c->src[i].epoch) &&
			     append(buf, cap, &n, "-%" PRIx32, c->src[i].window) &&
			     append(buf, cap, &n, "-%" PRIx64, c->src[i].index);
	}
	if (ok && c->has_data)
		ok = append(buf, cap, &n, "-%016" PRIx64, c->data);
	/*
	 * k_w (issue #22) follows the data identity: a cursor without data has
	 * none. fc1: its window's, when counts may be unknown (text). fc2: one
	 * per source, every source's, when one of them may be unknown.
	 */
	bool kw = false;
	for (uint32_t i = 0; i < c->n_sources && i < MIX_MAX_SOURCES; i++)
		kw |= c->src[i].has_k;
	if (ok && c->has_data && !c->n_sources && c->pos.has_k)
		ok = append(buf, cap, &n, "-%" PRIx64, c->pos.k);
	for (uint32_t i = 0; ok && c->has_data && kw && i < c->n_sources && i < MIX_MAX_SOURCES; i++)
		ok = append(buf, cap, &n, "-%" PRIx64, c->src[i].k);
	if (!ok || !append(buf, cap, &n, "-%08" PRIx32, check_of(buf, n)))
		return -ENOBUFS;
	return (int)n;
}

int cursor_parse(const char *text, struct cursor *ret)
{
	bool mixed;
	if (strncmp(text, "fc1", 3) == 0)
		mixed = false;
	else if (strncmp(text, "fc2", 3) == 0)
		mixed = true;
	else
		return -EINVAL;
	const char *p = text + 3;
	/* fc1: 8 fields before the check; fc2: 8, then 3 per source. */
	uint64_t f[8 + 3 * MIX_MAX_SOURCES];
	size_t fields = 8;
	for (size_t i = 0; i < fields; i++) {
		const char *start = p;
		if (vstate_hex_field(&p, &f[i]) < 0)
			return -EINVAL;
		if (i == 0 && p - start != 17) /* '-' and exactly 16 digits */
			return -EINVAL;
		if (mixed && i == 7) {
			if (f[7] == 0 || f[7] > MIX_MAX_SOURCES)
				return -EINVAL;
			fields += 3 * (size_t)f[7];
		}
	}
	/*
	 * What follows, up to the check (the last field): nothing, the data
	 * identity (exactly 16 digits), or it and k_w: one (fc1) or one per
	 * source (fc2).
	 */
	const size_t n_kw = mixed ? (size_t)f[7] : 1;
	uint64_t tail[2 + MIX_MAX_SOURCES];
	const char *start = p, *last = p;
	size_t n_tail = 0;
	while (*p == '-') {
		if (n_tail == ARRAY_SIZE(tail))
			return -EINVAL;
		last = p;
		if (vstate_hex_field(&p, &tail[n_tail]) < 0)
			return -EINVAL;
		if (n_tail == 0 && *p == '-' && p - start != 17)
			return -EINVAL;
		n_tail++;
	}
	if (*p != 0 || n_tail == 0 || p - last != 9 || (n_tail > 2 && n_tail != 2 + n_kw))
		return -EINVAL;
	const uint64_t check = tail[n_tail - 1];
	const bool has_data = n_tail >= 2, has_k = n_tail > 2;
	const uint64_t data = has_data ? tail[0] : 0;
	size_t body = (size_t)(last - text);
	if (check != check_of(text, body))
		return -EINVAL;
	if (f[1] == 0 || f[1] > UINT32_MAX || f[2] >= f[1])
		return -EINVAL;
	struct cursor c = { .fingerprint = f[0], .data = data, .has_data = has_data, .world = (uint32_t)f[1],
			    .rank = (uint32_t)f[2], .batch = f[3] };
	if (!mixed) {
		if (f[5] > UINT32_MAX)
			return -EINVAL;
		c.pos = (struct stream_pos){ .epoch = f[4], .window = (uint32_t)f[5], .index = f[6], .offset = f[7],
					     .k = has_k ? tail[1] : 0, .has_k = has_k };
	} else {
		c.k = f[4];
		c.offset = f[5];
		c.row = f[6];
		c.n_sources = (uint32_t)f[7];
		for (uint32_t i = 0; i < c.n_sources; i++) {
			const uint64_t *t = &f[8 + 3 * i];
			if (t[1] > UINT32_MAX)
				return -EINVAL;
			c.src[i] = (struct stream_pos){ .epoch = t[0], .window = (uint32_t)t[1], .index = t[2],
							.k = has_k ? tail[1 + i] : 0, .has_k = has_k };
		}
	}
	*ret = c;
	return 0;
}
