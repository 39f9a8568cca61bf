/* SPDX-License-Identifier: MIT */
/*
 * A session: one attached rank's stream flowing into its ring. The main
 * thread plans batches in order (cheap: document lengths only) and hands
 * each to the pool; workers fill slots in any order; the main thread
 * publishes finished slots strictly in order. So the stream is identical
 * whatever the thread count or timing, and a slow client only ever holds its
 * own slots.
 *
 * Packing other than "concat" of one stream, and mixtures, plan by whole
 * documents (docs/sample-order.md, sections 11 to 14): each stream (the
 * feed's, or each source's) queues the documents taken from it, the packer
 * (pad.h, bestfit.h, concat.h) draws them in mixed order, and a dry run over
 * the queues first checks that every count a plan needs is known, so text
 * tokenized on the way is never planned on a guess. Cursors name the
 * bestfit buffer's start (recorded when the packer starts a buffer) or each
 * stream's next document.
 *
 * Lifetime: the server owns a session; each job in flight holds a reference,
 * so a client that vanishes mid-batch frees its ring only after the workers
 * are done with it. session_new() builds a session and produces nothing;
 * the owner wires it (its connection, telemetry, GPU staging) and then calls
 * session_start(), so a failure is always reported to a session its owner
 * already holds.
 *
 * struct session is private to daemon/feed/ (session-internal.h); others
 * read it through the accessors below.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/feed/feed.h"
#include "daemon/feed/producer.h"
#include "daemon/order/cursor.h"
#include "daemon/ring/ring.h"

struct session;
struct staging;
struct vstate;

/* Called on the main thread when a session stops producing for good (error text in msg). */
typedef void (*session_fail_fn)(struct session *s, int code, const char *msg, void *userdata);

/*
 * Builds a session for rank/world of feed f, at cursor c (NULL: the start),
 * or for a feed with virtual ranks at elastic state `state` (NULL: the
 * start; docs/sample-order.md, section 17):
 * its ring, its streams, the cursor checked as far as known counts allow.
 * Produces nothing and calls no callback until session_start(). Returns 0;
 * -EINVAL (cursor of another feed/world/rank, or not a place in this stream)
 * with a message in err; -ENODATA, -ENOMEM, ...
 */
int session_new(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		const struct vstate *state, unsigned slots, session_fail_fn on_fail, void *userdata,
		struct session **ret, char *err, size_t errlen);
/*
 * Gives the session the GPU staging of its ring (daemon/gpu, gpu_attach_reply),
 * which it then owns; before session_start() only.
 */
void session_attach_staging(struct session *s, struct staging *st);
/*
 * Starts producing: plans and hands out the first batches. A failure found
 * now (or later) goes to on_fail, once the caller holds the session. Once.
 */
void session_start(struct session *s);
/* Stops producing and drops the owner's reference (jobs in flight keep theirs). */
struct session *session_close(struct session *s);

/*
 * Provenance (feedctl explain): plans `batches` batches of rank/world of
 * feed f from cursor c or elastic state st (both NULL: the start) on the
 * side, nothing attached, and returns one line per piece of a row
 * (malloc'd text). Stored tokens are planned at once: returns 1 with
 * *ret_text. Text is tokenized first on p's workers: returns 0 with
 * *ret_pending, and done() is called later on the main thread with the
 * text (the callee takes it) or the error, unless cancelled first.
 * Errors: -EINVAL, -ENODATA, ... with the reason in err.
 */
struct session_explain;
typedef void (*session_explain_fn)(int code, char *text, const char *msg, void *userdata);
int session_explain(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		    const struct vstate *st, uint32_t batches, session_explain_fn done, void *userdata,
		    struct session_explain **ret_pending, char **ret_text, char *err, size_t errlen);
/* Stops a pending explanation (its done() is not called). Takes NULL; returns NULL. */
struct session_explain *session_explain_cancel(struct session_explain *e);

/* Ring fill as the client sees it: published and not yet released. */
uint64_t session_fill(struct session *s);
/*
 * Stops the session for good: the ring is marked failed, the reason logged
 * and handed to the on_fail callback (which tells the client). Idempotent.
 */
void session_fail(struct session *s, int code, const char *msg);
/* Marks the ring stopping (daemon shutdown) and wakes the client. */
void session_stop(struct session *s);

/* Accessors: what the server, status and telemetry read of a session (main thread). */
struct feed *session_feed(const struct session *s);
struct ring *session_ring(const struct session *s);
struct staging *session_staging(const struct session *s); /* NULL: host batches */
uint32_t session_rank(const struct session *s);
uint32_t session_world(const struct session *s);
uint64_t session_first_batch(const struct session *s); /* batch index of ring sequence 0 */
uint64_t session_published(const struct session *s);   /* batches published (ring head) */
uint64_t session_in_flight(const struct session *s);   /* batches handed to the workers, not yet published */
bool session_failed(const struct session *s);
/* Issue #22: its streams wait for their windows' counts, on the pool (a resume on a cold cache_dir). */
bool session_opening(const struct session *s);
uint64_t session_attach_ns(const struct session *s);   /* when it was built (CLOCK_MONOTONIC) */
/* Time the ring spent full up to now (ns), the current spell included. */
uint64_t session_full_ns(const struct session *s, uint64_t now);
/* The epoch of its (first) stream's current document. */
uint64_t session_epoch(const struct session *s);
