/* SPDX-License-Identifier: MIT */
/*
 * The control socket: accepts clients, speaks proto/wire.h, attaches
 * sessions, answers status requests and operator commands. Runs on the main
 * thread's libevent loop. Every connection has bounded buffers and is
 * dropped on the first protocol violation; peers are checked against the
 * allow lists and the connection and memory limits; a peer whose process
 * exits is noticed through a pidfd even while another process still holds
 * its socket. The daemon keeps serving everyone else.
 *
 * The server holds a reference on each feed it serves. The feed list changes
 * on reload (server_set_feeds): feeds that left the config, or whose
 * definition changed, keep serving their attached clients as "draining" and
 * are let go when the last one detaches.
 */
#pragma once

/*
 * The event loop's priorities (main.c sets them on the base before any event
 * exists, so every event is ordinary): an operator's connection (root,
 * feedd's user, admin_users/admin_groups) is served first, before the
 * ordinary events of the same loop turn, so that `feedctl status` answers
 * at once however many clients' requests are queued (issue 18).
 */
#define SERVER_PRIORITIES 2
#define SERVER_PRIORITY_ADMIN 0

#include <stdint.h>

#include "daemon/conf/conf.h"
#include "daemon/feed/feed.h"
#include "daemon/feed/session.h"
#include "daemon/gpu/gpu.h"
#include "daemon/server/status.h"

struct event_base;
struct server;

struct server_config {
	const char *socket_path;
	int listen_fd;          /* passed by the service manager (taken over), or -1: bind socket_path */
	const char *gpu_status; /* "unavailable: <reason>" or "cuda: N devices" */
	struct gpu *gpu;        /* device attachments (daemon/gpu); NULL or unavailable: host-only */
	/*
	 * An operator's RELOAD from connection `client`: start re-reading the
	 * config off the main loop. Returns 0 once started (the answer follows
	 * with server_reload_done), or a negative errno with the reason in msg.
	 */
	int (*reload)(void *userdata, uint64_t client, char *msg, size_t msglen);
	void *userdata;
};

/*
 * Starts listening (on cfg->listen_fd, or by binding cfg->socket_path with
 * the config's mode and group) and serves the given feeds (the server takes
 * a reference on each) under the policy of conf. Returns 0 or a negative
 * errno with a message in err.
 */
int server_new(struct event_base *base, const struct server_config *cfg, const struct conf *conf,
	       struct producer *producer, struct feed **feeds, size_t n_feeds, struct server **ret, char *err,
	       size_t errlen);

/* Applies a (re-read) config's policy: ring_slots, allow lists, limits. Returns 0 or -ENOMEM. */
int server_configure(struct server *s, const struct conf *conf);

/*
 * Serves `feeds` from now on (taking a reference on each). A running feed of
 * the same name that is ready, not draining and has the same fingerprint is
 * kept instead of the new one, so its clients notice nothing. Others that
 * are no longer listed drain. Writes a one-line summary into msg.
 */
void server_set_feeds(struct server *s, struct feed **feeds, size_t n_feeds, char *msg, size_t msglen);

/*
 * Answers the RELOAD of connection `client` (if it is still there): r >= 0
 * the summary in msg, else an ERROR with r and msg.
 */
void server_reload_done(struct server *s, uint64_t client, int r, const char *msg);

/* Feed `name` takes no new attaches; attached clients stream on. Returns 0, or -ENOENT (message in msg). */
int server_drain(struct server *s, const char *name, char *msg, size_t msglen);

/* Stops accepting, tells attached clients the daemon is stopping, and frees everything. */
struct server *server_free(struct server *s);

/*
 * Takes the status snapshot (status.h) that the status document, the
 * STATUS= line and the metrics are made of. Returns 0 (clear it with
 * status_input_clear) or -ENOMEM.
 */
int server_snapshot(struct server *s, struct status_input *ret);

/*
 * The status document (docs/protocol.md#status), as JSON text of at most
 * max_len bytes in *ret (caller frees), without what `flags` (the STATUS
 * request's WIRE_STATUS_*) leaves out. When the whole document is longer,
 * each client's per-second history keeps only its newest samples (the rest
 * counted in history.omitted). Returns 0, -EMSGSIZE (too long even with no
 * history) or -ENOMEM.
 */
int server_status_json(struct server *s, unsigned flags, size_t max_len, char **ret);

/* The one-line summary for the service manager's STATUS=: feeds, clients, tokens/s, worst stall. */
void server_status_line(struct server *s, char *buf, size_t len);

/*
 * Whether the pipeline makes progress: returns 0, or 1 with a description of
 * the first stuck stage in buf when a session has had a batch in the worker
 * pool for longer than stuck_ns without one being published.
 */
int server_stuck(struct server *s, uint64_t stuck_ns, char *buf, size_t len);

void server_counters(const struct server *s, struct server_counters *ret);

/*
 * Records where the metrics endpoint listens (listen, e.g. "127.0.0.1:9464";
 * NULL: off) or why it does not (error, or NULL), for the status document.
 */
void server_set_metrics(struct server *s, const char *listen, const char *error);
