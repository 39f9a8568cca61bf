/* SPDX-License-Identifier: MIT */
/*
 * The periodic shard check off the main loop (docs/operations.md, "Reload
 * and configuration"): the main loop picks which shards a sweep checks
 * (checker_add, from where each feed's last sweep stopped), a thread of the
 * checker's own stat()s them (format_check), and the main loop applies what
 * it found (checker_done fails the feeds whose shards changed). A stat()
 * stuck on a hung network mount then holds up that thread only: the main
 * loop keeps serving, starts no second sweep while one is under way, and
 * can tell what the sweep is stuck on (checker_stuck).
 *
 * Threads: everything here is called on the main thread. The sweep's thread
 * reads only what feed_load() made immutable (the shards' paths and
 * identities) of feeds the sweep holds a reference on, so a reload that lets
 * go of a feed meanwhile frees nothing under it; feed_fail() and the
 * references are the main thread's. A result for a feed that only the sweep
 * still holds (replaced or removed by a reload) is dropped.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct feed;
struct checker;

/* On the main loop, for each feed (as it was added) that the sweep failed: its clients' sessions are done. */
typedef void (*checker_failed_fn)(void *userdata, struct feed *f);

/* Returns 0 with a checker in *ret, or a negative errno. */
int checker_new(struct event_base *base, checker_failed_fn failed, void *userdata, struct checker **ret);
/*
 * Frees the checker. A sweep still stuck is left to its thread, which frees
 * what it can when its stat() returns (the feeds it holds stay referenced).
 * Returns NULL.
 */
struct checker *checker_free(struct checker *c);

/* Whether a sweep is under way (started and not yet applied): then add and start do nothing. */
bool checker_busy(const struct checker *c);
/*
 * Adds to the next sweep at most *budget shards of f (a READY feed; a
 * mixture: of its sources, in turn), from where f's last sweep stopped, and
 * takes them off *budget. Returns 0, or -EBUSY (a sweep is under way), or
 * -ENOMEM.
 */
int checker_add(struct checker *c, struct feed *f, uint32_t *budget);
/* Starts the sweep of what was added (nothing added: starts nothing). Returns 0 or a negative errno. */
int checker_start(struct checker *c);
/*
 * A read of f came up short (a shard changed): every shard of f is checked
 * by the next sweep, at once when none is under way, else right after it
 * (no file is touched here). The feed is failed, and its sessions, when the
 * sweep finds the change. c NULL (no checker could start): feed_check(f)
 * here, on the calling thread.
 */
void checker_recheck(struct checker *c, struct feed *f);
/*
 * Whether the sweep under way has been on one shard file for at least
 * min_ns: then true, with the path in what and the time in *ret_ns.
 */
bool checker_stuck(struct checker *c, uint64_t min_ns, char *what, size_t whatlen, uint64_t *ret_ns);
