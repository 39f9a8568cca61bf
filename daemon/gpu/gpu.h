/* SPDX-License-Identifier: MIT */
/*
 * The daemon's GPU: which backend serves device attachments, or why none
 * does (host-only mode). Opened once at start; never fails for lack of a
 * GPU: then every device attach is answered with the reason, and host
 * batches flow as always.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/gpu/backend.h"
#include "daemon/gpu/staging.h"
#include "daemon/ring/ring.h"

struct gpu {
	struct gpu_backend *backend; /* NULL in host-only mode */
	char status[320];            /* "cuda: N devices (...)" or "unavailable: <reason>" */
	uint64_t memory_max;         /* [feedd] gpu_memory_max: device bytes of client staging per device, 0: no limit */
	uint64_t *used;              /* device bytes staged now, per device (backend's device_count entries) */
	int devices;
};

/*
 * Opens the CUDA backend. Returns 0 with *ret set, host-only included
 * (status says why); -ENOMEM only.
 */
int gpu_open(struct gpu **ret);
/*
 * Opens over a backend the caller made (the tests' host simulation,
 * gpu_backend_sim_new(), which is built only into the tests); takes b.
 */
int gpu_open_backend(struct gpu_backend *b, struct gpu **ret);
struct gpu *gpu_free(struct gpu *g);

/* Applies the limits of a (re)loaded config; attachments made before keep their memory. */
void gpu_configure(struct gpu *g, uint64_t memory_max);

/* The per-client "gpu" member of status: device, copies, bytes, H2D time, waits (new reference). */
json_t *gpu_client_json(struct staging *st);

/* True when device attachments can be served. */
static inline bool gpu_available(const struct gpu *g)
{
	return g && g->backend;
}

/*
 * Stages `ring` on `device` for one client. Returns 0; -ENODEV in host-only
 * mode or for a missing device; -EDQUOT when its device buffers would pass
 * gpu_memory_max; other negative errnos from the backend; with a line in err.
 */
int gpu_attach(struct gpu *g, struct ring *ring, uint32_t device, struct staging **ret, char *err, size_t errlen);

/*
 * The device half of an ATTACH that set WIRE_ATTACH_DEVICE, for the ring of
 * the new session. Returns 0 with the DEVICE_REPLY to send after the
 * ATTACH_REPLY (header included, malloc'd, caller frees) in *ret_msg and
 * *ret_len, the fd to pass with it in *ret_fd (a duplicate the caller owns,
 * or -1), and the staging for the session in *ret_staging: NULL when the
 * client asked for WIRE_ATTACH_HOST_FALLBACK and gets host batches (the
 * reply's reason says why). Otherwise a negative errno (-ENODEV without GPU
 * staging or for a missing device, ...) with the reason in err: refuse the
 * attach with it.
 */
int gpu_attach_reply(struct gpu *g, struct ring *ring, const struct wire_attach *a, struct staging **ret_staging,
		     uint8_t **ret_msg, size_t *ret_len, int *ret_fd, char *err, size_t errlen);
