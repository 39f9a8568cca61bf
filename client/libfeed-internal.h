/* SPDX-License-Identifier: MIT */
/*
 * What libfeed's two files share: the client object, how a failure is
 * recorded, how a message is read, and the device half (device.c) that
 * libfeed.c calls at attach, release and close. Nothing here is exported.
 *
 * Everything read from the daemon is untrusted. The ring's geometry is
 * validated once at attach and copied into `geo`; from then on only the copy
 * is used, whatever the shared header says.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "feed/feed.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"
#include "proto/wire.h"

#define FEED_EXPORT __attribute__((visibility("default")))
#define REPLY_TIMEOUT_MS 30000

/*
 * For the public entry points: an argument they cannot use (NULL where an
 * object is needed) returns r, never crashes. No message is recorded: there
 * may be no client to record it in.
 */
#define assert_return(expr, r)             \
	do {                               \
		if (_unlikely_(!(expr)))   \
			return (r);        \
	} while (0)

/* The ring's geometry as validated at attach (check_ring): bytes and offsets inside the mapping. */
struct ring_geometry {
	uint32_t header_size;    /* bytes before slot 0 */
	uint32_t slot_size;      /* bytes per slot */
	uint32_t off_input_ids;  /* offsets inside a slot */
	uint32_t off_labels;
	uint32_t off_position_ids;
	uint32_t off_cu_seqlens;
	uint32_t cu_capacity;    /* entries of cu_seqlens */
	uint32_t state_capacity; /* bytes of each slot's state area (long elastic states), 0: none */
	uint32_t off_state;
};

struct device_ring;

/* A ring left by a daemon that went away, kept mapped while batches it holds are not released (reconnect.c). */
struct retired_ring {
	struct retired_ring *next;
	void *hdr;
	size_t size;
	uint64_t end_seq; /* client sequences below this one point into it */
	struct device_ring *dev; /* its device buffers and events, or NULL */
};

struct feed_client {
	int fd;
	char error[WIRE_MESSAGE_MAX + 64];
	uint32_t daemon_pid;
	uint32_t daemon_flags; /* WIRE_DAEMON_* of its HELLO_REPLY */

	bool attached;
	int stopped; /* the code that ended the stream, 0 while it flows */
	struct feed_ring_header *hdr;
	size_t ring_size;
	struct feed_consumer_page *cons;
	int data_efd, space_efd;
	struct ring_geometry geo;
	uint32_t slot_count, batch_size, seq_len;
	uint64_t first_batch;
	uint64_t next_seq; /* next sequence to hand out */
	uint64_t tail;     /* sequences released */
	uint64_t last_return_ns;
	int device;              /* the GPU batches are staged on, -1: host batches only */
	struct device_ring *dev; /* that GPU's buffers and events (device_attach) */
	const char *held_cursor;       /* cursor of the last batch delivered, in its slot */
	char cursor[FEED_CURSOR_MAX];  /* a copy, made when that batch is released */
	size_t held_cap;               /* bytes held_cursor may span: FEED_CURSOR_MAX, or a slot's state area */
	char *long_cursor;             /* the copy when longer than `cursor` (elastic states, state.c), else NULL */
	char *long_start;              /* the attach's own cursor when longer than start_cursor, else NULL */

	/* Reconnect (reconnect.c): what the attach asked for, to ask it again of the next daemon. */
	char socket_path[108];         /* resolved at connect */
	char feed[WIRE_NAME_MAX];
	uint32_t rank, world, attach_flags, attach_device;
	char start_cursor[FEED_CURSOR_MAX]; /* the attach's own cursor, used while nothing was delivered */
	uint64_t seq_base;             /* client sequence of the current ring's sequence 0 */
	int64_t reconnect_timeout_ms;  /* 0: reconnect disabled */
	bool resuming;                 /* the daemon went away; not attached again yet (next() goes on) */
	bool intr;                     /* a signal interrupting a wait for a reply returns -EINTR (while reconnecting) */
	int resume_code;               /* what started it: -ESHUTDOWN or -ECONNRESET */
	uint64_t resume_t0, resume_limit, resume_backoff, resume_rnd;
	char *resume_cursor;           /* where to attach again: after the last batch delivered (any length) */
	uint64_t reconnects, reconnect_ns;
	struct feed_stats carry;       /* counters of the consumer pages of earlier rings */
	struct retired_ring *retired;
};

