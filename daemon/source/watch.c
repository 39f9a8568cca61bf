/* SPDX-License-Identifier: MIT */
/*
 * Change watches over local files: read leases where the kernel grants them,
 * inotify otherwise (watch.h says what each sees).
 *
 * One watch per file (device + inode) per daemon, however many feeds serve
 * it: a node holds the lease or the inotify descriptor, a reference count
 * and the list of watchers (the ids source_watch_add hands out) to tell. The
 * last watcher's removal drops the lease or the inotify watch.
 *
 * A lease is taken on the daemon's one open file description of that file
 * (fdshare.c: the source's own, when a source holds the file open), so
 * watching costs no descriptor for a file a source keeps open, and one for a
 * file only read at load (a Megatron .idx). Those are limited to a quarter
 * of RLIMIT_NOFILE; past it, or when open fails with EMFILE/ENFILE, the file
 * is watched with inotify, which needs no descriptor.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/source/fdshare.h"
#include "daemon/source/watch.h"
#include "proto/macro.h"

#define WATCH_MASK (IN_MODIFY | IN_ATTRIB | IN_MOVE_SELF | IN_DELETE_SELF)
#define NONE UINT32_MAX

/* Descriptors the watch opened itself and holds, in preps or under leases: process-wide (fd_budget). */
static atomic_uint own_open;

/*
 * The process's shared inotify descriptor. A prep made past the watch's
 * share of descriptors (by_name) adds its inotify watch on it, by path, on
 * the preparing thread (a loader's), so that the main loop looks up no path;
 * the first watch made takes it as its own (a second watch in one process,
 * in tests only, makes its own and watches such preps by path as before).
 * Inotify gives one wd per inode, which preps and a node may hold at once:
 * each wd on it is counted (wd_hold) and removed when its count drops to 0.
 * The descriptor is opened when first needed and closed when no watch uses
 * it and no wd is held. All of it under wd_lock.
 */
static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static int shared_ifd = -1;
static bool shared_taken; /* a watch uses it as its own */
struct wd_count {
	int wd; /* 0: an empty slot (inotify's wds start at 1) */
	uint32_t n;
};
static struct wd_count *wd_counts; /* open addressing, linear probing; wd_cap a power of two */
static size_t wd_cap, wd_used;

static int shared_open_locked(void)
{
	if (shared_ifd < 0)
		shared_ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	return shared_ifd < 0 ? -errno : 0;
}

static void shared_close_locked(void)
{
	if (shared_ifd >= 0 && !shared_taken && wd_used == 0) {
		close(shared_ifd);
		shared_ifd = -1;
	}
}

static size_t wd_home(int wd)
{
	return ((uint32_t)wd * 2654435761u) & (wd_cap - 1);
}

static size_t wd_find(int wd)
{
	size_t i = wd_home(wd);
	while (wd_counts[i].wd && wd_counts[i].wd != wd)
		i = (i + 1) & (wd_cap - 1);
	return i;
}

/*
 * Counts one more (d = 1) or one fewer (d = -1) holder of wd on the shared
 * descriptor; the last one's release removes the inotify watch. Any thread.
 * Returns 0, or -ENOMEM (not counted: the watch is then never removed).
 */
static int wd_hold_locked(int wd, int d)
{
	if (wd <= 0)
		return 0;
	if (d > 0 && 2 * (wd_used + 1) > wd_cap) {
		size_t cap = wd_cap ? 2 * wd_cap : 64;
		struct wd_count *t = calloc(cap, sizeof(*t)), *old = wd_counts;
		if (!t)
			return -ENOMEM;
		size_t old_cap = wd_cap;
		wd_counts = t;
		wd_cap = cap;
		for (size_t i = 0; i < old_cap; i++)
			if (old[i].wd)
				wd_counts[wd_find(old[i].wd)] = old[i];
		free(old);
	}
	size_t i = wd_cap ? wd_find(wd) : 0;
	if (!wd_cap || !wd_counts[i].wd) {
		if (d > 0) {
			wd_counts[i] = (struct wd_count){ .wd = wd, .n = 1 };
			wd_used++;
		}
		return 0;
	}
	if (d > 0 || --wd_counts[i].n > 0) {
		wd_counts[i].n += d > 0;
		return 0;
	}
	(void)inotify_rm_watch(shared_ifd, wd);
	/* Backward-shift deletion: the slots after i that probed past it move up. */
	size_t j = i;
	for (;;) {
		j = (j + 1) & (wd_cap - 1);
		if (!wd_counts[j].wd)
			break;
		size_t h = wd_home(wd_counts[j].wd);
		if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
			wd_counts[i] = wd_counts[j];
			i = j;
		}
	}
	wd_counts[i] = (struct wd_count){ 0 };
	wd_used--;
	shared_close_locked();
	return 0;
}

