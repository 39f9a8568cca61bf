/* SPDX-License-Identifier: MIT */
/*
 * What the files of the server share: the server and connection objects and
 * the functions one file calls in another. Main thread only.
 *
 *   server.c   the server object: start, policy, feeds, reload, drain, the
 *              once-a-second tick, the watchdog's progress check, the status
 *              snapshot (from conn_status and telemetry's views), stop
 *   listen.c   the listening socket: binding it (in a directory no one else
 *              can write), accepting, credentials, allow lists, connection
 *              limits and admin slots, running out of fds, refusals, pidfds
 *   headroom.c what memory the node and feedd's cgroup have left
 *   conn.c     one connection: framing, bounded input and output queues,
 *              fds passed with replies, dropping a peer that breaks the
 *              protocol; what status and telemetry read of its session
 *   request.c  the requests: HELLO, ATTACH, STATUS, DETACH, RELOAD, DRAIN
 *   status.c   renders a snapshot: the status document and the STATUS= line
 *              (it includes only status.h and the views' headers)
 *   status-clients.c  the document's clients array, without a jansson tree
 *
 * The server owns its connections (a list), its telemetry object, and a
 * reference on each feed it serves (struct served, with the feed's clients
 * and draining); a connection owns its session and embeds its telemetry.
 */
#pragma once

#include <event2/event.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/log/log.h"
#include "daemon/ring/ring.h"
#include "daemon/server/server.h"
#include "daemon/server/status.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/macro.h"
#include "proto/wire.h"

#define MAX_OUT_BYTES (16u << 20) /* a client that does not read its replies is dropped */
#define MAX_LINGER 256 /* refused connections kept half-open until the next tick */
#define TRIM_AFTER_DEPARTED 8 /* sessions closed before the tick gives freed memory back (malloc_trim) */
#define CHECK_PER_TICK 1024 /* shards whose identity the tick checks, over all feeds */
/*
 * Idle ring memory kept for the next attach of the same uid (ring.h, struct
 * ring_pool): at most this much, and none idle longer than RING_POOL_IDLE_NS
 * past a tick. Under attach churn a ring is taken again within milliseconds.
 */
#define RING_POOL_MAX (16u << 20)
#define RING_POOL_IDLE_NS (500 * NSEC_PER_MSEC)
/*
 * How long a headroom reading (headroom.c: /proc/meminfo and every memory
 * cgroup up to the root, a dozen files) lets further attaches in without
 * reading again, less the rings attached since. A refusal always reads afresh.
 */
#define HEADROOM_FRESH_NS (100 * NSEC_PER_MSEC)

struct out_msg {
	struct out_msg *next;
	size_t len, off;
	int fds[WIRE_ATTACH_FDS];
	unsigned n_fds;
	uint8_t data[];
};

struct conn {
	struct server *srv;
	struct conn *prev, *next;
	int fd, pidfd;
	struct event *rev, *wev, *pidev;
	uint8_t in[WIRE_MAX_REQUEST];
	size_t in_len;
	struct out_msg *out_head, *out_tail;
	size_t out_bytes;
	bool hello, closing;
	bool reserved; /* holds one of the admin_connections slots */
	bool uid_counted; /* in its uid's count (listen_uid_count) */
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t *groups;     /* supplementary groups (SO_PEERGROUPS), all of them; malloc'd */
	unsigned n_groups;
	char name[32];
	struct session *session;
	struct session_explain *explain; /* an EXPLAIN waiting for text to be tokenized (feed/session-explain.c) */
	uint32_t explain_batches;        /* the batches it asked for */
	/* while attached: what it attached to (the session holds a reference on feed) */
	struct feed *feed;
	uint32_t rank, world;
	struct telemetry_client tm; /* tracked while the session is attached */
	uint64_t memory; /* ring bytes this connection's session holds */
	struct log_context log;
	uint64_t connect_ns;
	/* a rate over the last status interval */
	uint64_t rate_delivered, rate_ns, rate_wait, rate_step;
	double tokens_per_s, stall_pct;
	/* consumption watch: released count (tail) and when it last moved */
	uint64_t idle_released, idle_since_ns;
	bool stuck;
	/* pipeline watch: published count and when it last moved */
	uint64_t prog_published, prog_since_ns;
	/* a long cursor (elastic state) sent as STATE parts, for the next ATTACH or EXPLAIN */
	char *state;
	size_t state_len;
};

