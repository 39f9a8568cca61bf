/* SPDX-License-Identifier: MIT */
/*
 * Block checksums (sums.h). The table is little-endian on disk; this code
 * keeps it in host order in memory (every supported host is little-endian;
 * the conversions say where that is assumed).
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "daemon/io/sums.h"
#include "proto/macro.h"

struct sums_writer {
	int fd;
	uint32_t block;
	uint64_t size;          /* bytes summed */
	size_t fill;            /* bytes of the current block summed */
	XXH3_state_t *st;
	uint64_t *sum;
	size_t n, cap;
	uint64_t extra_size, extra_hash;
};

uint64_t sums_hash(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

struct sums *sums_free(struct sums *s)
{
	if (!s)
		return NULL;
	free(s->sum);
	free(s);
	return NULL;
}

int sums_verify(const struct sums *s, uint64_t offset, const void *p, size_t n, uint64_t *ret_bad)
{
	const uint64_t block = s->block;
	if (offset % block || offset > s->data_size || n > s->data_size - offset ||
	    (n % block && offset + n != s->data_size))
		return -EINVAL;
	const uint8_t *b = p;
	for (uint64_t i = offset / block; n > 0; i++) {
		size_t len = (size_t)MIN((uint64_t)n, block);
		if (XXH3_64bits(b, len) != s->sum[i]) {
			if (ret_bad)
				*ret_bad = i * block;
			return -EBADMSG;
		}
		b += len;
		n -= len;
	}
	return 0;
}

static bool block_ok(uint32_t block)
{
	return block >= SUMS_BLOCK_MIN && block <= SUMS_BLOCK_MAX && (block & (block - 1)) == 0;
}

static uint64_t footer_check(const uint64_t *sum_le, uint64_t n, const struct sums_footer *f)
{
	struct sums_footer c = *f;
	c.check = 0;
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		return 0;
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, sum_le, (size_t)n * 8);
	XXH3_64bits_update(st, &c, sizeof(c));
	uint64_t h = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return h;
}

/*
 * Parses the footer at the end of [table, table + table_size) (the table
 * region: sums then footer, any data before it excluded by the caller
 * through expect_data). Fills a new struct sums.
 */
static int parse(const uint8_t *end, uint64_t avail, bool sidecar, const char *name, struct sums **ret, char *err,
		 size_t errlen)
{
	struct sums_footer f;
	if (avail < SUMS_FOOTER)
		return -ENODATA;
	memcpy(&f, end - SUMS_FOOTER, SUMS_FOOTER);
	if (memcmp(f.magic, SUMS_MAGIC, 8) != 0)
		return -ENODATA;
	const uint64_t at = avail - SUMS_FOOTER;
	f.version = le32toh(f.version);
	f.block = le32toh(f.block);
	f.data_size = le64toh(f.data_size);
	f.n_blocks = le64toh(f.n_blocks);
	/* data_size first, so that the sums below cannot overflow: a trailer's data lies in its own file. */
	if (f.version != 1 || !block_ok(f.block) || f.data_size > (UINT64_MAX >> 1) || (!sidecar && f.data_size > avail) ||
	    f.n_blocks != (f.data_size + f.block - 1) / f.block) {
		snprintf(err, errlen, "%s: checksum footer at byte %" PRIu64 " is damaged (version %u, block %u, %" PRIu64
			 " blocks for %" PRIu64 " bytes)", name, at, f.version, f.block, f.n_blocks, f.data_size);
		return -EBADMSG;
	}
	uint64_t table = f.n_blocks * 8 + SUMS_FOOTER;
	uint64_t want = sidecar ? table : f.data_size + table;
	if (f.n_blocks > avail / 8 || want != avail) {
		snprintf(err, errlen, "%s: checksum footer at byte %" PRIu64 " describes %" PRIu64
			 " bytes of data, which does not fit the file's %" PRIu64 " bytes", name, at, f.data_size, avail);
		return -EBADMSG;
	}
	const uint8_t *sum_le = end - table;
	/* The footer as stored, for its check. */
	struct sums_footer raw;
	memcpy(&raw, end - SUMS_FOOTER, SUMS_FOOTER);
	if (footer_check((const uint64_t *)(const void *)sum_le, f.n_blocks, &raw) != le64toh(raw.check)) {
		snprintf(err, errlen, "%s: checksum table at byte %" PRIu64 " is damaged (its own check fails)", name,
			 avail - table);
		return -EBADMSG;
	}
	struct sums *s = calloc(1, sizeof(*s));
	if (!s || !(s->sum = malloc(MAX(f.n_blocks, 1u) * 8))) {
		free(s);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < f.n_blocks; i++) {
		uint64_t v;
		memcpy(&v, sum_le + i * 8, 8);
		s->sum[i] = le64toh(v);
	}
	s->block = f.block;
	s->data_size = f.data_size;
	s->n_blocks = f.n_blocks;
	s->extra_size = le64toh(raw.extra_size);
	s->extra_hash = le64toh(raw.extra_hash);
	s->digest = le64toh(raw.check);
	*ret = s;
	return 0;
}