static int wd_hold(int wd, int d)
{
	if (wd <= 0)
		return 0;
	pthread_mutex_lock(&wd_lock);
	int r = wd_hold_locked(wd, d);
	pthread_mutex_unlock(&wd_lock);
	return r;
}

struct watch_node {
	uint64_t dev, ino;
	uint32_t refs;    /* watchers; 0: a free node (next free in hnext) */
	uint32_t hnext;   /* the next node in its hash bucket */
	uint32_t first;   /* the first of its watchers */
	int lease_fd;     /* >= 0: watched by a read lease on this fdshare descriptor */
	struct source_id lease_id; /* ... taken from fdshare under this identity */
	bool own_fd;      /* ... opened by the watch (counted against the budget) */
	int wd;           /* >= 0: watched by this inotify descriptor */
	const char *what; /* seen, not yet reported */
	bool fired;       /* reported in this dispatch: the lease is released after the callbacks */
};

struct watcher {
	char *path;       /* NULL: a free id (next free in `next`) */
	uint32_t node;
	uint32_t prev, next;
	const char *what; /* to report in this dispatch */
	bool spent;       /* reported: a watcher is told once */
};

struct source_watch {
	int ifd;
	bool shared; /* ifd is shared_ifd */
	int signo;
	pid_t tid; /* leases are signalled to this thread */
	struct watcher *e;
	uint32_t n, cap, free_e;
	struct watch_node *nodes;
	uint32_t n_nodes, cap_nodes, free_nodes, used_nodes;
	uint32_t *bucket; /* heads of hash chains; n_bucket is a power of two */
	uint32_t n_bucket;
	uint32_t n_inotify; /* nodes watched by inotify: none, no ioctl in source_watch_pending */
};

int source_watch_new(int signo, struct source_watch **ret)
{
	struct source_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	pthread_mutex_lock(&wd_lock);
	w->shared = !shared_taken && shared_open_locked() == 0;
	shared_taken |= w->shared;
	w->ifd = w->shared ? shared_ifd : -1;
	pthread_mutex_unlock(&wd_lock);
	if (!w->shared)
		w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	/* What a watch freed before left queued (IN_IGNORED of its removals) is not this one's. */
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	while (w->shared && read(w->ifd, buf, sizeof(buf)) > 0)
		;
	if (w->ifd < 0) {
		int r = -errno;
		free(w);
		return r;
	}
	w->signo = signo;
	w->tid = gettid();
	w->free_e = w->free_nodes = NONE;
	*ret = w;
	return 0;
}

static uint32_t hash(const struct source_watch *w, uint64_t dev, uint64_t ino)
{
	uint64_t h = (dev * UINT64_C(0x9e3779b97f4a7c15)) ^ (ino * UINT64_C(0xbf58476d1ce4e5b9));
	return (uint32_t)(h ^ (h >> 31)) & (w->n_bucket - 1);
}

static uint32_t node_find(const struct source_watch *w, uint64_t dev, uint64_t ino)
{
	if (!w->n_bucket)
		return NONE;
	for (uint32_t i = w->bucket[hash(w, dev, ino)]; i != NONE; i = w->nodes[i].hnext)
		if (w->nodes[i].dev == dev && w->nodes[i].ino == ino)
			return i;
	return NONE;
}

