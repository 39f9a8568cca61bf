/* SPDX-License-Identifier: MIT */
/*
 * The status document: what `feedctl status --json` prints. Its schema is
 * documented in docs/protocol.md and kept stable: fields are added, never
 * renamed or removed.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/feed/feed.h"
#include "daemon/feed/session.h"
#include "daemon/pool/pool.h"

struct status_client {
	uint64_t id;
	pid_t pid;
	uid_t uid;
	const char *name;
	struct session *session;
	uint64_t connected_ns;
	double tokens_per_s;
};

struct status_input {
	const char *socket_path;
	uint64_t uptime_ns;
	struct pool *pool;
	const char *gpu_status;
	struct feed **feeds;
	size_t n_feeds;
	struct status_client *clients;
	size_t n_clients;
	uint64_t accepted, protocol_errors;
};

/* Returns the JSON text (caller frees), or NULL on allocation failure. */
char *status_json(const struct status_input *in);
