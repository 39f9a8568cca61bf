/* SPDX-License-Identifier: MIT */
/* Cursor text encoding with a check value, so typos are caught, not resumed from. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/order/cursor.h"

static uint32_t check_of(const char *s, size_t n)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * UINT64_C(0x100000001b3);
	return (uint32_t)order_mix(h);
}

int cursor_format(const struct cursor *c, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "fc1-%016" PRIx64 "-%" PRIx32 "-%" PRIx32 "-%" PRIx64 "-%" PRIx64 "-%" PRIx32
			 "-%" PRIx64 "-%" PRIx64,
			 c->fingerprint, c->world, c->rank, c->batch, c->pos.epoch, c->pos.window, c->pos.index,
			 c->pos.offset);
	if (n < 0 || (size_t)n >= cap)
		return -ENOBUFS;
	int m = snprintf(buf + n, cap - (size_t)n, "-%08" PRIx32, check_of(buf, (size_t)n));
	if (m < 0 || (size_t)(n + m) >= cap)
		return -ENOBUFS;
	return n + m;
}

/* Parses one '-'-led lower-case hex field of at most 16 digits. */
static int hex_field(const char **p, uint64_t *ret)
{
	const char *s = *p;
	if (*s != '-')
		return -EINVAL;
	s++;
	uint64_t v = 0;
	int digits = 0;
	for (; (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f'); s++, digits++) {
		if (digits == 16)
			return -EINVAL;
		v = v << 4 | (uint64_t)(*s <= '9' ? *s - '0' : *s - 'a' + 10);
	}
	if (digits == 0)
		return -EINVAL;
	*p = s;
	*ret = v;
	return 0;
}

int cursor_parse(const char *text, struct cursor *ret)
{
	if (strncmp(text, "fc1", 3) != 0)
		return -EINVAL;
	const char *p = text + 3;
	uint64_t f[8], check;
	for (size_t i = 0; i < 8; i++) {
		const char *start = p;
		if (hex_field(&p, &f[i]) < 0)
			return -EINVAL;
		if (i == 0 && p - start != 17) /* '-' and exactly 16 digits */
			return -EINVAL;
	}
	size_t body = (size_t)(p - text);
	if (hex_field(&p, &check) < 0 || *p != 0 || p - text - (ptrdiff_t)body != 9)
		return -EINVAL;
	if (check != check_of(text, body))
		return -EINVAL;
	if (f[1] == 0 || f[1] > UINT32_MAX || f[2] >= f[1] || f[5] > UINT32_MAX)
		return -EINVAL;
	*ret = (struct cursor){
		.fingerprint = f[0],
		.world = (uint32_t)f[1],
		.rank = (uint32_t)f[2],
		.batch = f[3],
		.pos = { .epoch = f[4], .window = (uint32_t)f[5], .index = f[6], .offset = f[7] },
	};
	return 0;
}