static void lease_drop(struct source_watch *w, struct watch_node *x)
{
	if (x->lease_fd < 0)
		return;
	/* The description may be a source's too: only our lease goes, the descriptor stays theirs. */
	(void)fcntl(x->lease_fd, F_SETLEASE, F_UNLCK);
	fdshare_drop(x->lease_fd, &x->lease_id);
	if (x->own_fd)
		atomic_fetch_sub(&own_open, 1);
	x->lease_fd = -1;
	x->own_fd = false;
}

static void inotify_drop(struct source_watch *w, struct watch_node *x)
{
	if (x->wd < 0)
		return;
	if (w->shared)
		wd_hold(x->wd, -1);
	else
		(void)inotify_rm_watch(w->ifd, x->wd);
	x->wd = -1;
	w->n_inotify--;
}

/* Hash chains are rebuilt when the buckets are outnumbered. */
static int rehash(struct source_watch *w, uint32_t want)
{
	if (want <= w->n_bucket)
		return 0;
	uint32_t nb = MAX(w->n_bucket * 2, 64u);
	while (nb < want)
		nb *= 2;
	uint32_t *b = malloc(nb * sizeof(*b));
	if (!b)
		return -ENOMEM;
	free(w->bucket);
	w->bucket = b;
	w->n_bucket = nb;
	for (uint32_t i = 0; i < nb; i++)
		b[i] = NONE;
	for (uint32_t i = 0; i < w->n_nodes; i++)
		if (w->nodes[i].refs) {
			uint32_t h = hash(w, w->nodes[i].dev, w->nodes[i].ino);
			w->nodes[i].hnext = b[h];
			b[h] = i;
		}
	return 0;
}

static uint32_t node_new(struct source_watch *w, uint64_t dev, uint64_t ino)
{
	if (rehash(w, w->used_nodes + 1) < 0)
		return NONE;
	uint32_t i = w->free_nodes;
	if (i != NONE) {
		w->free_nodes = w->nodes[i].hnext;
	} else {
		if (w->n_nodes == w->cap_nodes) {
			uint32_t cap = MAX(16u, w->cap_nodes * 2);
			struct watch_node *n = realloc(w->nodes, cap * sizeof(*n));
			if (!n)
				return NONE;
			w->nodes = n;
			w->cap_nodes = cap;
		}
		i = w->n_nodes++;
	}
	uint32_t h = hash(w, dev, ino);
	w->nodes[i] = (struct watch_node){ .dev = dev, .ino = ino, .hnext = w->bucket[h], .first = NONE,
					   .lease_fd = -1, .wd = -1 };
	w->bucket[h] = i;
	w->used_nodes++;
	return i;
}

static void node_free(struct source_watch *w, uint32_t i)
{
	struct watch_node *x = &w->nodes[i];
	lease_drop(w, x);
	inotify_drop(w, x);
	uint32_t *p = &w->bucket[hash(w, x->dev, x->ino)];
	while (*p != i)
		p = &w->nodes[*p].hnext;
	*p = x->hnext;
	*x = (struct watch_node){ .hnext = w->free_nodes, .lease_fd = -1, .wd = -1 };
	w->free_nodes = i;
	w->used_nodes--;
}

struct source_watch *source_watch_free(struct source_watch *w)
{
	if (!w)
		return NULL;
	for (uint32_t i = 0; i < w->n; i++)
		free(w->e[i].path);
	for (uint32_t i = 0; i < w->n_nodes; i++)
		if (w->nodes[i].refs) {
			lease_drop(w, &w->nodes[i]);
			inotify_drop(w, &w->nodes[i]);
		}
	if (w->shared) { /* kept open while preps hold watches on it */
		pthread_mutex_lock(&wd_lock);
		shared_taken = false;
		shared_close_locked();
		pthread_mutex_unlock(&wd_lock);
	} else {
		close(w->ifd);
	}
	free(w->e);
	free(w->nodes);
	free(w->bucket);
	free(w);
	return NULL;
}

int source_watch_fd(const struct source_watch *w)
{
	return w->ifd;
}

unsigned source_watch_files(const struct source_watch *w)
{
	return w->used_nodes;
}

static void id_of(const struct stat *st, struct source_id *id)
{
	*id = (struct source_id){ .dev = st->st_dev, .ino = st->st_ino, .size = (uint64_t)st->st_size,
				  .mtime = st->st_mtim, .ctime = st->st_ctim };
}

