/* SPDX-License-Identifier: MIT */
/*
 * The loader (loader.h): one detached thread per load, an eventfd that
 * tells the main loop it finished, and a timer on the main loop that watches
 * its progress. The state both sides touch (the result, what the thread
 * touches now and when) is under one mutex; the object is freed by whichever
 * side lets go last (refs, under the mutex).
 */
#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/feed/fs-thread.h"
#include "daemon/feed/loader.h"
#include "daemon/source/source.h"
#include "proto/macro.h"

struct loader {
	pthread_mutex_t lock;
	unsigned refs;         /* the thread and the main loop's side */
	bool finished;         /* the thread returned from run */
	bool abandoned;        /* the main loop gave up on it: the thread frees arg */
	int r;
	char err[1024];
	struct fs_mark mark;   /* the path the thread touches now, since when */

	loader_run_fn run;
	void *arg;
	void (*free_arg)(void *);
	loader_done_fn done;
	void *userdata;
	unsigned stall_s;
	int efd;
	struct event *ev_done, *ev_tick;
};

static void unref(struct loader *l)
{
	pthread_mutex_lock(&l->lock);
	bool last = --l->refs == 0;
	pthread_mutex_unlock(&l->lock);
	if (!last)
		return;
	pthread_mutex_destroy(&l->lock);
	if (l->efd >= 0)
		close(l->efd);
	free(l);
}

static void *thread_main(void *userdata)
{
	struct loader *l = userdata;
	char err[sizeof(l->err)] = "";
	source_set_progress(fs_mark_progress, &l->mark);
	int r = l->run(l->arg, err, sizeof(err));
	source_set_progress(NULL, NULL);
	pthread_mutex_lock(&l->lock);
	l->finished = true;
	l->r = r;
	memcpy(l->err, err, sizeof(err));
	bool abandoned = l->abandoned;
	pthread_mutex_unlock(&l->lock);
	if (abandoned) {
		l->free_arg(l->arg);
	} else {
		uint64_t one = 1;
		ssize_t _unused_ w = write(l->efd, &one, sizeof(one));
	}
	unref(l);
	return NULL;
}

/* The main loop lets go: events freed, its reference dropped. */
static void let_go(struct loader *l)
{
	if (l->ev_done)
		event_free(l->ev_done);
	if (l->ev_tick)
		event_free(l->ev_tick);
	l->ev_done = l->ev_tick = NULL;
	unref(l);
}

static void on_done(evutil_socket_t fd, short what, void *userdata)
{
	struct loader *l = userdata;
	pthread_mutex_lock(&l->lock);
	bool finished = l->finished;
	int r = l->r;
	pthread_mutex_unlock(&l->lock);
	if (!finished)
		return;
	loader_done_fn done = l->done;
	void *ud = l->userdata;
	char err[sizeof(l->err)];
	memcpy(err, l->err, sizeof(err));
	let_go(l);
	done(ud, r, err);
}

static void on_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct loader *l = userdata;
	char msg[sizeof(l->err)];
	pthread_mutex_lock(&l->lock);
	uint64_t idle = now_ns() - l->mark.since_ns;
	bool stuck = !l->finished && idle >= (uint64_t)l->stall_s * 1000000000u;
	if (stuck) {
		l->abandoned = true;
		if (l->mark.what[0])
			snprintf(msg, sizeof(msg), "%s: no answer for %u s (load_timeout_s); gave up on this load "
				 "(a FIFO, a hung mount or a stuck device?)", l->mark.what, l->stall_s);
		else
			snprintf(msg, sizeof(msg), "the load made no progress for %u s (load_timeout_s); gave up on it",
				 l->stall_s);
	}
	pthread_mutex_unlock(&l->lock);
	if (!stuck)
		return;
	loader_done_fn done = l->done;
	void *ud = l->userdata;
	let_go(l);
	done(ud, -ETIMEDOUT, msg);
}

int loader_start(struct event_base *base, unsigned stall_s, loader_run_fn run, void *arg, void (*free_arg)(void *),
		 loader_done_fn done, void *userdata, struct loader **ret)
{
	struct loader *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	*l = (struct loader){ .refs = 1, .run = run, .arg = arg, .free_arg = free_arg, .done = done,
			      .userdata = userdata, .stall_s = MAX(stall_s, 1u), .mark.since_ns = now_ns() };
	pthread_mutex_init(&l->lock, NULL);
	l->mark.lock = &l->lock;
	l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	/* Watched four times per stall period, at most once a second. */
	uint64_t tick_us = MIN((uint64_t)l->stall_s * 250000u, (uint64_t)1000000u);
	struct timeval tv = { .tv_sec = (time_t)(tick_us / 1000000u), .tv_usec = (suseconds_t)(tick_us % 1000000u) };
	if (l->efd < 0 || !(l->ev_done = event_new(base, l->efd, EV_READ | EV_PERSIST, on_done, l)) ||
	    !(l->ev_tick = event_new(base, -1, EV_PERSIST, on_tick, l)) || event_add(l->ev_done, NULL) < 0 ||
	    event_add(l->ev_tick, &tv) < 0) {
		let_go(l);
		return -ENOMEM;
	}
	l->refs++;
	int e = fs_thread_start(thread_main, l);
	if (e < 0) {
		l->refs--;
		let_go(l);
		return e;
	}
	*ret = l;
	return 0;
}

struct loader *loader_abandon(struct loader *l)
{
	if (!l)
		return NULL;
	pthread_mutex_lock(&l->lock);
	bool finished = l->finished;
	l->abandoned = true;
	pthread_mutex_unlock(&l->lock);
	if (finished) /* the thread left arg to us */
		l->free_arg(l->arg);
	let_go(l);
	return NULL;
}
