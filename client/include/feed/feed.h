/* SPDX-License-Identifier: MIT */
/*
 * libfeed: attach to feedd and receive packed training batches straight out
 * of shared memory.
 *
 *     feed_client *c;
 *     int r = feed_client_connect(NULL, &c);           // $FEEDD_SOCKET or the default
 *     r = feed_client_attach(c, "web", rank, world, NULL);
 *     for (;;) {
 *             struct feed_batch b;
 *             r = feed_client_next(c, 10000, &b);      // waits at most 10 s
 *             if (r < 0) { fprintf(stderr, "%s\n", feed_client_error(c)); break; }
 *             train(b.input_ids, b.labels, b.position_ids, b.cu_seqlens, b.n_cu_seqlens);
 *             save_checkpoint_cursor(b.cursor);        // resume point after this batch
 *             feed_client_release(c, &b);
 *     }
 *     c = feed_client_close(c);
 *
 * Every function returns 0 (or a positive count) on success and a negative
 * errno-style code on failure; feed_strerror() names a code and
 * feed_client_error() gives the daemon's own message for the last failure.
 * The library keeps no global state, never prints, and never changes errno.
 * A feed_client is not thread-safe: use it from one thread at a time.
 *
 * Lifetime: the arrays of a feed_batch point into the ring and stay valid
 * until the batch is released; batches are released in the order they were
 * received. At most `slots` (feed_client_slots) batches may be held at once.
 */
#ifndef FEED_FEED_H
#define FEED_FEED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FEED_CURSOR_MAX_LEN 512 /* including the NUL */
/* How long next() waits for a daemon that went away to come back, unless set (feed_client_set_reconnect_timeout). */
#define FEED_RECONNECT_TIMEOUT_DEFAULT_MS 300000

typedef struct feed_client feed_client;

/* One batch: B rows of L positions, read-only views into shared memory. */
struct feed_batch {
	uint64_t index;     /* batch number in this rank's stream */
	uint64_t epoch;     /* epoch of the batch's first position */
	uint32_t rank, world;
	uint32_t batch_size; /* B */
	uint32_t seq_len;    /* L */
	const int32_t *input_ids;    /* [B][L] */
	const int32_t *labels;       /* [B][L]; -100 where the next position starts a document */
	const int32_t *position_ids; /* [B][L] */
	const int32_t *cu_seqlens;   /* [n_cu_seqlens] over the flattened batch */
	uint32_t n_cu_seqlens;
	uint32_t n_docs;             /* documents that start in this batch */
	const char *cursor;          /* resume here to get the batch after this one */
	uint64_t seq;                /* private: ring sequence number */
};

/*
 * Connects to feedd's control socket: `socket_path`, else $FEEDD_SOCKET, else
 * /run/feedd/feedd.sock (root) or $XDG_RUNTIME_DIR/feedd.sock. Returns 0 and
 * a new client in *ret, or a negative code (-ENOENT, -ECONNREFUSED: no daemon).
 */
int feed_client_connect(const char *socket_path, feed_client **ret);

/*
 * As feed_client_connect(), and on failure writes one line saying why into
 * err (errlen bytes, always NUL-terminated; err may be NULL): the daemon's
 * own message when it refused the connection (-EACCES: not in allow_users /
 * allow_groups; -EUSERS: max_connections or max_connections_per_uid
 * reached), else what failed on this side.
 */
int feed_client_connect_err(const char *socket_path, char *err, size_t errlen, feed_client **ret);

/*
 * Attaches to `feed` as `rank` of `world`, from the start of the stream or
 * from `cursor` (the cursor of the last batch consumed: the next batch
 * follows it). Returns 0, or a negative code with the daemon's message in
 * feed_client_error(): -ENOENT (no such feed), -EINVAL (bad rank/world, or a
 * cursor of another feed, world or rank), ...
 */
int feed_client_attach(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor);

/*
 * Waits up to timeout_ms (-1: forever, 0: poll) for the next batch. Returns
 * 0 and fills *ret; -ETIMEDOUT; -ENOBUFS when `slots` batches are already
 * held; -ESHUTDOWN when the daemon stopped and -ECONNRESET when it vanished
 * (and did not come back within the reconnect timeout, below); -EINTR when
 * a signal interrupted a reconnect (call again); -ESTALE when a shard of the
 * feed changed while served (the batches not yet taken are withdrawn, never
 * returned; feed_client_error() names the file); or the error that stopped
 * the stream (message in feed_client_error()).
 */
int feed_client_next(feed_client *c, int timeout_ms, struct feed_batch *ret);

