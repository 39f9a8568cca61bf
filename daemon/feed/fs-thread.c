/* SPDX-License-Identifier: MIT */
/* The file-system threads' shared parts (fs-thread.h). */
#include <signal.h>
#include <stdio.h>

#include "daemon/feed/fs-thread.h"
#include "proto/macro.h"

void fs_mark_progress(void *userdata, const char *name)
{
	struct fs_mark *m = userdata;
	pthread_mutex_lock(m->lock);
	snprintf(m->what, sizeof(m->what), "%s", name);
	m->since_ns = now_ns();
	pthread_mutex_unlock(m->lock);
}

int fs_thread_start(void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_t t;
	int e = pthread_create(&t, &attr, fn, arg);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return -e;
}
