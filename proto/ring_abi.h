/* SPDX-License-Identifier: MIT */
/*
 * The shared-memory ABI between feedd and libfeed: one batch ring per attached
 * client.
 *
 * Two memfds per client:
 *  - the ring (daemon writes, client maps read-only; sealed against grow,
 *    shrink and future writes): a header page, then slot_count slots of
 *    slot_size bytes, each holding one batch;
 *  - the consumer page (client writes, daemon reads and validates): the
 *    consumer's position and its telemetry counters.
 *
 * Sequence numbers are monotonic u64 counts of batches; batch number `seq`
 * lives in slot `seq % slot_count`. The producer publishes by storing `head`
 * (release); the consumer frees slots by storing `tail` (release). The daemon
 * writes a slot only when `seq - tail < slot_count`.
 *
 * Wake-ups go through two eventfds and cost a system call only when the other
 * side is asleep: a sleeper sets its `*_waiting` flag, issues a full fence and
 * re-checks the index before blocking; a publisher stores the index, fences,
 * and kicks the eventfd only when the flag is set. The daemon sleeps on a full
 * ring until half of it is free (`wake_tail`), so a client that releases one
 * batch at a time wakes it once per half ring, not once per batch; a client
 * about to sleep in next() kicks a waiting daemon regardless, so holding many
 * batches can never deadlock.
 *
 * Every field is fixed-width and little-endian (the daemon and client run on
 * the same host, so this is native order on the platforms feedd supports).
 * Everything the client reads here is validated before use, and the daemon
 * treats everything in the consumer page as untrusted.
 */
#pragma once

#include <stdint.h>

#define FEED_RING_MAGIC UINT64_C(0x474e495244454546)     /* "FEEDRING" */
#define FEED_CONSUMER_MAGIC UINT64_C(0x524d534e4f434546) /* "FECONSMR" */
#define FEED_RING_VERSION 1
#define FEED_CURSOR_MAX 512 /* bytes, including the terminating NUL */
#define FEED_HIST_BUCKETS 256
#define FEED_RING_HEADER_SIZE 4096
#define FEED_CONSUMER_PAGE_SIZE 8192
#define FEED_SLOT_HEADER_SIZE 1024
#define FEED_LABEL_IGNORE (-100)

/* feed_ring_header.state */
enum {
	FEED_RING_RUNNING = 0,
	FEED_RING_FAILED = 1,   /* error_code says why; the control socket carries the text */
	FEED_RING_STOPPING = 2, /* daemon is shutting down; no further batches */
	/*
	 * Failed because a shard changed (error_code -ESTALE): every batch not
	 * yet taken is withdrawn. A client checks the state after copying a
	 * slot's header and delivers no batch once it reads WITHDRAWN.
	 */
	FEED_RING_WITHDRAWN = 3,
};

struct feed_ring_header {
	/* --- geometry: written once before the fd is sent, never changed --- */
	uint64_t magic;           /* FEED_RING_MAGIC */
	uint32_t version;         /* FEED_RING_VERSION */
	uint32_t header_size;     /* bytes before slot 0; page multiple */
	uint32_t slot_count;      /* number of slots, >= 2 */
	uint32_t slot_size;       /* bytes per slot; page multiple */
	uint32_t batch_size;      /* B: rows per batch */
	uint32_t seq_len;         /* L: positions per row */
	uint32_t off_input_ids;   /* offsets inside a slot, 64-byte aligned */
	uint32_t off_labels;
	uint32_t off_position_ids;
	uint32_t off_cu_seqlens;
	uint32_t cu_capacity;     /* entries reserved for cu_seqlens: B*L + 1 */
	uint32_t rank;            /* the attached rank */
	uint32_t world;           /* the attached world size */
	uint32_t state_capacity;  /* bytes of each slot's state area (feed_slot_state_offset), 0: none */
	/* --- producer cache line --- */
	uint64_t head __attribute__((aligned(64))); /* batches published (release) */
	uint32_t state;            /* FEED_RING_* */
	int32_t error_code;        /* negative errno when state == FAILED */
	uint32_t producer_waiting; /* daemon waits for space: kick the space eventfd ... */
	uint32_t reserved2;
	uint64_t daemon_pid;       /* who produces; lets a client tell restarts apart */
	uint64_t wake_tail;        /* ... once tail reaches this, or before sleeping in next() */
	uint8_t pad[FEED_RING_HEADER_SIZE - 104];
};
_Static_assert(sizeof(struct feed_ring_header) == FEED_RING_HEADER_SIZE, "ring header size");
_Static_assert(__builtin_offsetof(struct feed_ring_header, head) == 64, "head on its own line");