/*
 * Whether one more descriptor of the watch's own may be opened: a quarter of
 * RLIMIT_NOFILE at most, counting those preps hold (on a loader's thread)
 * and those under leases (the main loop's).
 */
static bool fd_budget(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
		return true;
	return atomic_load(&own_open) < rl.rlim_cur / 4;
}

/*
 * A by_name prep's inotify watch, added by path on the shared descriptor on
 * the calling thread (a loader's) and held (wd_hold) until the prep is added
 * or dropped. Always returns 0: a failure is in p->wd_err, for the add.
 */
static int prep_by_name(const char *path, struct source_watch_prep *p)
{
	/* Under the lock from the add to the count: a node's release of the same wd must not remove it between. */
	pthread_mutex_lock(&wd_lock);
	int r = shared_open_locked();
	int wd = r < 0 ? -1 : inotify_add_watch(shared_ifd, path, WATCH_MASK);
	if (r == 0 && wd < 0)
		r = -errno;
	if (r == 0 && wd_hold_locked(wd, 1) < 0)
		r = -ENOMEM; /* not counted: left to the kernel, never removed */
	if (r < 0)
		shared_close_locked();
	pthread_mutex_unlock(&wd_lock);
	p->wd_err = r;
	p->wd = r < 0 ? -1 : wd;
	return 0;
}

int source_watch_prepare(const char *path, const struct source_id *loaded, struct source_watch_prep *ret)
{
	*ret = (struct source_watch_prep){ .fd = -1, .wd = -1 };
	struct source_id id;
	if (!loaded) { /* a source may hold the file open: its descriptor, found by the name's identity */
		struct stat st;
		if (stat(path, &st) < 0)
			return ret->err = -errno;
		id_of(&st, &id);
		loaded = &id;
	}
	int fd = fdshare_ref(loaded);
	if (fd >= 0) {
		*ret = (struct source_watch_prep){ .fd = fd, .id = *loaded, .wd = -1 };
		return 0;
	}
	/* Past the watch's share of descriptors: inotify by name, here (watch.h). */
	*ret = (struct source_watch_prep){ .fd = -1, .err = -EMFILE, .id = *loaded, .by_name = true, .wd = -1 };
	if (!fd_budget())
		return prep_by_name(path, ret);
	/* O_NONBLOCK: the name may have become a FIFO since it was loaded. */
	_cleanup_close_ int nfd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat now;
	if (nfd < 0 && (errno == EMFILE || errno == ENFILE))
		return prep_by_name(path, ret);
	*ret = (struct source_watch_prep){ .fd = -1, .wd = -1 };
	if (nfd < 0 || fstat(nfd, &now) < 0)
		return ret->err = -errno;
	if (!S_ISREG(now.st_mode))
		return ret->err = -ESTALE; /* replaced since the load: the checks see it */
	int fl = fcntl(nfd, F_GETFL);
	if (fl < 0 || fcntl(nfd, F_SETFL, fl & ~O_NONBLOCK) < 0)
		return ret->err = -errno;
	id_of(&now, &id);
	int ofd = nfd;
	fd = fdshare_take(TAKE_FD(nfd), &id);
	*ret = (struct source_watch_prep){ .fd = fd, .own = fd == ofd, .id = id, .wd = -1 };
	if (ret->own)
		atomic_fetch_add(&own_open, 1);
	return 0;
}

void source_watch_prep_drop(struct source_watch_prep *p)
{
	if (p->fd >= 0)
		fdshare_drop(p->fd, &p->id);
	if (p->fd >= 0 && p->own)
		atomic_fetch_sub(&own_open, 1);
	p->fd = -1;
	p->own = false;
	wd_hold(p->wd, -1);
	p->wd = -1;
}

static void prep_dropp(struct source_watch_prep **p)
{
	source_watch_prep_drop(*p);
}

/*
 * A read lease on x's file, broken towards this thread's signal, on p's
 * descriptor (a source's, or one of the watch's own, counted against its
 * share: -EMFILE past it). On success the node holds the descriptor.
 */
