/* SPDX-License-Identifier: MIT */
/*
 * A session's streams opened without counting on the main loop (issue
 * #22). A resume (a cursor, an elastic state) opens its streams in the
 * windows its positions name. A text shard of such a window may not be
 * counted yet (a cold cache_dir: seconds for a large compressed shard, and
 * an old cursor without <kw> needs every window before its own), and the
 * window's shuffle may not be built yet (session-window.c). So the streams
 * are opened with feed_count_never_block(): an attempt that meets a shard
 * not counted or a window not built stops (-EAGAIN) having named every
 * shard (feed_count_wanted) and window (feed_windows_wanted) it missed; a
 * state's streams are all tried, so that one round gets what all of them
 * miss. The session is kept OPENING: its ring made and the attach answered
 * as for any session, the cursor or state kept here, the streams opened so
 * far torn down (session_streams_clear), the shards counted and the windows
 * built on the pool (session_count_ask, session_window_ask). When they are
 * back, session_pump() lands in session_open_pump(), which tries again:
 * until the streams open (then the session plans as any other) or an
 * attempt fails, with the message the attach would have given (the client
 * reads it at its next batch).
 *
 * What an attempt costs on the main loop is the positions' (a window entered
 * per stream, shards not read), never the windows' documents: counting and
 * indexing are the pool's. The checks that need no window (fingerprint,
 * data identity, rank and world, a malformed position) run in every attempt,
 * the first one inside session_new(): they stay refusals of the attach.
 *
 * A side session of feedctl explain (session-explain.c) opens the same way:
 * its explanation waits for the pool, and a client that leaves meanwhile
 * closes it (the jobs out stop at their next shard).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "daemon/log/log.h"

void session_opening_free(struct session *s)
{
	if (!s->opening)
		return;
	vstate_clear(&s->opening->st);
	free(s->opening);
	s->opening = NULL;
}

/*
 * Whether jobs the open waits for are out on the pool: their completion
 * pumps the session (the last one of a round), which tries again. The
 * one place that says what an attempt may wait for: shards' counts
 * (session-count.c) and shuffled windows (session-window.c).
 */
static bool waiting(const struct session *s)
{
	return s->count_jobs > 0 || s->window_job;
}

/* Hands the pool what the attempt's walks waited for (feed_count_wanted's and feed_windows_wanted's sets). */
static void ask(struct session *s)
{
	session_count_ask(s);
	session_window_ask(s);
}

/* One attempt, every count it needs asked for (never read here). 0, -EAGAIN, or an error in err. */
static int attempt(struct session *s, const struct cursor *c, const struct vstate *st, char *err, size_t errlen)
{
	bool was = feed_count_never_block(true);
	/* What earlier walks of this thread left is not this attempt's. */
	feed_count_wanted(NULL, 0);
	feed_windows_wanted(NULL, 0);
	int r = s->feed->vranks && !s->plain ? session_virtual_open(s, st, err, errlen)
					     : session_open_streams(s, c, err, errlen);
	feed_count_never_block(was);
	if (s->opening)
		s->opening->attempts++;
	if (r == -EAGAIN) {
		/* The streams opened so far hold windows they do not read yet: the next attempt opens them again. */
		session_streams_clear(s);
		ask(s);
	}
	return r;
}

/* Keeps copies of c and st for the next attempts. 0 or -ENOMEM. */
static int keep(struct session *s, const struct cursor *c, const struct vstate *st)
{
	struct session_opening *o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	if (c) {
		o->has_cursor = true;
		o->c = *c;
	}
	if (st) {
		o->has_state = true;
		o->st = *st;
		o->st.s = st->n ? malloc(st->n * sizeof(*st->s)) : NULL;
		if (st->n && !o->st.s) {
			free(o);
			return -ENOMEM;
		}
		if (st->n)
			memcpy(o->st.s, st->s, st->n * sizeof(*st->s));
	}
	o->attempts = 1;
	s->opening = o;
	return 0;
}

int session_open(struct session *s, const struct cursor *c, const struct vstate *st, char *err, size_t errlen)
{
	int r = attempt(s, c, st, err, errlen);
	if (r != -EAGAIN)
		return r;
	if (!waiting(s)) {
		/* Nothing was asked for: an attempt that waits must name what it waits for. */
		snprintf(err, errlen, "internal error: the streams wait for counts or windows nothing was asked for");
		return -EIO;
	}
	if (keep(s, c, st) < 0) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

bool session_open_pump(struct session *s)
{
	struct session_opening *o = s->opening;
	char err[512];
	if (!o)
		return true;
	if (s->failed || s->closed || waiting(s))
		return false; /* the counts are not all back yet: their last completion pumps again */
	int r = attempt(s, o->has_cursor ? &o->c : NULL, o->has_state ? &o->st : NULL, err, sizeof(err));
	if (r == -EAGAIN && waiting(s))
		return false;
	if (r == -EAGAIN) {
		r = -EIO;
		snprintf(err, sizeof(err), "internal error: the streams wait for counts or windows nothing was asked for");
	}
	if (r < 0) {
		session_streams_clear(s);
		session_fail(s, r, err);
		return false;
	}
	/* The round trips it took (a state's 1,024 streams: a few, not one per stream or shard). */
	if (!s->explain)
		log_info("feed %s rank %u/%u: streams open after %u attempts, their windows counted on the pool", s->feed->name,
			 s->rank, s->world, o->attempts);
	session_opening_free(s);
	return true;
}
