/* SPDX-License-Identifier: MIT */
/*
 * Watching the files a feed serves for writes as they happen (issue #16;
 * the choice and its measurements are in docs/reliability.md).
 *
 * Each file is watched one of two ways, chosen per file at add:
 *
 *   read lease   fcntl(F_SETLEASE, F_RDLCK) on an fd of our own. The kernel
 *                breaks it when anyone opens the file for writing or
 *                truncates it, and holds that open(2) until the lease is
 *                released (or lease-break-time, 45 s by default, passes):
 *                the change is known before the first byte is written.
 *                The break is signalled with `signo` to the thread that
 *                created the watch (F_SETSIG, F_SETOWN_EX), so the caller
 *                must handle that signal (feedd: a libevent signal event).
 *                Needs the daemon to own the file or hold CAP_LEASE, a
 *                local file system, and no writer holding the file open.
 *   inotify      IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF |
 *                IN_DELETE_SELF on one inotify fd: no privilege needed, but
 *                the event comes after the write (fsnotify runs at the end
 *                of write(2)), so a read racing the write may see new bytes
 *                before the event; and writes through a shared mmap make
 *                no event at all.
 *
 * One watch per file (device + inode) per daemon: every add of a file
 * already watched, under any name, joins its watch (a reference and a
 * watcher id); the last source_watch_remove() drops the lease or inotify
 * watch. The lease is taken on fdshare's descriptor of the file, the one its
 * source reads through, so a file a source holds open costs no descriptor;
 * one only read at load costs one, and the watch opens at most a quarter of
 * RLIMIT_NOFILE so: past that, or out of descriptors, inotify.
 *
 * Neither sees writes made by other machines on a network file system; the
 * periodic identity check (source_check) and, when present, checksums are
 * the guard there.
 *
 * Not thread-safe: one thread (feedd's main loop) adds, removes and
 * dispatches. source_watch_prepare() is the exception, for any thread: it
 * does the add's path lookup and open, so the add itself makes no system
 * call on a path (fcntl on a descriptor, or inotify on /proc/self/fd/N).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/source/source.h"

struct source_watch;

enum source_watch_how {
	SOURCE_WATCH_LEASE = 1,
	SOURCE_WATCH_INOTIFY = 2,
};

/*
 * A watch set. Leases are signalled with signo (0: leases are not tried)
 * to the calling thread. Returns 0, or a negative errno (inotify_init1's:
 * -EMFILE when the user has too many inotify instances).
 */
int source_watch_new(int signo, struct source_watch **ret);
struct source_watch *source_watch_free(struct source_watch *w);

/* The inotify fd: readable when events are queued (the caller polls it). */
int source_watch_fd(const struct source_watch *w);

/*
 * Watches `path`. Returns SOURCE_WATCH_LEASE or SOURCE_WATCH_INOTIFY (how
 * its file is watched, perhaps since an earlier add of the same file) with
 * an id in *ret_id (for source_watch_remove and the dispatch callback); or
 * a negative errno when neither works (-ENOSPC: the inotify watch limit).
 * *ret_lease_err, when not NULL, tells why this add took no lease (0: it
 * took one, or joined a watch already there; -EMFILE: out of descriptors or
 * of the watch's share of them).
 */
int source_watch_add(struct source_watch *w, const char *path, uint32_t *ret_id, int *ret_lease_err);

/*
 * A file readied for the watch off the main loop (issue #18: nothing that
 * touches a file system runs there): its descriptor, taken through fdshare
 * (the source's own when a source holds the file open, else one opened
 * here, shared with sources opened later), and that descriptor's identity.
 */
struct source_watch_prep {
	int fd;              /* -1: none (err says why) */
	bool own;            /* opened here, not a source's */
	bool by_name;        /* no fd: past the watch's share of descriptors (err -EMFILE), inotify by name */
	int err;
	int wd;              /* by_name: the inotify watch added by path when prepared (-1: none, wd_err says why) */
	int wd_err;
	struct source_id id; /* of the file fd is open on (by_name: as it was loaded) */
};

/*
 * Readies path for source_watch_add_prepared, on any thread: the path is
 * looked up and opened here (O_NONBLOCK: a FIFO is refused, not waited on),
 * never by the add. `loaded`, when not NULL, is the identity the file was
 * loaded with: a source holding that file open lends its descriptor, with
 * no system call. Always fills *ret (ret->fd -1 and ret->err on failure)
 * and returns 0 or that negative errno. Pairs with source_watch_prep_drop.
 */
int source_watch_prepare(const char *path, const struct source_id *loaded, struct source_watch_prep *ret);
/* Lets go of what a prep still holds (idempotent). */
void source_watch_prep_drop(struct source_watch_prep *p);
/*
 * source_watch_add without touching the file system by path: the lease is
 * taken on p's descriptor (fcntl), or inotify watches the file through
 * /proc/self/fd/N, which names the file itself whatever its path now leads
 * to. Takes what p holds (the watch keeps or drops the descriptor). Returns
 * as source_watch_add; p->err when p has no descriptor. A prep made past
 * the watch's share of descriptors (by_name, a file no source holds open
 * beyond a quarter of RLIMIT_NOFILE) has no descriptor: source_watch_prepare
 * added its inotify watch by path, on the preparing thread, on the process's
 * shared inotify descriptor, which the first watch made uses as its own; the
 * add only takes that watch over (a second watch in one process, which
 * tests make, adds such a prep by path here).
 */
int source_watch_add_prepared(struct source_watch *w, const char *path, struct source_watch_prep *p, uint32_t *ret_id,
			      int *ret_lease_err);
void source_watch_remove(struct source_watch *w, uint32_t id);
/* Distinct files (inodes) watched: one lease or inotify watch each. */
unsigned source_watch_files(const struct source_watch *w);

/*
 * Whether inotify events wait to be dispatched (one ioctl, none when no file
 * is under inotify; no read). Leases need no polling: a writer waits.
 */
bool source_watch_pending(const struct source_watch *w);

/*
 * Reads every queued inotify event and looks for leases being broken, and
 * calls fn once per watcher of each file seen written or opened for writing, with
 * what happened ("opened for writing", "written", ...). Only then are the
 * broken leases released, letting the writers' open(2) return: whatever fn
 * does to stop serving the file is done before the first byte is written.
 * Returns the number of watchers told.
 */
int source_watch_dispatch(struct source_watch *w, void (*fn)(void *ctx, uint32_t id, const char *path, const char *what),
			  void *ctx);
