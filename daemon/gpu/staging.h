/* SPDX-License-Identifier: MIT */
/*
 * Staging: the device side of one client's ring, and the per-slot state
 * machine that hands batches to the client's GPU without a CPU wait.
 *
 * One device allocation holds one buffer per ring slot (slot s at s * stride,
 * laid out like the host slot). Per slot, two interprocess events owned by
 * the daemon: `ready` and `release`. For batch `seq` in slot s, at publish:
 *
 *   daemon stream:  wait(release[s])  ->  copy slot s H2D  ->  record(ready[s])
 *   then the ring's head moves past seq (the client may look);
 *   client stream:  wait(ready[s])  ->  kernels read the buffer  ->  record(release[s])
 *   then the client stores its tail past seq (the daemon may reuse slot s).
 *
 * Records and waits alternate strictly per slot, because each side acts only
 * after the other's index moved: the daemon re-records ready[s] only after
 * the client released the slot, i.e. after it queued its wait; the client
 * records release[s] only after head passed seq, i.e. after the daemon
 * queued its wait on the previous release. A slot's first use waits on
 * nothing (a never-recorded event is complete).
 *
 * The host slot has a hazard of its own: the client may release a batch
 * (its kernels queued, not run) before the daemon's copy of it has run, and
 * the next fill of that host slot must not overwrite bytes the DMA still
 * reads. staging_host_reusable() checks the slot's `ready` without blocking
 * (in the steady state the copy finished long ago); when it has not, a host
 * callback queued behind the copy kicks `wake_fd` (the ring's space eventfd,
 * which makes the session refill) once it has.
 *
 * The host ring is pinned once here (cudaHostRegister of the daemon's
 * mapping) and unpinned when the staging is freed. All calls on the main
 * thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/gpu/backend.h"
#include "proto/ring_abi.h"
#include "proto/wire.h"

enum {
	STAGING_SLOT_UNUSED = 0,    /* never staged: nothing to wait for */
	STAGING_SLOT_PUBLISHED = 1, /* batch `seq` copied and announced; the client owns it until tail passes */
};

struct staging_slot {
	struct gpu_event *ready, *release;
	struct gpu_event *t0, *t1; /* daemon-private timers around the slot's copy */
	uint64_t seq;   /* the batch last staged here */
	uint32_t state; /* STAGING_SLOT_* */
	bool timing;    /* t0/t1 hold a copy not yet added to h2d_ns */
	size_t len;     /* bytes of the slot's last copy */
};

/* What one client's staging did (status JSON "gpu"), counted on the main thread. */
struct staging_counters {
	uint64_t copies;       /* batches copied host to device */
	uint64_t bytes;        /* bytes copied */
	uint64_t waits;        /* release events the copy stream waited on (a slot reused) */
	uint64_t h2d_ns;       /* GPU time of the copies timed so far (timer events, read without blocking) */
	uint64_t timed;        /* copies whose time is in h2d_ns */
	uint64_t timed_bytes;  /* their bytes */
	uint64_t not_ready;    /* host slot refills deferred because its copy had not run yet */
};

struct gpu;

struct staging {
	struct gpu_backend *backend; /* not owned */
	struct gpu *gpu;             /* the daemon's GPU that made it (gpu_attach), NULL for a bare staging_new */
	int device;
	struct gpu_stream *stream;
	struct gpu_mem *mem;
	size_t mem_size, stride;
	struct gpu_mem_export export;
	struct feed_ring_header *hdr; /* the daemon's mapping of the host ring (not owned) */
	size_t ring_size;
	bool registered;
	uint32_t slot_count;
	struct staging_slot *slots;
	uint8_t *handles;  /* slot_count x (ready, release) IPC handles, as sent in DEVICE_REPLY */
	uint64_t next_seq; /* the next batch to stage */
	int wake_fd;       /* kicked when a pending copy finishes (not owned) */
	bool notify_armed; /* a kick is queued and not yet consumed */
	struct staging_counters n;
	uint64_t *charge;  /* device bytes accounted to (struct gpu, per device): mem_size is taken off when freed */
};

/*
 * Pins the ring and allocates, on `device`, the stream, the slots' buffers
 * and their events. Returns 0, or a negative errno with a line in err
 * (-ENODEV: no such device; backend failures name the CUDA call and error).
 */
int staging_new(struct gpu_backend *b, int device, struct feed_ring_header *hdr, size_t ring_size, int wake_fd,
		struct staging **ret, char *err, size_t errlen);

/*
 * May a worker fill the host slot of batch `seq` now? True when the slot's
 * last copy has run (or it never held one). When false, a kick of wake_fd
 * is queued behind that copy, so the caller stops refilling and retries when
 * woken. Never blocks. Returns 1 (reusable), 0 (not yet), or a negative
 * errno from the backend.
 */
int staging_host_reusable(struct staging *st, uint64_t seq);

/*
 * Stages batch `seq` (its slot is filled) before the ring's head moves past
 * it; `tail` is the client's validated tail. Queues wait(release) when the
 * slot was used before, the copy of the slot's header and arrays, and
 * record(ready). Never blocks. Returns 0; -EINVAL when seq is not the next
 * batch; -EBUSY when the slot's previous batch is not released (the client
 * would still be reading it); a backend error (text in the backend's error).
 */
int staging_publish(struct staging *st, uint64_t seq, uint64_t tail);

/*
 * Adds the GPU time of every finished, not yet counted copy to st->n (never
 * blocks; a copy still running is counted later). Call before reading the
 * counters.
 */
void staging_collect(struct staging *st);

/* The DEVICE_REPLY describing this staging; ret->handles points into st. */
void staging_reply(const struct staging *st, struct wire_device_reply *ret);

/* 1 when every copy queued so far has run (its buffers may go), 0 while some are pending; never blocks. */
int staging_query(struct staging *st);

/*
 * Releases the device buffers, events and stream, and unpins the ring. If
 * queued copies cannot be confirmed finished (a client died mid-batch and
 * the driver never resolved its record), the device memory is kept rather
 * than freed under a running copy; returns NULL either way. *ret_leaked (may
 * be NULL) says which.
 */
struct staging *staging_free(struct staging *st, bool *ret_leaked);
