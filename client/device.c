/* SPDX-License-Identifier: MIT */
/*
 * libfeed's device batches: loading the CUDA driver at run time and
 * importing the daemon's GPU buffers and events into this process.
 *
 * The daemon copies each batch into a buffer on the client's GPU and records
 * the slot's `ready` event; next() hands out the host view,
 * feed_client_device_batch() makes the caller's stream wait on `ready` (no
 * CPU wait), and releasing records `release` on the caller's stream before
 * tail moves, so the daemon's next copy into that buffer waits for the
 * client's kernels. The CUDA driver is loaded at run time (dlopen of
 * libcuda.so.1): libfeed itself links no CUDA library and works without one.
 * Events and buffers are opened once per attach and closed with the client
 * (device_close), or, after the daemon went away, with the retired ring
 * whose batches they back; a reconnect imports the next daemon's anew
 * (device_attach again). Slots count from the current ring's first
 * sequence (seq_base). struct device_ring is this file's alone.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/libfeed-internal.h"
#include "config.h"

/* Device batches need CUDA's headers (only them); a target that compiles this file without them gets none. */
#if HAVE_CUDA && __has_include(<cuda.h>)
#define FEED_CUDA 1
#else
#define FEED_CUDA 0
#endif
#if FEED_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#endif

struct device_ring {
#if FEED_CUDA
	void *lib;
	struct {
		PFN_cuInit_v2000 init;
		PFN_cuDeviceGet_v2000 device_get;
		PFN_cuDevicePrimaryCtxRetain_v7000 retain;
		PFN_cuDevicePrimaryCtxRelease_v11000 unretain;
		PFN_cuCtxPushCurrent_v4000 push;
		PFN_cuCtxPopCurrent_v4000 pop;
		PFN_cuIpcOpenEventHandle_v4010 open_event;
		PFN_cuEventDestroy_v4000 event_destroy;
		PFN_cuStreamWaitEvent_v3020 wait;
		PFN_cuEventRecord_v2000 record;
		PFN_cuIpcOpenMemHandle_v11000 open_mem;
		PFN_cuIpcCloseMemHandle_v4010 close_mem;
		PFN_cuMemImportFromShareableHandle_v10020 import;
		PFN_cuMemAddressReserve_v10020 reserve;
		PFN_cuMemMap_v10020 map;
		PFN_cuMemSetAccess_v10020 set_access;
		PFN_cuMemUnmap_v10020 unmap;
		PFN_cuMemAddressFree_v10020 address_free;
		PFN_cuMemRelease_v10020 mem_release;
	} cu;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr base;
	size_t size, stride;
	bool vmm, reserved, mapped, imported;
	CUmemGenericAllocationHandle handle;
	uint32_t slots;
	CUevent *ready, *release;
	uint8_t *recorded; /* per slot: `release` recorded for its current batch (atomic) */
#endif
	int kind; /* WIRE_DEVICE_* */
};

#if FEED_CUDA
static bool cu_entry(struct device_ring *d, PFN_cuGetProcAddress_v12000 get, const char *name, void **fn)
{
	CUdriverProcAddressQueryResult q;
	return get(name, fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS && q == CU_GET_PROC_ADDRESS_SUCCESS &&
	       *fn;
}

/* Loads the driver and its entry points. Returns 0, or -ENODEV with the reason in c's error. */
static int cu_load(feed_client *c, struct device_ring *d)
{
	d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!d->lib)
		return client_fail(c, -ENODEV, "cannot load the CUDA driver (libcuda.so.1): %s", dlerror());
	PFN_cuGetProcAddress_v12000 get;
	*(void **)&get = dlsym(d->lib, "cuGetProcAddress_v2"); /* POSIX's way to take a function from dlsym */
	if (!get)
		return client_fail(c, -ENODEV, "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)");
#define E(field, name) cu_entry(d, get, name, (void **)&d->cu.field)
	if (!(E(init, "cuInit") && E(device_get, "cuDeviceGet") && E(retain, "cuDevicePrimaryCtxRetain") &&
	      E(unretain, "cuDevicePrimaryCtxRelease") && E(push, "cuCtxPushCurrent") && E(pop, "cuCtxPopCurrent") &&
	      E(open_event, "cuIpcOpenEventHandle") && E(event_destroy, "cuEventDestroy") &&
	      E(wait, "cuStreamWaitEvent") && E(record, "cuEventRecord") && E(open_mem, "cuIpcOpenMemHandle") &&
	      E(close_mem, "cuIpcCloseMemHandle") && E(import, "cuMemImportFromShareableHandle") &&
	      E(reserve, "cuMemAddressReserve") && E(map, "cuMemMap") && E(set_access, "cuMemSetAccess") &&
	      E(unmap, "cuMemUnmap") && E(address_free, "cuMemAddressFree") && E(mem_release, "cuMemRelease")))
		return client_fail(c, -ENODEV, "the CUDA driver lacks an entry point libfeed needs");
#undef E
	return 0;
}

