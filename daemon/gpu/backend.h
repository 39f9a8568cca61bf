/* SPDX-License-Identifier: MIT */
/*
 * The small interface between the GPU staging logic (staging.c) and whatever
 * moves bytes: the CUDA backend (backend-cuda.c, libcudart plus driver entry
 * points) or the host simulation (backend-sim.c: streams are worker threads,
 * events are counters), which the tests use on machines without a GPU; it is
 * built only into the tests (feedd-gpu-sim), never into feedd.
 *
 * Semantics every backend keeps, because staging relies on them:
 * - work queued on one stream runs in order, asynchronously to the caller;
 * - record(e) on a stream marks "everything queued on it so far"; wait(e)
 *   makes a stream wait for the most recent record of e *at the time wait is
 *   called* (a never-recorded event is complete);
 * - nothing on the hot path (wait, copy_h2d, record) blocks the caller.
 *
 * The backend's objects are owned by whoever created them and freed through
 * the same backend. All calls come from the daemon's main thread, except that
 * the simulation's streams run on threads of their own.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto/wire.h"

struct gpu_backend;
struct gpu_stream;
struct gpu_event;
struct gpu_mem;

/* What a client needs to open a device allocation (see wire_device_reply). */
struct gpu_mem_export {
	uint32_t kind;                            /* WIRE_DEVICE_VMM or WIRE_DEVICE_IPC */
	int fd;                                   /* VMM: a POSIX fd for the allocation (owned by the gpu_mem), else -1 */
	uint8_t ipc[WIRE_IPC_HANDLE_SIZE];        /* IPC: the legacy memory handle */
};

struct gpu_backend_ops {
	const char *name;
	void (*free)(struct gpu_backend *b);
	/* Devices visible to the daemon. */
	int (*device_count)(struct gpu_backend *b);
	/* Pins [addr, addr+len) for DMA, once per ring (page-aligned, already faulted in). */
	int (*host_register)(struct gpu_backend *b, void *addr, size_t len);
	void (*host_unregister)(struct gpu_backend *b, void *addr);
	/*
	 * A non-blocking stream on `device`. Freeing lets its queued work finish
	 * (giving up on waits whose record may never come) and returns 0, or
	 * -ETIMEDOUT when work may still be running: then the memory it touches
	 * must not be freed.
	 */
	int (*stream_new)(struct gpu_backend *b, int device, struct gpu_stream **ret);
	int (*stream_free)(struct gpu_backend *b, struct gpu_stream *s);
	/* Device memory of at least `size` bytes, exportable to another process; *ret_size is the real size. */
	int (*mem_new)(struct gpu_backend *b, int device, size_t size, struct gpu_mem **ret, size_t *ret_size,
		       struct gpu_mem_export *ret_export);
	void (*mem_free)(struct gpu_backend *b, struct gpu_mem *m);
	/* An interprocess event (timing disabled) and its handle for the client. */
	int (*event_new)(struct gpu_backend *b, int device, struct gpu_event **ret,
			 uint8_t ret_handle[WIRE_IPC_HANDLE_SIZE]);
	void (*event_free)(struct gpu_backend *b, struct gpu_event *e);
	/* The hot path: queue work on s; none of these block. */
	int (*wait)(struct gpu_backend *b, struct gpu_stream *s, struct gpu_event *e);
	int (*copy_h2d)(struct gpu_backend *b, struct gpu_stream *s, struct gpu_mem *dst, size_t off, const void *src,
			size_t len);
	int (*record)(struct gpu_backend *b, struct gpu_stream *s, struct gpu_event *e);
	/* 1 when everything before e's most recent record has run, 0 while pending; never blocks. */
	int (*query)(struct gpu_backend *b, struct gpu_event *e);
	/* Queues "write 1 to the eventfd fd" on s, after the work queued so far (a host callback). */
	int (*notify)(struct gpu_backend *b, struct gpu_stream *s, int fd);
	/*
	 * A timing event, private to the daemon (not interprocess), recorded
	 * around the daemon's own copies to measure them on the GPU's clock.
	 * Freed with event_free.
	 */
	int (*timer_new)(struct gpu_backend *b, int device, struct gpu_event **ret);
	/*
	 * The GPU time between the most recent records of two timers: 1 with it
	 * in *ret_ns once `end` has run, 0 while it is pending; never blocks.
	 */
	int (*elapsed)(struct gpu_backend *b, struct gpu_event *start, struct gpu_event *end, uint64_t *ret_ns);
};

struct gpu_backend {
	const struct gpu_backend_ops *ops;
	char error[256]; /* the last failure's text, with the backend's own error name (main thread only) */
};

/*
 * The CUDA backend. Returns 0, or a negative errno with the CUDA error text in
 * err when there is no usable driver or device (host-only mode): -ENODEV,
 * -ENOSYS (built without CUDA), ...
 */
int gpu_backend_cuda_new(struct gpu_backend **ret, char *err, size_t errlen);

/* The host simulation: `devices` fake devices whose memory is malloc'd. */
int gpu_backend_sim_new(unsigned devices, struct gpu_backend **ret);

/* For the tests: every simulated copy sleeps this long first (to widen races); objects still alive. */
void gpu_backend_sim_set_copy_delay(struct gpu_backend *b, unsigned usec);
unsigned gpu_backend_sim_live_objects(struct gpu_backend *b);
/* For the tests: s stops running work, as the stream of a process that died; freeing drops its queue. */
void gpu_backend_sim_stream_stall(struct gpu_backend *b, struct gpu_stream *s);
/* For the tests only (the design has no CPU wait): blocks until s has run everything queued. */
void gpu_backend_sim_stream_sync(struct gpu_backend *b, struct gpu_stream *s);
/* For the tests: the simulated device memory behind m (a client "opening" it in-process). */
uint8_t *gpu_backend_sim_mem_ptr(struct gpu_mem *m);
/* For the tests: the simulated event a handle from event_new names (same process only). */
struct gpu_event *gpu_backend_sim_event_from_handle(const uint8_t handle[WIRE_IPC_HANDLE_SIZE]);

static inline struct gpu_backend *gpu_backend_free(struct gpu_backend *b)
{
	if (b)
		b->ops->free(b);
	return NULL;
}
