/* SPDX-License-Identifier: MIT */
/*
 * The session's insides, shared by the files of daemon/feed/ that implement
 * it and by no one else (outsiders use session.h's accessors):
 *
 *   session.c       lifecycle, pump, publication (advance), accessors
 *   session-plan.c  document queues, the dry run, plans and cursors
 *   session-text.c  tokenizing ahead: chunks of a text stream
 *   producer.c      the workers' side of both kinds of job, and completions
 *
 * Invariants (asserted where they change):
 *   tail <= published <= planned, planned - tail <= slot_count;
 *   refs > 0 while anything holds the session: its owner until
 *   session_close(), and every job or chunk handed to the producer;
 *   a chunk is freed only once done, and only once no plan in flight or to
 *   come reads its tokens.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/feed/producer.h"
#include "daemon/feed/session-epoch.h"
#include "daemon/feed/session.h"
#include "daemon/feed/worker.h"
#include "daemon/order/cursor.h"
#include "daemon/order/epoch-len.h"
#include "daemon/pack/bestfit.h"
#include "daemon/pack/concat.h"
#include "daemon/pack/pack.h"
#include "daemon/pack/pad.h"
#include "daemon/ring/ring.h"
#include "proto/vstate.h"

#ifndef container_of
#define container_of(ptr, type, member) ((type *)(void *)((char *)(ptr) - offsetof(type, member)))
#endif

struct session_src;

/* An EPOCH_INFO being measured on the pool (session-epoch.c); freed when done. */
struct session_epoch_job {
	struct producer_job pj; /* kind PRODUCER_EPOCH */
	bool has_pos;           /* else: the stream's start */
	struct stream_pos pos;  /* the cursor's position */
	uint64_t next_batch;    /* the cursor's batch */
	session_epoch_fn done;
	void *userdata;
	int result;             /* of epoch_units_measure */
	struct epoch_units m;
	struct epoch_vstream *vs; /* virtual ranks: the served streams at the question's state (else NULL) */
	uint64_t state_key;       /* virtual ranks: the question's key in the cache */
	struct epoch_vinfo vm;
};

/*
 * Text (issue #22): shards the walks of the session wait for (a part of
 * what one pump or open attempt asked for), counted and indexed on the
 * pool (the main loop never reads a shard), or, with n = 0, the feed
 * counted until it has `until` documents (the attach's "at least R
 * documents", decided after the attach). Freed when done.
 */
struct session_count_job {
	struct producer_job pj; /* kind PRODUCER_COUNT */
	struct feed *feed;      /* n = 0: the feed counted; else the feed of the shard that failed (NULL: none) */
	uint64_t until;
	int result;
	char error[512];
	size_t n;
	struct feed_wanted shards[]; /* n shards with their feeds (the session's or its sources: the session holds them) */
};

/*
 * Issue #22: the cursor or state an opening session opens its streams at,
 * kept (copied) until they open; session-open.c.
 */
struct session_opening {
	bool has_cursor;
	struct cursor c;
	bool has_state;
	struct vstate st; /* its entries copied too */
	uint32_t attempts; /* open attempts so far (status; tests count round trips) */
};

/*
 * Issue #22: shuffled windows the session's walks wait for (the main loop
 * never builds one), built on the pool (session-window.c), each pinned
 * until a walk took it. Freed when done; its pins go to the session.
 */
struct session_window_job {
	struct producer_job pj; /* kind PRODUCER_WINDOW */
	unsigned n;
	struct feed_window_want want[FEED_WINDOW_WANTS]; /* feeds: the session's or its mixture's sources */
	struct feed_window_pin pin[FEED_WINDOW_WANTS];
	bool pinned[FEED_WINDOW_WANTS];
	int result; /* the first failure */
	char error[512];
};

/* A window built for the session, pinned until one of its walks took it (session-window.c). */
struct session_window_pin {
	struct feed *feed;
	struct feed_window_pin pin;
};

/*
 * A chunk of one text stream: visits first_seq .. first_seq + t.n - 1, read
 * and tokenized together by a worker (t is the library's tokenize_chunk: the
 * documents in, their tokens out). Chunks are kept in stream order; plans
 * point into their tokens.
 */
struct session_chunk {
	struct producer_job pj;       /* kind PRODUCER_CHUNK */
	struct session_src *src;      /* the stream it belongs to */
	struct session_chunk *next;   /* in stream order */
	uint64_t first_seq;
	uint64_t *docs;               /* t.n document ids (t.docs points here) */
	struct tokenize_chunk t;
	int result;                   /* of worker_tokenize */

	/* main thread */
	bool done;
	uint64_t last_batch; /* the latest batch that may use its tokens (plain concat) */
};

