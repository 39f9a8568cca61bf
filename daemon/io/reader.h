/* SPDX-License-Identifier: MIT */
/*
 * Batched positional reads. One io_reader per thread: it owns an io_uring
 * (queue depth `depth`) and keeps every request of a batch in flight at once,
 * splitting large requests into chunks and resubmitting short reads. When
 * io_uring cannot be set up (seccomp, kernel.io_uring_disabled, old kernel) or
 * is switched off, the same calls run on pread(2), and the reader says why.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum io_engine {
	IO_ENGINE_AUTO = 0,  /* io_uring, else pread */
	IO_ENGINE_URING = 1, /* io_uring or fail */
	IO_ENGINE_PREAD = 2,
};

struct io_req {
	int fd;
	uint64_t offset;
	size_t len;
	void *dst;
};

struct io_stats {
	uint64_t reads;      /* requests completed */
	uint64_t submits;    /* io_uring_submit calls (or preads) */
	uint64_t bytes;
	uint64_t wait_ns;    /* time spent waiting for completions */
	uint64_t max_inflight;
	uint64_t depth_sum;  /* requests in flight, summed over io_uring submissions ... */
	uint64_t depth_n;    /* ... and the submissions counted: the mean queue depth */
};

struct io_reader;

/*
 * Creates a reader. Returns 0; -ENOMEM; or with IO_ENGINE_URING, the error
 * io_uring setup gave. With IO_ENGINE_AUTO a failed setup falls back to pread
 * and io_reader_fallback() tells why.
 */
int io_reader_new(enum io_engine engine, unsigned depth, struct io_reader **ret);
struct io_reader *io_reader_free(struct io_reader *r);

/* "io_uring" or "pread". */
const char *io_reader_engine(const struct io_reader *r);
/* Negative errno of the failed io_uring setup, 0 if io_uring is in use or was not asked for. */
int io_reader_fallback(const struct io_reader *r);
const struct io_stats *io_reader_stats(const struct io_reader *r);

/*
 * Reads every request fully. Returns 0; or a negative errno, with
 * *ret_failed set to the index of a failing request: -ENODATA when the file
 * ended before the request did (a file shrunk under us), the read's own error
 * otherwise. On error the contents of the destinations are unspecified.
 */
int io_reader_run(struct io_reader *r, const struct io_req *reqs, size_t n, size_t *ret_failed);

/* Reads a whole file of known size into a new buffer (caller frees). */
int io_reader_read_file(struct io_reader *r, int fd, size_t size, void **ret);
