/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend. Only libcudart is linked: the VMM calls (cuMem*) are
 * driver entry points reached with cudaGetDriverEntryPointByVersion, so the
 * daemon loads and runs (host-only) on a machine without a driver, where
 * every runtime call fails with cudaErrorInsufficientDriver.
 *
 * Device memory is exported as a CUDA VMM allocation with a POSIX fd handle
 * when the device supports it (the fd travels over the control socket, and
 * the physical memory lives as long as any process holds a handle), else as
 * cudaMalloc memory with a legacy IPC handle. Events are interprocess with
 * timing disabled. Each object remembers its device and the backend switches
 * the calling thread's current device only when it differs.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/gpu/backend.h"
#include "proto/macro.h"

#define DRAIN_TIMEOUT_NS (5 * NSEC_PER_SEC)

struct vmm {
	PFN_cuMemCreate_v10020 create;
	PFN_cuMemRelease_v10020 release;
	PFN_cuMemExportToShareableHandle_v10020 export_handle;
	PFN_cuMemAddressReserve_v10020 reserve;
	PFN_cuMemAddressFree_v10020 address_free;
	PFN_cuMemMap_v10020 map;
	PFN_cuMemUnmap_v10020 unmap;
	PFN_cuMemSetAccess_v10020 set_access;
	PFN_cuMemGetAllocationGranularity_v10020 granularity;
	PFN_cuDeviceGetAttribute_v2000 attribute;
	/* for messages only: NULL when the driver lacks them */
	PFN_cuGetErrorName_v6000 error_name;
	PFN_cuGetErrorString_v6000 error_string;
};

/* Devices this code tracks the usability of; more are refused by device_check. */
#define CUDA_MAX_DEVICES 64

struct cuda {
	struct gpu_backend b;
	int devices;
	char unusable[CUDA_MAX_DEVICES][160]; /* why device d cannot stage ("" when it can) */
	int current; /* the device this (main) thread has set, -1 unknown */
	bool have_vmm;
	struct vmm vmm;
};

struct gpu_stream {
	cudaStream_t s;
	int device;
};

struct gpu_event {
	cudaEvent_t e;
	int device;
};

struct gpu_mem {
	int device;
	bool vmm;
	void *ptr;
	size_t size;
	CUmemGenericAllocationHandle handle;
	int fd;
};

static struct cuda *to_cuda(struct gpu_backend *b)
{
	return (struct cuda *)b;
}

