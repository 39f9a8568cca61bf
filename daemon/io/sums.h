/* SPDX-License-Identifier: MIT */
/*
 * Block checksums for files feedd writes and later trusts (docs/checksums.md):
 * the cache's decompressed copies and indexes, `feedctl prep` outputs, and
 * the optional `X.bin.sums` sidecars of Megatron shards.
 *
 * A file's data is cut into fixed blocks of `block` bytes (a power of two;
 * the last block may be shorter), and each block has an XXH3-64 sum. The sums
 * are stored as
 *
 *   u64 sums[n_blocks]          little-endian
 *   struct sums_footer          64 bytes, at the very end
 *
 * either right after the data in the same file (a trailer: the cache's own
 * files, one rename makes data and sums appear together) or alone in a
 * sidecar file (a Megatron .bin, whose format other tools read). The
 * footer's `check` is XXH3-64 over the sums and the footer (with check = 0):
 * a torn or foreign table is refused, and it is the content digest of the
 * data (sums_digest) that a cursor may carry.
 *
 * struct sums is immutable once loaded; any thread may verify with it.
 * struct sums_writer belongs to one thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SUMS_MAGIC "FDSUMS01"
#define SUMS_FOOTER 64
#define SUMS_BLOCK_MIN 512u
#define SUMS_BLOCK_MAX (64u << 20)
/* The block feedd writes unless told otherwise (docs/benchmarks.md, "Checksum cost": reads of whole blocks cost least at the page size). */
#define SUMS_BLOCK_DEFAULT 4096u

struct sums_footer {
	char magic[8];       /* SUMS_MAGIC */
	uint32_t version;    /* 1 */
	uint32_t block;      /* bytes per block, a power of two in SUMS_BLOCK_MIN .. SUMS_BLOCK_MAX */
	uint64_t data_size;  /* bytes covered */
	uint64_t n_blocks;   /* ceil(data_size / block) */
	uint64_t extra_size; /* a companion file covered whole (Megatron: the .idx), 0 when none */
	uint64_t extra_hash; /* its XXH3-64 */
	uint64_t reserved;   /* 0 */
	uint64_t check;      /* XXH3-64 of sums[] then this footer with check = 0 */
};
_Static_assert(sizeof(struct sums_footer) == SUMS_FOOTER, "sums footer layout");

struct sums {
	uint32_t block;
	uint64_t data_size;
	uint64_t n_blocks;
	uint64_t extra_size, extra_hash;
	uint64_t digest;     /* the footer's check */
	uint64_t *sum;       /* n_blocks, host order */
};

struct sums *sums_free(struct sums *s);

/* XXH3-64 of [p, p + n) (the hash every sum and digest uses). */
uint64_t sums_hash(const void *p, size_t n);

/*
 * Checks bytes [offset, offset + n) of the data against the table: offset is
 * a multiple of the block and the range ends on a block boundary or at
 * data_size. Returns 0; -EINVAL for a range that does not fit those rules;
 * -EBADMSG with *ret_bad (if not NULL) the byte offset of the first damaged
 * block.
 */
int sums_verify(const struct sums *s, uint64_t offset, const void *p, size_t n, uint64_t *ret_bad);

/* The block-aligned range covering [offset, offset + len), clipped at data_size. */
static inline void sums_cover(const struct sums *s, uint64_t offset, uint64_t len, uint64_t *ret_lo, uint64_t *ret_hi)
{
	uint64_t m = (uint64_t)s->block - 1;
	uint64_t hi = (offset + len + m) & ~m;
	*ret_lo = offset & ~m;
	*ret_hi = hi < s->data_size ? hi : s->data_size;
}

/*
 * Loads the table at the end of fd, whose size is file_size: a trailer when
 * data_size + table == file_size; with sidecar, a file holding the table
 * alone. Returns 0; -ENODATA when the file holds no table (no magic at its
 * end); -EBADMSG when it is damaged or does not fit the file, with a message
 * in err naming `name` and the offset; or another negative errno.
 */
int sums_load(int fd, uint64_t file_size, bool sidecar, const char *name, struct sums **ret, char *err,
	      size_t errlen);

/*
 * Checks a whole file held in memory that ends in a trailer. Returns the
 * data's size (the bytes before the trailer), or -EBADMSG with a message
 * naming `name` and the offset of the first damaged block or field.
 */
int64_t sums_check_buffer(const void *buf, size_t size, const char *name, char *err, size_t errlen);

/*
 * Sums data as it is written. fd >= 0: sums_writer_write() also writes the
 * bytes to fd; fd < 0: they are only summed (an existing file's sidecar).
 */
struct sums_writer;
int sums_writer_new(int fd, uint32_t block, struct sums_writer **ret);
struct sums_writer *sums_writer_free(struct sums_writer *w);
/* Writes (fd >= 0) and sums [p, p + n). Returns 0 or a negative errno. */
int sums_writer_write(struct sums_writer *w, const void *p, size_t n);
/* Bytes summed so far. */
uint64_t sums_writer_size(const struct sums_writer *w);
/* Records a companion file's size and hash (sums_hash) in the footer. */
void sums_writer_extra(struct sums_writer *w, uint64_t size, uint64_t hash);
/*
 * Appends the table to fd (a trailer after the data; or, for a sidecar, into
 * an fd of its own) and returns the digest in *ret_digest (if not NULL).
 * Returns 0 or a negative errno. The writer is spent afterwards.
 */
int sums_writer_finish(struct sums_writer *w, int fd, uint64_t *ret_digest);

/*
 * Writes the sidecar `path` for `data_path` (its whole content, in blocks
 * of `block`), with the companion file `extra_path` (NULL: none) covered
 * whole: a temporary file renamed into place. Returns 0, or a negative errno
 * with a message in err.
 */
int sums_write_sidecar(const char *path, const char *data_path, const char *extra_path, uint32_t block, char *err,
		       size_t errlen);

/* The size and XXH3-64 of the whole file `path`. Returns 0, or a negative errno with a message. */
int sums_hash_file(const char *path, uint64_t *ret_size, uint64_t *ret_hash, char *err, size_t errlen);