/*
 * Elastic states (docs/sample-order.md, section 17) may be longer than a
 * cursor. A ring whose header has state_capacity > 0 has, in every slot, a
 * state area of that many bytes at feed_slot_state_offset(); a slot whose
 * cursor is FEED_CURSOR_IN_STATE_AREA holds its NUL-terminated cursor there.
 */
#define FEED_CURSOR_IN_STATE_AREA "fv1+"
static inline uint64_t feed_slot_state_offset(uint32_t off_cu_seqlens, uint32_t cu_capacity)
{
	return ((uint64_t)off_cu_seqlens + 4ull * cu_capacity + 63) & ~UINT64_C(63);
}

struct feed_slot_header {
	uint64_t seq;          /* ring sequence number of the batch in this slot */
	uint64_t batch_index;  /* b: index of this batch in the rank's stream */
	uint64_t epoch;        /* epoch of the batch's first position */
	uint32_t rank;
	uint32_t world;
	uint32_t batch_size;   /* B */
	uint32_t seq_len;      /* L */
	uint32_t n_cu_seqlens; /* valid entries in cu_seqlens */
	uint32_t n_docs;       /* documents that start inside this batch */
	uint64_t produced_ns;  /* CLOCK_MONOTONIC when the daemon published it */
	uint64_t reserved[3];
	char cursor[FEED_CURSOR_MAX]; /* cursor after this batch, NUL-terminated */
	uint8_t pad[FEED_SLOT_HEADER_SIZE - 592];
};
_Static_assert(sizeof(struct feed_slot_header) == FEED_SLOT_HEADER_SIZE, "slot header size");

struct feed_consumer_page {
	uint64_t magic;   /* FEED_CONSUMER_MAGIC, written by the daemon */
	uint32_t version; /* FEED_RING_VERSION */
	uint32_t reserved0;
	uint8_t pad0[48];
	/* --- consumer cache line: the client writes, the daemon validates --- */
	uint64_t tail __attribute__((aligned(64))); /* batches released (release) */
	uint32_t consumer_waiting; /* client sleeps: kick the data eventfd */
	uint32_t reserved1;
	uint8_t pad1[48];
	/* --- telemetry: written by the client, read by the daemon --- */
	uint64_t delivered;     /* batches returned by next() */
	uint64_t wait_ns_total; /* time spent blocked in next() */
	uint64_t step_ns_total; /* time between a next() return and the following call */
	uint64_t h2d_ns_total;  /* reported by the trainer, when it measures it */
	uint64_t last_wait_ns;
	uint64_t last_step_ns;
	uint64_t reports;       /* explicit report() calls */
	uint64_t last_delivered_batch; /* batch_index of the last delivered batch + 1; 0 = none */
	uint64_t reported_step_ns_total; /* step times the trainer reported itself */
	uint64_t hist_wait[FEED_HIST_BUCKETS]; /* log-linear buckets, see feed_hist_bucket() */
	uint64_t hist_step[FEED_HIST_BUCKETS];
	/* libfeed's reconnects (issue 17): how often this client's daemon went away, and the time it waited. */
	uint64_t reconnects;
	uint64_t reconnect_ns_total;
	uint8_t pad2[FEED_CONSUMER_PAGE_SIZE - 216 - 2 * 8 * FEED_HIST_BUCKETS];
};
_Static_assert(sizeof(struct feed_consumer_page) == FEED_CONSUMER_PAGE_SIZE, "consumer page size");
_Static_assert(__builtin_offsetof(struct feed_consumer_page, tail) == 64, "tail on its own line");

/*
 * Histogram buckets, 4 per power of two (about 19 % wide): values 0..3 have a
 * bucket each; for v >= 4 with e = floor(log2 v), bucket = 4(e-1) + the two
 * bits below the leading one. Bucket b >= 4 covers [feed_hist_lower(b),
 * feed_hist_lower(b+1)).
 */
static inline unsigned feed_hist_bucket(uint64_t v)
{
	if (v < 4)
		return (unsigned)v;
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	return 4u * (e - 1u) + (unsigned)((v >> (e - 2u)) & 3u);
}

static inline uint64_t feed_hist_lower(unsigned b)
{
	if (b < 4)
		return b;
	unsigned e = b / 4u + 1u;
	return (uint64_t)(4u + b % 4u) << (e - 2u);
}