/* Opens the daemon's buffers and events in this process, on the device's primary context. */
static int cu_open(feed_client *c, struct device_ring *d, const struct wire_device_reply *rep, int fd)
{
	CUresult e;
	if ((e = d->cu.init(0)) != CUDA_SUCCESS || (e = d->cu.device_get(&d->dev, (int)rep->device)) != CUDA_SUCCESS)
		return client_fail(c, -ENODEV, "cuda:%u: cannot open the device (CUDA error %d)", rep->device, (int)e);
	if ((e = d->cu.retain(&d->ctx, d->dev)) != CUDA_SUCCESS)
		return client_fail(c, -ENODEV, "cuda:%u: cannot retain its context (CUDA error %d)", rep->device, (int)e);
	d->cu.push(d->ctx);
	int r = 0;
	d->size = rep->mem_size;
	d->stride = rep->slot_stride;
	d->slots = rep->slot_count;
	if (rep->kind == WIRE_DEVICE_VMM) {
		d->vmm = true;
		e = d->cu.import(&d->handle, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		d->imported = e == CUDA_SUCCESS;
		if (e == CUDA_SUCCESS && (e = d->cu.reserve(&d->base, d->size, 0, 0, 0)) == CUDA_SUCCESS)
			d->reserved = true;
		if (e == CUDA_SUCCESS && (e = d->cu.map(d->base, d->size, 0, d->handle, 0)) == CUDA_SUCCESS)
			d->mapped = true;
		CUmemAccessDesc access = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)rep->device },
					   .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		if (e == CUDA_SUCCESS)
			e = d->cu.set_access(d->base, d->size, &access, 1);
	} else {
		CUipcMemHandle h;
		memcpy(&h, rep->mem_handle, sizeof(h));
		e = d->cu.open_mem(&d->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		d->mapped = e == CUDA_SUCCESS;
	}
	if (e != CUDA_SUCCESS)
		r = client_fail(c, -EIO, "cuda:%u: cannot open the batch buffers (CUDA error %d)", rep->device, (int)e);
	d->ready = r ? NULL : calloc(d->slots, sizeof(*d->ready));
	d->release = r ? NULL : calloc(d->slots, sizeof(*d->release));
	d->recorded = r ? NULL : calloc(d->slots, 1);
	if (!r && (!d->ready || !d->release || !d->recorded))
		r = client_fail(c, -ENOMEM, "out of memory");
	for (uint32_t i = 0; r == 0 && i < d->slots; i++) {
		CUipcEventHandle h;
		memcpy(&h, rep->handles + (size_t)i * 2 * WIRE_IPC_HANDLE_SIZE, sizeof(h));
		e = d->cu.open_event(&d->ready[i], h);
		if (e == CUDA_SUCCESS) {
			memcpy(&h, rep->handles + ((size_t)i * 2 + 1) * WIRE_IPC_HANDLE_SIZE, sizeof(h));
			e = d->cu.open_event(&d->release[i], h);
		}
		if (e != CUDA_SUCCESS)
			r = client_fail(c, -EIO, "cuda:%u: cannot open the events of slot %u (CUDA error %d)", rep->device, i,
				 (int)e);
	}
	CUcontext popped;
	d->cu.pop(&popped);
	return r;
}
#endif

/*
 * Closes the imported events and buffers. After the daemon died the events
 * are only destroyed (never recorded or waited on); a VMM buffer stays
 * readable until unmapped here, which is why a retired ring keeps its
 * device ring until its batches are released (reconnect.c).
 */
struct device_ring *device_ring_free(struct device_ring *d)
{
	if (!d)
		return NULL;
#if FEED_CUDA
	if (d->ctx) {
		d->cu.push(d->ctx);
		for (uint32_t i = 0; i < d->slots; i++) {
			if (d->ready && d->ready[i])
				d->cu.event_destroy(d->ready[i]);
			if (d->release && d->release[i])
				d->cu.event_destroy(d->release[i]);
		}
		if (d->vmm) {
			if (d->mapped)
				d->cu.unmap(d->base, d->size);
			if (d->reserved)
				d->cu.address_free(d->base, d->size);
			if (d->imported)
				d->cu.mem_release(d->handle);
		} else if (d->mapped) {
			d->cu.close_mem(d->base);
		}
		CUcontext popped;
		d->cu.pop(&popped);
		d->cu.unretain(d->dev);
	}
	free(d->ready);
	free(d->release);
	free(d->recorded);
	if (d->lib)
		dlclose(d->lib);
#endif
	free(d);
	return NULL;
}

void device_close(feed_client *c)
{
	c->dev = device_ring_free(c->dev);
	c->device = -1;
}

/*
 * Reads the DEVICE_REPLY that follows the ATTACH_REPLY and opens what it
 * names. Host batches instead (device -1, the reason in feed_client_error())
 * when the daemon has no GPU staging or this process cannot open it, if the
 * client allowed that; otherwise an error (the attachment stays unusable:
 * close the client).
 */
