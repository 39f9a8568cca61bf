/* SPDX-License-Identifier: MIT */
/*
 * The daemon's GPU: which backend serves device attachments, or why none
 * does (host-only mode). Opened once at start; never fails for lack of a
 * GPU: then every device attach is answered with the reason, and host
 * batches flow as always.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/gpu/backend.h"
#include "daemon/gpu/staging.h"
#include "daemon/ring/ring.h"

/*
 * A client's staging and ring kept after the client left because copies on
 * its stream had not run: they wait on a `release` the dead client recorded,
 * and until the driver resolves that, the copy may still read the pinned
 * ring and write the device buffers. Freed by gpu_reap once they have run;
 * the ring is never unmapped while registered or under a copy.
 */
struct gpu_grave {
	struct gpu_grave *next;
	struct staging *staging;
	struct ring *ring;
	uint64_t since_ns;
};

struct gpu {
	struct gpu_backend *backend; /* NULL in host-only mode */
	struct gpu_grave *graveyard; /* stagings of departed clients whose copies have not run */
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

/* A client's GPU staging as status shows it (the "gpu" member, rendered by daemon/server/status.c). */
struct gpu_client_view {
	int device;
	bool vmm;                     /* exported as VMM handles, else CUDA IPC */
	uint64_t memory_bytes;        /* device memory of its slots */
	struct staging_counters n;    /* copies, bytes, H2D time, waits */
};

/* Collects finished copy timings and fills *ret. */
void gpu_client_view(struct staging *st, struct gpu_client_view *ret);

/*
 * Ends a client's staging and its ring; takes ownership of both (either may
 * be NULL). Frees them now when the staging's copies have all run and
 * returns 0; otherwise keeps both until gpu_reap sees them finish and
 * returns 1 (nothing blocks, and the ring stays mapped and pinned under its
 * copies). A staging made without gpu_attach is drained and freed at once.
 */
int gpu_retire(struct staging *st, struct ring *ring);

/* Frees every retired staging whose copies have run, with its ring; never blocks. On the daemon's tick. */
void gpu_reap(struct gpu *g);

/* Retired stagings still waiting for their copies, and their device bytes. */
unsigned gpu_graveyard_count(const struct gpu *g, uint64_t *ret_bytes);

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
