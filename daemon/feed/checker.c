/* SPDX-License-Identifier: MIT */
/*
 * The shard checker (checker.h): one sweep at a time, each on a detached
 * thread of its own, an eventfd that tells the main loop the sweep is done.
 * The sweep object is shared by the thread and the main loop; the state both
 * touch (finished, abandoned, what the thread stats now and since when) is
 * under its mutex, and whichever side lets go last frees it (refs). The
 * items' results are written by the thread before it sets finished and read
 * by the main loop after it saw finished, both under the mutex.
 */
#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/feed/checker.h"
#include "daemon/feed/feed.h"
#include "daemon/feed/fs-thread.h"
#include "daemon/source/source.h"
#include "proto/macro.h"

struct check_item {
	uint32_t top;         /* index into the sweep's feeds (each held by a reference) */
	uint32_t source;      /* a mixture's source the shard is of; UINT32_MAX: the feed's own */
	struct shard *shard;
	int r;                /* format_check's, on the thread */
	char *err;            /* its message when r < 0 (malloc'd by the thread) */
};

struct sweep {
	pthread_mutex_t lock;
	unsigned refs;        /* the thread and the main loop's side */
	bool finished, abandoned;
	struct fs_mark mark;  /* the file the thread stats now, since when */
	int efd;              /* the checker's; written under lock unless abandoned */

	struct feed **feeds;
	size_t n_feeds, cap_feeds;
	struct check_item *items;
	size_t n_items, cap_items;
};

struct checker {
	struct event_base *base;
	checker_failed_fn failed;
	void *userdata;
	int efd;
	struct event *ev;
	struct sweep *next;     /* being added to */
	struct sweep *running;  /* started, not yet applied */
	struct feed **urgent;   /* held: feeds a short read asked to check in full (checker_recheck) */
	size_t n_urgent, cap_urgent;
};

static struct sweep *sweep_new(int efd)
{
	struct sweep *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	w->refs = 1;
	w->efd = efd;
	pthread_mutex_init(&w->lock, NULL);
	w->mark.lock = &w->lock;
	return w;
}

/* Frees what the sweep holds but the feeds' references (unref_feeds: main thread only). */
static void sweep_free(struct sweep *w, bool unref_feeds);

static void sweep_unref(struct sweep *w, bool unref_feeds)
{
	pthread_mutex_lock(&w->lock);
	bool last = --w->refs == 0;
	pthread_mutex_unlock(&w->lock);
	if (last)
		sweep_free(w, unref_feeds);
}

static void sweep_free(struct sweep *w, bool unref_feeds)
{
	for (size_t i = 0; i < w->n_items; i++)
		free(w->items[i].err);
	for (size_t i = 0; unref_feeds && i < w->n_feeds; i++)
		feed_unref(w->feeds[i]);
	free(w->items);
	free(w->feeds);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

static void *sweep_main(void *userdata)
{
	struct sweep *w = userdata;
	source_set_progress(fs_mark_progress, &w->mark);
	for (size_t i = 0; i < w->n_items; i++) {
		struct check_item *it = &w->items[i];
		char err[512];
		it->r = format_check(it->shard, err, sizeof(err));
		if (it->r < 0)
			it->err = strdup(err);
	}
	source_set_progress(NULL, NULL);
	/*
	 * The thread lets go of the sweep in the same step that marks it
	 * finished: the main loop, which sees `finished` only after this, is
	 * then the last holder and drops the feeds' references on its thread
	 * (on_done). Abandoned: the daemon stops, and the feeds are left to
	 * exit (their references are not ours to drop here).
	 */
	pthread_mutex_lock(&w->lock);
	w->finished = true;
	bool abandoned = w->abandoned;
	bool last = --w->refs == 0;
	if (!abandoned) {
		uint64_t one = 1;
		ssize_t _unused_ n = write(w->efd, &one, sizeof(one));
	}
	pthread_mutex_unlock(&w->lock);
	if (last)
		sweep_free(w, false);
	return NULL;
}

/* Main loop: what the finished sweep found. */
static void apply(struct checker *c, struct sweep *w)
{
	bool *hit = calloc(w->n_feeds ? w->n_feeds : 1, sizeof(*hit));
	for (size_t i = 0; i < w->n_items; i++) {
		struct check_item *it = &w->items[i];
		struct feed *top = w->feeds[it->top];
		/* Only this sweep still holds it: a reload let go of it, nobody reads it any more. */
		if (it->r >= 0 || top->refs <= 1 || top->state != FEED_READY)
			continue;
		const char *why = it->err ? it->err : "changed while serving";
		if (it->source == UINT32_MAX) {
			feed_fail(top, it->r, why);
		} else {
			struct feed *src = top->sources[it->source];
			feed_fail(src, it->r, why);
			char err[512];
			snprintf(err, sizeof(err), "source %s: %.400s", top->conf.mix->names[it->source], src->error);
			feed_fail(top, it->r, err);
		}
		if (hit)
			hit[it->top] = true;
	}
	for (size_t i = 0; hit && i < w->n_feeds; i++)
		if (hit[i])
			c->failed(c->userdata, w->feeds[i]);
	free(hit);
}

/* Starts a sweep of every shard of the feeds checker_recheck asked for, unless one is under way. */
static void start_urgent(struct checker *c)
{
	if (c->running || !c->n_urgent)
		return;
	for (size_t i = 0; i < c->n_urgent; i++) {
		uint32_t all = UINT32_MAX; /* each shard once: add_shards stops at the feed's count */
		(void)checker_add(c, c->urgent[i], &all);
		feed_unref(c->urgent[i]);
	}
	c->n_urgent = 0;
	(void)checker_start(c);
}

void checker_recheck(struct checker *c, struct feed *f)
{
	if (!c) {
		(void)feed_check(f);
		return;
	}
	for (size_t i = 0; i < c->n_urgent; i++)
		if (c->urgent[i] == f)
			return;
	if (c->n_urgent == c->cap_urgent) {
		size_t cap = c->cap_urgent ? 2 * c->cap_urgent : 4;
		struct feed **p = realloc(c->urgent, cap * sizeof(*p));
		if (!p)
			return; /* the periodic sweep still comes to it */
		c->urgent = p;
		c->cap_urgent = cap;
	}
	c->urgent[c->n_urgent++] = feed_ref(f);
	start_urgent(c);
}

static void on_done(evutil_socket_t fd, short what, void *userdata)
{
	struct checker *c = userdata;
	uint64_t n;
	ssize_t _unused_ got = read(c->efd, &n, sizeof(n));
	struct sweep *w = c->running;
	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	bool finished = w->finished;
	pthread_mutex_unlock(&w->lock);
	if (!finished)
		return;
	c->running = NULL;
	apply(c, w);
	sweep_unref(w, true);
	start_urgent(c);
}

int checker_new(struct event_base *base, checker_failed_fn failed, void *userdata, struct checker **ret)
{
	struct checker *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = (struct checker){ .base = base, .failed = failed, .userdata = userdata };
	c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->efd < 0) {
		int r = -errno;
		free(c);
		return r;
	}
	if (!(c->ev = event_new(base, c->efd, EV_READ | EV_PERSIST, on_done, c)) || event_add(c->ev, NULL) < 0) {
		checker_free(c);
		return -ENOMEM;
	}
	*ret = c;
	return 0;
}

struct checker *checker_free(struct checker *c)
{
	if (!c)
		return NULL;
	if (c->next)
		sweep_unref(c->next, true);
	for (size_t i = 0; i < c->n_urgent; i++)
		feed_unref(c->urgent[i]);
	free(c->urgent);
	if (c->running) {
		struct sweep *w = c->running;
		pthread_mutex_lock(&w->lock);
		bool finished = w->finished;
		w->abandoned = true;
		pthread_mutex_unlock(&w->lock);
		/* Finished: its references are ours to drop; stuck: the thread lets go of the rest. */
		sweep_unref(w, finished);
	}
	if (c->ev)
		event_free(c->ev);
	close(c->efd);
	free(c);
	return NULL;
}

bool checker_busy(const struct checker *c)
{
	return c->running != NULL;
}

static int add_item(struct sweep *w, uint32_t top, uint32_t source, struct shard *shard)
{
	if (w->n_items == w->cap_items) {
		size_t cap = w->cap_items ? 2 * w->cap_items : 64;
		struct check_item *p = realloc(w->items, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		w->items = p;
		w->cap_items = cap;
	}
	w->items[w->n_items++] = (struct check_item){ .top = top, .source = source, .shard = shard };
	return 0;
}

/* The shards of f (a feed, or a mixture's source `source` of feed `top`), from where its last sweep stopped. */
static int add_shards(struct sweep *w, uint32_t top, uint32_t source, struct feed *f, uint32_t *budget)
{
	for (uint32_t k = 0; k < f->n_shards && *budget > 0; k++, (*budget)--) {
		int r = add_item(w, top, source, f->shards[f->check_next++ % f->n_shards]);
		if (r < 0)
			return r;
	}
	return 0;
}

int checker_add(struct checker *c, struct feed *f, uint32_t *budget)
{
	if (c->running)
		return -EBUSY;
	if (f->state != FEED_READY || *budget == 0)
		return 0;
	if (!c->next && !(c->next = sweep_new(c->efd)))
		return -ENOMEM;
	struct sweep *w = c->next;
	if (w->n_feeds == w->cap_feeds) {
		size_t cap = w->cap_feeds ? 2 * w->cap_feeds : 8;
		struct feed **p = realloc(w->feeds, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		w->feeds = p;
		w->cap_feeds = cap;
	}
	uint32_t top = (uint32_t)w->n_feeds;
	w->feeds[w->n_feeds++] = feed_ref(f);
	if (!f->sources)
		return add_shards(w, top, UINT32_MAX, f, budget);
	/* Each source sweeps its own shards; the first to go with the budget turns round. */
	uint32_t first = f->check_next++;
	for (uint32_t k = 0; k < f->n_sources && *budget > 0; k++) {
		uint32_t i = (first + k) % f->n_sources;
		int r = add_shards(w, top, i, f->sources[i], budget);
		if (r < 0)
			return r;
	}
	return 0;
}

int checker_start(struct checker *c)
{
	if (c->running || !c->next)
		return 0;
	struct sweep *w = c->next;
	if (w->n_items == 0) {
		c->next = NULL;
		sweep_unref(w, true);
		return 0;
	}
	w->mark.since_ns = now_ns();
	w->refs++;
	int e = fs_thread_start(sweep_main, w);
	c->next = NULL;
	if (e < 0) {
		w->refs--;
		sweep_unref(w, true);
		return e;
	}
	c->running = w;
	return 0;
}

bool checker_stuck(struct checker *c, uint64_t min_ns, char *what, size_t whatlen, uint64_t *ret_ns)
{
	struct sweep *w = c->running;
	if (!w)
		return false;
	pthread_mutex_lock(&w->lock);
	uint64_t now = now_ns(), since = w->mark.since_ns;
	bool stuck = !w->finished && now - since >= min_ns;
	if (stuck) {
		snprintf(what, whatlen, "%s", w->mark.what[0] ? w->mark.what : "(starting)");
		*ret_ns = now - since;
	}
	pthread_mutex_unlock(&w->lock);
	return stuck;
}
