/* SPDX-License-Identifier: MIT */
/*
 * The control protocol between feedd and its clients, over a unix stream
 * socket. Every message is a 16-byte header followed by `length` payload bytes:
 *
 *   u32 magic "FEDW" | u16 version | u16 type | u32 length | u32 reserved (0)
 *
 * All integers are little-endian; strings are fixed-size, NUL-terminated
 * arrays. The first message on a connection is HELLO (client) / HELLO_REPLY
 * (daemon), which settles the version. Requests are answered in order; a
 * client sends one request and waits for its reply. ATTACH_REPLY carries
 * WIRE_ATTACH_FDS file descriptors (SCM_RIGHTS) in this order: ring memfd,
 * consumer-page memfd, data eventfd (daemon -> client wake-ups), space eventfd
 * (client -> daemon wake-ups). After an ATTACH, the daemon may send ERROR at any
 * time to say why the stream stopped.
 *
 * Decoders check every length and string before reading; they never trust the
 * peer. Encoders return the total byte count (header + payload).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "proto/ring_abi.h"

#define WIRE_MAGIC UINT32_C(0x57444546) /* "FEDW" */
#define WIRE_VERSION 1
#define WIRE_HEADER_SIZE 16
#define WIRE_MAX_REQUEST 4096         /* largest message a client may send */
#define WIRE_MAX_REPLY (16u << 20)   /* largest payload the daemon sends (a status document) */
#define WIRE_NAME_MAX 64
#define WIRE_MESSAGE_MAX 512
#define WIRE_ATTACH_FDS 4

enum wire_type {
	WIRE_HELLO = 1,
	WIRE_HELLO_REPLY = 2,
	WIRE_ATTACH = 3,
	WIRE_ATTACH_REPLY = 4,
	WIRE_ERROR = 5,
	WIRE_STATUS = 6,
	WIRE_STATUS_REPLY = 7,
	WIRE_DETACH = 8,
	WIRE_DEVICE_REPLY = 9, /* after ATTACH_REPLY, when ATTACH asked for a device */
	WIRE_RELOAD = 10,      /* operator: re-read the config (privileged) */
	WIRE_DRAIN = 11,       /* operator: a feed takes no new attaches (privileged) */
	WIRE_ADMIN_REPLY = 12, /* the outcome of RELOAD or DRAIN */
	WIRE_EPOCH_INFO = 13,  /* attached: how many batches the current epoch has (daemons with WIRE_DAEMON_EPOCH_INFO) */
	WIRE_EPOCH_INFO_REPLY = 14,
	WIRE_EXPLAIN = 15,       /* which documents a stream's next batches hold (daemons with WIRE_DAEMON_EXPLAIN) */
	WIRE_EXPLAIN_REPLY = 16, /* text, one line per piece of a row */
	WIRE_STATE = 17,         /* a part of a long cursor for the next ATTACH or EXPLAIN; not answered */
	_WIRE_TYPE_MAX,
};

struct wire_header {
	uint16_t version;
	uint16_t type;
	uint32_t length; /* payload bytes after the header */
};

struct wire_hello {
	uint16_t min_version;
	uint16_t max_version;
	uint32_t pid;
	char name[32]; /* program name, informational */
};
#define WIRE_HELLO_SIZE 40

enum {
	WIRE_DAEMON_GPU = 1u << 0, /* the daemon can stage batches in GPU memory */
	/*
	 * The daemon answers EPOCH_INFO. Older daemons drop a connection that
	 * sends a type they do not know, so a client asks only when this is set.
	 */
	WIRE_DAEMON_EPOCH_INFO = 1u << 1,
	/* The daemon answers EXPLAIN (feedctl explain; docs/sample-order.md, section 17.9). */
	WIRE_DAEMON_EXPLAIN = 1u << 2,
	/*
	 * The daemon takes cursors longer than FEED_CURSOR_MAX (elastic states,
	 * docs/sample-order.md section 17.5): sent before ATTACH or EXPLAIN as
	 * STATE messages (raw text, WIRE_STATE_MAX in all) whose cursor field is
	 * then FEED_CURSOR_IN_STATE_AREA.
	 */
	WIRE_DAEMON_LONG_STATE = 1u << 3,
};
/*
 * A state names at most 65,536 streams (virtual_ranks), a few dozen bytes
 * each: 4 MiB holds the largest with room, and bounds what one connection
 * may make the daemon hold before it attaches.
 */
