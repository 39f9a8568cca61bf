/* SPDX-License-Identifier: MIT */
/*
 * The control socket: accepts clients, speaks proto/wire.h, attaches
 * sessions, answers status requests. Runs on the main thread's libevent loop.
 * Every connection has bounded buffers and is dropped on the first protocol
 * violation; the daemon keeps serving everyone else.
 */
#pragma once

#include <stdint.h>

#include "daemon/conf/conf.h"
#include "daemon/feed/feed.h"
#include "daemon/feed/session.h"

struct event_base;
struct server;

struct server_config {
	const char *socket_path;
	unsigned ring_slots;
	const char *gpu_status; /* "unavailable: <reason>" or "cuda:N" */
};

/*
 * Binds the socket and starts serving the given feeds (the server takes a
 * reference on each). Returns 0 or a negative errno with a message in err.
 */
int server_new(struct event_base *base, const struct server_config *cfg, struct producer *producer,
	       struct feed **feeds, size_t n_feeds, struct server **ret, char *err, size_t errlen);

/* Stops accepting, tells attached clients the daemon is stopping, and frees everything. */
struct server *server_free(struct server *s);

/* The status document (docs/protocol.md#status), as JSON text (caller frees). */
char *server_status_json(struct server *s);
