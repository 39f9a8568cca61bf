/* SPDX-License-Identifier: MIT */
/*
 * The cache directory (cache.h). A build holds an exclusive flock on its
 * temporary file; a pin holds a shared flock on the entry. Eviction takes an
 * exclusive flock without waiting before it unlinks, so it fails on exactly
 * the files someone builds or reads.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/cache/cache.h"
#include "daemon/io/sums.h"
#include "proto/macro.h"

struct cache_build {
	char *dir;
	char *path;
	char *tmp;
	int fd;              /* the temporary file, locked LOCK_EX */
	uint64_t max_bytes;
	uint32_t block;
	uint64_t reserved;   /* bytes of the entry (data + trailer) room was made for */
	struct sums_writer *w;
};

struct cache_pin {
	int fd;
};

/* Builds of this process, numbering their temporary files. */
static unsigned build_seq;

/* "NAME.tmp-DIGITS" (a sequence number of 10 digits, then the pid): a build's temporary file. */
static bool is_tmp(const char *name)
{
	const char *t = strstr(name, ".tmp-");
	if (!t || !t[5])
		return false;
	for (const char *p = t + 5; *p; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

/* Whether nobody holds a lock on dir/name; removes it then (under our own exclusive lock). */
static int remove_unlocked(int dfd, const char *name)
{
	_cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		return errno == EWOULDBLOCK ? 0 : -errno;
	if (unlinkat(dfd, name, 0) < 0)
		return errno == ENOENT ? 0 : -errno;
	return 1;
}

int cache_clean(const char *dir, char *err, size_t errlen)
{
	if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
		int r = -errno;
		snprintf(err, errlen, "cache_dir %s: cannot create: %s", dir, strerror(-r));
		return r;
	}
	DIR *d = opendir(dir);
	if (!d) {
		int r = -errno;
		snprintf(err, errlen, "cache_dir %s: cannot open: %s", dir, strerror(-r));
		return r;
	}
	int removed = 0;
	for (struct dirent *e; (e = readdir(d));) {
		if (e->d_name[0] == '.' || !is_tmp(e->d_name))
			continue;
		/* A live build holds its file locked; a crashed one's lock went with it. */
		if (remove_unlocked(dirfd(d), e->d_name) > 0)
			removed++;
	}
	closedir(d);
	return removed;
}

struct entry {
	char *name;
	uint64_t size;
	struct timespec used;
};

static int cmp_used(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	if (x->used.tv_sec != y->used.tv_sec)
		return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
	if (x->used.tv_nsec != y->used.tv_nsec)
		return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* Lists the regular files of dir (but the lock file) and their total size. */
static int list(int dfd, struct entry **ret, size_t *ret_n, uint64_t *ret_total)
{
	int fd = dup(dfd);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	rewinddir(d);
	struct entry *v = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	int r = 0;
	for (struct dirent *e; (e = readdir(d));) {
		struct stat st;
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || strcmp(e->d_name, ".lock") == 0)
			continue;
		if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		total += (uint64_t)st.st_size;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			struct entry *g = realloc(v, cap * sizeof(*v));
			if (!g) {
				r = -ENOMEM;
				break;
			}
			v = g;
		}
		v[n] = (struct entry){ .name = strdup(e->d_name), .size = (uint64_t)st.st_size, .used = st.st_mtim };
		if (!v[n].name) {
			r = -ENOMEM;
			break;
		}
		n++;
	}
	closedir(d);
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			free(v[i].name);
		free(v);
		return r;
	}
	*ret = v;
	*ret_n = n;
	*ret_total = total;
	return 0;
}

