/* SPDX-License-Identifier: MIT */
/*
 * A loader runs work that touches file systems (reading the config, loading
 * feeds: globs, opens, index reads) on a thread of its own, so that the main
 * loop never waits for a slow disk, a FIFO or a hung network mount: clients
 * keep their batches while a reload works (docs/operations.md, "Reload and
 * configuration").
 *
 * The thread reports what it touches through the source layer's progress
 * hook (source_set_progress). When it has touched nothing new for stall_s
 * seconds the loader gives up on it: done() is called with -ETIMEDOUT and a
 * message naming the path it is stuck on. A thread stuck in open() or read()
 * cannot be cancelled, so it is left to finish on its own; it then frees
 * what it made (free_arg) and nobody looks at it again.
 *
 * Ownership: arg belongs to the loader until done() is called. When done()
 * gets r >= 0 (or any error other than the timeout) the caller owns arg
 * again and frees it; after a timeout the stuck thread frees it.
 */
#pragma once

#include <stddef.h>

struct event_base;
struct loader;

/* The work, on the loader's thread. Returns 0 or a negative errno with a message in err. */
typedef int (*loader_run_fn)(void *arg, char *err, size_t errlen);
/* On the main loop, once: what run returned (err: its message), or -ETIMEDOUT. */
typedef void (*loader_done_fn)(void *userdata, int r, const char *err);

/*
 * Starts run(arg) on a new thread. done(userdata, ...) is called from base's
 * loop. Returns 0 with the loader in *ret (it frees itself after done; the
 * caller may abandon it earlier with loader_abandon), or a negative errno.
 */
int loader_start(struct event_base *base, unsigned stall_s, loader_run_fn run, void *arg, void (*free_arg)(void *),
		 loader_done_fn done, void *userdata, struct loader **ret);

/* Forgets a loader that has not called done yet (the daemon stops): done is never called. Returns NULL. */
struct loader *loader_abandon(struct loader *l);
