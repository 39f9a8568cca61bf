/* SPDX-License-Identifier: MIT */
/*
 * The status snapshot and what is made of it: the status document that
 * `feedctl status --json` prints (its schema is documented in
 * docs/protocol.md and kept stable: fields are added, never renamed or
 * removed), the service manager's STATUS= line (status.c), and the
 * Prometheus metrics (daemon/metrics). Each reads the same snapshot, so a
 * number is computed in one place: server_snapshot() (server.c) reads every
 * value that needs care once (client-written consumer pages through
 * ring_read_consumer(), which clamps them) and the renderers only format.
 *
 * A snapshot points into the server's feeds, telemetry and connections: use
 * it on the main thread before returning to the event loop, then
 * status_input_clear() it. The renderers never see a session.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/feed/feed.h"
#include "daemon/gpu/gpu.h"
#include "daemon/pool/pool.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/ring_abi.h"
#include "daemon/source/remote.h"

/* Why connections were refused or dropped (status: daemon.refused / daemon.dropped). */
struct server_counters {
	uint64_t accepted;            /* connections accepted, refused ones included */
	uint64_t refused_credentials; /* peer not in allow_users / allow_groups */
	uint64_t refused_limit;       /* max_connections or max_connections_per_uid reached */
	uint64_t refused_memory;      /* attach over client_/uid_/memory_max */
	uint64_t refused_admin;       /* RELOAD/DRAIN from an unprivileged peer */
	uint64_t protocol_errors;     /* connections dropped for breaking the protocol: the sum of: */
	uint64_t bad_magic, bad_version, unknown_type, oversized, bad_message, passed_fds, unread_output,
		ring_protocol;
	uint64_t clients_reaped;      /* connections closed because the peer process exited (pidfd) */
	uint64_t stuck_clients;       /* times a client was reported for consuming nothing */
};

/* One attached client. */
struct status_client {
	/* the connection, as the server knows it */
	uint64_t id;
	pid_t pid;
	uid_t uid;
	const char *name;
	uint64_t connected_ns;  /* since the connection was accepted */
	double tokens_per_s;    /* delivered over the last tick */
	double stall_pct_tick;  /* its wait share over the last tick (the STATUS= line's "worst stall") */
	bool stuck;             /* reported for releasing nothing for stuck_client_s */
	uint64_t idle_ns;       /* since it last released a batch */
	uint64_t memory;        /* ring bytes its session holds */

	/* the session and its consumer page, read once; client-written values clamped */
	const struct feed *feed;    /* the feed it reads */
	unsigned rank, world;
	unsigned ring_slots;
	uint64_t first_batch;       /* batch index of its ring's first slot */
	bool failed;                /* its stream stopped with an error */
	bool opening;               /* its streams wait for their windows' counts (issue #22) */
	bool gpu;                   /* its batches are staged on a GPU: */
	struct gpu_client_view gpu_view;
	struct telemetry_reading reading;  /* what its consumer page and ring said */
	struct telemetry_client_view tv;   /* its telemetry (tv.tracked false when none) */
	uint64_t attached_ns;       /* since attach */
	uint64_t published;         /* batches published into its ring */
	uint64_t delivered;         /* batches next() returned (at most published) */
	uint64_t wait_ns, step_ns;  /* time blocked in next(), and between next() calls */
	uint64_t h2d_ns, reports, reported_step_ns; /* what the trainer reported itself */
	uint64_t reconnects, reconnect_ns;          /* libfeed's reconnects, counted by the client */
	uint64_t full_ns;           /* time its ring spent full */
	uint64_t fill;              /* batches published and not released */
	uint64_t epoch;             /* the epoch its stream is planned in (0 = the first pass) */
	double stall_pct;           /* wait / (wait + step) since attach, in percent */
};

