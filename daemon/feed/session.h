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
 * are done with it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/feed/feed.h"
#include "daemon/feed/worker.h"
#include "daemon/gpu/staging.h"
#include "daemon/order/cursor.h"
#include "daemon/pack/bestfit.h"
#include "daemon/pack/concat.h"
#include "daemon/pack/pack.h"
#include "daemon/pack/pad.h"
#include "daemon/pool/pool.h"
#include "daemon/ring/ring.h"

struct producer;
struct session;
struct session_src;

/* Called on the main thread when a session stops producing for good (error text in msg). */
typedef void (*session_fail_fn)(struct session *s, int code, const char *msg, void *userdata);


struct session_job {
	struct pool_job job;
	struct session *session;
	struct batch_plan plan;
	char cursor[FEED_CURSOR_MAX];
	enum { JOB_IDLE, JOB_RUNNING, JOB_DONE } state;
	int result;
	char error[512];
	struct session_job *next_done;
	struct pad_batch rows;          /* by_docs sessions: the plan */
	struct pack_counters counts;    /* what the batch holds, added to the feed's when it is published */
	uint64_t src_docs[MIX_MAX_SOURCES]; /* documents starting in the batch, per source */
	uint64_t hold[MIX_MAX_SOURCES]; /* the oldest visit of each stream whose tokens the plan reads */
};

/*
 * One stream of a session: the rank's stream of the feed, or of one of a
 * mixture's sources. Documents taken from it wait in `queue` until the
 * packer draws them, so that a plan can be checked (all its documents'
 * counts known) before it is made.
 */
struct session_src {
	struct session *session;
	struct feed *feed;       /* the source's feed; the session's own for one stream */
	uint32_t index;
	struct stream *stream;   /* &session->stream for the first, else &own */
	struct stream own;
	struct pack_doc *queue;  /* ring of taken, undrawn documents */
	size_t q_head, q_n, q_cap;
	uint64_t q_positions;    /* their contributions' positions */

	/* tokenized text (FEED_TEXT) */
	struct text_chunk *chunk_head, *chunk_tail; /* oldest still in use .. newest */
	struct text_chunk *chunk_cur;  /* holds the stream's current document */
	struct doc_walk ahead;         /* the next document to tokenize */
	uint64_t ahead_seq;            /* its visit number */
	bool ahead_end;                /* the walk ended (the rank's documents run out) */
	unsigned chunks_inflight;
	uint64_t inflight_bytes;
};

struct session {
	unsigned refs;
	struct producer *producer;
	struct feed *feed;
	struct ring *ring;
	struct stream stream;  /* the first stream (status reads its epoch) */
	uint32_t rank, world;
	uint64_t first_batch;  /* batch index of ring sequence 0 */
	uint64_t planned;      /* sequences planned and handed to workers */
	uint64_t published;    /* sequences published (ring head) */
	struct session_job *jobs; /* one per slot */
	struct session_src *srcs; /* the streams: one, or a mixture's sources in `sources` order */
	uint32_t n_srcs;
	bool has_text;            /* a stream is tokenized on the way: plan only from known counts */

	/* packing other than plain "concat" of one stream (docs/sample-order.md, sections 11 to 14) */
	bool by_docs;             /* plans are pad_batch rows of whole documents drawn from the streams */
	uint64_t mix_k;           /* the next mixed document to draw (0, 1, ... without a mixture too) */
	struct bestfit bestfit;
	struct concat concat;     /* a mixture's "concat" */
	uint64_t resume_row;      /* bestfit resuming inside a buffer: gather it and start at this row */
	struct {                  /* where the current bestfit buffer started, for cursors */
		uint64_t k;
		struct stream_pos pos[MIX_MAX_SOURCES];
		int error;
	} mark;
	uint32_t starved;         /* the text stream a plan waits for (UINT32_MAX: none) */
	bool failed, closed;
	session_fail_fn on_fail;
	void *userdata;
	struct event *space_ev;
	struct staging *staging; /* GPU staging of this ring (daemon/gpu), NULL for host batches */

	/* telemetry */
	uint64_t attach_ns;
	uint64_t full_since_ns;   /* ring full since, 0 when not */
	uint64_t full_ns_total;   /* time the ring spent full */
};

struct event_base;

/* The pool and the completion path back to the main loop. */
int producer_new(struct event_base *base, unsigned threads, enum io_engine engine, unsigned io_depth,
		 struct producer **ret);
struct producer *producer_free(struct producer *p);
struct pool *producer_pool(struct producer *p);

/*
 * Starts a session for rank/world of feed f, at cursor c (NULL: the start).
 * Returns 0; -EINVAL (cursor of another feed/world/rank, or not a place in
 * this stream) with a message in err; -ENODATA, -ENOMEM, ...
 */
int session_new(struct producer *p, struct feed *f, uint32_t rank, uint32_t world, const struct cursor *c,
		unsigned slots, session_fail_fn on_fail, void *userdata, struct session **ret, char *err,
		size_t errlen);
/* Stops producing and drops the owner's reference (jobs in flight keep theirs). */
struct session *session_close(struct session *s);

/* Ring fill as the client sees it: published and not yet released. */
uint64_t session_fill(struct session *s);
/*
 * Stops the session for good: the ring is marked failed, the reason logged
 * and handed to the on_fail callback (which tells the client). Idempotent.
 */
void session_fail(struct session *s, int code, const char *msg);
/* Marks the ring stopping (daemon shutdown) and wakes the client. */
void session_stop(struct session *s);
