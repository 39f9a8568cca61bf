/* SPDX-License-Identifier: MIT */
/*
 * How many batches an epoch of an attached rank's stream has
 * (docs/sample-order.md, section 16), for EPOCH_INFO and `len()` of the
 * Python loader. Only where every count is known without tokenizing or
 * packing: a feed of stored tokens, one stream, packing "concat" or "pad".
 *
 * The measure walks the epoch's order over document lengths, O(documents);
 * so it runs on the producer's pool, never on the main loop, and its result
 * is kept per (feed, rank, world, epoch) in the feed (main thread only).
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "daemon/order/cursor.h"

struct session;
struct feed;
struct vstate;

struct session_epoch_info {
	uint64_t epoch;
	uint64_t first_batch; /* index of the epoch's first batch in the stream's numbering */
	uint64_t batches;     /* this rank's batches whose epoch is `epoch` */
	uint64_t units;       /* the epoch's positions (concat) or rows (pad) for this rank */
};

/* The measure is done (main thread); code < 0 with the reason in msg, else info. Not called once the session is closed. */
typedef void (*session_epoch_fn)(struct session *s, int code, const struct session_epoch_info *info, const char *msg,
				 void *userdata);

/*
 * The epoch of the position c names (a cursor of this session's stream;
 * NULL: the stream's start); with virtual ranks, of state st instead (the
 * rank's own or a global one; NULL: the start of every served stream). Returns 1 with *ret filled (known already); 0
 * when measuring on the pool (done(userdata) follows on the main thread);
 * -EOPNOTSUPP (the feed cannot know it; why in err), -EINVAL (c is not a
 * cursor of this stream), -ENOMEM.
 */
int session_epoch_info(struct session *s, const struct cursor *c, const struct vstate *st, session_epoch_fn done,
		       void *userdata, struct session_epoch_info *ret, char *err, size_t errlen);

/* Whether feed f can answer (0), or -EOPNOTSUPP with why in err. */
int feed_epoch_info_supported(const struct feed *f, char *err, size_t errlen);