struct session_job {
	struct producer_job pj;         /* kind PRODUCER_BATCH */
	struct batch_plan plan;
	char cursor[FEED_CURSOR_MAX];
	enum { JOB_IDLE, JOB_RUNNING, JOB_DONE } state;
	int result;
	char error[512];
	struct pad_batch rows;          /* by_docs sessions: the plan */
	struct pack_counters counts;    /* what the batch holds, added to the feed's when it is published */
	uint64_t src_docs[MIX_MAX_SOURCES]; /* documents starting in the batch, per source */
	uint64_t hold[MIX_MAX_SOURCES]; /* the oldest visit of each stream whose tokens the plan reads */
	struct session_vrow *vrows;     /* elastic sessions: the batch's B rows, each a virtual stream's one-row plan */
	uint32_t vrow_next;             /* elastic sessions: the rows planned so far, when a window stopped the plan (issue #22) */
	char *long_cursor;              /* elastic sessions: a state longer than `cursor` (which then says so); "" or NULL: none */
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
	struct session_chunk *chunk_head, *chunk_tail; /* oldest still in use .. newest */
	struct session_chunk *chunk_cur; /* holds the stream's current document */
	struct doc_walk ahead;         /* the next document to tokenize */
	uint64_t ahead_seq;            /* its visit number */
	bool ahead_end;                /* the walk ended (the rank's documents run out) */
	bool ahead_unplaced;           /* it stands before the stream's first document (whose window waited for its count) */
	unsigned chunks_inflight;
	uint64_t tok_bytes, tok_tokens; /* tokenized so far by this stream's chunks: its bytes per token */
	uint64_t ahead_pf_epoch, ahead_pf_window; /* text copies: the ahead walk's window (+1) whose read-ahead was asked */

	/* object storage: the window (+1 for none yet) whose shards and successor's were prefetched */
	uint64_t prefetch_epoch, prefetch_window;
};

struct session {
	unsigned refs;
	uint32_t batch_size;   /* rows per batch: the feed's, or 1 for a virtual stream (section 17) */
	struct session_virtual *virt; /* elastic sessions: the virtual streams this rank serves (session-virtual.c) */
	struct session *parent; /* a virtual stream's session: the rank's, which owns its ring and its failures */
	struct session_explain *explain; /* a side session of feedctl explain (no ring): pumping it explains on */
	bool plain;             /* a feed with virtual ranks serving one rank's stream of sections 3 to 16: resumed
				   from a cursor saved without them, of a world other than V' (section 17.7) */
	const struct order_params *params; /* per stream (source): the order its streams walk; NULL: each feed's own */
	uint32_t rows_ahead;    /* rows of this stream per batch of the ring, for tokenizing ahead */
	/* a virtual rank: its streams' tokenized text bytes and tokens per source (bytes per token before each has its own) */
	uint64_t sub_tok_bytes[MIX_MAX_SOURCES], sub_tok_tokens[MIX_MAX_SOURCES];
	uint64_t text_rows;     /* a virtual stream: the rows it gives to the batches the rank tokenizes for now
				   (session_virtual_text), its tokenize-ahead target instead of rows_ahead's */
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
	unsigned count_jobs;      /* out on the pool: the walks wait for shards' counts (0: none) */
	struct session_opening *opening; /* the streams wait for counts to open (session-open.c); NULL: open */
	struct session_window_job *window_job; /* out on the pool: walks wait for windows to be built (NULL: none) */
	struct session_window_pin *window_pins; /* windows built for the walks, not taken yet */
	unsigned n_window_pins;
	bool world_check;         /* text: whether the feed has R documents was not known at attach: decided before planning */
	bool started, failed, closed;
	session_fail_fn on_fail;
	void *userdata;
	struct event *space_ev;
	struct staging *staging; /* GPU staging of this ring (daemon/gpu), NULL for host batches */

	/* telemetry */
	uint64_t attach_ns;
	uint64_t full_since_ns;   /* ring full since, 0 when not */
	uint64_t full_ns_total;   /* time the ring spent full */
};

/* One row of an elastic batch: the virtual stream it comes from and its one-row plan. */
struct session_vrow {
	struct session *sub;
	struct session_job job;
};

/* session.c: a session's streams at cursor c, for a rank or a virtual stream */
int session_open_streams(struct session *s, const struct cursor *c, char *err, size_t errlen);

/* The session that owns the ring: the rank's (itself, or a virtual stream's parent). */
static inline struct session *session_root(struct session *s)
{
	return s->parent ? s->parent : s;
}

/* session-plan.c: whether `rows` rows can be planned from known counts (0, -EAGAIN, -ENODATA, ...). */
int session_plan_ready(struct session *s, uint32_t rows);

/* session-virtual.c: elastic sessions (docs/sample-order.md, section 17) */
struct vstate;
struct vstate_stream;
int session_virtual_open(struct session *s, const struct vstate *state, char *err, size_t errlen);
/*
 * Section 17.7: a cursor of the same feed without virtual ranks, of rank
 * r of world V', as the state of that rank (its one stream, v = r). Fills
 * *st with one entry in *e. Returns 0, or -EINVAL when it is not such a
 * cursor.
 */
