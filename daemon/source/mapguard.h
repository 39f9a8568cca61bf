/* SPDX-License-Identifier: MIT */
/*
 * A read of a file mapping (source_map) that another process truncates
 * raises SIGBUS. A mapguard turns that fault into an error instead of a
 * crash: a process-wide SIGBUS handler (installed on first use) unwinds
 * to the innermost guard armed on the faulting thread when the faulting
 * address lies inside that guard's range; any other SIGBUS keeps its
 * default action (the process dies with a core, as before).
 *
 *   struct mapguard g;
 *   mapguard_prepare(&g, base, len);
 *   if (sigsetjmp(g.env, 0) != 0)
 *           return -ESTALE;          // faulted inside [base, base + len); g is disarmed
 *   mapguard_arm(&g);
 *   ... reads of the mapping; no other state the fault would leave half-done ...
 *   mapguard_disarm(&g);
 *
 * The code between arm and disarm must only read the mapping and local
 * state (no locks taken, no allocations), since a fault skips the rest of
 * it. Arming costs no system call (the signal mask is not saved: the
 * handler runs with SA_NODEFER), but the first in a thread unblocks
 * SIGBUS there: a blocked synchronous SIGBUS kills the process whatever
 * the handler, and the daemon starts its threads with every signal
 * blocked. A thread must not block SIGBUS again afterwards. Guards nest
 * per thread.
 */
#pragma once

#include <setjmp.h>
#include <stddef.h>

struct mapguard {
	sigjmp_buf env;
	const char *base;
	size_t len;
	struct mapguard *prev;
};

/* Records the range and installs the handler once per process. */
void mapguard_prepare(struct mapguard *g, const void *base, size_t len);
void mapguard_arm(struct mapguard *g);
void mapguard_disarm(struct mapguard *g);
/* Faults caught since start (all threads): for tests and `feedctl` figures. */
unsigned long mapguard_caught(void);
