/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "daemon/order/mix.h"
#include "daemon/order/order.h"
#include "proto/macro.h"

__extension__ typedef unsigned __int128 u128;

int mix_parse_weight(const char *text, uint64_t *ret_units)
{
	uint64_t whole = 0, frac = 0;
	unsigned int_digits = 0, frac_digits = 0;
	const char *p = text;

	for (; *p >= '0' && *p <= '9'; p++, int_digits++) {
		if (whole > MIX_WEIGHT_MAX_UNITS / MIX_UNITS_PER_WEIGHT)
			return -EINVAL;
		whole = whole * 10 + (uint64_t)(*p - '0');
	}
	if (*p == '.') {
		for (p++; *p >= '0' && *p <= '9'; p++, frac_digits++) {
			if (frac_digits == 9)
				return -EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
		}
		if (frac_digits == 0)
			return -EINVAL;
	}
	if (*p || int_digits == 0)
		return -EINVAL;
	for (unsigned i = frac_digits; i < 9; i++)
		frac *= 10;
	if (whole > MIX_WEIGHT_MAX_UNITS / MIX_UNITS_PER_WEIGHT)
		return -EINVAL;
	uint64_t units = whole * MIX_UNITS_PER_WEIGHT + frac;
	if (units == 0 || units > MIX_WEIGHT_MAX_UNITS)
		return -EINVAL;
	*ret_units = units;
	return 0;
}

_printf_(4, 5) static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (errlen)
		vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return code;
}

static bool name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
	       c == '.';
}

/* [a, b) without the spaces and tabs around it. */
static void trim(const char **a, const char **b)
{
	while (*a < *b && (**a == ' ' || **a == '\t'))
		(*a)++;
	while (*b > *a && ((*b)[-1] == ' ' || (*b)[-1] == '\t'))
		(*b)--;
}

int mix_parse(const char *text, struct mix_spec *ret, char *err, size_t errlen)
{
	struct mix_spec spec = { 0 };
	const char *p = text;

	for (unsigned entry = 1;; entry++) {
		const char *end = strchr(p, ',');
		if (!end)
			end = p + strlen(p);
		const char *a = p, *b = end;
		trim(&a, &b);
		int len = (int)(b - a);
		if (spec.n == MIX_MAX_SOURCES)
			return fail(err, errlen, -EINVAL, "more than %d sources", MIX_MAX_SOURCES);
		const char *colon = memchr(a, ':', (size_t)(b - a));
		if (!colon)
			return fail(err, errlen, -EINVAL, "entry %u ('%.*s') is not name:weight", entry, len, a);

		const char *na = a, *nb = colon;
		trim(&na, &nb);
		if (nb == na || nb - na > MIX_NAME_MAX)
			return fail(err, errlen, -EINVAL, "entry %u ('%.*s'): the name must be 1 to %d characters", entry,
				    len, a, MIX_NAME_MAX);
		for (const char *c = na; c < nb; c++)
			if (!name_char(*c))
				return fail(err, errlen, -EINVAL,
					    "entry %u ('%.*s'): '%c' is not allowed in a source name (A-Z a-z 0-9 _ - .)",
					    entry, len, a, *c);
		char name[MIX_NAME_MAX + 1];
		memcpy(name, na, (size_t)(nb - na));
		name[nb - na] = 0;
		for (uint32_t i = 0; i < spec.n; i++)
			if (strcmp(spec.names[i], name) == 0)
				return fail(err, errlen, -EINVAL, "entry %u: source '%s' is named twice", entry, name);

		const char *wa = colon + 1, *wb = b;
		trim(&wa, &wb);
		char weight[32];
		uint64_t units;
		if (wb - wa >= (long)sizeof(weight))
			units = 0;
		else {
			memcpy(weight, wa, (size_t)(wb - wa));
			weight[wb - wa] = 0;
		}
		if (wb - wa >= (long)sizeof(weight) || mix_parse_weight(weight, &units) < 0)
			return fail(err, errlen, -EINVAL,
				    "entry %u ('%.*s'): weight '%.*s' is not a decimal number above 0 and at most 1000000 "
				    "with at most 9 digits after the point",
				    entry, len, a, (int)(wb - wa), wa);

		memcpy(spec.names[spec.n], name, sizeof(name));
		spec.units[spec.n++] = units;
		if (!*end)
			break;
		p = end + 1;
	}
	*ret = spec;
	return 0;
}

int mix_init(uint64_t seed, const uint64_t *units, uint32_t n, struct mix *ret)
{
	if (n < 1 || n > MIX_MAX_SOURCES)
		return -EINVAL;
	struct mix m = { .n = n, .u0 = order_mix(seed ^ MIX_TAG) };
	uint64_t total = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (units[i] < 1 || units[i] > MIX_WEIGHT_MAX_UNITS)
			return -EINVAL;
		m.units[i] = units[i];
		total += units[i];
	}
	/* bound[i] = floor(2^64 * (units[0] + .. + units[i]) / total), exact in 128 bits. */
	uint64_t prefix = 0;
	for (uint32_t i = 0; i + 1 < n; i++) {
		prefix += units[i];
		m.bound[i] = (uint64_t)(((u128)prefix << 64) / total);
	}
	m.bound[n - 1] = UINT64_MAX;
	*ret = m;
	return 0;
}