#define WIRE_STATE_MAX (4u << 20)

/*
 * EXPLAIN: the provenance of `batches` batches of rank/world of a feed from
 * `cursor` (a cursor, an elastic state, or "" for the start), planned on the
 * side: nothing is attached or delivered. Answered with EXPLAIN_REPLY (text,
 * no NUL, like STATUS_REPLY's) or ERROR.
 */
struct wire_explain {
	uint32_t rank;
	uint32_t world;
	uint32_t batches; /* 1 .. WIRE_EXPLAIN_MAX_BATCHES */
	uint32_t flags;   /* reserved, 0 */
	char feed[WIRE_NAME_MAX];
	char cursor[FEED_CURSOR_MAX];
};
#define WIRE_EXPLAIN_SIZE (16 + WIRE_NAME_MAX + FEED_CURSOR_MAX)
#define WIRE_EXPLAIN_MAX_BATCHES 4096

struct wire_hello_reply {
	uint16_t version;
	uint32_t daemon_pid;
	uint32_t flags; /* WIRE_DAEMON_* */
	char daemon_version[32];
};
#define WIRE_HELLO_REPLY_SIZE 44

enum {
	WIRE_ATTACH_RESUME = 1u << 0,        /* cursor is set */
	WIRE_ATTACH_DEVICE = 1u << 1,        /* stage batches on GPU `device` too (DEVICE_REPLY follows) */
	WIRE_ATTACH_HOST_FALLBACK = 1u << 2, /* with DEVICE: host batches instead of an error without a GPU */
};
#define WIRE_ATTACH_FLAGS (WIRE_ATTACH_RESUME | WIRE_ATTACH_DEVICE | WIRE_ATTACH_HOST_FALLBACK)
#define WIRE_MAX_DEVICE 255 /* highest device ordinal an ATTACH may name */

struct wire_attach {
	uint32_t rank;
	uint32_t world;
	uint32_t flags;
	uint32_t device; /* CUDA device ordinal with WIRE_ATTACH_DEVICE, else 0 */
	char feed[WIRE_NAME_MAX];
	char cursor[FEED_CURSOR_MAX];
};
#define WIRE_ATTACH_SIZE (16 + WIRE_NAME_MAX + FEED_CURSOR_MAX)

struct wire_attach_reply {
	uint64_t ring_size;     /* bytes to map from the ring memfd */
	uint64_t consumer_size; /* bytes to map from the consumer memfd */
	uint64_t fingerprint;   /* the feed's identity */
	uint64_t first_batch;   /* batch index of the first batch in the ring */
	uint32_t slot_count;
	uint32_t batch_size;
	uint32_t seq_len;
	uint32_t n_fds;         /* WIRE_ATTACH_FDS */
};
#define WIRE_ATTACH_REPLY_SIZE 48

struct wire_error {
	int32_t code; /* negative errno */
	char message[WIRE_MESSAGE_MAX];
};
#define WIRE_ERROR_SIZE (8 + WIRE_MESSAGE_MAX)

/*
 * wire_status.flags: members a STATUS leaves out of every clients[] entry
 * of the document (docs/protocol.md, section 10.3). 0 asks for the whole
 * document, as clients that predate the flags do. A daemon ignores the bits
 * it does not know, and daemons that predate them ignore them all and send
 * the whole document: the flags only ever make a reply smaller.
 */
enum {
	/*
	 * telemetry.history: the per-second samples, which grow with a client's
	 * age up to history_s (1,000 clients of 600 s: 25 MB of a 27 MB
	 * document) and which `feedctl status` does not print.
	 */
	WIRE_STATUS_NO_HISTORY = 1u << 0,
	/* telemetry.since_attach: the period since attach (`feedctl status` prints the window's). */
	WIRE_STATUS_NO_SINCE_ATTACH = 1u << 1,
};

struct wire_status {
	uint32_t flags; /* WIRE_STATUS_* */
};
#define WIRE_STATUS_SIZE 8

/* wire_device_reply.kind: how the client opens the device memory */
enum {
	WIRE_DEVICE_HOST = 0, /* no device staging: host batches only (the reason says why) */
	WIRE_DEVICE_VMM = 1,  /* CUDA VMM allocation, its POSIX fd passed with the message */
	WIRE_DEVICE_IPC = 2,  /* cudaMalloc'd, opened with the legacy IPC handle in mem_handle */
};
#define WIRE_IPC_HANDLE_SIZE 64 /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define WIRE_DEVICE_REASON_MAX 256
#define WIRE_DEVICE_MAX_SLOTS 1024 /* the ring's own limit (ring_slots) */

