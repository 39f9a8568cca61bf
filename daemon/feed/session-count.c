/* SPDX-License-Identifier: MIT */
/*
 * Text shards counted for a session's walks off the main loop (issue #22).
 * The main loop's walks never read a shard (feed_count_never_block): one
 * that enters a window whose count or line index is missing stops there
 * (-EAGAIN, like a document not tokenized yet) and names the shard
 * (feed_count_wanted). After the pump, session_count_ask() hands that
 * shard to the pool as a PRODUCER_COUNT job, one per session at a time;
 * its completion pumps the session again, whose walks go on from where
 * they stopped. So a window counted for the first time (a compressed shard
 * decompressed, a large one scanned) holds up only the batches that need
 * it, never the main loop, the other clients or status. Nothing spins: a
 * session that waits has a job out, and pumps again only when it is back.
 *
 * The attach's "at least R documents" check of a text feed (session_new) is
 * decided from the counts known then; when they do not decide it, after
 * the attach: the session plans nothing until the pool has counted, in
 * epoch 0's order, R documents (then it goes on) or every shard (then it
 * fails with the attach's message).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "proto/macro.h"

void session_count_run(struct session_count_job *j)
{
	struct feed *f = j->feed;
	/* A failure is reported by the session (and kept for the feed's next poll), not by feed_fail() here. */
	feed_off_main_thread();
	if (j->shard == UINT32_MAX) {
		j->result = feed_count_until(f, j->until);
		if (j->result < 0)
			snprintf(j->error, sizeof(j->error), "feed %s: cannot count its documents: %.400s", f->name,
				 f->lazy_code ? f->lazy_err : strerror(-j->result));
		return;
	}
	uint32_t n;
	j->result = feed_count_shard(f, j->shard, &n);
	if (j->result < 0)
		snprintf(j->error, sizeof(j->error), "%s", f->lazy_code ? f->lazy_err : strerror(-j->result));
}

void session_count_done(struct session *s, struct session_count_job *j)
{
	if (s->count_job == j)
		s->count_job = NULL;
	int r = j->result;
	char error[512];
	snprintf(error, sizeof(error), "%s", j->error);
	/* A shard that cannot be read fails its feed now, as when the main loop counted (feed_scan_poll folds it in). */
	if (r < 0)
		feed_scan_poll(j->feed);
	free(j);
	if (s->failed || s->closed)
		return;
	if (r < 0) {
		/* The shard's window cannot be read: the feed fails with it (at its next poll), this session now. */
		session_fail(s, r, error);
		return;
	}
	session_pump(s);
}

static void submit(struct session *s, struct feed *f, uint32_t shard, uint64_t until)
{
	struct session_count_job *j = calloc(1, sizeof(*j));
	if (!j) {
		session_fail(s, -ENOMEM, "out of memory counting a text shard");
		return;
	}
	*j = (struct session_count_job){ .pj = { .kind = PRODUCER_COUNT, .session = s }, .feed = f, .shard = shard,
					 .until = until };
	s->count_job = j;
	session_ref(s);
	producer_submit(s->producer, &j->pj);
}

void session_count_ask(struct session *s)
{
	struct feed *f;
	uint32_t shard;
	/* Taken whatever happens: a wanted shard left behind would be asked for by the next pump, of another session. */
	bool want = feed_count_wanted(&f, &shard);
	if (!want || s->count_job || s->failed || s->closed)
		return;
	submit(s, f, shard, 0);
}

int session_world_check(struct session *s)
{
	struct feed *f = s->feed;
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		struct feed *sf = f->n_sources ? f->sources[i] : f;
		int r = feed_docs_known_at_least(sf, s->world);
		if (r == -EAGAIN) {
			if (!s->count_job)
				submit(s, sf, UINT32_MAX, s->world);
			return 0;
		}
		if (r < 0) {
			char msg[640];
			snprintf(msg, sizeof(msg), "feed %s is not available: %s", sf->name, sf->error);
			session_fail(s, r, msg);
			return r;
		}
		if (r == 0) {
			char msg[512];
			snprintf(msg, sizeof(msg),
				 "feed %s has %" PRIu64 " non-empty documents, fewer than the world size %u: some ranks would get no data",
				 sf->name, sf->n_nonempty, s->world);
			session_fail(s, -EINVAL, msg);
			return -EINVAL;
		}
	}
	s->world_check = false;
	return 0;
}