/* A feed as the server serves it: the server's policy state of the feed is here, not in struct feed. */
struct served {
	struct feed *feed;
	unsigned clients; /* connections attached to it (server_attached / server_detached) */
	bool draining;    /* takes no new attaches (drained, or removed from the config) */
	bool removed;     /* no longer in the config: let go when its last client detaches */
};

/* Refusals of one kind: the first in a tick is logged, the rest counted and summed up at the tick. */
struct refusal_log {
	uint64_t suppressed;
	bool logged;
};

enum { REFUSE_CREDENTIALS, REFUSE_LIMIT, REFUSE_MEMORY, REFUSE_FDS, REFUSE_HANDSHAKE, _REFUSE_MAX };

struct server {
	struct event_base *base;
	struct server_config cfg;
	char *path;
	bool own_path; /* bound by us: unlink at exit */
	int listen_fd;
	struct event *listen_ev, *tick_ev;
	int op_fd;           /* the operator socket (listen_operator), or -1 */
	struct event *op_ev; /* its accepts, always before everything else */
	char *op_path;       /* bound by us: unlinked at exit */
	struct producer *producer;
	struct feed_watch *watch; /* the served feeds' files under read leases or inotify (feed/integrity.h); may be NULL */
	struct telemetry *tm; /* created with the server, freed after its connections */
	struct served *feeds;
	size_t n_feeds;
	size_t check_first; /* the feed the tick's shard check starts at */
	struct checker *checker;    /* the tick's shard check, on a thread (feed/checker.h); NULL: none */
	uint64_t check_reported_ns; /* a stuck sweep is logged again once stuck this long */
	unsigned departed;  /* sessions closed since the tick last trimmed the heap */
	struct conn *conns;
	size_t n_conns;
	struct uid_slot *uid_slots; /* connections per uid (listen_uid_count), open addressing; cap a power of two */
	size_t uid_cap, uid_used;
	size_t n_reserved; /* of them, in the slots kept for operators (admin_connections) */
	int spare_fd;      /* spent to accept and refuse a connection when out of fds (listen.c) */
	bool accept_paused; /* out of fds with no spare: the listening event is off until the tick */
	uint64_t next_id;
	uint64_t start_ns;
	struct server_counters n;
	struct refusal_log refusal_logs[_REFUSE_MAX];
	int linger[MAX_LINGER]; /* refused: ERROR sent, write side shut, closed at the next tick */
	size_t n_linger;
	uint64_t memory; /* ring bytes of all sessions */
	struct ring_pool *rings; /* idle ring memory, per uid, for the next attaches (NULL: none) */
	/* the last headroom_read() that let an attach in: what it found, when, and s->memory then */
	uint64_t room, room_ns, room_memory;
	char metrics_listen[80];  /* the metrics endpoint's bound address, or "" (server_set_metrics) */
	char metrics_error[256];  /* why it is not listening, or "" */

	/* policy, from the config (server_configure) */
	unsigned ring_slots;
	struct conf_ids allow, admin;
	unsigned max_connections, max_connections_per_uid, admin_connections;
	unsigned handshake_timeout_s;
	unsigned load_timeout_s; /* a shard check stuck this long is reported */
	uint64_t client_memory_max, uid_memory_max, memory_max;
	unsigned stuck_client_s;
};

/* server.c */
/* The feed that takes attaches under `name`; NULL, with *ret_draining set when only a draining one exists. */
struct feed *server_find_feed(struct server *s, const char *name, bool *ret_draining);
/* Counts a connection attached to / detached from feed f, which the server serves. */
void server_attached(struct server *s, const struct feed *f);
void server_detached(struct server *s, const struct feed *f);

/* headroom.c */
/*
 * The bytes feedd may still allocate: the least of MemAvailable and, for its
 * memory cgroup and each ancestor (v1 or v2), limit minus usage. Returns 0
 * with *ret (UINT64_MAX when nothing is known) and the tightest bound
 * described in what; or -ENOENT when nothing could be read.
 */
int headroom_read(uint64_t *ret, char *what, size_t whatlen);

