/* SPDX-License-Identifier: MIT */
/* SIGBUS from a truncated file mapping as an error (mapguard.h). */
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "daemon/source/mapguard.h"

static __thread struct mapguard *current;
static __thread bool unblocked; /* SIGBUS unblocked in this thread already */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static unsigned long caught;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
	(void)uctx;
	struct mapguard *g = current;
	const char *a = si->si_addr;
	if (g && si->si_code > 0 && a >= g->base && (uintptr_t)(a - g->base) < g->len) {
		current = g->prev;
		__atomic_fetch_add(&caught, 1, __ATOMIC_RELAXED);
		siglongjmp(g->env, 1);
	}
	/* Not ours: the default action. A fault re-executes and dies; a sent signal is raised again. */
	struct sigaction dfl = { .sa_handler = SIG_DFL };
	sigemptyset(&dfl.sa_mask);
	sigaction(sig, &dfl, NULL);
	if (si->si_code <= 0)
		raise(sig);
}

static void install(void)
{
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_NODEFER };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
}

void mapguard_prepare(struct mapguard *g, const void *base, size_t len)
{
	pthread_once(&once, install);
	g->base = base;
	g->len = len;
	g->prev = NULL;
}

void mapguard_arm(struct mapguard *g)
{
	/*
	 * A synchronous SIGBUS that is blocked kills the process whatever the
	 * handler, and the daemon's threads start with every signal blocked
	 * (they leave SIGTERM and the like to the main loop): unblock this one,
	 * once per thread (one system call, then none).
	 */
	if (!unblocked) {
		sigset_t bus;
		sigemptyset(&bus);
		sigaddset(&bus, SIGBUS);
		pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
		unblocked = true;
	}
	g->prev = current;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	current = g;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}

void mapguard_disarm(struct mapguard *g)
{
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	current = g->prev;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
}

unsigned long mapguard_caught(void)
{
	return __atomic_load_n(&caught, __ATOMIC_RELAXED);
}