static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t r = pread(fd, p, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ENODATA;
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

int sums_load(int fd, uint64_t file_size, bool sidecar, const char *name, struct sums **ret, char *err,
	      size_t errlen)
{
	uint8_t foot[SUMS_FOOTER];
	if (file_size < SUMS_FOOTER)
		return -ENODATA;
	int r = pread_all(fd, foot, SUMS_FOOTER, file_size - SUMS_FOOTER);
	if (r < 0)
		return r;
	struct sums_footer f;
	memcpy(&f, foot, sizeof(f));
	if (memcmp(f.magic, SUMS_MAGIC, 8) != 0)
		return -ENODATA;
	uint64_t n = le64toh(f.n_blocks);
	if (n > (file_size - SUMS_FOOTER) / 8) {
		snprintf(err, errlen, "%s: checksum footer at byte %" PRIu64 " counts %" PRIu64 " blocks, more than the file holds",
			 name, file_size - SUMS_FOOTER, n);
		return -EBADMSG;
	}
	size_t table = (size_t)n * 8 + SUMS_FOOTER;
	_cleanup_free_ uint8_t *buf = malloc(table);
	if (!buf)
		return -ENOMEM;
	r = pread_all(fd, buf, table, file_size - table);
	if (r < 0)
		return r;
	/* parse() sees the table's end and how many bytes precede it in the file. */
	struct sums *s = NULL;
	uint64_t avail = file_size;
	r = parse(buf + table, avail, sidecar, name, &s, err, errlen);
	if (r < 0)
		return r == -ENODATA ? -EBADMSG : r;
	*ret = s;
	return 0;
}

int64_t sums_check_buffer(const void *buf, size_t size, const char *name, char *err, size_t errlen)
{
	struct sums *s = NULL;
	int r = parse((const uint8_t *)buf + size, size, false, name, &s, err, errlen);
	if (r == -ENODATA) {
		snprintf(err, errlen, "%s: no checksum trailer", name);
		return -EBADMSG;
	}
	if (r < 0)
		return r;
	uint64_t bad = 0;
	r = sums_verify(s, 0, buf, (size_t)s->data_size, &bad);
	int64_t data = (int64_t)s->data_size;
	sums_free(s);
	if (r < 0) {
		snprintf(err, errlen, "%s: block at byte %" PRIu64 " does not match its checksum", name, bad);
		return -EBADMSG;
	}
	return data;
}

int sums_writer_new(int fd, uint32_t block, struct sums_writer **ret)
{
	if (!block_ok(block))
		return -EINVAL;
	struct sums_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = fd;
	w->block = block;
	w->st = XXH3_createState();
	if (!w->st) {
		free(w);
		return -ENOMEM;
	}
	XXH3_64bits_reset(w->st);
	*ret = w;
	return 0;
}

struct sums_writer *sums_writer_free(struct sums_writer *w)
{
	if (!w)
		return NULL;
	XXH3_freeState(w->st);
	free(w->sum);
	free(w);
	return NULL;
}

static int push(struct sums_writer *w, uint64_t h)
{
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 1024;
		uint64_t *s = realloc(w->sum, cap * 8);
		if (!s)
			return -ENOMEM;
		w->sum = s;
		w->cap = cap;
	}
	w->sum[w->n++] = htole64(h);
	return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = write(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

int sums_writer_write(struct sums_writer *w, const void *p, size_t n)
{
	int r;
	if (w->fd >= 0 && (r = write_all(w->fd, p, n)) < 0)
		return r;
	const uint8_t *b = p;
	w->size += n;
	while (n) {
		if (w->fill == 0 && n >= w->block) {
			/* A whole block at once: the one-shot hash is faster than the streaming state. */
			if ((r = push(w, XXH3_64bits(b, w->block))) < 0)
				return r;
			b += w->block;
			n -= w->block;
			continue;
		}
		size_t k = MIN(n, (size_t)w->block - w->fill);
		XXH3_64bits_update(w->st, b, k);
		w->fill += k;
		b += k;
		n -= k;
		if (w->fill == w->block) {
			if ((r = push(w, XXH3_64bits_digest(w->st))) < 0)
				return r;
			XXH3_64bits_reset(w->st);
			w->fill = 0;
		}
	}
	return 0;
}

uint64_t sums_writer_size(const struct sums_writer *w)
{
	return w->size;
}

void sums_writer_extra(struct sums_writer *w, uint64_t size, uint64_t hash)
{
	w->extra_size = size;
	w->extra_hash = hash;
}

int sums_writer_finish(struct sums_writer *w, int fd, uint64_t *ret_digest)
{
	int r;
	if (w->fill > 0) {
		if ((r = push(w, XXH3_64bits_digest(w->st))) < 0)
			return r;
		w->fill = 0;
	}
	struct sums_footer f = {
		.version = htole32(1),
		.block = htole32(w->block),
		.data_size = htole64(w->size),
		.n_blocks = htole64(w->n),
		.extra_size = htole64(w->extra_size),
		.extra_hash = htole64(w->extra_hash),
	};
	memcpy(f.magic, SUMS_MAGIC, 8);
	uint64_t check = footer_check(w->sum, w->n, &f);
	f.check = htole64(check);
	r = write_all(fd, (const uint8_t *)w->sum, w->n * 8);
	if (r == 0)
		r = write_all(fd, (const uint8_t *)&f, sizeof(f));
	if (r == 0 && ret_digest)
		*ret_digest = check;
	return r;
}

/* Sums the whole of `path` into w (or only hashes it when w is NULL). */
static int sum_file(const char *path, struct sums_writer *w, uint64_t *ret_size, uint64_t *ret_hash, char *err,
		    size_t errlen)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int r = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(-r));
		return r;
	}
	const size_t cap = 8u << 20;
	_cleanup_free_ uint8_t *buf = malloc(cap);
	XXH3_state_t *st = XXH3_createState();
	if (!buf || !st) {
		XXH3_freeState(st);
		return -ENOMEM;
	}
	XXH3_64bits_reset(st);
	uint64_t size = 0;
	int r = 0;
	for (;;) {
		ssize_t n = read(fd, buf, cap);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			snprintf(err, errlen, "%s: read at byte %" PRIu64 " failed: %s", path, size, strerror(-r));
			break;
		}
		if (n == 0)
			break;
		if (w && (r = sums_writer_write(w, buf, (size_t)n)) < 0)
			break;
		if (!w)
			XXH3_64bits_update(st, buf, (size_t)n);
		size += (uint64_t)n;
	}
	if (ret_size)
		*ret_size = size;
	if (ret_hash)
		*ret_hash = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return r;
}