/*
 * Reconnect (an attach option, on by default; set it before or after
 * attaching): when feedd goes away (next() would return -ESHUTDOWN or
 * -ECONNRESET: it stopped, crashed, or is being restarted or upgraded),
 * next() waits for the daemon to come back, for at most timeout_ms,
 * retrying with capped exponential backoff plus jitter, attaches again at
 * the cursor of the last batch it returned and goes on with the batch after
 * it: the caller sees one longer next() (the wait does not count against
 * next()'s own timeout). Batches held meanwhile stay valid until released.
 * A device attachment imports the new daemon's buffers and events; the
 * device views of batches staged by the old daemon must be taken before the
 * next() that reconnects.
 *
 * Past the timeout next() returns the error that started it (-ESHUTDOWN or
 * -ECONNRESET) and feed_client_error() says what happened; a daemon that is
 * back but refuses the attach (the feed is gone, its data changed so the
 * cursor is refused) gives its reason at once. If a signal handler runs
 * during the backoff, next() returns -EINTR at once and the next call goes
 * on reconnecting (without a handler, SIGINT and SIGTERM end the process as
 * usual). 0 disables it: next() returns the error as before. The default is
 * $FEED_RECONNECT_TIMEOUT (seconds, 0 disables) when set, else
 * FEED_RECONNECT_TIMEOUT_DEFAULT_MS (300 s: long enough for a package
 * upgrade). Returns 0 or -EINVAL.
 */
int feed_client_set_reconnect_timeout(feed_client *c, int64_t timeout_ms);

/* How many times this client reconnected, and the time (ns) spent reconnecting. */
int feed_client_reconnect_stats(const feed_client *c, uint64_t *ret_reconnects, uint64_t *ret_ns);

/* Releases the oldest held batch, which must be b. Returns 0 or -EINVAL. */
int feed_client_release(feed_client *c, const struct feed_batch *b);

/* The cursor after the last batch returned by next(), or "" if none yet. */
const char *feed_client_cursor(const feed_client *c);

/* Ring slots: how many batches the daemon prepares ahead, and the most one may hold. */
uint32_t feed_client_slots(const feed_client *c);

/*
 * Reports timings a trainer measured itself (nanoseconds; 0 = not measured):
 * the compute time of the last step and the host-to-device copy wait. The
 * library measures the wait in next() and the time between calls on its
 * own; this refines them. Costs no system call.
 */
int feed_client_report(feed_client *c, uint64_t step_ns, uint64_t h2d_ns);

/* What this client measured and reported so far (the figures the daemon sees). */
struct feed_stats {
	uint64_t delivered;       /* batches returned by next() */
	uint64_t wait_ns_total;   /* time blocked in next() */
	uint64_t step_ns_total;   /* time between a next() return and the following call */
	uint64_t reported_step_ns_total; /* from feed_client_report() */
	uint64_t h2d_ns_total;    /* from feed_client_report() */
	uint64_t last_wait_ns, last_step_ns;
	/*
	 * Histograms of the waits and steps: bucket b counts values v with
	 * feed_stats_bucket_lower(b) <= v < feed_stats_bucket_lower(b + 1),
	 * four buckets per power of two.
	 */
	uint64_t hist_wait[256];
	uint64_t hist_step[256];
};

/*
 * Copies the client's counters (over every daemon it was attached to, see
 * reconnect above). Returns 0, or -ENOTCONN when not attached (between
 * daemons: the counters so far).
 */
int feed_client_stats(const feed_client *c, struct feed_stats *ret);

/* Lower bound (ns) of histogram bucket b of struct feed_stats. */
uint64_t feed_stats_bucket_lower(unsigned b);

/* The length of an epoch of the attached rank's stream (docs/sample-order.md, section 16). */
struct feed_epoch_info {
	uint64_t epoch;       /* the epoch measured */
	uint64_t batches;     /* this rank's batches whose epoch is `epoch` */
	uint64_t first_batch; /* index of the first of them (batch numbering of the stream) */
	uint64_t units;       /* this rank's positions (packing concat) or rows (pad) in the epoch */
};

/*
 * Measures the epoch of the position `cursor` names: a cursor of this
 * attachment's stream (a batch's cursor names where the next batch starts),
 * or NULL / "" for the stream's start. Asks the daemon, which walks the
 * epoch's order (it may take a while on a large corpus; the reply is
 * cached daemon-side per rank and epoch). Returns 0; -EOPNOTSUPP when the
 * feed cannot know it without tokenizing or packing (mixtures, text feeds,
 * packing bestfit: the message says why) or the daemon is too old to
 * answer; -ENOTCONN when not attached; -EINVAL for a cursor of another
 * stream; or the error that stopped the stream.
 */
int feed_client_epoch_info(feed_client *c, const char *cursor, struct feed_epoch_info *ret);

/*
 * The daemon's status document (JSON, docs/protocol.md). Works with or
 * without an attachment. Returns 0 and a malloc'd string in *ret_json.
 */
int feed_client_status(feed_client *c, char **ret_json);