/* A virtual stream's cursor from its entry in a state (session_open_streams() resumes from it), and back (session-ventry.c). */
void session_cursor_of_entry(const struct feed *f, uint32_t v, const struct vstate_stream *e, struct cursor *c);
void session_entry_of_cursor(uint32_t v, const struct cursor *c, struct vstate_stream *e);
int session_virtual_from_cursor(const struct feed *f, const struct cursor *c, uint32_t rank, uint32_t world,
				struct vstate *st, struct vstate_stream *e);
/* The epoch status shows: the earliest of the served streams' (they move at about the same pace). */
uint64_t session_virtual_epoch(const struct session *s);
/* The fingerprint of the cursors this session takes and makes (section 17.7: a plain one, the feed's without virtual ranks). */
static inline uint64_t session_fingerprint(const struct session *s)
{
	return s->plain ? s->feed->fingerprint_plain : s->feed->fingerprint;
}
/* Served stream i (v = rank + i * world) delivers rows: false once dead (section 17.4). */
bool session_virtual_live(const struct session *s, uint32_t i);
void session_virtual_free(struct session *s);
void session_virtual_job_clear(struct session_job *j);
/* Plans batch `batch` into j, its state text into j->cursor. Same returns as session_plan(). */
int session_virtual_plan(struct session *s, struct session_job *j, uint64_t batch, char *msg, size_t msglen);
/* A batch job was published: its rows are its streams' published rows. */
int session_virtual_published(struct session *s, const struct session_job *j);
/* Tokenizing ahead for the served text streams, and freeing what nothing reads. Returns 0 or -ENOMEM. */
int session_virtual_text(struct session *s, bool submit);
/* Text chunks of the served streams out with the workers (explain waits for them). */
unsigned session_virtual_inflight(const struct session *s);
/* session-explain.c: a chunk came back to an explanation's side session (from session_pump). */
void session_explain_step(struct session_explain *e);
/* The worker's half: fills the slot from the rows' plans. */
int session_virtual_produce(struct session *s, struct session_job *j, struct worker *w, uint8_t *slot);

/*
 * session-count.c: the pool's half (any thread) and the main thread's.
 * session_count_ask() (main thread, after a pump of root session s) hands
 * the shard the pump's walks waited for to the pool, when there is one and
 * no count is out yet; its completion pumps s again.
 * session_world_check() decides a deferred world_check: 0 (decided, or
 * being counted) or a negative errno after failing the session.
 */
void session_count_run(struct session_count_job *j);
void session_count_done(struct session *s, struct session_count_job *j);
void session_count_ask(struct session *s);
int session_world_check(struct session *s);

/*
 * session-open.c (issue #22): a session's streams opened at cursor c or
 * state st (both NULL: the start) without counting on the main loop.
 * session_open() makes one attempt: 0 (open), or, when the streams wait for
 * shards' counts, 0 with the session OPENING (s->opening: the cursor or
 * state kept, the streams opened so far torn down, the shards handed to the
 * pool); or a negative errno with the attach error in err.
 * session_open_pump() (from session_pump, while OPENING) tries again once
 * the counts are back: still OPENING, open (then the caller pumps on), or
 * failed with the message session_open() would have given. Returns whether
 * the session is open now.
 */
int session_open(struct session *s, const struct cursor *c, const struct vstate *st, char *err, size_t errlen);
bool session_open_pump(struct session *s);
/* Frees what an OPENING session kept (the session's end). */
void session_opening_free(struct session *s);
/* session.c: the streams opened by an attempt torn down (what session_unref frees of them), for the next. */
void session_streams_clear(struct session *s);

/*
 * session-window.c: the pool's half (any thread) and the main thread's.
 * session_window_ask() (main thread, after a pump of root session s)
 * drops the pins of windows its walks took, and hands the windows the
 * pump's walks waited for to the pool, when there are some and no window
 * job is out yet; its completion pumps s again. session_window_clear()
 * drops every pin (the session's end).
 */
void session_window_run(struct session_window_job *j);
void session_window_done(struct session *s, struct session_window_job *j);
void session_window_ask(struct session *s);
void session_window_clear(struct session *s);

/* session-epoch.c: the pool's half (any thread) and the main thread's */
void session_epoch_run(struct session_epoch_job *j);
void session_epoch_done(struct session *s, struct session_epoch_job *j);

/* session.c */
/*
 * Why a walk failed with -ERANGE after a resume: the cursor's k_w, checked
 * once the shards before its window were counted, was off by other than a
 * multiple of the world (docs/sample-order.md, section 7.3).
 */
#define SESSION_KW_WRONG                                                                                        \
	"the cursor's <kw> (k_w) is not the number of documents before its window, now that they are counted, "  \
	"and its <index> was changed with it: the batches since the resume were not this rank's stream"
void session_ref(struct session *s);
void session_unref(struct session *s);
/* A batch job came back from a worker (main thread, from the producer). */
void session_batch_done(struct session *s, struct session_job *j);
/* Plans and submits batches while the client has free slots. */
void session_pump(struct session *s);