int64_t cache_usage(const char *dir)
{
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	struct entry *v = NULL;
	size_t n = 0;
	uint64_t total = 0;
	int r = list(dfd, &v, &n, &total);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	return (int64_t)total;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The index of NAME.data's NAME.idx, or of NAME.idx's NAME.data, in v; -1 when none. */
static ssize_t sibling(const struct entry *v, size_t n, const char *name)
{
	const char *from = ends_with(name, ".idx") ? ".idx" : ends_with(name, ".data") ? ".data" : NULL;
	if (!from)
		return -1;
	const char *to = from[1] == 'i' ? ".data" : ".idx";
	size_t stem = strlen(name) - strlen(from);
	for (size_t j = 0; j < n; j++)
		if (strncmp(v[j].name, name, stem) == 0 && strcmp(v[j].name + stem, to) == 0)
			return (ssize_t)j;
	return -1;
}

int64_t cache_evict(const char *dir, uint64_t max_bytes, uint64_t need)
{
	if (max_bytes == 0)
		return 0;
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	/* One evictor at a time, across processes. */
	_cleanup_close_ int lk = openat(dfd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (lk < 0)
		return -errno;
	while (flock(lk, LOCK_EX) < 0)
		if (errno != EINTR)
			return -errno;
	struct entry *v = NULL;
	size_t n = 0;
	uint64_t total = 0;
	int r = list(dfd, &v, &n, &total);
	if (r < 0)
		return r;
	int64_t freed = 0;
	if (need > max_bytes || total > max_bytes - need) {
		qsort(v, n, sizeof(*v), cmp_used);
		for (size_t i = 0; i < n && total > max_bytes - MIN(need, max_bytes); i++) {
			if (is_tmp(v[i].name) || v[i].size == UINT64_MAX)
				continue; /* a build in progress (a stale one is cache_clean's), or gone with its copy */
			/*
			 * An index goes with its copy, never before it: a pinned copy whose
			 * index went would be built again beside itself, its old inode
			 * still on disk until unpinned.
			 */
			ssize_t sib = sibling(v, n, v[i].name);
			if (ends_with(v[i].name, ".idx") && sib >= 0)
				continue;
			int k = remove_unlocked(dfd, v[i].name);
			if (k > 0) {
				total -= v[i].size;
				freed += (int64_t)v[i].size;
				if (sib >= 0 && v[sib].size != UINT64_MAX && remove_unlocked(dfd, v[sib].name) > 0) {
					total -= v[sib].size;
					freed += (int64_t)v[sib].size;
					v[sib].size = UINT64_MAX; /* gone */
				}
			}
		}
	}
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
	if (need > max_bytes || total > max_bytes - need)
		return -ENOSPC;
	return freed;
}

int cache_build_begin(const char *dir, uint64_t max_bytes, const char *path, uint32_t block,
		      struct cache_build **ret, char *err, size_t errlen)
{
	struct cache_build *b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->fd = -1;
	b->max_bytes = max_bytes;
	b->block = block;
	if (!(b->dir = strdup(dir)) || !(b->path = strdup(path)) ||
	    asprintf(&b->tmp, "%s.tmp-%010u%d", path, __atomic_fetch_add(&build_seq, 1, __ATOMIC_RELAXED),
		     (int)getpid()) < 0) {
		b->tmp = NULL;
		cache_build_abort(b);
		return -ENOMEM;
	}
	int r;
	/* Its own name (a build of the same entry may run on another thread, or in another process): never truncates one. */
	b->fd = open(b->tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (b->fd < 0 || flock(b->fd, LOCK_EX) < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create: %s", b->tmp, strerror(-r));
		cache_build_abort(b);
		return r;
	}
	r = sums_writer_new(b->fd, block, &b->w);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot start its checksums: %s", b->tmp, strerror(-r));
		cache_build_abort(b);
		return r;
	}
	*ret = b;
	return 0;
}

/* The entry's size on disk once it holds `data` bytes: the data and its checksum trailer. */
static uint64_t entry_bytes(uint64_t data, uint32_t block)
{
	return data + (data + block - 1) / block * 8 + SUMS_FOOTER;
}

/* Makes room for the entry to hold `data` bytes of data, one growth step at a time. */
static int reserve(struct cache_build *b, uint64_t data, char *err, size_t errlen)
{
	if (b->max_bytes == 0)
		return 0;
	uint64_t want = entry_bytes(data, b->block);
	if (want <= b->reserved)
		return 0;
	if (want > b->max_bytes) {
		snprintf(err, errlen, "%s: the cache entry would pass cache_max_bytes (%" PRIu64
			 " bytes) on its own; raise cache_max_bytes or split the shard", b->path, b->max_bytes);
		return -EFBIG;
	}
	uint64_t step = MIN((uint64_t)CACHE_STEP, MAX(b->max_bytes / 16, (uint64_t)1));
	uint64_t target = MIN(MAX(want, b->reserved + step), b->max_bytes);
	/* The temporary file is counted at its present size by cache_evict. */
	uint64_t have = sums_writer_size(b->w);
	int64_t e = cache_evict(b->dir, b->max_bytes, target - MIN(have, target));
	if (e == -ENOSPC && target > want) {
		target = want;
		e = cache_evict(b->dir, b->max_bytes, target - MIN(have, target));
	}
	if (e < 0) {
		if (e == -ENOSPC)
			snprintf(err, errlen, "%s: no room in the cache for %" PRIu64 " bytes under cache_max_bytes (%" PRIu64
				 " bytes): the rest is in use by open shards or other builds", b->path, want, b->max_bytes);
		else
			snprintf(err, errlen, "%s: cannot make room in the cache: %s", b->path, strerror((int)-e));
		return (int)e;
	}
	b->reserved = target;
	return 0;
}

int cache_build_write(struct cache_build *b, const void *p, size_t n, char *err, size_t errlen)
{
	int r = reserve(b, sums_writer_size(b->w) + n, err, errlen);
	if (r < 0)
		return r;
	r = sums_writer_write(b->w, p, n);
	if (r < 0)
		snprintf(err, errlen, "%s: cannot write: %s", b->tmp, strerror(-r));
	return r;
}

uint64_t cache_build_size(const struct cache_build *b)
{
	return sums_writer_size(b->w);
}

int cache_build_commit(struct cache_build *b, char *err, size_t errlen)
{
	int r = reserve(b, sums_writer_size(b->w), err, errlen);
	if (r == 0 && (r = sums_writer_finish(b->w, b->fd, NULL)) < 0)
		snprintf(err, errlen, "%s: cannot write its checksums: %s", b->tmp, strerror(-r));
	if (r == 0 && rename(b->tmp, b->path) < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot rename into place: %s", b->path, strerror(-r));
	}
	if (r == 0) {
		/* Renamed: nothing left to remove. */
		free(b->tmp);
		b->tmp = NULL;
	}
	cache_build_abort(b);
	return r;
}

struct cache_build *cache_build_abort(struct cache_build *b)
{
	if (!b)
		return NULL;
	if (b->tmp)
		unlink(b->tmp);
	if (b->fd >= 0)
		close(b->fd);
	sums_writer_free(b->w);
	free(b->tmp);
	free(b->path);
	free(b->dir);
	free(b);
	return NULL;
}

int cache_pin(const char *path, struct cache_pin **ret)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (flock(fd, LOCK_SH) < 0)
		if (errno != EINTR)
			return -errno;
	/* Evicted between our open and our lock: the name is gone or names a new file. */
	struct stat a, b;
	if (fstat(fd, &a) < 0)
		return -errno;
	if (stat(path, &b) < 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev)
		return -ENOENT;
	/* Used now: eviction goes by mtime, least recent first. */
	(void)futimens(fd, (const struct timespec[2]){ { .tv_nsec = UTIME_OMIT }, { .tv_nsec = UTIME_NOW } });
	struct cache_pin *p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->fd = TAKE_FD(fd);
	*ret = p;
	return 0;
}

int cache_pin_fd(const struct cache_pin *p)
{
	return p->fd;
}

struct cache_pin *cache_unpin(struct cache_pin *p)
{
	if (!p)
		return NULL;
	close(p->fd);
	free(p);
	return NULL;
}
