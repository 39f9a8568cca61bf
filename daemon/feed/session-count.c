/* SPDX-License-Identifier: MIT */
/*
 * Text shards counted for a session's walks off the main loop (issue #22).
 * The main loop's walks never read a shard (feed_count_never_block): one
 * that enters a window whose count or line index is missing stops there
 * (-EAGAIN, like a document not tokenized yet) and names the shards
 * (feed_count_wanted: every shard it missed, a set, not only the first).
 * After the pump (or an attempt to open the streams, session-open.c),
 * session_count_ask() hands the set to the pool as PRODUCER_COUNT jobs, at
 * most one per pool thread, each counting a list of shards; when the last
 * of them is back the session pumps again, whose walks go on from where
 * they stopped. So a window counted for the first time (a compressed shard
 * decompressed, a large one scanned) holds up only the batches that need
 * it, never the main loop, the other clients or status, and a window of
 * many shards, or a resume's many streams, costs one round trip to the
 * pool, not one per shard. Nothing spins: a session that waits has jobs
 * out, and pumps again only when they are back.
 *
 * The attach's "at least R documents" check of a text feed (session_new) is
 * decided from the counts known then; when they do not decide it, after
 * the attach: the session plans nothing until the pool has counted, in
 * epoch 0's order, R documents (then it goes on) or every shard (then it
 * fails with the attach's message).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "proto/macro.h"

void session_count_run(struct session_count_job *j)
{
	/* A failure is reported by the session (and kept for the feed's next poll), not by feed_fail() here. */
	feed_off_main_thread();
	if (j->n == 0) {
		struct feed *f = j->feed;
		j->result = feed_count_until(f, j->until);
		if (j->result < 0)
			snprintf(j->error, sizeof(j->error), "feed %s: cannot count its documents: %.400s", f->name,
				 f->lazy_code ? f->lazy_err : strerror(-j->result));
		return;
	}
	for (size_t i = 0; i < j->n; i++) {
		/* Its client left (or the explanation was cancelled): the rest is counted by whoever needs it. */
		if (__atomic_load_n(&session_root(j->pj.session)->closed, __ATOMIC_RELAXED))
			return;
		struct feed *f = j->shards[i].feed;
		uint32_t n;
		j->result = feed_count_shard(f, j->shards[i].shard, &n);
		if (j->result < 0) {
			j->feed = f;
			snprintf(j->error, sizeof(j->error), "%s", f->lazy_code ? f->lazy_err : strerror(-j->result));
			return;
		}
	}
}

void session_count_done(struct session *s, struct session_count_job *j)
{
	assert(s->count_jobs > 0);
	s->count_jobs--;
	int r = j->result;
	char error[512];
	snprintf(error, sizeof(error), "%s", j->error);
	/* A shard that cannot be read fails its feed now, as when the main loop counted (feed_scan_poll folds it in). */
	if (r < 0 && j->feed)
		feed_scan_poll(j->feed);
	free(j);
	if (s->failed || s->closed)
		return;
	if (r < 0) {
		/* The shard's window cannot be read: the feed fails with it (at its next poll), this session now. */
		session_fail(s, r, error);
		return;
	}
	/* The round is back when its last job is: the walks (or the open) go on once, with every count. */
	if (s->count_jobs == 0)
		session_pump(s);
}

/* Hands n shards (n = 0: the feed f counted until `until` documents) to the pool. */
static void submit(struct session *s, struct feed *f, const struct feed_wanted *shards, size_t n, uint64_t until)
{
	struct session_count_job *j = calloc(1, sizeof(*j) + n * sizeof(*shards));
	if (!j) {
		session_fail(s, -ENOMEM, "out of memory counting a text shard");
		return;
	}
	*j = (struct session_count_job){ .pj = { .kind = PRODUCER_COUNT, .session = s }, .feed = f, .until = until,
					 .n = n };
	if (n)
		memcpy(j->shards, shards, n * sizeof(*shards));
	s->count_jobs++;
	session_ref(s);
	producer_submit(s->producer, &j->pj);
}

void session_count_ask(struct session *s)
{
	struct feed_wanted w[FEED_WANTED_MAX];
	/* Taken whatever happens: a wanted shard left behind would be asked for by the next pump, of another session. */
	size_t n = feed_count_wanted(w, FEED_WANTED_MAX);
	if (!n || s->count_jobs || s->failed || s->closed)
		return;
	/* In parallel, one list per pool thread at most: a window's shards decompressed side by side. */
	size_t jobs = MIN(n, (size_t)MAX(producer_threads(s->producer), 1u));
	for (size_t k = 0; k < jobs && !s->failed; k++)
		submit(s, NULL, w + n * k / jobs, n * (k + 1) / jobs - n * k / jobs, 0);
}

int session_world_check(struct session *s)
{
	struct feed *f = s->feed;
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		struct feed *sf = f->n_sources ? f->sources[i] : f;
		int r = feed_docs_known_at_least(sf, s->world);
		if (r == -EAGAIN) {
			if (!s->count_jobs)
				submit(s, sf, NULL, 0, s->world);
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