/*
 * feed_client_connect_err(), waiting reply_ms for the HELLO_REPLY; with
 * intr, a signal handler running meanwhile gives -EINTR (reconnect.c).
 */
int client_connect(const char *socket_path, bool intr, int reply_ms, char *err, size_t errlen, feed_client **ret);
/*
 * Sends msg (n bytes; n < 0: its encoding failed, that error) and waits for
 * a reply of reply_type, returned NUL-terminated in *ret (caller frees).
 * STATUS and EXPLAIN. Returns 0 or a negative errno (reported; `what` names
 * the request in the message about an unexpected reply).
 */
int client_request_text(feed_client *c, const uint8_t *msg, int n, int reply_type, const char *what, char **ret);
/*
 * state.c: puts `cursor` (NULL: none) into a request's cursor field, or,
 * when it is longer, sends it first as STATE parts and puts
 * FEED_CURSOR_IN_STATE_AREA there. Returns 0 or a negative errno (reported).
 */
int client_put_cursor(feed_client *c, const char *cursor, char field[FEED_CURSOR_MAX]);
/* state.c: keeps a copy of text in *buf (NULL when it fits fixed[cap]: then there). Returns 0 or -ENOMEM. */
int client_keep_cursor(const char *text, size_t n, char *fixed, size_t cap, char **buf);

/* ATTACH with wire flags (WIRE_ATTACH_DEVICE: the device half follows, device_attach). */
int client_attach(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor, uint32_t flags,
		  uint32_t device);

/*
 * The stream stopped with *code. If that is the daemon going away (stopping,
 * or the connection lost) and reconnecting is enabled, or a reconnect is
 * already under way (c->resuming), reconnects with backoff, re-attaches at
 * the cursor of the last batch delivered (device attachments import the new
 * daemon's buffers and events) and returns true. Otherwise returns false
 * with *code the error to report: a refused re-attach gives the daemon's
 * reason, a timeout says what happened, and -EINTR (a signal handler ran
 * during the backoff) leaves the reconnect under way for the next call.
 */
bool client_resume(feed_client *c, int *code);
/* The reconnect_timeout a new client starts with: $FEED_RECONNECT_TIMEOUT seconds, else FEED_RECONNECT_TIMEOUT_DEFAULT_MS. */
int64_t client_reconnect_default(void);
/* Unmaps the retired rings no held batch points into (all of them: at close). */
void client_retired_free(feed_client *c, bool all);
/* Adds the counters of earlier rings' consumer pages to s. */
void client_stats_carry(const feed_client *c, struct feed_stats *s);

/* Records a message for feed_client_error() and returns code. Keeps errno. */
int client_fail(feed_client *c, int code, const char *fmt, ...) _printf_(3, 4);
/*
 * peer.c: whether the process listening on fd (connected to path) may be
 * trusted as feedd: root, this uid, $FEED_DAEMON_UID, or the owner of a socket
 * directory only root could make. Returns 0, or -EPERM with the reason in err.
 */
int client_check_daemon(int fd, const char *path, char *err, size_t errlen);

/* Sends all of buf. Returns 0 or a negative errno (-ECONNRESET for a closed peer). */
int client_send(feed_client *c, const void *buf, size_t len);

/*
 * Reads one message. Returns its type with the payload in *ret_payload
 * (malloc'd, caller frees), or a negative code. An ERROR message is turned
 * into its code, with its text recorded. Passed fds go into fds (at most
 * max_fds, counted in *n_fds; the rest are closed).
 */
int client_recv_msg(feed_client *c, int timeout_ms, void **ret_payload, size_t *ret_len, int *fds, unsigned max_fds,
		    unsigned *n_fds);

/*
 * Reads the DEVICE_REPLY that follows the ATTACH_REPLY and opens what it
 * names (device.c). Returns 0 (device batches, or host batches with the
 * reason recorded when the client allowed that) or a negative code.
 */
int device_attach(feed_client *c, const struct wire_attach *a);
/* Frees what device_attach opened; takes a client without a device. */
void device_close(feed_client *c);
/* Frees one device ring (the current one's or a retired ring's); takes NULL, returns NULL. */
struct device_ring *device_ring_free(struct device_ring *d);
/* Records `release` of the slot of seq on stream (NULL: the legacy default stream), once per batch. */
void device_release(feed_client *c, uint64_t seq, void *stream, bool at_release);