static int errno_of(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorInsufficientDriver:
	case cudaErrorNoDevice:
	case cudaErrorInvalidDevice:
		return -ENODEV;
	case cudaErrorInvalidValue:
		return -EINVAL;
	case cudaErrorNotSupported:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Records "what: CUDA's text (its name)" and returns the errno for e. */
static int fail(struct cuda *c, cudaError_t e, const char *what)
{
	snprintf(c->b.error, sizeof(c->b.error), "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
	return errno_of(e);
}

/* As fail() for a driver entry point: the driver's own text and name when it can give them. */
static int fail_drv(struct cuda *c, CUresult e, const char *what)
{
	const char *name = NULL, *text = NULL;
	if (c->vmm.error_name && c->vmm.error_name(e, &name) != CUDA_SUCCESS)
		name = NULL;
	if (c->vmm.error_string && c->vmm.error_string(e, &text) != CUDA_SUCCESS)
		text = NULL;
	if (name && text)
		snprintf(c->b.error, sizeof(c->b.error), "%s: %s (%s)", what, text, name);
	else
		snprintf(c->b.error, sizeof(c->b.error), "%s: CUDA driver error %d", what, (int)e);
	switch (e) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	default:
		return -EIO;
	}
}

static int use_device(struct cuda *c, int device)
{
	if (c->current == device)
		return 0;
	cudaError_t e = cudaSetDevice(device);
	if (e != cudaSuccess)
		return fail(c, e, "cudaSetDevice");
	c->current = device;
	return 0;
}

static void cuda_free(struct gpu_backend *b)
{
	free(to_cuda(b));
}

static int cuda_device_count(struct gpu_backend *b)
{
	return to_cuda(b)->devices;
}

static int cuda_device_check(struct gpu_backend *b, int device, char *why, size_t whylen)
{
	struct cuda *c = to_cuda(b);
	if (device < 0 || device >= c->devices)
		return -ENODEV;
	if (device >= CUDA_MAX_DEVICES) {
		snprintf(why, whylen, "feedd stages on cuda:0 to cuda:%d only", CUDA_MAX_DEVICES - 1);
		return -ENODEV;
	}
	if (!c->unusable[device][0])
		return 0;
	snprintf(why, whylen, "%s", c->unusable[device]);
	return -EOPNOTSUPP;
}

/*
 * Why device d cannot stage batches, into why (left empty when it can). Only
 * attributes are read: cudaDeviceGetAttribute needs no context, so a device
 * found unusable never gets one of feedd's.
 */
static void check_device(struct cuda *c, int d, PFN_cuDeviceGetAttribute_v2000 drv_attribute, char *why, size_t len)
{
	int mode = 0, pin = 1, ipc_events = 1;
	if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, d) != cudaSuccess)
		mode = cudaComputeModeDefault;
	if (cudaDeviceGetAttribute(&pin, cudaDevAttrHostRegisterSupported, d) != cudaSuccess)
		pin = 1;
	if (drv_attribute && drv_attribute(&ipc_events, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, d) != CUDA_SUCCESS)
		ipc_events = 1;
	if (mode == cudaComputeModeProhibited)
		snprintf(why, len, "cuda:%d is in PROHIBITED compute mode (nvidia-smi -c)", d);
	else if (mode == cudaComputeModeExclusiveProcess)
		snprintf(why, len,
			 "cuda:%d is in EXCLUSIVE_PROCESS compute mode: feedd and the trainer each need a context "
			 "on it (nvidia-smi -c DEFAULT)", d);
	else if (!pin)
		snprintf(why, len, "cuda:%d cannot pin host memory (cudaDevAttrHostRegisterSupported is 0)", d);
	else if (!ipc_events)
		snprintf(why, len, "cuda:%d cannot share events between processes (IPC events unsupported)", d);
	(void)c;
}

static int cuda_host_register(struct gpu_backend *b, int device, void *addr, size_t len)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, device);
	if (r < 0)
		return r;
	cudaError_t e = cudaHostRegister(addr, len, cudaHostRegisterPortable);
	return e == cudaSuccess ? 0 : fail(c, e, "cudaHostRegister");
}

static void cuda_host_unregister(struct gpu_backend *b, void *addr)
{
	(void)cudaHostUnregister(addr);
}

static int cuda_stream_new(struct gpu_backend *b, int device, struct gpu_stream **ret)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, device);
	if (r < 0)
		return r;
	struct gpu_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->device = device;
	cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
	if (e != cudaSuccess) {
		free(s);
		return fail(c, e, "cudaStreamCreateWithFlags");
	}
	*ret = s;
	return 0;
}

static int cuda_stream_query(struct gpu_backend *b, struct gpu_stream *s)
{
	/* Any answer but "not ready" means no more of its work will touch memory: done, or a broken context. */
	return cudaStreamQuery(s->s) == cudaErrorNotReady ? 0 : 1;
}

/*
 * Lets the stream's queued copies finish before its memory goes, polling
 * rather than blocking: a copy waits on a `release` that a client recorded,
 * and if that client died mid-batch the wait is the driver's to resolve.
 * After DRAIN_TIMEOUT_NS the stream is destroyed anyway and the caller is
 * told (-ETIMEDOUT) to keep the memory the work may still touch.
 */
