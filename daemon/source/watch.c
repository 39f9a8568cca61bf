/* SPDX-License-Identifier: MIT */
/*
 * Change watches over local files: read leases where the kernel grants them,
 * inotify otherwise (watch.h says what each sees). An entry is one add; two
 * entries on one inode share its inotify watch descriptor, which is removed
 * with the last of them.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "daemon/source/watch.h"
#include "proto/macro.h"

#define WATCH_MASK (IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF)

struct watch_entry {
	char *path;       /* NULL: a free entry */
	int lease_fd;     /* >= 0: watched by this fd's read lease */
	int wd;           /* >= 0: watched by this inotify descriptor */
	const char *what; /* seen, not yet reported */
	bool spent;       /* reported: a file is reported once */
};

struct source_watch {
	int ifd;
	int signo;
	pid_t tid; /* leases are signalled to this thread */
	struct watch_entry *e;
	uint32_t n, cap;
	uint32_t n_inotify; /* entries watched by inotify: none, no ioctl in source_watch_pending */
};

int source_watch_new(int signo, struct source_watch **ret)
{
	struct source_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->ifd < 0) {
		int r = -errno;
		free(w);
		return r;
	}
	w->signo = signo;
	w->tid = gettid();
	*ret = w;
	return 0;
}

static void entry_clear(struct source_watch *w, struct watch_entry *x)
{
	if (x->lease_fd >= 0) {
		(void)fcntl(x->lease_fd, F_SETLEASE, F_UNLCK);
		close(x->lease_fd);
	}
	if (x->wd >= 0) {
		w->n_inotify--;
		bool shared = false;
		for (uint32_t i = 0; i < w->n && !shared; i++)
			shared = &w->e[i] != x && w->e[i].path && w->e[i].wd == x->wd;
		if (!shared)
			(void)inotify_rm_watch(w->ifd, x->wd);
	}
	free(x->path);
	*x = (struct watch_entry){ .lease_fd = -1, .wd = -1 };
}

struct source_watch *source_watch_free(struct source_watch *w)
{
	if (!w)
		return NULL;
	for (uint32_t i = 0; i < w->n; i++)
		if (w->e[i].path)
			entry_clear(w, &w->e[i]);
	close(w->ifd);
	free(w->e);
	free(w);
	return NULL;
}

int source_watch_fd(const struct source_watch *w)
{
	return w->ifd;
}

/* A read lease on a read-only fd of our own, broken towards this thread's signal. */
static int lease_open(const struct source_watch *w, const char *path)
{
	if (!w->signo)
		return -EOPNOTSUPP;
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct f_owner_ex owner = { .type = F_OWNER_TID, .pid = w->tid };
	if (fcntl(fd, F_SETSIG, w->signo) < 0 || fcntl(fd, F_SETOWN_EX, &owner) < 0 || fcntl(fd, F_SETLEASE, F_RDLCK) < 0)
		return -errno;
	return TAKE_FD(fd);
}

int source_watch_add(struct source_watch *w, const char *path, uint32_t *ret_id, int *ret_lease_err)
{
	uint32_t id = 0;
	while (id < w->n && w->e[id].path)
		id++;
	if (id == w->cap) {
		uint32_t cap = MAX(16u, w->cap * 2);
		struct watch_entry *e = realloc(w->e, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		w->e = e;
		w->cap = cap;
	}
	struct watch_entry x = { .lease_fd = -1, .wd = -1, .path = strdup(path) };
	if (!x.path)
		return -ENOMEM;
	int r = lease_open(w, path);
	if (ret_lease_err)
		*ret_lease_err = r < 0 ? r : 0;
	if (r >= 0) {
		x.lease_fd = r;
	} else {
		x.wd = inotify_add_watch(w->ifd, path, WATCH_MASK);
		if (x.wd < 0) {
			r = -errno;
			free(x.path);
			return r;
		}
	}
	w->e[id] = x;
	w->n_inotify += x.wd >= 0;
	if (id == w->n)
		w->n++;
	*ret_id = id;
	return x.lease_fd >= 0 ? SOURCE_WATCH_LEASE : SOURCE_WATCH_INOTIFY;
}

void source_watch_remove(struct source_watch *w, uint32_t id)
{
	if (id < w->n && w->e[id].path)
		entry_clear(w, &w->e[id]);
}

bool source_watch_pending(const struct source_watch *w)
{
	int n = 0;
	return w->n_inotify && ioctl(w->ifd, FIONREAD, &n) == 0 && n > 0;
}

static const char *event_what(uint32_t mask)
{
	if (mask & IN_MODIFY)
		return "written (inotify IN_MODIFY)";
	if (mask & IN_DELETE_SELF)
		return "deleted";
	if (mask & IN_MOVE_SELF)
		return "moved or renamed";
	if (mask & IN_ATTRIB)
		return "its timestamps, mode, owner or links changed (inotify IN_ATTRIB)";
	return NULL;
}

static void read_events(struct source_watch *w)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	for (;;) {
		ssize_t n = read(w->ifd, buf, sizeof(buf));
		if (n <= 0)
			return;
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			p += sizeof(*ev) + ev->len;
			const char *what = event_what(ev->mask);
			for (uint32_t i = 0; i < w->n; i++) {
				struct watch_entry *x = &w->e[i];
				if (!x->path || x->wd != ev->wd)
					continue;
				if (what && !x->what && !x->spent)
					x->what = what;
				if ((ev->mask & IN_IGNORED) && x->wd >= 0) {
					x->wd = -1; /* the kernel dropped the watch (the inode is gone) */
					w->n_inotify--;
				}
			}
			if (ev->mask & IN_Q_OVERFLOW) /* events were lost: every inotify-watched file is suspect */
				for (uint32_t i = 0; i < w->n; i++)
					if (w->e[i].path && w->e[i].wd >= 0 && !w->e[i].what && !w->e[i].spent)
						w->e[i].what = "possibly written (inotify queue overflowed)";
		}
	}
}

int source_watch_dispatch(struct source_watch *w, void (*fn)(void *ctx, uint32_t id, const char *path, const char *what),
			  void *ctx)
{
	read_events(w);
	/* A lease being broken reads back as the type it is broken to: F_UNLCK for a writer's open. */
	for (uint32_t i = 0; i < w->n; i++) {
		struct watch_entry *x = &w->e[i];
		if (x->path && x->lease_fd >= 0 && !x->spent && !x->what && fcntl(x->lease_fd, F_GETLEASE) == F_UNLCK)
			x->what = "opened for writing or truncated (read lease broken)";
	}
	int n = 0;
	for (uint32_t i = 0; i < w->n; i++) {
		struct watch_entry *x = &w->e[i];
		if (!x->path || !x->what)
			continue;
		const char *what = x->what;
		x->what = NULL;
		x->spent = true;
		fn(ctx, i, x->path, what);
		n++;
	}
	/* Only now may the writers go on. */
	for (uint32_t i = 0; i < w->n; i++) {
		struct watch_entry *x = &w->e[i];
		if (x->path && x->spent && x->lease_fd >= 0) {
			(void)fcntl(x->lease_fd, F_SETLEASE, F_UNLCK);
			close(x->lease_fd);
			x->lease_fd = -1;
		}
	}
	return n;
}