/*
 * The status document without what `flags` leaves out of every client
 * (docs/protocol.md, STATUS): with 1,000 long-lived clients the history is
 * 25 MB of the document. A daemon too old to know a flag sends the member
 * anyway: readers check for it. Returns as feed_client_status(); -EINVAL
 * for an unknown flag.
 */
#define FEED_STATUS_NO_HISTORY 1u      /* clients[].telemetry.history: per-second samples */
#define FEED_STATUS_NO_SINCE_ATTACH 2u /* clients[].telemetry.since_attach */
int feed_client_status_flags(feed_client *c, unsigned flags, char **ret_json);

/*
 * Operator commands (docs/operations.md). They need root, the daemon's own
 * user, or an entry in its admin_users / admin_groups; otherwise -EPERM.
 * On success they return 0 and the daemon's one-line summary in
 * *ret_message (malloc'd, caller frees); on failure a negative errno, with
 * the daemon's reason in feed_client_error().
 *
 * reload: re-read the config (as SIGHUP does). A config that does not parse
 * is rejected whole (the reason names file and line) and the old one stays.
 * drain: the feed takes no new attaches; attached clients stream on.
 */
int feed_client_reload(feed_client *c, char **ret_message);
int feed_client_drain(feed_client *c, const char *feed, char **ret_message);

/*
 * Device batches (docs/gpu.md): feedd copies every batch into a buffer on
 * GPU `device` as well, without a CPU wait on either side.
 *
 * feed_client_attach_device() attaches like feed_client_attach(). Without
 * GPU staging (no driver or device on the daemon's side, or none usable in
 * this process) it returns -ENODEV with the reason in feed_client_error(),
 * unless flags has FEED_ATTACH_HOST_FALLBACK: then it returns 0, the batches
 * are host batches only (feed_client_device() is -1) and feed_client_error()
 * says why. On any other failure, close the client.
 *
 * Per batch from feed_client_next(): feed_client_device_batch() makes
 * `stream` (a CUstream / cudaStream_t; NULL: the legacy default stream) wait
 * until the batch is in device memory and gives the device addresses of its
 * arrays; kernels on that stream may read them. feed_client_device_done()
 * records on `stream` that they are no longer read (safe from any thread);
 * feed_client_release() does it on the legacy default stream if it was not
 * done. The daemon's next copy into that buffer waits for that point on the
 * GPU. If feedd dies, device memory stays readable (VMM handles) or becomes
 * undefined (legacy IPC handles); see docs/gpu.md.
 */
#define FEED_ATTACH_HOST_FALLBACK 1u

struct feed_device_batch {
	uint64_t input_ids, labels, position_ids, cu_seqlens; /* device addresses (CUdeviceptr) */
};

int feed_client_attach_device(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor,
			      int device, unsigned flags);
/* The device batches are staged on, or -1 (host batches only). */
int feed_client_device(const feed_client *c);
int feed_client_device_batch(feed_client *c, const struct feed_batch *b, void *stream, struct feed_device_batch *ret);
int feed_client_device_done(feed_client *c, const struct feed_batch *b, void *stream);

/* The daemon's or library's message for the last failure on c ("" if none). */
const char *feed_client_error(const feed_client *c);

/* Closes the connection and unmaps the ring. Takes NULL; returns NULL. */
feed_client *feed_client_close(feed_client *c);

/*
 * Elastic resume (feeds with virtual_ranks, docs/sample-order.md, section
 * 17): a batch's cursor is then its rank's state ("fv1-..."). Merges the
 * states of every rank 0 .. R-1 of one world, taken after the same step,
 * into a global state; attaching as any rank of any world with it continues
 * every virtual stream exactly where it stopped. Writes it into buf (cap
 * bytes, NUL included). Returns its length; -EINVAL (not every rank once,
 * states of different feeds or worlds, a damaged state; why in err),
 * -ENOBUFS (buf too small; err says the length), -ENOMEM.
 */
int feed_merge_states(const char *const *states, size_t n, char *buf, size_t cap, char *err, size_t errlen);

/*
 * Provenance: which documents the next `batches` batches of rank/world of
 * `feed` hold from `cursor` (a cursor, an elastic state, or NULL/"" for the
 * start), planned by feedd on the side (nothing is attached or delivered):
 * one line per piece of a row, "batch B row I cols C0-C1 [vstream V]
 * [source S] shard S doc D tokens T0-T1 of T [+bos] [+eos] file PATH"
 * (tokens T0 .. T1-1 of the document; docs/sample-order.md, section 17.9).
 * On a connection that is not attached. *ret_text is malloc'd (free it).
 * Returns 0, or -EINVAL, -EOPNOTSUPP (feeds of text tokenized on the way,
 * older daemons), -ENOENT, ... with the reason in feed_client_error().
 */
int feed_client_explain(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor,
			uint32_t batches, char **ret_text);

/* A static description of a code returned by this library. */
const char *feed_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif
