/* SPDX-License-Identifier: MIT */
/*
 * What the file-system threads share (checker.c's sweeps, loader.c's
 * loads): a detached thread that takes no signals, and the mark of what it
 * touches now, set through source_set_progress and read by the main loop
 * to name a file that does not answer.
 */
#pragma once

#include <pthread.h>
#include <stdint.h>

struct fs_mark {
	pthread_mutex_t *lock; /* the owner's, which guards the mark with the rest of its shared state */
	char what[512];        /* the path the thread touches now; "" before the first */
	uint64_t since_ns;     /* since when (now_ns) */
};

/* A source_set_progress callback; userdata is the struct fs_mark. Takes mark->lock. */
void fs_mark_progress(void *userdata, const char *name);

/* Starts fn(arg) on a detached thread with every signal blocked (they are the main loop's). Negative errno. */
int fs_thread_start(void *(*fn)(void *), void *arg);