static int cuda_stream_free(struct gpu_backend *b, struct gpu_stream *s)
{
	struct cuda *c = to_cuda(b);
	int r = 0;
	if (use_device(c, s->device) == 0) {
		uint64_t deadline = now_ns() + DRAIN_TIMEOUT_NS;
		cudaError_t e;
		while ((e = cudaStreamQuery(s->s)) == cudaErrorNotReady) {
			if (now_ns() > deadline) {
				r = -ETIMEDOUT;
				break;
			}
			usleep(200);
		}
	}
	(void)cudaStreamDestroy(s->s);
	free(s);
	return r;
}

static size_t granularity(struct cuda *c, const CUmemAllocationProp *prop)
{
	size_t g = 0;
	if (c->vmm.granularity(&g, prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || g == 0)
		return 2u << 20;
	return g;
}

static bool vmm_usable(struct cuda *c, int device)
{
	int vmm = 0, fd = 0;
	if (!c->have_vmm)
		return false;
	if (c->vmm.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) != CUDA_SUCCESS ||
	    c->vmm.attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device) != CUDA_SUCCESS)
		return false;
	return vmm && fd;
}

static void mem_release(struct cuda *c, struct gpu_mem *m)
{
	if (m->vmm) {
		if (m->ptr) {
			c->vmm.unmap((CUdeviceptr)(uintptr_t)m->ptr, m->size);
			c->vmm.address_free((CUdeviceptr)(uintptr_t)m->ptr, m->size);
		}
		if (m->handle)
			c->vmm.release(m->handle);
	} else if (m->ptr) {
		(void)cudaFree(m->ptr);
	}
	if (m->fd >= 0)
		close(m->fd);
	free(m);
}

static int vmm_new(struct cuda *c, struct gpu_mem *m, size_t size)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = m->device },
	};
	m->vmm = true;
	m->size = ALIGN_UP(size, granularity(c, &prop));
	CUresult e = c->vmm.create(&m->handle, m->size, &prop, 0);
	if (e != CUDA_SUCCESS)
		return fail_drv(c, e, "cuMemCreate");
	CUdeviceptr p = 0;
	e = c->vmm.reserve(&p, m->size, 0, 0, 0);
	if (e != CUDA_SUCCESS)
		return fail_drv(c, e, "cuMemAddressReserve");
	e = c->vmm.map(p, m->size, 0, m->handle, 0);
	if (e != CUDA_SUCCESS) {
		c->vmm.address_free(p, m->size);
		return fail_drv(c, e, "cuMemMap");
	}
	m->ptr = (void *)(uintptr_t)p;
	CUmemAccessDesc access = {
		.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = m->device },
		.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
	};
	e = c->vmm.set_access(p, m->size, &access, 1);
	if (e != CUDA_SUCCESS)
		return fail_drv(c, e, "cuMemSetAccess");
	int fd = -1;
	e = c->vmm.export_handle(&fd, m->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	if (e != CUDA_SUCCESS)
		return fail_drv(c, e, "cuMemExportToShareableHandle");
	m->fd = fd;
	return 0;
}

static int cuda_mem_new(struct gpu_backend *b, int device, size_t size, struct gpu_mem **ret, size_t *ret_size,
			struct gpu_mem_export *ret_export)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, device);
	if (r < 0)
		return r;
	struct gpu_mem *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->device = device;
	m->fd = -1;
	struct gpu_mem_export x = { .fd = -1 };
	if (vmm_usable(c, device)) {
		r = vmm_new(c, m, size);
		x.kind = WIRE_DEVICE_VMM;
		x.fd = m->fd;
	} else {
		m->size = ALIGN_UP(size, (size_t)(2u << 20));
		cudaError_t e = cudaMalloc(&m->ptr, m->size);
		r = e == cudaSuccess ? 0 : fail(c, e, "cudaMalloc");
		if (r == 0) {
			cudaIpcMemHandle_t h;
			e = cudaIpcGetMemHandle(&h, m->ptr);
			r = e == cudaSuccess ? 0 : fail(c, e, "cudaIpcGetMemHandle");
			_Static_assert(sizeof(h) == WIRE_IPC_HANDLE_SIZE, "IPC memory handle size");
			memcpy(x.ipc, &h, sizeof(h));
		}
		x.kind = WIRE_DEVICE_IPC;
	}
	if (r < 0) {
		mem_release(c, m);
		return r;
	}
	*ret = m;
	*ret_size = m->size;
	*ret_export = x;
	return 0;
}