int sums_hash_file(const char *path, uint64_t *ret_size, uint64_t *ret_hash, char *err, size_t errlen)
{
	return sum_file(path, NULL, ret_size, ret_hash, err, errlen);
}

int sums_write_sidecar(const char *path, const char *data_path, const char *extra_path, uint32_t block, char *err,
		       size_t errlen)
{
	struct sums_writer *w = NULL;
	err[0] = 0;
	int r = sums_writer_new(-1, block, &w);
	if (r < 0) {
		snprintf(err, errlen, "%s: block size %u is not a power of two in %u..%u", path, block, SUMS_BLOCK_MIN,
			 SUMS_BLOCK_MAX);
		return r;
	}
	r = sum_file(data_path, w, NULL, NULL, err, errlen);
	if (r == 0 && extra_path) {
		uint64_t size = 0, hash = 0;
		r = sum_file(extra_path, NULL, &size, &hash, err, errlen);
		sums_writer_extra(w, size, hash);
	}
	_cleanup_free_ char *tmp = NULL;
	if (r == 0 && asprintf(&tmp, "%s.tmp-%d", path, (int)getpid()) < 0) {
		tmp = NULL;
		r = -ENOMEM;
	}
	if (r < 0) {
		sums_writer_free(w);
		return r;
	}
	_cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(-r));
	}
	if (r == 0)
		r = sums_writer_finish(w, fd, NULL);
	if (r == 0 && fsync(fd) < 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		if (!err[0])
			snprintf(err, errlen, "%s: cannot write: %s", path, strerror(-r));
		unlink(tmp);
	}
	sums_writer_free(w);
	return r;
}
