/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "client/feedctl/npy.h"

FILE *npy_create_i32(const char *path, const size_t *shape, size_t ndim)
{
	char dict[256];
	int n = snprintf(dict, sizeof(dict), "{'descr': '<i4', 'fortran_order': False, 'shape': (");
	for (size_t i = 0; i < ndim; i++)
		n += snprintf(dict + n, sizeof(dict) - (size_t)n, "%zu,%s", shape[i], i + 1 < ndim ? " " : "");
	n += snprintf(dict + n, sizeof(dict) - (size_t)n, "), }");
	/* magic(6) + version(2) + length(2) + dict + padding + '\n' is a multiple of 64. */
	size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
	size_t hlen = total - 10;
	if (hlen > 0xffff) {
		errno = EOVERFLOW;
		return NULL;
	}
	FILE *f = fopen(path, "we");
	if (!f)
		return NULL;
	unsigned char pre[10] = { 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
				  (unsigned char)(hlen >> 8) };
	fwrite(pre, 1, sizeof(pre), f);
	fwrite(dict, 1, (size_t)n, f);
	for (size_t i = (size_t)n; i + 1 < hlen; i++)
		fputc(' ', f);
	fputc('\n', f);
	return f;
}
