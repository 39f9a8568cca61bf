/* SPDX-License-Identifier: MIT */
/*
 * Never a wrong token (issue #16, docs/reliability.md): what ties a feed's
 * batches and cursors to one version of its shards' bytes.
 *
 *   feed_data_identity()  the feed's data identity: every shard file's path,
 *                         size, mtime, inode and ctime (or the shard's content
 *                         digest when it has one). Cursors carry it; a resume
 *                         on other data is refused with "the data changed".
 *   struct feed_watch     one per daemon, on the main loop: every file of the
 *                         served feeds under a read lease or an inotify watch
 *                         (daemon/source/watch.h). A file seen opened for
 *                         writing or written fails its feed (-ESTALE) at
 *                         once; the owner's `changed` callback then withdraws
 *                         its sessions' unread batches, before a leased
 *                         writer's open(2) may return.
 *
 * The feed_watch outlives every feed it watches: its owner (the server)
 * calls feed_unwatch() before dropping a feed from its list.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct event_base;
struct feed;
struct feed_watch;

uint64_t feed_data_identity(const struct feed *f);

/* Called on the main loop after feed f was failed for a change of one of its files. */
typedef void (*feed_changed_fn)(struct feed *f, void *userdata);

/*
 * The daemon's watch, dispatched on base. Leases are tried unless
 * `leases` is false. Returns 0, -ENOMEM, or inotify's error.
 */
int feed_watch_new(struct event_base *base, bool leases, feed_changed_fn changed, void *userdata,
		   struct feed_watch **ret);
struct feed_watch *feed_watch_free(struct feed_watch *w);

/*
 * Readies the watch of f's files (a mixture: its sources' too), off the main
 * loop: on the loader's thread, after the load. Each file is looked up and
 * opened here (or its source's descriptor borrowed), each path reported as
 * progress (source_progress), so that feed_watch_add on the main loop makes
 * no system call on a path. What a feed never added holds is let go by
 * feed_unref (feed_watch_prep_release). Returns 0 or -ENOMEM.
 */
int feed_watch_prepare(struct feed *f);
/* Lets go of the descriptors f's prepare holds (its sources' too). Idempotent. */
void feed_watch_prep_release(struct feed *f);

/*
 * Watches every file of f (a mixture: of its sources), each through what
 * feed_watch_prepare readied: a file not readied (or that could not be) is
 * logged and left to the periodic identity check. Returns the number of
 * files watched.
 */
int feed_watch_add(struct feed_watch *w, struct feed *f);
/* Stops watching f's files (NULL-safe, idempotent). */
void feed_unwatch(struct feed *f);

/*
 * Dispatches inotify events already queued, synchronously: called before
 * batches are published, so that a write the kernel has reported is acted
 * on before the batches read around it reach a ring. NULL-safe.
 */
void feed_watch_poll(struct feed_watch *w);