static int lease_take(struct source_watch *w, struct watch_node *x, struct source_watch_prep *p)
{
	if (!w->signo)
		return -EOPNOTSUPP;
	struct f_owner_ex owner = { .type = F_OWNER_TID, .pid = w->tid };
	if (fcntl(p->fd, F_SETSIG, w->signo) < 0 || fcntl(p->fd, F_SETOWN_EX, &owner) < 0 ||
	    fcntl(p->fd, F_SETLEASE, F_RDLCK) < 0)
		return -errno;
	x->lease_fd = p->fd;
	x->lease_id = p->id;
	x->own_fd = p->own; /* counted in own_open already, by the prep */
	p->fd = -1;
	p->own = false;
	return 0;
}

/*
 * Puts x under a lease, else inotify on the descriptor's file: the name
 * /proc/self/fd/N leads to that file whatever the user's path does, and
 * resolving it looks nothing up on the file's own file system. Returns 0,
 * or -ENOSPC etc. when neither.
 */
static int node_arm(struct source_watch *w, struct watch_node *x, const char *path, struct source_watch_prep *p,
		    int *ret_lease_err)
{
	int r = p->fd >= 0 ? lease_take(w, x, p) : p->err;
	if (ret_lease_err)
		*ret_lease_err = r;
	if (r == 0)
		return 0;
	if (p->fd < 0 && w->shared) {
		/* by_name: added by path where it was prepared; the node takes over the prep's hold. */
		if (p->wd < 0)
			return p->wd_err < 0 ? p->wd_err : -EBADF;
		x->wd = p->wd;
		p->wd = -1;
		w->n_inotify++;
		return 0;
	}
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", p->fd);
	/* By path only for a by_name prep of a watch not on the shared descriptor (a test's second watch). */
	if (w->shared) /* from the add to the count, as in prep_by_name */
		pthread_mutex_lock(&wd_lock);
	x->wd = inotify_add_watch(w->ifd, p->fd >= 0 ? self : path, WATCH_MASK);
	r = x->wd < 0 ? -errno : 0;
	if (r == 0 && w->shared && wd_hold_locked(x->wd, 1) < 0) {
		x->wd = -1; /* not counted: not ours to remove, nor to keep */
		r = -ENOMEM;
	}
	if (w->shared)
		pthread_mutex_unlock(&wd_lock);
	if (r < 0)
		return r;
	w->n_inotify++;
	return 0;
}

static uint32_t watcher_new(struct source_watch *w)
{
	if (w->free_e != NONE) {
		uint32_t id = w->free_e;
		w->free_e = w->e[id].next;
		return id;
	}
	if (w->n == w->cap) {
		uint32_t cap = MAX(16u, w->cap * 2);
		struct watcher *e = realloc(w->e, cap * sizeof(*e));
		if (!e)
			return NONE;
		w->e = e;
		w->cap = cap;
	}
	return w->n++;
}

static void watcher_put(struct source_watch *w, uint32_t id)
{
	w->e[id] = (struct watcher){ .next = w->free_e };
	w->free_e = id;
}

int source_watch_add_prepared(struct source_watch *w, const char *path, struct source_watch_prep *p, uint32_t *ret_id,
			      int *ret_lease_err)
{
	if (ret_lease_err)
		*ret_lease_err = 0;
	if (p->fd < 0 && !p->by_name)
		return p->err < 0 ? p->err : -EBADF;
	/* Whatever the node does not keep goes back to fdshare (closed when nobody else holds it). */
	_cleanup_(prep_dropp) struct source_watch_prep *hold = p;
	uint32_t id = watcher_new(w);
	if (id == NONE)
		return -ENOMEM;
	char *s = strdup(path);
	if (!s) {
		watcher_put(w, id);
		return -ENOMEM;
	}
	uint32_t ni = node_find(w, p->id.dev, p->id.ino);
	bool fresh = ni == NONE;
	if (fresh && (ni = node_new(w, p->id.dev, p->id.ino)) == NONE) {
		free(s);
		watcher_put(w, id);
		return -ENOMEM;
	}
	struct watch_node *x = &w->nodes[ni];
	/* New, or its lease went with a change reported before: watched again for this watcher. */
	if (x->lease_fd < 0 && x->wd < 0) {
		int r = node_arm(w, x, path, p, ret_lease_err);
		if (r < 0) {
			if (fresh)
				node_free(w, ni);
			free(s);
			watcher_put(w, id);
			return r;
		}
	}
	w->e[id] = (struct watcher){ .path = s, .node = ni, .prev = NONE, .next = x->first };
	if (x->first != NONE)
		w->e[x->first].prev = id;
	x->first = id;
	x->refs++;
	*ret_id = id;
	return x->lease_fd >= 0 ? SOURCE_WATCH_LEASE : SOURCE_WATCH_INOTIFY;
}