/*
 * DEVICE_REPLY: the device side of an attachment. One allocation of mem_size
 * bytes holds one buffer per ring slot, slot s at s * slot_stride, each laid
 * out like the host slot (same offsets). Per slot, two interprocess events,
 * both created and owned by the daemon: `ready` (the daemon records it after
 * the slot's copy; the client's stream waits on it) and `release` (the client
 * records it on its stream when done; the daemon's copy stream waits on it).
 * The handles follow the fixed part: slot_count x (ready[64], release[64]),
 * at `handles` after decoding (pointing into the payload).
 */
struct wire_device_reply {
	uint32_t kind;        /* WIRE_DEVICE_* */
	uint32_t device;      /* CUDA device ordinal */
	uint64_t mem_size;    /* bytes of the device allocation */
	uint64_t slot_stride; /* bytes between consecutive slots' buffers */
	uint32_t slot_count;  /* equals the ring's; 0 for WIRE_DEVICE_HOST */
	uint32_t n_fds;       /* 1 for WIRE_DEVICE_VMM, else 0 */
	uint8_t mem_handle[WIRE_IPC_HANDLE_SIZE]; /* WIRE_DEVICE_IPC, else zeros */
	char reason[WIRE_DEVICE_REASON_MAX];      /* WIRE_DEVICE_HOST: why; else "" */
	const uint8_t *handles; /* 2 * WIRE_IPC_HANDLE_SIZE * slot_count bytes */
};
#define WIRE_DEVICE_REPLY_FIXED (32 + WIRE_IPC_HANDLE_SIZE + WIRE_DEVICE_REASON_MAX)
#define WIRE_DEVICE_REPLY_SIZE(n) (WIRE_DEVICE_REPLY_FIXED + (size_t)(n) * 2 * WIRE_IPC_HANDLE_SIZE)

struct wire_reload {
	uint32_t flags; /* reserved, 0 */
};
#define WIRE_RELOAD_SIZE 8

struct wire_drain {
	char feed[WIRE_NAME_MAX];
};
#define WIRE_DRAIN_SIZE WIRE_NAME_MAX

/* Success of a RELOAD or DRAIN (a refusal or failure is an ERROR). */
struct wire_admin_reply {
	char message[WIRE_MESSAGE_MAX]; /* what was done, for the operator */
};
#define WIRE_ADMIN_REPLY_SIZE WIRE_MESSAGE_MAX

/*
 * EPOCH_INFO (attached connections): the epoch of the position `cursor`
 * names (a cursor of this attachment's stream; "" = the stream's start) and
 * the number of this rank's batches whose epoch it is, batch boundaries
 * falling where a batch starts at that position (docs/sample-order.md,
 * section 16). Answered with EPOCH_INFO_REPLY, or ERROR: -EOPNOTSUPP when
 * the feed cannot know it without tokenizing or packing (the message says
 * why), -EINVAL for a cursor that is not of this stream, -ENOTCONN before
 * ATTACH.
 */
struct wire_epoch_info {
	uint32_t flags; /* reserved, 0 */
	char cursor[FEED_CURSOR_MAX];
};
#define WIRE_EPOCH_INFO_SIZE (8 + FEED_CURSOR_MAX)

struct wire_epoch_info_reply {
	uint64_t epoch;
	uint64_t batches;   /* this rank's batches whose epoch is `epoch` */
	uint64_t first_batch; /* index of its first batch (the stream's numbering: the cursor's batch field) */
	uint64_t units;     /* the epoch's units for this rank: positions (concat) or rows (pad) */
};
#define WIRE_EPOCH_INFO_REPLY_SIZE 32

/*
 * Header. Returns 0, or -EBADMSG (magic, version 0, type, reserved) /
 * -EMSGSIZE (length > max_length). Any non-zero version is returned for the
 * caller to judge: a HELLO from a peer of another version must be answered
 * (HELLO's payload layout never changes), every other message must carry
 * WIRE_VERSION.
 */
int wire_header_decode(const void *buf, size_t len, size_t max_length, struct wire_header *ret);

/*
 * Encoders write header + payload into buf (cap bytes). Return the total size,
 * -ENOBUFS if cap is too small, -ENAMETOOLONG if a string does not fit.
 */
