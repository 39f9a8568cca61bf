/* SPDX-License-Identifier: MIT */
/*
 * What source.c and checked.c share (the room's own; no other room includes
 * it): the objects behind source.h's handles, and the checked-read hooks
 * that source_submit()/source_complete() call.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/io/reader.h"
#include "daemon/source/source.h"

struct remote_object;
struct remote_read;
struct sums;

struct source {
	char *name;
	struct source_id id;
	int fd;
	struct sums *sums;   /* block checksums every read is verified against; NULL: none */
	bool cache_entry;    /* feedd's own cache copy (source_set_cache_entry) */
	struct remote_object *remote; /* a URL's object; NULL: a local file */
	uint8_t *mem;        /* source_open_mem's bytes (id.size of them); NULL: a file or an object */
	struct source *with; /* a file checked (fstat) after every read of this one too (source_check_with); NULL: none */
	char *with_name;     /* ... or checked by name, when descriptors are short; NULL: none */
	struct source_id with_id; /* ... and its identity when it was opened */
};

/* A read of a checksummed source: its covering blocks [lo, lo + span), verified at completion. */
struct verify_rec {
	size_t req;          /* index in submission order since the last completion */
	const struct source *src;
	uint64_t offset;     /* the caller's read: offset, len, dst */
	size_t len;
	void *dst;
	uint64_t lo;
	size_t span;         /* 0: the read goes past what the sums cover */
	uint8_t *bounce;     /* where the blocks land when they are not the caller's bytes exactly; NULL: in place */
};

struct source_reader {
	struct io_reader *io;
	struct io_req *reqs; /* queued local reads */
	size_t *lidx;        /* their index in submission order */
	struct source **srcs; /* ... and the source each one reads (checked after the reads, source_complete) */
	size_t n, cap;
	struct remote_read *rreads; /* queued remote reads */
	size_t *ridx;
	size_t rn, rcap;
	struct io_stats remote;  /* what the remote reads added */
	struct io_stats stats;   /* the io_reader's and those: what source_reader_stats() shows */
	size_t n_sub;        /* reads submitted since the last completion */
	struct verify_rec *vr; /* reads of checksummed sources, queued */
	size_t n_vr, cap_vr;
	struct bounce { uint8_t *p; size_t size; } *bounce; /* whole blocks of reads that cover part of one */
	size_t n_bounce, cap_bounce;
	struct bounce spare; /* the last completion's largest buffer, kept for the next */
	struct source_read *wide; /* verify_plan's copy of a submission */
	size_t wide_cap;
	char why[320];       /* the last checksum failure */
	char stale[320];     /* the last -ESTALE that the file saying where the bytes are (a .idx) caused; "" if none */
	int mem_err;         /* a read of a source in memory failed at submission (past its end) ... */
	size_t mem_failed;   /* ... this one, in submission order: reported at completion */
};

/*
 * checked.c: plans reads[0..n) (submitted at r->n_sub on): *ret is NULL when
 * none is of a checked source, else a copy to submit instead (the reader's,
 * valid until the next submission). Returns 0 or -ENOMEM.
 */
int source_verify_plan(struct source_reader *r, const struct source_read *reads, size_t n, struct source_read **ret);
/* Checks every block read and copies the caller's bytes out of the bounce buffers: 0 or -EUCLEAN. */
int source_verify_finish(struct source_reader *r, size_t *ret_failed);
/* Frees a completed batch's bounce buffers (the largest is kept) and forgets its plan. */
void source_verify_clear(struct source_reader *r);
