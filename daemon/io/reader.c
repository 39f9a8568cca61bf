/* SPDX-License-Identifier: MIT */
/*
 * io_uring and pread implementations of io_reader_run(). The io_uring path
 * keeps up to `depth` chunk reads of at most IO_CHUNK bytes in flight; each
 * in-flight read is tracked in a slot whose index is the CQE's user_data.
 */
#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/io/reader.h"
#include "proto/macro.h"

#define IO_CHUNK (1u << 20)

struct inflight {
	size_t req;     /* index of the request */
	uint64_t done;  /* bytes of the request completed before this read */
	uint32_t len;   /* bytes asked for by this read */
};

struct io_reader {
	bool uring;
	int fallback;
	unsigned depth;
	struct io_uring ring;
	struct inflight *slots;
	unsigned *free_slots;
	unsigned n_free;
	struct io_stats stats;
};

int io_reader_new(enum io_engine engine, unsigned depth, struct io_reader **ret)
{
	struct io_reader *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->depth = MAX(depth, 1u);

	if (engine != IO_ENGINE_PREAD) {
		int e = io_uring_queue_init(r->depth, &r->ring, 0);
		if (e < 0) {
			if (engine == IO_ENGINE_URING) {
				free(r);
				return e;
			}
			r->fallback = e;
		} else {
			r->uring = true;
			r->slots = calloc(r->depth, sizeof(*r->slots));
			r->free_slots = calloc(r->depth, sizeof(*r->free_slots));
			if (!r->slots || !r->free_slots) {
				io_reader_free(r);
				return -ENOMEM;
			}
		}
	}
	*ret = r;
	return 0;
}

struct io_reader *io_reader_free(struct io_reader *r)
{
	if (!r)
		return NULL;
	if (r->uring)
		io_uring_queue_exit(&r->ring);
	free(r->slots);
	free(r->free_slots);
	free(r);
	return NULL;
}

const char *io_reader_engine(const struct io_reader *r)
{
	return r->uring ? "io_uring" : "pread";
}

int io_reader_fallback(const struct io_reader *r)
{
	return r->fallback;
}

const struct io_stats *io_reader_stats(const struct io_reader *r)
{
	return &r->stats;
}

static int run_pread(struct io_reader *r, const struct io_req *reqs, size_t n, size_t *ret_failed)
{
	for (size_t i = 0; i < n; i++) {
		size_t done = 0;
		while (done < reqs[i].len) {
			ssize_t k = pread(reqs[i].fd, (char *)reqs[i].dst + done, reqs[i].len - done,
					  (off_t)(reqs[i].offset + done));
			r->stats.submits++;
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) {
				*ret_failed = i;
				return k < 0 ? -errno : -ENODATA;
			}
			done += (size_t)k;
		}
		r->stats.reads++;
		r->stats.bytes += reqs[i].len;
	}
	return 0;
}

static void queue_read(struct io_reader *r, const struct io_req *req, size_t idx, uint64_t done)
{
	unsigned slot = r->free_slots[--r->n_free];
	uint32_t len = (uint32_t)MIN((uint64_t)IO_CHUNK, req->len - done);
	r->slots[slot] = (struct inflight){ .req = idx, .done = done, .len = len };
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	/* The SQ has `depth` entries and at most `depth` slots are taken. */
	io_uring_prep_read(sqe, req->fd, (char *)req->dst + done, len, req->offset + done);
	io_uring_sqe_set_data64(sqe, slot);
}

static int run_uring(struct io_reader *r, const struct io_req *reqs, size_t n, size_t *ret_failed)
{
	r->n_free = r->depth;
	for (unsigned i = 0; i < r->depth; i++)
		r->free_slots[i] = i;

	size_t next = 0;        /* next request to start */
	uint64_t next_done = 0; /* bytes of reqs[next] already queued */
	unsigned inflight = 0;
	int err = 0;

	for (;;) {
		/* Fill the queue: later chunks of a large request, then new requests. */
		while (!err && r->n_free > 0 && next < n) {
			if (reqs[next].len == 0) {
				next++;
				continue;
			}
			queue_read(r, &reqs[next], next, next_done);
			inflight++;
			next_done += MIN((uint64_t)IO_CHUNK, reqs[next].len - next_done);
			if (next_done == reqs[next].len) {
				next++;
				next_done = 0;
			}
		}
		if (inflight == 0)
			break;
		r->stats.max_inflight = MAX(r->stats.max_inflight, (uint64_t)inflight);
		r->stats.depth_sum += inflight;
		r->stats.depth_n++;

		uint64_t t0 = now_ns();
		struct io_uring_cqe *cqe;
		int e = io_uring_submit_and_wait(&r->ring, 1);
		r->stats.submits++;
		if (e < 0 && e != -EINTR && e != -EAGAIN && e != -EBUSY) {
			/* The ring itself is broken; nothing more will complete. */
			*ret_failed = next < n ? next : n - 1;
			return e;
		}
		e = io_uring_wait_cqe(&r->ring, &cqe);
		r->stats.wait_ns += now_ns() - t0;
		if (e < 0) {
			if (e == -EINTR)
				continue;
			*ret_failed = next < n ? next : n - 1;
			return e;
		}

		unsigned head, seen = 0;
		io_uring_for_each_cqe(&r->ring, head, cqe) {
			seen++;
			unsigned slot = (unsigned)io_uring_cqe_get_data64(cqe);
			struct inflight f = r->slots[slot];
			r->free_slots[r->n_free++] = slot;
			inflight--;
			int res = cqe->res;
			if (res == -EAGAIN || res == -EINTR) {
				res = 0;
			} else if (res == 0) {
				if (!err) {
					err = -ENODATA;
					*ret_failed = f.req;
				}
				continue;
			} else if (res < 0) {
				if (!err) {
					err = res;
					*ret_failed = f.req;
				}
				continue;
			}
			r->stats.bytes += (uint64_t)res;
			if ((uint32_t)res < f.len && !err) {
				/* Short read: queue the rest of this chunk. */
				unsigned s2 = r->free_slots[--r->n_free];
				r->slots[s2] = (struct inflight){ .req = f.req, .done = f.done + (uint64_t)res,
								  .len = f.len - (uint32_t)res };
				struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
				const struct io_req *q = &reqs[f.req];
				io_uring_prep_read(sqe, q->fd, (char *)q->dst + r->slots[s2].done, r->slots[s2].len,
						   q->offset + r->slots[s2].done);
				io_uring_sqe_set_data64(sqe, s2);
				inflight++;
			} else if ((uint32_t)res == f.len && f.done + f.len == reqs[f.req].len) {
				r->stats.reads++;
			}
		}
		io_uring_cq_advance(&r->ring, seen);
	}
	return err;
}

int io_reader_run(struct io_reader *r, const struct io_req *reqs, size_t n, size_t *ret_failed)
{
	size_t failed = 0;
	int e = r->uring ? run_uring(r, reqs, n, &failed) : run_pread(r, reqs, n, &failed);
	if (e < 0 && ret_failed)
		*ret_failed = failed;
	return e;
}

int io_reader_read_file(struct io_reader *r, int fd, size_t size, void **ret)
{
	void *buf = malloc(MAX(size, 1u));
	if (!buf)
		return -ENOMEM;
	struct io_req req = { .fd = fd, .offset = 0, .len = size, .dst = buf };
	int e = io_reader_run(r, &req, 1, NULL);
	if (e < 0) {
		free(buf);
		return e;
	}
	*ret = buf;
	return 0;
}
