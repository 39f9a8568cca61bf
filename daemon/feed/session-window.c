/* SPDX-License-Identifier: MIT */
/*
 * Shuffled windows built for a session's walks off the main loop (issue
 * #22). The main loop's walks never build a window nor wait for one
 * (feed-windows.c, feed_count_never_block): a walk entering a window that
 * is not built yet stops there (-EAGAIN, like a shard not counted yet) and
 * the window is noted as wanted (feed_windows_wanted), several per pump
 * (an elastic session's streams may each want one). After the pump,
 * session_window_ask() hands the set to the pool as one PRODUCER_WINDOW
 * job, one per session at a time; the worker builds each window (or waits
 * while the feed's builder thread does) and pins it, so that no prefetch
 * or trim evicts it before the walk that waits takes it. Its completion
 * pumps the session again, whose walks go on where they stopped (a plan
 * stopped halfway goes on too: pack_plan, session_virtual_plan). Each
 * pin is dropped after a pump in which a walk took its window, or at the
 * session's end. Nothing spins: a session that waits has a job out, and
 * pumps again only when it is back.
 *
 * Owns: the job (freed when done) and the session's pins (window_pins,
 * main thread only). The feeds named are the session's own or its
 * mixture's sources, which the session holds.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/session-internal.h"
#include "proto/macro.h"

/* Pins kept at most: past it the oldest go (their walks ask again if they still need them). */
#define PINS_MAX (4 * FEED_WINDOW_WANTS)

void session_window_run(struct session_window_job *j)
{
	/* A text shard the window needs counted here fails its feed at the next poll, not here. */
	feed_off_main_thread();
	for (unsigned i = 0; i < j->n; i++) {
		char err[512];
		int r = feed_window_make(j->want[i].feed, &j->want[i], &j->pin[i], err, sizeof(err));
		j->pinned[i] = r == 0;
		if (r < 0 && r != -ERANGE && !j->result) {
			j->result = r;
			snprintf(j->error, sizeof(j->error), "%s", err);
		}
	}
}

/* Drops the pins of windows a walk took since (all when force). Main thread. */
static void unpin(struct session *s, bool force)
{
	unsigned kept = 0;
	for (unsigned i = 0; i < s->n_window_pins; i++) {
		struct session_window_pin *p = &s->window_pins[i];
		if (!feed_window_unpin(p->feed, &p->pin, force || s->n_window_pins - i > PINS_MAX))
			s->window_pins[kept++] = *p;
	}
	s->n_window_pins = kept;
	if (!kept) {
		free(s->window_pins);
		s->window_pins = NULL;
	}
}

void session_window_clear(struct session *s)
{
	unpin(s, true);
}

void session_window_done(struct session *s, struct session_window_job *j)
{
	if (s->window_job == j)
		s->window_job = NULL;
	struct session_window_pin *pins = realloc(s->window_pins, (s->n_window_pins + j->n) * sizeof(*pins));
	if (pins)
		s->window_pins = pins;
	for (unsigned i = 0; i < j->n; i++) {
		if (!j->pinned[i])
			continue;
		if (pins)
			s->window_pins[s->n_window_pins++] = (struct session_window_pin){ .feed = j->want[i].feed, .pin = j->pin[i] };
		else
			feed_window_unpin(j->want[i].feed, &j->pin[i], true); /* its walk asks again */
	}
	int r = j->result;
	char error[512];
	snprintf(error, sizeof(error), "%s", j->error);
	free(j);
	if (s->failed || s->closed) {
		unpin(s, true);
		return;
	}
	if (r < 0) {
		session_fail(s, r, error);
		return;
	}
	session_pump(s);
}

/* Whether f is the session's feed or one of its mixture's sources (held by the session). */
static bool feed_of(const struct session *s, const struct feed *f)
{
	if (f == s->feed)
		return true;
	for (uint32_t i = 0; i < s->feed->n_sources; i++)
		if (f == s->feed->sources[i])
			return true;
	return false;
}

void session_window_ask(struct session *s)
{
	struct feed_window_want want[FEED_WINDOW_WANTS];
	/* Taken whatever happens: a set left behind would be asked for by the next pump, of another session. */
	unsigned n = feed_windows_wanted(want, FEED_WINDOW_WANTS);
	/*
	 * While a resume opens (session-open.c), every attempt starts over and
	 * lets go of the windows the last one took: their pins stay until the
	 * streams are open, so that the next attempt finds them.
	 */
	if (s->n_window_pins && !s->opening)
		unpin(s, false);
	if (!n || s->window_job || s->failed || s->closed)
		return;
	struct session_window_job *j = calloc(1, sizeof(*j));
	if (!j) {
		session_fail(s, -ENOMEM, "out of memory building a shuffled window");
		return;
	}
	*j = (struct session_window_job){ .pj = { .kind = PRODUCER_WINDOW, .session = s } };
	for (unsigned i = 0; i < n; i++)
		if (feed_of(s, want[i].feed))
			j->want[j->n++] = want[i];
	if (!j->n) {
		free(j);
		return;
	}
	s->window_job = j;
	session_ref(s);
	producer_submit(s->producer, &j->pj);
}
