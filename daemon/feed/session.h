/* SPDX-License-Identifier: MIT */
/*
 * A session: one attached rank's stream flowing into its ring. The main
 * thread plans batches in order (cheap: document lengths only) and hands
 * each to the pool; workers fill slots in any order; the main thread
 * publishes finished slots strictly in order. So the stream is identical
 * whatever the thread count or timing, and a slow client only ever holds its
 * own slots.
 *
 * Lifetime: the server owns a session; each job in flight holds a reference,
 * so a client that vanishes mid-batch frees its ring only after the workers
 * are done with it.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "daemon/feed/feed.h"
#include "daemon/gpu/staging.h"
#include "daemon/order/cursor.h"
#include "daemon/pack/pack.h"
#include "daemon/pool/pool.h"
#include "daemon/ring/ring.h"

struct producer;
struct session;

/* Called on the main thread when a session stops producing for good (error text in msg). */
typedef void (*session_fail_fn)(struct session *s, int code, const char *msg, void *userdata);

/*
 * Tokenized text: a run of consecutive documents of one rank's stream (visits
 * first_seq .. first_seq + n - 1), read and tokenized together by a worker.
 * Chunks are kept in stream order; plans point into their tokens, so a chunk
 * is freed only once every batch that used it is published.
 */
struct text_chunk {
	struct pool_job job;
	struct session *session;
	struct text_chunk *next;      /* in stream order */
	struct text_chunk *next_done; /* completion list */
	uint64_t first_seq;
	uint32_t n;
	uint64_t *docs;      /* n document ids */
	uint64_t bytes;      /* of text to read */

	/* written by the worker */
	uint64_t *start;     /* n + 1 offsets into ids */
	int32_t *ids;
	uint32_t skipped;    /* bad records turned into empty documents */
	char **bad;          /* n entries: why each skipped document was bad, NULL for good ones (array NULL when none) */
	int result;
	char error[512];     /* the failure, or the first skipped record's reason */

	/* main thread */
	bool done;
	uint64_t last_batch; /* the latest batch that may use its tokens */
};

struct session_job {
	struct pool_job job;
	struct session *session;
	struct batch_plan plan;
	char cursor[FEED_CURSOR_MAX];
	enum { JOB_IDLE, JOB_RUNNING, JOB_DONE } state;
	int result;
	char error[512];
	struct session_job *next_done;
};

struct session {
	unsigned refs;
	struct producer *producer;
	struct feed *feed;
	struct ring *ring;
	struct stream stream;
	uint32_t rank, world;
	uint64_t first_batch;  /* batch index of ring sequence 0 */
	uint64_t planned;      /* sequences planned and handed to workers */
	uint64_t published;    /* sequences published (ring head) */
	struct session_job *jobs; /* one per slot */
	bool failed, closed;
	session_fail_fn on_fail;
	void *userdata;
	struct event *space_ev;
	struct staging *staging; /* GPU staging of this ring (daemon/gpu), NULL for host batches */

	/* tokenized text (FEED_TEXT) */
	struct text_chunk *chunk_head, *chunk_tail; /* oldest still in use .. newest */
	struct text_chunk *chunk_cur;  /* holds the stream's current document */
	struct doc_walk ahead;         /* the next document to tokenize */
	uint64_t ahead_seq;            /* its visit number */
	bool ahead_end;                /* the walk ended (the rank's documents run out) */
	unsigned chunks_inflight;
	uint64_t inflight_bytes;

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
