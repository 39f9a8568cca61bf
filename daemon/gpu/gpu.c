/* SPDX-License-Identifier: MIT */
/*
 * Backend choice and the status line. The CUDA backend exists only when the
 * build found the toolkit (HAVE_CUDA); otherwise the reason is the build.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "daemon/gpu/gpu.h"
#include "proto/macro.h"

/* Device allocations are made in these units (VMM granularity and the cudaMalloc fallback alike). */
#define GPU_ALLOC_UNIT (UINT64_C(2) << 20)

#if !HAVE_CUDA
int gpu_backend_cuda_new(struct gpu_backend **ret, char *err, size_t errlen)
{
	snprintf(err, errlen, "feedd was built without CUDA support");
	return -ENOSYS;
}
#endif

/* The GPU layer over backend b (NULL: unavailable, r and why say why). */
static int open_with(struct gpu_backend *b, int r, const char *why, struct gpu **ret)
{
	if (r == -ENOMEM && !why[0])
		return r;
	struct gpu *g = calloc(1, sizeof(*g));
	if (!g) {
		gpu_backend_free(b);
		return -ENOMEM;
	}
	if (r < 0) {
		g->backend = NULL;
		snprintf(g->status, sizeof(g->status), "unavailable: %s", why[0] ? why : strerror(-r));
	} else {
		g->backend = b;
		int n = g->backend->ops->device_count(g->backend);
		snprintf(g->status, sizeof(g->status), "%s: %d device%s", g->backend->ops->name, n, n == 1 ? "" : "s");
		g->devices = MAX(n, 0);
		g->used = calloc(MAX(g->devices, 1), sizeof(*g->used));
		if (!g->used) {
			gpu_backend_free(g->backend);
			free(g);
			return -ENOMEM;
		}
	}
	*ret = g;
	return 0;
}

int gpu_open(struct gpu **ret)
{
	char why[256] = "";
	struct gpu_backend *b = NULL;
	int r = gpu_backend_cuda_new(&b, why, sizeof(why));
	return open_with(r < 0 ? NULL : b, r, why, ret);
}

int gpu_open_backend(struct gpu_backend *b, struct gpu **ret)
{
	return open_with(b, 0, "", ret);
}

struct gpu *gpu_free(struct gpu *g)
{
	if (!g)
		return NULL;
	gpu_backend_free(g->backend);
	free(g->used);
	free(g);
	return NULL;
}

void gpu_configure(struct gpu *g, uint64_t memory_max)
{
	if (g)
		g->memory_max = memory_max;
}

json_t *gpu_client_json(struct staging *st)
{
	staging_collect(st);
	const struct staging_counters *n = &st->n;
	return json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:f, s:I, s:o, s:I}", "device", st->device, "export",
			 st->export.kind == WIRE_DEVICE_VMM ? "vmm" : "ipc", "memory_bytes",
			 (json_int_t)st->mem_size, "copies", (json_int_t)n->copies, "h2d_bytes", (json_int_t)n->bytes,
			 "events_waited", (json_int_t)n->waits, "h2d_ms", (double)n->h2d_ns / 1e6, "copies_timed",
			 (json_int_t)n->timed, "h2d_gb_per_s",
			 n->h2d_ns ? json_real((double)n->timed_bytes / (double)n->h2d_ns) : json_null(),
			 "refills_deferred", (json_int_t)n->not_ready);
}

int gpu_attach(struct gpu *g, struct ring *ring, uint32_t device, struct staging **ret, char *err, size_t errlen)
{
	if (!gpu_available(g)) {
		snprintf(err, errlen, "cuda:%u was asked for, but feedd has no GPU staging (%s)", device,
			 g ? g->status : "unavailable");
		return -ENODEV;
	}
	if (device >= (uint32_t)g->devices) {
		snprintf(err, errlen, "there is no device cuda:%u (feedd sees %d)", device, g->devices);
		return -ENODEV;
	}
	/* Checked before allocating, at the size the allocation will round to. */
	uint64_t need = ALIGN_UP((uint64_t)ring->hdr->slot_size * ring->hdr->slot_count, GPU_ALLOC_UNIT);
	if (g->memory_max && g->used[device] + need > g->memory_max) {
		snprintf(err, errlen,
			 "its device buffers need %" PRIu64 " bytes on cuda:%u, and with %" PRIu64
			 " bytes already staged there that passes feedd's gpu_memory_max (%" PRIu64 " bytes)",
			 need, device, g->used[device], g->memory_max);
		return -EDQUOT;
	}
	struct staging *st;
	int r = staging_new(g->backend, (int)device, ring->hdr, ring->size, ring->space_efd, &st, err, errlen);
	if (r < 0)
		return r;
	st->charge = &g->used[device];
	*st->charge += st->mem_size;
	*ret = st;
	return 0;
}

int gpu_attach_reply(struct gpu *g, struct ring *ring, const struct wire_attach *a, struct staging **ret_staging,
		     uint8_t **ret_msg, size_t *ret_len, int *ret_fd, char *err, size_t errlen)
{
	struct staging *st = NULL;
	struct wire_device_reply rep = { .kind = WIRE_DEVICE_HOST };
	int r = gpu_attach(g, ring, a->device, &st, err, errlen);
	if (r < 0 && !(a->flags & WIRE_ATTACH_HOST_FALLBACK))
		return r;
	if (r < 0)
		snprintf(rep.reason, sizeof(rep.reason), "%s", err);
	else
		staging_reply(st, &rep);
	size_t len = WIRE_HEADER_SIZE + WIRE_DEVICE_REPLY_SIZE(rep.slot_count);
	uint8_t *msg = malloc(len);
	int fd = -1;
	if (!msg) {
		snprintf(err, errlen, "out of memory");
		staging_free(st, NULL);
		return -ENOMEM;
	}
	r = wire_encode_device_reply(msg, len, &rep);
	if (r >= 0 && st && st->export.fd >= 0 && (fd = fcntl(st->export.fd, F_DUPFD_CLOEXEC, 3)) < 0)
		r = -errno;
	if (r < 0) {
		snprintf(err, errlen, "cannot describe the device buffers: %s", strerror(-r));
		free(msg);
		staging_free(st, NULL);
		return r;
	}
	*ret_staging = st;
	*ret_msg = msg;
	*ret_len = len;
	*ret_fd = fd;
	return 0;
}
