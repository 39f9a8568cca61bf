/* SPDX-License-Identifier: MIT */
/*
 * Planning a session's batches: which positions of which documents each
 * batch holds, and the cursor after it (docs/sample-order.md). Plain
 * "concat" of one stream plans positions straight from the stream
 * (pack_plan). Other packings, and mixtures, plan whole documents: each
 * stream queues the documents taken from it, the packer (pad.h, bestfit.h,
 * concat.h) draws them in mixed order, and with text tokenized on the way a
 * dry run over the queues first checks that every count the plan needs is
 * known. Main thread only; plans are made strictly in batch order.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct cursor;
struct feed;
struct session;
struct session_job;

/*
 * Sets up whole-document planning at cursor c (NULL: the start) for a
 * by_docs session whose streams are open. With stored tokens every count is
 * known, so a cursor that names no position is refused now. Returns 0, or a
 * negative errno with the attach error in err.
 */
int session_plan_init(struct session *s, const struct cursor *c, char *err, size_t errlen);

/*
 * Plans batch `batch` into j (and its counters), and the position after it
 * into *cur (whose identity fields the caller has set). Returns 0; -EAGAIN
 * when a count it needs is not tokenized yet (s->starved names the stream,
 * nothing was consumed); another negative errno with the reason in msg.
 */
int session_plan(struct session *s, struct session_job *j, uint64_t batch, struct cursor *cur, char *msg,
		 size_t msglen);

/* "cursor does not name a position in rank R's stream of feed F" into err. Returns -EINVAL. */
int session_cursor_not_here(char *err, size_t errlen, uint32_t rank, const struct feed *f);
