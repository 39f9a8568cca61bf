/* SPDX-License-Identifier: MIT */
/*
 * A host simulation of the CUDA driver's client half, as libfeed's device.c
 * uses it (tests only): built as libcuda.so.1 in a folder of its own, found
 * through LD_LIBRARY_PATH by the test that wants it (unit-libfeed-device),
 * never installed. Device memory is the POSIX fd of a VMM export (a memfd
 * here) mapped into this process, so a CUdeviceptr is a host address the
 * test can read; an IPC event is the first 8 bytes of its handle, and
 * records and waits are counted and remembered. fake_cuda_state() gives the
 * counters to the test, which holds its own dlopen() reference so that
 * libfeed's dlclose() does not drop them.
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/unit/fake-cuda/fake-cuda.h"

static struct fake_cuda_state state;
static int context; /* the primary context's address is all that is handed out */

struct CUevent_st {
	uint8_t h[8];
};

struct fake_cuda_state *fake_cuda_state(void)
{
	return &state;
}

static CUresult CUDAAPI init(unsigned int flags)
{
	(void)flags;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI device_get(CUdevice *dev, int ordinal)
{
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = 0;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI retain(CUcontext *ctx, CUdevice dev)
{
	(void)dev;
	*ctx = (CUcontext)(void *)&context;
	state.contexts++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI unretain(CUdevice dev)
{
	(void)dev;
	state.contexts--;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI push(CUcontext ctx)
{
	(void)ctx;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI pop(CUcontext *ctx)
{
	*ctx = (CUcontext)(void *)&context;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI open_event(CUevent *ev, CUipcEventHandle h)
{
	struct CUevent_st *e = malloc(sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memcpy(e->h, h.reserved, sizeof(e->h));
	*ev = e;
	state.events_opened++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI event_destroy(CUevent ev)
{
	free(ev);
	state.events_destroyed++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI stream_wait(CUstream s, CUevent ev, unsigned int flags)
{
	(void)s, (void)flags;
	memcpy(state.last_wait, ev->h, sizeof(state.last_wait));
	state.waits++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI record(CUevent ev, CUstream s)
{
	(void)s;
	memcpy(state.last_record, ev->h, sizeof(state.last_record));
	state.records++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI open_mem(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
	(void)p, (void)h, (void)flags;
	return CUDA_ERROR_NOT_SUPPORTED; /* the simulation exports VMM fds only */
}

static CUresult CUDAAPI close_mem(CUdeviceptr p)
{
	(void)p;
	return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult CUDAAPI import(CUmemGenericAllocationHandle *handle, void *os_handle, CUmemAllocationHandleType type)
{
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = dup((int)(intptr_t)os_handle); /* the caller closes its fd: the handle keeps the memory */
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	*handle = (CUmemGenericAllocationHandle)fd + 1;
	state.imports++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI mem_release(CUmemGenericAllocationHandle handle)
{
	close((int)(handle - 1));
	state.mem_releases++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI reserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
	(void)align, (void)addr, (void)flags;
	void *m = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*p = (CUdeviceptr)(uintptr_t)m;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			    unsigned long long flags)
{
	(void)flags;
	void *m = mmap((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, (int)(handle - 1),
		       (off_t)offset);
	if (m == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	state.maps++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	(void)p, (void)size, (void)desc, (void)count;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI unmap(CUdeviceptr p, size_t size)
{
	mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	state.unmaps++;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI address_free(CUdeviceptr p, size_t size)
{
	munmap((void *)(uintptr_t)p, size);
	return CUDA_SUCCESS;
}

/* The typed entry points, so that a signature that differs from the driver's does not compile. */
static const struct {
	const char *name;
	void (*fn)(void);
} entries[] = {
#define E(name, fn, type) { name, (void (*)(void))(type)fn }
	E("cuInit", init, PFN_cuInit_v2000),
	E("cuDeviceGet", device_get, PFN_cuDeviceGet_v2000),
	E("cuDevicePrimaryCtxRetain", retain, PFN_cuDevicePrimaryCtxRetain_v7000),
	E("cuDevicePrimaryCtxRelease", unretain, PFN_cuDevicePrimaryCtxRelease_v11000),
	E("cuCtxPushCurrent", push, PFN_cuCtxPushCurrent_v4000),
	E("cuCtxPopCurrent", pop, PFN_cuCtxPopCurrent_v4000),
	E("cuIpcOpenEventHandle", open_event, PFN_cuIpcOpenEventHandle_v4010),
	E("cuEventDestroy", event_destroy, PFN_cuEventDestroy_v4000),
	E("cuStreamWaitEvent", stream_wait, PFN_cuStreamWaitEvent_v3020),
	E("cuEventRecord", record, PFN_cuEventRecord_v2000),
	E("cuIpcOpenMemHandle", open_mem, PFN_cuIpcOpenMemHandle_v11000),
	E("cuIpcCloseMemHandle", close_mem, PFN_cuIpcCloseMemHandle_v4010),
	E("cuMemImportFromShareableHandle", import, PFN_cuMemImportFromShareableHandle_v10020),
	E("cuMemAddressReserve", reserve, PFN_cuMemAddressReserve_v10020),
	E("cuMemMap", map, PFN_cuMemMap_v10020),
	E("cuMemSetAccess", set_access, PFN_cuMemSetAccess_v10020),
	E("cuMemUnmap", unmap, PFN_cuMemUnmap_v10020),
	E("cuMemAddressFree", address_free, PFN_cuMemAddressFree_v10020),
	E("cuMemRelease", mem_release, PFN_cuMemRelease_v10020),
#undef E
};

/* cuGetProcAddress_v2, under its exported name (cuda.h maps the plain names to versioned ones). */
__attribute__((visibility("default"))) CUresult fake_get_proc_address(const char *symbol, void **pfn, int version,
								      cuuint64_t flags,
								      CUdriverProcAddressQueryResult *found)
	__asm__("cuGetProcAddress_v2");
CUresult fake_get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
			       CUdriverProcAddressQueryResult *found)
{
	(void)version, (void)flags;
	for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
		if (strcmp(symbol, entries[i].name) == 0) {
			memcpy(pfn, &entries[i].fn, sizeof(*pfn)); /* POSIX: a function pointer fits a void * */
			*found = CU_GET_PROC_ADDRESS_SUCCESS;
			return CUDA_SUCCESS;
		}
	*pfn = NULL;
	*found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_ERROR_NOT_FOUND;
}