/* listen.c */
/* Binds path for the control socket. Returns the listening fd, or a negative errno with a message in err. */
int listen_bind(const char *path, unsigned mode, int64_t group, char *err, size_t errlen);
/* The listening socket's read event: accepts every pending connection. */
void listen_on_accept(evutil_socket_t fd, short what, void *userdata);
/*
 * Binds the operator socket beside the control socket (proto/wire.h,
 * wire_operator_socket_path) and accepts on it at the operators' priority.
 * Without it (a directory feedd cannot bind in, a path too long) operators
 * use the control socket as before: logged, not an error.
 */
void listen_operator(struct server *s);
/* Closes the operator socket and removes its name. */
void listen_operator_close(struct server *s);
/* Logs a refusal of kind (REFUSE_*), unless one of its kind was logged this tick already. */
void listen_refusal_log(struct server *s, unsigned kind, const char *fmt, ...) _printf_(3, 4);
/* Raises the soft fd limit to the hard one; returns the soft limit. */
unsigned long listen_raise_nofile(void);
/* Accepts again after running out of fds paused it (called each tick). */
void listen_resume(struct server *s);
/*
 * The count of connections of uid (counted at accept, uncounted by
 * conn_free), found in O(1) however many connections there are: a flood's
 * every accept asks it. NULL: out of memory (the caller counts by walking).
 */
struct uid_slot {
	uid_t uid;
	bool used;
	unsigned n;
	uint64_t memory; /* ring bytes of its connections' sessions (conn_set_memory), for uid_memory_max */
};
unsigned *listen_uid_count(struct server *s, uid_t uid);
/* The slot of uid (made if new), as listen_uid_count; NULL: out of memory. */
struct uid_slot *listen_uid_slot(struct server *s, uid_t uid);
/* Closes a refused connection kept half-open, reading what the client sent first. */
void listen_linger_close(int fd);
/* Whether the peer is root or feedd's own user, or is listed in ids by uid, gid or a supplementary group. */
bool listen_peer_trusted(const struct conn *c);
bool listen_peer_listed(const struct conn *c, const struct conf_ids *ids);

/* conn.c */
/* What telemetry and status read of c's session at `now`: its ring and consumer page. c must have a session. */
void conn_reading(const struct conn *c, uint64_t now, struct telemetry_reading *ret);
/* c's entry of a status snapshot at `now`. c must have a session. */
void conn_status(struct conn *c, uint64_t now, struct status_client *ret);
/*
 * Sets the ring bytes c's session holds (0: none), in c, the server's total
 * and its uid's (an attach checks uid_memory_max against that, without
 * walking every connection).
 */
void conn_set_memory(struct conn *c, uint64_t memory);
/* Frees a connection and closes its session. */
void conn_free(struct conn *c);
/* Drops a connection. When why is set it was a protocol error: counted (and in *counter) and logged. */
void conn_drop(struct conn *c, uint64_t *counter, const char *why);
/* Sends queued output. Returns 0, or -EPIPE etc. when the peer is gone. */
int conn_flush(struct conn *c);
/* Queues a message; takes ownership of fds (dup'd by the caller). Returns 0, -ENOBUFS (over MAX_OUT_BYTES), -ENOMEM. */
int conn_queue(struct conn *c, const void *data, size_t len, const int *fds, unsigned n_fds);
/* Queues an ERROR message (code < 0; others are sent as -EIO). */
void conn_send_error(struct conn *c, int code, const char *fmt, ...) _printf_(3, 4);
/* Encodes an ERROR message into buf. Returns its size or a negative errno. */
int conn_encode_error(uint8_t *buf, size_t cap, int code, const char *fmt, va_list ap) _printf_(4, 0);
/* The read, write and peer-exit events of a connection. */
void conn_on_read(evutil_socket_t fd, short what, void *userdata);
void conn_on_write(evutil_socket_t fd, short what, void *userdata);
void conn_on_peer_exit(evutil_socket_t fd, short what, void *userdata);

/* request.c */
/* Handles one complete message. Returns 0, -ENOBUFS (output over its limit), or another negative errno to drop the client. */
int request_dispatch(struct conn *c, const struct wire_header *h, const uint8_t *payload);
