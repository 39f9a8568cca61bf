/* SPDX-License-Identifier: MIT */
/*
 * The fetcher's on-disk block cache (diskcache.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/source/diskcache.h"
#include "proto/macro.h"

#define FILES_MAX 65536

struct diskcache {
	char *dir;
	uint64_t max_bytes, bytes;
	char *files[FILES_MAX]; /* written by us, oldest first (a ring) */
	size_t head, n;
};

struct diskcache *diskcache_new(const char *dir, uint64_t max_bytes)
{
	char *d = NULL;
	if ((mkdir(dir, 0755) < 0 && errno != EEXIST) || asprintf(&d, "%s/s3", dir) < 0)
		return NULL;
	if (mkdir(d, 0755) < 0 && errno != EEXIST) {
		free(d);
		return NULL;
	}
	struct diskcache *c = calloc(1, sizeof(*c));
	if (!c) {
		free(d);
		return NULL;
	}
	c->dir = d;
	c->max_bytes = max_bytes;
	return c;
}

struct diskcache *diskcache_free(struct diskcache *c)
{
	if (!c)
		return NULL;
	for (; c->n; c->n--, c->head = (c->head + 1) % FILES_MAX)
		free(c->files[c->head]);
	free(c->dir);
	free(c);
	return NULL;
}

static void name(const struct diskcache *c, const char *key, uint64_t idx, char *out, size_t n)
{
	snprintf(out, n, "%s/%s.%" PRIu64, c->dir, key, idx);
}

bool diskcache_load(struct diskcache *c, const char *key, uint64_t idx, void *dst, size_t len)
{
	char path[4096];
	name(c, key, idx, path, sizeof(path));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	struct stat st;
	bool ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == len && pread(fd, dst, len, 0) == (ssize_t)len;
	close(fd);
	return ok;
}

void diskcache_store(struct diskcache *c, const char *key, uint64_t idx, const void *data, size_t len)
{
	char path[4096], tmp[4200];
	name(c, key, idx, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp-%d", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	bool ok = write(fd, data, len) == (ssize_t)len;
	close(fd);
	if (!ok || rename(tmp, path) < 0) {
		unlink(tmp);
		return;
	}
	while (c->n && (c->bytes + len > c->max_bytes || c->n == FILES_MAX)) {
		char *old = c->files[c->head];
		struct stat st;
		if (stat(old, &st) == 0) {
			c->bytes -= MIN(c->bytes, (uint64_t)st.st_size);
			unlink(old);
		}
		free(old);
		c->head = (c->head + 1) % FILES_MAX;
		c->n--;
	}
	char *keep = strdup(path);
	if (keep) {
		c->files[(c->head + c->n) % FILES_MAX] = keep;
		c->n++;
		c->bytes += len;
	}
}

uint64_t diskcache_bytes(const struct diskcache *c)
{
	return c ? c->bytes : 0;
}