static void cuda_mem_free(struct gpu_backend *b, struct gpu_mem *m)
{
	struct cuda *c = to_cuda(b);
	(void)use_device(c, m->device);
	mem_release(c, m);
}

static int cuda_event_new(struct gpu_backend *b, int device, struct gpu_event **ret,
			  uint8_t ret_handle[WIRE_IPC_HANDLE_SIZE])
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, device);
	if (r < 0)
		return r;
	struct gpu_event *ev = calloc(1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	ev->device = device;
	cudaError_t e = cudaEventCreateWithFlags(&ev->e, cudaEventInterprocess | cudaEventDisableTiming);
	if (e != cudaSuccess) {
		free(ev);
		return fail(c, e, "cudaEventCreateWithFlags");
	}
	cudaIpcEventHandle_t h;
	_Static_assert(sizeof(h) == WIRE_IPC_HANDLE_SIZE, "IPC event handle size");
	e = cudaIpcGetEventHandle(&h, ev->e);
	if (e != cudaSuccess) {
		(void)cudaEventDestroy(ev->e);
		free(ev);
		return fail(c, e, "cudaIpcGetEventHandle");
	}
	memcpy(ret_handle, &h, sizeof(h));
	*ret = ev;
	return 0;
}

static void cuda_event_free(struct gpu_backend *b, struct gpu_event *ev)
{
	(void)cudaEventDestroy(ev->e);
	free(ev);
}

static int cuda_wait(struct gpu_backend *b, struct gpu_stream *s, struct gpu_event *ev)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, s->device);
	if (r < 0)
		return r;
	cudaError_t e = cudaStreamWaitEvent(s->s, ev->e, 0);
	return e == cudaSuccess ? 0 : fail(c, e, "cudaStreamWaitEvent");
}

static int cuda_copy_h2d(struct gpu_backend *b, struct gpu_stream *s, struct gpu_mem *dst, size_t off,
			 const void *src, size_t len)
{
	struct cuda *c = to_cuda(b);
	if (off > dst->size || len > dst->size - off)
		return -EINVAL;
	int r = use_device(c, s->device);
	if (r < 0)
		return r;
	cudaError_t e = cudaMemcpyAsync((uint8_t *)dst->ptr + off, src, len, cudaMemcpyHostToDevice, s->s);
	return e == cudaSuccess ? 0 : fail(c, e, "cudaMemcpyAsync");
}

static int cuda_record(struct gpu_backend *b, struct gpu_stream *s, struct gpu_event *ev)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, s->device);
	if (r < 0)
		return r;
	cudaError_t e = cudaEventRecord(ev->e, s->s);
	return e == cudaSuccess ? 0 : fail(c, e, "cudaEventRecord");
}

static int cuda_query(struct gpu_backend *b, struct gpu_event *ev)
{
	cudaError_t e = cudaEventQuery(ev->e);
	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady)
		return 0;
	return fail(to_cuda(b), e, "cudaEventQuery");
}

/* Runs on a CUDA driver thread: no CUDA calls here, one write(2). */
static void CUDART_CB notify_fn(void *userdata)
{
	uint64_t one = 1;
	ssize_t _unused_ n = write((int)(intptr_t)userdata, &one, sizeof(one));
}

static int cuda_notify(struct gpu_backend *b, struct gpu_stream *s, int fd)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, s->device);
	if (r < 0)
		return r;
	cudaError_t e = cudaLaunchHostFunc(s->s, notify_fn, (void *)(intptr_t)fd);
	return e == cudaSuccess ? 0 : fail(c, e, "cudaLaunchHostFunc");
}