int device_attach(feed_client *c, const struct wire_attach *a)
{
	bool fallback = a->flags & WIRE_ATTACH_HOST_FALLBACK;
	int fd = -1;
	unsigned n_fds = 0;
	void *p = NULL;
	size_t len;
	int type = client_recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, &fd, 1, &n_fds);
	if (type < 0)
		return type;
	struct wire_device_reply rep;
	int r = type == WIRE_DEVICE_REPLY && wire_decode_device_reply(p, len, &rep) == 0 && n_fds == rep.n_fds &&
			rep.slot_count == (rep.kind == WIRE_DEVICE_HOST ? 0 : c->slot_count) &&
			rep.slot_stride * rep.slot_count <= rep.mem_size && rep.slot_stride >= c->geo.slot_size * !!rep.slot_count
		? 0 : client_fail(c, -EPROTO, "feedd sent an unexpected reply to a device attach");
	if (r == 0 && rep.kind == WIRE_DEVICE_HOST)
		r = client_fail(c, -ENODEV, "%s", rep.reason);
	struct device_ring *d = NULL;
	if (r == 0) {
		d = calloc(1, sizeof(*d));
		r = d ? 0 : client_fail(c, -ENOMEM, "out of memory");
	}
#if FEED_CUDA
	if (r == 0) {
		c->dev = d;
		d->kind = (int)rep.kind;
		r = cu_load(c, d);
		if (r == 0)
			r = cu_open(c, d, &rep, fd);
		if (r == 0)
			c->device = (int)rep.device;
	}
#else
	if (r == 0) {
		free(d);
		r = client_fail(c, -ENODEV, "this libfeed was built without CUDA support");
	}
#endif
	if (fd >= 0)
		close(fd); /* the imported handle keeps the memory */
	free(p);
	if (r < 0 && c->dev)
		device_close(c);
	/* Host batches still flow through the ring; a caller who allowed that keeps them, with the reason. */
	if (r < 0 && r != -EPROTO && fallback)
		return 0;
	if (r < 0)
		c->stopped = r;
	return r;
}

void device_release(feed_client *c, uint64_t seq, void *stream, bool at_release)
{
#if FEED_CUDA
	struct device_ring *d = c->dev;
	/* A batch of a ring whose daemon went away (reconnect.c): nobody waits for its release. */
	if (seq < c->seq_base)
		return;
	uint32_t s = (uint32_t)((seq - c->seq_base) % d->slots);
	if (__atomic_exchange_n(&d->recorded[s], 1, __ATOMIC_ACQ_REL))
		goto out;
	/* After the daemon died its events are gone (using them is undefined): record nothing. */
	if (c->stopped == -ECONNRESET)
		goto out;
	d->cu.push(d->ctx);
	d->cu.record(d->release[s], stream ? (CUstream)stream : CU_STREAM_LEGACY);
	CUcontext popped;
	d->cu.pop(&popped);
out:
	/* Released: the slot's next batch starts unrecorded. */
	if (at_release)
		__atomic_store_n(&d->recorded[s], 0, __ATOMIC_RELEASE);
#endif
}

FEED_EXPORT int feed_client_device(const feed_client *c)
{
	assert_return(c, -EINVAL);
	return c->device;
}

FEED_EXPORT int feed_client_device_batch(feed_client *c, const struct feed_batch *b, void *stream,
					 struct feed_device_batch *ret)
{
	assert_return(c && b && ret, -EINVAL);
	if (!c->dev || !b || b->seq < c->tail || b->seq >= c->next_seq)
		return client_fail(c, c->dev ? -EINVAL : -ENODEV, c->dev ? "not a batch this client holds" : "not attached to a device");
	if (b->seq < c->seq_base)
		return client_fail(c, -ESHUTDOWN, "batch %llu was staged by a feedd that went away since: take its "
				   "device views before the next next()", (unsigned long long)b->index);
#if FEED_CUDA
	struct device_ring *d = c->dev;
	uint32_t s = (uint32_t)((b->seq - c->seq_base) % d->slots);
	d->cu.push(d->ctx);
	CUresult e = d->cu.wait(stream ? (CUstream)stream : CU_STREAM_LEGACY, d->ready[s], 0);
	CUcontext popped;
	d->cu.pop(&popped);
	if (e != CUDA_SUCCESS)
		return client_fail(c, -EIO, "cuStreamWaitEvent: CUDA error %d", (int)e);
	const struct ring_geometry *g = &c->geo; /* validated at attach; the shared header is not read again */
	CUdeviceptr base = d->base + (CUdeviceptr)s * d->stride;
	*ret = (struct feed_device_batch){
		.input_ids = (uint64_t)(base + g->off_input_ids),
		.labels = (uint64_t)(base + g->off_labels),
		.position_ids = (uint64_t)(base + g->off_position_ids),
		.cu_seqlens = (uint64_t)(base + g->off_cu_seqlens),
	};
	return 0;
#else
	(void)ret;
	(void)stream;
	return -ENODEV;
#endif
}

FEED_EXPORT int feed_client_device_done(feed_client *c, const struct feed_batch *b, void *stream)
{
	assert_return(c && b, -EINVAL);
	if (!c->dev || !b)
		return -ENODEV;
	device_release(c, b->seq, stream, false);
	return 0;
}
