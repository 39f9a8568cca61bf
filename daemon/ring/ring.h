/* SPDX-License-Identifier: MIT */
/*
 * The daemon's side of one client's batch ring (proto/ring_abi.h): two memfds,
 * two eventfds, and the publish/reclaim protocol. The ring memfd is reserved
 * up front (fallocate: running out of memory fails the attach, never SIGBUS
 * later) and sealed against resizing and new writable mappings once the
 * daemon holds its own mapping. The consumer page is the only memory a client
 * may write.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/ring_abi.h"

struct ring {
	int ring_fd, consumer_fd;
	int data_efd;  /* daemon -> client: batches published */
	int space_efd; /* client -> daemon: slots released */
	struct feed_ring_header *hdr;
	size_t size;
	struct feed_consumer_page *cons;
	uint32_t slot_count, slot_size;
	uint64_t tail; /* last validated consumer tail */
	struct ring_pool *pool; /* where its memory goes back to (a reference), or NULL */
	uint32_t owner;         /* the uid it was made for, with a pool */
	bool made;              /* complete */
	/*
	 * Its client let go of it: said DETACH, which libfeed says once it
	 * unmapped the ring. Only such a ring's memory goes back to the
	 * pool: any other end (the connection lost, feedd stopping, the
	 * session failed) may leave a client that still maps it, holds a
	 * batch in it or reads its last cursor from it, and the pool wipes
	 * the memory and gives it to the uid's next ring.
	 */
	bool released;
};

struct ring_geometry {
	uint32_t slot_count, batch_size, seq_len, rank, world;
	uint32_t state_bytes; /* each slot's state area (long elastic states), 0: none */
};

/* Bytes one slot takes for a geometry, or 0 when B*L does not fit the ABI. */
size_t ring_slot_bytes(uint32_t batch_size, uint32_t seq_len);

/* Creates, reserves, maps and seals a ring. Returns 0, -ENOMEM, -ENOSPC, -EINVAL, ... */
int ring_new(const struct ring_geometry *g, struct ring **ret);
struct ring *ring_free(struct ring *r);

/*
 * The pool of ring memory kept between attaches (issue 18). Under attach
 * churn, making a ring (memfd_create, fallocate of every page, a populated
 * mapping, seals) and freeing it (every page unmapped and freed) was the
 * largest part of an attach. An idle ring's memory is kept for the next ring
 * of the same owner (a uid) and exactly the same size, wiped when given back:
 * a reused ring carries nothing of its previous client's batches, and a ring
 * never goes to another uid. Only a ring its client released (above) is
 * given back: wiping or reusing memory a client still maps would change the
 * batch it holds, or the cursor it resumes from, under it.
 * At most max_bytes are kept idle, the oldest let go first; the owner of the
 * pool trims what stayed idle (ring_pool_trim). Main thread only.
 */
struct ring_pool;
struct ring_pool_counters {
	uint64_t reused;     /* rings whose memory came from the pool */
	uint64_t made;       /* rings made new while lending (none idle of that uid and size) */
	uint64_t freed;      /* idle memories let go (trimmed, or room for newer ones) */
	uint64_t idle_bytes; /* kept idle now */
};
/* A pool keeping at most max_bytes of idle rings. Returns 0 or -ENOMEM. */
int ring_pool_new(size_t max_bytes, struct ring_pool **ret);
/* Frees its idle rings and drops the caller's reference: rings still out free their memory when freed. Takes NULL. */
struct ring_pool *ring_pool_free(struct ring_pool *p);
/*
 * Until the next call, rings ring_new makes are of uid `owner`: their memory
 * comes from p when it holds an idle ring of that owner and size, and goes
 * back to p when they are freed. p NULL: rings are made and freed whole, as
 * without a pool. A scope the caller opens around the calls that make a
 * client's ring, and closes with ring_pool_lend(NULL, 0).
 */
void ring_pool_lend(struct ring_pool *p, uint32_t owner);
/* Lets go of the idle rings given back before before_ns (UINT64_MAX: all). Returns the bytes let go. */
size_t ring_pool_trim(struct ring_pool *p, uint64_t before_ns);
void ring_pool_counters(const struct ring_pool *p, struct ring_pool_counters *ret);

/* Start of slot for sequence number seq. */
static inline uint8_t *ring_slot(const struct ring *r, uint64_t seq)
{
	return (uint8_t *)r->hdr + r->hdr->header_size + (size_t)(seq % r->slot_count) * r->slot_size;
}

/* Publishes batches up to `head` and wakes the client if it sleeps. */
void ring_publish(struct ring *r, uint64_t head);

/*
 * Reads and validates the client's tail against what was published.
 * Returns 0 and updates r->tail; -EPROTO when the client wrote nonsense (tail
 * past head, or moved backwards).
 */
int ring_refresh_tail(struct ring *r);

/*
 * Called when the ring is full: asks the client for a kick once half the ring
 * is released. Returns true when space appeared meanwhile (no need to wait).
 */
bool ring_wait_space(struct ring *r);
/* Clears the waiting flag and drains the space eventfd. */
void ring_space_ack(struct ring *r);

/*
 * What the client wrote into its consumer page, read once, field by field,
 * and clamped where the daemon relies on it. The page is the client's to
 * write at any time: this is the one place the daemon reads it for figures
 * (the tail the publisher trusts is validated by ring_refresh_tail()).
 * Totals and histograms are copied as written: whoever differences them
 * treats a counter that goes backwards as no progress.
 */
struct ring_consumer {
	uint64_t tail;             /* batches released, at most `published` */
	uint64_t delivered;        /* batches next() returned, at most `published` */
	bool waiting;              /* the client says it sleeps in next() */
	uint64_t wait_ns, step_ns; /* time blocked in next(), and between next() calls */
	uint64_t h2d_ns;           /* host-to-device copy time the trainer reported */
	uint64_t reports;          /* feed_client_report() calls */
	uint64_t reported_step_ns; /* step time the trainer reported itself */
	uint64_t reconnects, reconnect_ns; /* libfeed's reconnects before this attachment */
	uint64_t hist_wait[FEED_HIST_BUCKETS], hist_step[FEED_HIST_BUCKETS]; /* feed_hist_bucket() buckets */
};

/* Reads r's consumer page into *ret, clamping against the `published` count of the ring. */
void ring_read_consumer(const struct ring *r, uint64_t published, struct ring_consumer *ret);

/* Marks the ring failed (or stopping) and wakes the client. */
void ring_set_state(struct ring *r, uint32_t state, int error_code);