int source_watch_add(struct source_watch *w, const char *path, uint32_t *ret_id, int *ret_lease_err)
{
	struct source_watch_prep p;
	if (ret_lease_err)
		*ret_lease_err = 0;
	int r = source_watch_prepare(path, NULL, &p);
	return r < 0 ? r : source_watch_add_prepared(w, path, &p, ret_id, ret_lease_err);
}

void source_watch_remove(struct source_watch *w, uint32_t id)
{
	if (id >= w->n || !w->e[id].path)
		return;
	struct watcher *e = &w->e[id];
	struct watch_node *x = &w->nodes[e->node];
	if (e->prev != NONE)
		w->e[e->prev].next = e->next;
	else
		x->first = e->next;
	if (e->next != NONE)
		w->e[e->next].prev = e->prev;
	if (--x->refs == 0)
		node_free(w, e->node);
	free(e->path);
	watcher_put(w, id);
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
			for (uint32_t i = 0; ev->wd >= 0 && i < w->n_nodes; i++) {
				struct watch_node *x = &w->nodes[i];
				if (!x->refs || x->wd != ev->wd)
					continue;
				if (what && !x->what)
					x->what = what;
				if (ev->mask & IN_IGNORED) {
					/* The kernel dropped the watch (the inode is gone): the node's hold goes with it. */
					if (w->shared)
						wd_hold(x->wd, -1);
					x->wd = -1;
					w->n_inotify--;
				}
				break; /* one node per inode, so per descriptor */
			}
			if (ev->mask & IN_Q_OVERFLOW) /* events were lost: every inotify-watched file is suspect */
				for (uint32_t i = 0; i < w->n_nodes; i++)
					if (w->nodes[i].refs && w->nodes[i].wd >= 0 && !w->nodes[i].what)
						w->nodes[i].what = "possibly written (inotify queue overflowed)";
		}
	}
}

int source_watch_dispatch(struct source_watch *w, void (*fn)(void *ctx, uint32_t id, const char *path, const char *what),
			  void *ctx)
{
	read_events(w);
	/* A lease being broken reads back as the type it is broken to: F_UNLCK for a writer's open. */
	for (uint32_t i = 0; i < w->n_nodes; i++) {
		struct watch_node *x = &w->nodes[i];
		if (x->refs && x->lease_fd >= 0 && !x->what && fcntl(x->lease_fd, F_GETLEASE) == F_UNLCK)
			x->what = "opened for writing or truncated (read lease broken)";
	}
	/* Every watcher of a changed file is told, once; fn may remove watchers, so the list is walked first. */
	for (uint32_t i = 0; i < w->n_nodes; i++) {
		struct watch_node *x = &w->nodes[i];
		if (!x->refs || !x->what)
			continue;
		for (uint32_t k = x->first; k != NONE; k = w->e[k].next)
			if (!w->e[k].spent)
				w->e[k].what = x->what;
		x->what = NULL;
		x->fired = true;
	}
	int n = 0;
	for (uint32_t i = 0; i < w->n; i++) {
		struct watcher *e = &w->e[i];
		if (!e->path || !e->what)
			continue;
		const char *what = e->what;
		e->what = NULL;
		e->spent = true;
		fn(ctx, i, e->path, what);
		n++;
	}
	/* Only now may the writers go on. */
	for (uint32_t i = 0; i < w->n_nodes; i++) {
		struct watch_node *x = &w->nodes[i];
		if (x->refs && x->fired)
			lease_drop(w, x);
		x->fired = false;
	}
	return n;
}
