/* SPDX-License-Identifier: MIT */
/*
 * A Megatron shard's optional checksum sidecar, X.bin.sums (docs/checksums.md):
 * per-block XXH3 sums of X.bin and the XXH3 of the whole X.idx, written by
 * `feedctl prep` and `feedctl verify --write-sums`. When it is there, the
 * shard's .bin source carries the sums, so every read of the shard checks
 * the blocks it touches (daemon/source/source.h, source_set_sums), and the
 * .idx is checked whole at open. Kept apart from megatron.c's parsing.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "daemon/format/megatron.h"
#include "daemon/io/sums.h"
#include "proto/macro.h"

char *megatron_sums_path(const char *bin_path)
{
	char *p;
	return asprintf(&p, "%s.sums", bin_path) < 0 ? NULL : p;
}

/*
 * The XXH3 of the .idx as mapped (or read) at open: the very bytes the shard
 * serves, not whatever the name holds now, hashed in chunks that each report
 * progress to the loader, so a huge index on slow storage (page faults) is
 * not taken for a hang by load_timeout_s.
 */
static int hash_idx(const struct megatron_shard *s, uint64_t *ret_hash)
{
	const size_t chunk = 8u << 20;
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		return -ENOMEM;
	XXH3_64bits_reset(st);
	for (size_t off = 0; off < s->idx_len; off += chunk) {
		size_t n = s->idx_len - off < chunk ? s->idx_len - off : chunk;
		XXH3_64bits_update(st, s->idx + off, n);
		source_progress(s->idx_path);
	}
	*ret_hash = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return 0;
}

static int open_local(const char *path, int *ret_fd, uint64_t *ret_size, char *err, size_t errlen)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return -ENOENT;
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		int r = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(-r));
		return r;
	}
	*ret_size = (uint64_t)st.st_size;
	*ret_fd = TAKE_FD(fd);
	return 0;
}

/*
 * A remote shard's sidecar, through the source layer (the same endpoint,
 * credentials and retries as the shard): fetched whole into an anonymous
 * file for sums_load(). Not found (HTTP 404): -ENOENT, no sidecar.
 */
static int fetch_remote(const char *url, int *ret_fd, uint64_t *ret_size, char *err, size_t errlen)
{
	/* The listing that found the shard says whether its sidecar is there: no request when it is not. */
	if (source_known_absent(url))
		return -ENOENT;
	struct source *src = NULL;
	int r = source_open(url, &src, err, errlen);
	if (r < 0)
		return r;
	struct source_reader *io = NULL;
	void *buf = NULL;
	uint64_t size = source_size(src);
	r = source_reader_new(IO_ENGINE_PREAD, 1, &io);
	if (r == 0)
		r = source_read_all(io, src, &buf);
	if (r < 0 && !err[0])
		snprintf(err, errlen, "%s: cannot read: %s", url, strerror(-r));
	source_reader_free(io);
	source_close(src);
	_cleanup_close_ int fd = r < 0 ? -1 : memfd_create("feedd-sums", MFD_CLOEXEC);
	if (r == 0 && fd < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: cannot hold it: %s", url, strerror(-r));
	}
	for (uint64_t at = 0; r == 0 && at < size;) {
		ssize_t n = pwrite(fd, (const uint8_t *)buf + at, size - at, (off_t)at);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			snprintf(err, errlen, "%s: cannot hold it: %s", url, strerror(-r));
		}
		at += n > 0 ? (uint64_t)n : 0;
	}
	free(buf);
	if (r < 0)
		return r;
	*ret_size = size;
	*ret_fd = TAKE_FD(fd);
	return 0;
}

int megatron_sums_attach(struct megatron_shard *s, char *err, size_t errlen)
{
	_cleanup_free_ char *path = megatron_sums_path(s->bin_path);
	if (!path)
		return -ENOMEM;
	_cleanup_close_ int fd = -1;
	uint64_t size = 0;
	int r = source_is_remote(path) ? fetch_remote(path, &fd, &size, err, errlen) : open_local(path, &fd, &size, err, errlen);
	if (r == -ENOENT)
		return 0; /* no sidecar: the shard is served unchecked, as before */
	if (r < 0)
		return r;
	struct sums *sums = NULL;
	r = sums_load(fd, size, true, path, &sums, err, errlen);
	if (r == -ENODATA) {
		snprintf(err, errlen, "%s: not a checksum file (no %s footer)", path, SUMS_MAGIC);
		return -EBADMSG;
	}
	if (r < 0)
		return r;
	if (sums->data_size != s->bin_id.size) {
		snprintf(err, errlen, "%s: covers %" PRIu64 " bytes but %s holds %" PRIu64
			 ": the sidecar belongs to another version of the shard", path, sums->data_size, s->bin_path,
			 (uint64_t)s->bin_id.size);
		sums_free(sums);
		return -EBADMSG;
	}
	if (sums->extra_size || sums->extra_hash) {
		uint64_t idx_size = s->idx_len, hash = 0;
		r = hash_idx(s, &hash);
		if (r == 0 && (idx_size != sums->extra_size || hash != sums->extra_hash)) {
			snprintf(err, errlen, "%s: does not match the checksum in %s (%" PRIu64 " bytes, %" PRIu64
				 " recorded): the file is damaged or changed", s->idx_path, path, idx_size, sums->extra_size);
			r = -EBADMSG;
		}
		if (r < 0) {
			sums_free(sums);
			return r;
		}
	}
	s->sums_digest = sums->digest;
	s->sums_block = sums->block;
	r = source_set_sums(s->bin, sums);
	if (r < 0) {
		sums_free(sums);
		snprintf(err, errlen, "%s: covers more than %s holds", path, s->bin_path);
	}
	return r;
}

uint64_t megatron_sums_digest(const struct megatron_shard *s)
{
	return s->sums_digest;
}