static int cuda_timer_new(struct gpu_backend *b, int device, struct gpu_event **ret)
{
	struct cuda *c = to_cuda(b);
	int r = use_device(c, device);
	if (r < 0)
		return r;
	struct gpu_event *ev = calloc(1, sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	ev->device = device;
	/* Timing on, so not interprocess (CUDA allows interprocess events only with timing disabled). */
	cudaError_t e = cudaEventCreateWithFlags(&ev->e, cudaEventDefault);
	if (e != cudaSuccess) {
		free(ev);
		return fail(c, e, "cudaEventCreateWithFlags");
	}
	*ret = ev;
	return 0;
}

static int cuda_elapsed(struct gpu_backend *b, struct gpu_event *start, struct gpu_event *end, uint64_t *ret_ns)
{
	/* Queried first so that cudaEventElapsedTime never meets an unfinished event (it would not block, but fail). */
	cudaError_t e = cudaEventQuery(end->e);
	if (e == cudaErrorNotReady)
		return 0;
	if (e != cudaSuccess)
		return fail(to_cuda(b), e, "cudaEventQuery");
	float ms = 0;
	e = cudaEventElapsedTime(&ms, start->e, end->e);
	if (e == cudaErrorNotReady)
		return 0;
	if (e != cudaSuccess)
		return fail(to_cuda(b), e, "cudaEventElapsedTime");
	*ret_ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
	return 1;
}

static const struct gpu_backend_ops cuda_ops = {
	.name = "cuda",
	.free = cuda_free,
	.device_count = cuda_device_count,
	.device_check = cuda_device_check,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.stream_new = cuda_stream_new,
	.stream_free = cuda_stream_free,
	.stream_query = cuda_stream_query,
	.mem_new = cuda_mem_new,
	.mem_free = cuda_mem_free,
	.event_new = cuda_event_new,
	.event_free = cuda_event_free,
	.wait = cuda_wait,
	.copy_h2d = cuda_copy_h2d,
	.record = cuda_record,
	.query = cuda_query,
	.notify = cuda_notify,
	.timer_new = cuda_timer_new,
	.elapsed = cuda_elapsed,
};

/* Resolves one driver entry point; false when this driver lacks it. */
static bool entry(const char *name, void **fn)
{
	enum cudaDriverEntryPointQueryResult q;
	return cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
	       q == cudaDriverEntryPointSuccess && *fn;
}

int gpu_backend_cuda_new(struct gpu_backend **ret, char *err, size_t errlen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
		return errno_of(e) ? errno_of(e) : -ENODEV;
	}
	if (n <= 0) {
		snprintf(err, errlen, "no CUDA device is visible");
		return -ENODEV;
	}
	struct cuda *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->b.ops = &cuda_ops;
	c->devices = n;
	c->current = -1;
	struct vmm *v = &c->vmm;
	c->have_vmm = entry("cuMemCreate", (void **)&v->create) && entry("cuMemRelease", (void **)&v->release) &&
		      entry("cuMemExportToShareableHandle", (void **)&v->export_handle) &&
		      entry("cuMemAddressReserve", (void **)&v->reserve) &&
		      entry("cuMemAddressFree", (void **)&v->address_free) && entry("cuMemMap", (void **)&v->map) &&
		      entry("cuMemUnmap", (void **)&v->unmap) && entry("cuMemSetAccess", (void **)&v->set_access) &&
		      entry("cuMemGetAllocationGranularity", (void **)&v->granularity) &&
		      entry("cuDeviceGetAttribute", (void **)&v->attribute);
	if (!entry("cuGetErrorName", (void **)&v->error_name) || !entry("cuGetErrorString", (void **)&v->error_string)) {
		v->error_name = NULL;
		v->error_string = NULL;
	}
	PFN_cuDeviceGetAttribute_v2000 drv_attribute = NULL;
	if (!entry("cuDeviceGetAttribute", (void **)&drv_attribute))
		drv_attribute = NULL;
	for (int d = 0; d < MIN(n, CUDA_MAX_DEVICES); d++)
		check_device(c, d, drv_attribute, c->unusable[d], sizeof(c->unusable[d]));
	*ret = &c->b;
	return 0;
}