int wire_encode_hello(void *buf, size_t cap, const struct wire_hello *m);
int wire_encode_hello_reply(void *buf, size_t cap, const struct wire_hello_reply *m);
int wire_encode_attach(void *buf, size_t cap, const struct wire_attach *m);
int wire_encode_attach_reply(void *buf, size_t cap, const struct wire_attach_reply *m);
int wire_encode_error(void *buf, size_t cap, const struct wire_error *m);
int wire_encode_status(void *buf, size_t cap, const struct wire_status *m);
int wire_encode_detach(void *buf, size_t cap);
/* DEVICE_REPLY of WIRE_DEVICE_REPLY_SIZE(m->slot_count) payload bytes; m->handles may be NULL when slot_count is 0. */
int wire_encode_device_reply(void *buf, size_t cap, const struct wire_device_reply *m);
int wire_encode_reload(void *buf, size_t cap, const struct wire_reload *m);
int wire_encode_drain(void *buf, size_t cap, const struct wire_drain *m);
int wire_encode_admin_reply(void *buf, size_t cap, const struct wire_admin_reply *m);
int wire_encode_epoch_info(void *buf, size_t cap, const struct wire_epoch_info *m);
int wire_encode_epoch_info_reply(void *buf, size_t cap, const struct wire_epoch_info_reply *m);
/* Header for a STATUS_REPLY whose payload (JSON text, no NUL) follows separately. */
int wire_encode_status_reply_header(void *buf, size_t cap, size_t json_len);
int wire_encode_explain(void *buf, size_t cap, const struct wire_explain *m);
/* Header for an EXPLAIN_REPLY whose payload (text, no NUL) follows separately. */
int wire_encode_explain_reply_header(void *buf, size_t cap, size_t text_len);
int wire_decode_explain(const void *p, size_t len, struct wire_explain *ret);
/* Header for a STATE message of len bytes of text (1 .. WIRE_MAX_REQUEST - WIRE_HEADER_SIZE), which follow. */
int wire_encode_state_header(void *buf, size_t cap, size_t len);

/*
 * Decoders take the payload (after the header) and its exact length. Return 0,
 * or -EBADMSG when the length is wrong, a string is not terminated, or a field
 * is out of range.
 */
int wire_decode_hello(const void *p, size_t len, struct wire_hello *ret);
int wire_decode_hello_reply(const void *p, size_t len, struct wire_hello_reply *ret);
int wire_decode_attach(const void *p, size_t len, struct wire_attach *ret);
int wire_decode_attach_reply(const void *p, size_t len, struct wire_attach_reply *ret);
int wire_decode_error(const void *p, size_t len, struct wire_error *ret);
int wire_decode_status(const void *p, size_t len, struct wire_status *ret);
/* ret->handles points into p. Also -EBADMSG for a kind/slot_count/n_fds that do not agree. */
int wire_decode_device_reply(const void *p, size_t len, struct wire_device_reply *ret);
int wire_decode_reload(const void *p, size_t len, struct wire_reload *ret);
int wire_decode_drain(const void *p, size_t len, struct wire_drain *ret);
int wire_decode_admin_reply(const void *p, size_t len, struct wire_admin_reply *ret);
int wire_decode_epoch_info(const void *p, size_t len, struct wire_epoch_info *ret);
int wire_decode_epoch_info_reply(const void *p, size_t len, struct wire_epoch_info_reply *ret);

/* Name of a message type, for logs. */
const char *wire_type_name(unsigned type);

/*
 * Where the control socket lives when nobody says: /run/feedd/feedd.sock for
 * root, else $XDG_RUNTIME_DIR/feedd.sock (falling back to /run/feedd). `override`
 * and then $FEEDD_SOCKET win when set. Returns 0 or -ENAMETOOLONG.
 */
int wire_socket_path(const char *override, char *buf, size_t cap);

/*
 * The operator socket beside a control socket: "feedd-operator.sock" for
 * "feedd.sock" (a path not ending in ".sock" gets "-operator" appended).
 * feedd binds it mode 0600, so only root and feedd's user reach it, and
 * accepts on it ahead of everything: an operator's connection never queues
 * behind the clients' (or a flood's) in the control socket's backlog, which
 * the kernel hands out first come, first served. Returns 0 or -ENAMETOOLONG.
 */
int wire_operator_socket_path(const char *socket_path, char *buf, size_t cap);