/* What the server and telemetry say of a feed it serves. */
struct status_feed {
	uint64_t memory;  /* ring bytes of its clients */
	unsigned clients; /* connections attached to it */
	bool draining;    /* takes no new attaches (drained, or removed by a reload) */
	struct telemetry_stages_view stages;  /* its stage counters, over the window and in total */
	struct telemetry_feed_view verdict;   /* its diagnosis */
};

struct status_input {
	const char *socket_path;
	uint64_t uptime_ns;
	unsigned threads, threads_busy, jobs_queued; /* the worker pool */
	const char *io_engine;      /* the readers' engine, "none" without workers */
	int io_fallback;            /* why io_uring was not used (negative errno), or 0 */
	const struct telemetry *tm;              /* for the stragglers of a feed (telemetry_next_straggler) */
	struct telemetry_daemon_view telemetry;  /* the daemon-wide view and the worst line */
	const char *gpu_status;
	bool gpu_available;
	const char *metrics_listen; /* the metrics endpoint's address, or NULL when off */
	const char *metrics_error;  /* why it does not listen, or NULL */
	struct feed **feeds;
	struct status_feed *feed_info; /* per feed */
	size_t n_feeds;
	struct status_client *clients;
	size_t n_clients;
	size_t connections;         /* open connections, attached or not */
	uint64_t ring_memory;       /* ring bytes of all sessions */
	struct server_counters counters;
	struct remote_stats fetch;  /* object storage: the node's fetcher (zero when no shard is a URL) */
};

/* Frees what a snapshot allocated (server_snapshot) and zeroes it. */
void status_input_clear(struct status_input *in);

/* What a render of the document wrote of the clients' history. */
struct status_render {
	unsigned longest;          /* the longest history of a client, in samples, before trimming */
	uint64_t history_samples;  /* samples written, summed over the clients (each of 7 series) */
	size_t history_bytes;      /* bytes of those samples: the history arrays' contents */
};

/*
 * Returns the JSON text (caller frees), or NULL on allocation failure.
 * Leaves out of each client what `flags` (WIRE_STATUS_*) names, and keeps
 * the history_max newest per-second samples of each client's history
 * (UINT_MAX: all). *ret_stats (may be NULL) says what history it wrote.
 */
char *status_json(const struct status_input *in, unsigned flags, unsigned history_max, struct status_render *ret_stats);

/*
 * The document of status_json(in, flags, ...) in at most max_len bytes:
 * whole when it fits, else with the newest part of every client's history,
 * as much as fits. The size is estimated before anything is rendered (a few
 * clients rendered apart), so a document far over the limit is not rendered
 * whole first: one render in the common case, rarely two or three.
 * Returns 0 and the text in *ret (caller frees); -EMSGSIZE when even the
 * document without history does not fit; -ENOMEM.
 */
int status_json_fit(const struct status_input *in, unsigned flags, size_t max_len, char **ret);

/*
 * status_json()'s "clients" array (status-clients.c), written without a
 * jansson tree at offset `before` of the returned buffer, with `after` + 1
 * bytes free past its end for the caller; *ret_len is the offset of its end.
 * The first `before` bytes are the caller's to fill. Adds what history it
 * wrote to *ret_stats. NULL when out of memory.
 */
char *status_clients_json(const struct status_input *in, unsigned flags, unsigned history_max,
			  struct status_render *ret_stats, size_t before, size_t after, size_t *ret_len);

/*
 * Client i of the "clients" array rendered alone with all its history:
 * its bytes in *ret_bytes and what of them is history in *ret_stats (the
 * size estimate of status_json_fit()). 0, or -ENOMEM.
 */
int status_client_probe(const struct status_input *in, size_t i, unsigned flags, size_t *ret_bytes,
			struct status_render *ret_stats);

/*
 * The one-line summary for the service manager's STATUS=: feeds, clients,
 * tokens/s, the worst stall over the last tick and the worst diagnosis.
 * Always NUL-terminated.
 */
void status_line(const struct status_input *in, char *buf, size_t len);
