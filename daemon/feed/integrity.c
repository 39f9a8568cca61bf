/* SPDX-License-Identifier: MIT */
/*
 * The feed's data identity and the daemon's change watch (integrity.h). The
 * watch's ids index `owner`: the served feed (a mixture, not its source)
 * whose sessions stop when that file changes.
 */
#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/feed.h"
#include "daemon/feed/integrity.h"
#include "daemon/log/log.h"
#include "daemon/source/source.h"
#include "daemon/source/watch.h"
#include "proto/macro.h"

struct feed_watch {
	struct source_watch *sw;
	struct event *ev, *sig_ev;
	struct feed **owner; /* by watch id; NULL: free */
	uint32_t cap;
	unsigned leased; /* files put under a read lease so far (for the log line) */
	unsigned unwatched; /* ... that could be watched neither way (ditto) */
	bool told_enospc, told_emfile; /* the daemon-wide warnings, logged once each */
	feed_changed_fn changed;
	void *userdata;
};

static void hash_bytes(uint64_t *h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		*h = (*h ^ b[i]) * UINT64_C(0x100000001b3);
}

static void hash_u64(uint64_t *h, uint64_t v)
{
	hash_bytes(h, &v, sizeof(v));
}

uint64_t feed_data_identity(const struct feed *f)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	hash_bytes(&h, "feedd-data-v1", 13);
	hash_u64(&h, f->n_sources);
	for (uint32_t i = 0; i < f->n_sources; i++)
		hash_u64(&h, f->sources[i]->data_id);
	hash_u64(&h, f->sources ? 0 : f->n_shards);
	for (uint32_t i = 0; !f->sources && i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		hash_bytes(&h, s->name, strlen(s->name) + 1);
		for (unsigned k = 0; k < s->n_ids; k++) {
			const struct source_id *id = s->ids[k];
			hash_u64(&h, id->size);
			hash_u64(&h, (uint64_t)id->mtime.tv_sec);
			hash_u64(&h, (uint64_t)id->mtime.tv_nsec);
			if (s->content_digest)
				continue; /* the bytes' own sums stand for them: a copy elsewhere is the same data */
			hash_u64(&h, id->ino);
			hash_u64(&h, (uint64_t)id->ctime.tv_sec);
			hash_u64(&h, (uint64_t)id->ctime.tv_nsec);
		}
		hash_u64(&h, s->content_digest);
	}
	return order_mix(h);
}

/* A watched file changed: its feed fails now, and the owner withdraws its sessions' batches. */
static void on_file(void *ctx, uint32_t id, const char *path, const char *what)
{
	struct feed_watch *w = ctx;
	struct feed *f = id < w->cap ? w->owner[id] : NULL;
	if (!f || f->state != FEED_READY)
		return;
	char msg[512];
	snprintf(msg, sizeof(msg), "%.300s: changed while serving: %s; batches read from it are withdrawn", path, what);
	feed_fail(f, -ESTALE, msg);
	if (w->changed)
		w->changed(f, w->userdata);
}

static void dispatch(struct feed_watch *w)
{
	source_watch_dispatch(w->sw, on_file, w);
}

static void on_event(evutil_socket_t fd, short what, void *userdata)
{
	dispatch(userdata);
}

int feed_watch_new(struct event_base *base, bool leases, feed_changed_fn changed, void *userdata,
		   struct feed_watch **ret)
{
	struct feed_watch *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->changed = changed;
	w->userdata = userdata;
	int signo = leases ? SIGRTMIN + 1 : 0;
	int r = source_watch_new(signo, &w->sw);
	if (r < 0) {
		free(w);
		return r;
	}
	w->ev = event_new(base, source_watch_fd(w->sw), EV_READ | EV_PERSIST, on_event, w);
	/* A broken lease holds the writer's open(2) until dispatch releases it. */
	if (signo)
		w->sig_ev = evsignal_new(base, signo, on_event, w);
	if (!w->ev || (signo && !w->sig_ev) || event_add(w->ev, NULL) < 0 || (signo && event_add(w->sig_ev, NULL) < 0)) {
		feed_watch_free(w);
		return -ENOMEM;
	}
	*ret = w;
	return 0;
}

struct feed_watch *feed_watch_free(struct feed_watch *w)
{
	if (!w)
		return NULL;
	if (w->ev)
		event_free(w->ev);
	/* Leases first: a break signalled after its handler is gone would kill the daemon. */
	source_watch_free(w->sw);
	if (w->sig_ev)
		event_free(w->sig_ev);
	free(w->owner);
	free(w);
	return NULL;
}

/* The files of f the watch covers, in order: fn(ctx, path, identity loaded) each; stops at fn's error. */
static int each_file(struct feed *f, int (*fn)(void *ctx, const char *path, const struct source_id *id), void *ctx)
{
	for (uint32_t i = 0; f->shards && i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		for (unsigned k = 0; k < s->n_ids; k++) {
			const char *path = s->files[k] ? s->files[k] : k == 0 ? s->name : NULL;
			/* An object in storage is pinned by its ETag instead (If-Match on every read: docs/storage.md). */
			if (!path || source_is_remote(path))
				continue;
			int r = fn(ctx, path, s->ids[k]);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

static int count_file(void *ctx, const char *path, const struct source_id *id)
{
	(*(uint32_t *)ctx)++;
	return 0;
}

static int prepare_file(void *ctx, const char *path, const struct source_id *id)
{
	struct feed *f = ctx;
	source_progress(path); /* a hung open here is the load's: given up after load_timeout_s, naming path */
	(void)source_watch_prepare(path, id, &f->watch_prep[f->n_watch_prep++]);
	return 0;
}

int feed_watch_prepare(struct feed *f)
{
	if (f->state != FEED_READY || f->watch_prep)
		return 0;
	for (uint32_t i = 0; i < f->n_sources; i++) {
		int r = feed_watch_prepare(f->sources[i]);
		if (r < 0)
			return r;
	}
	uint32_t n = 0;
	(void)each_file(f, count_file, &n);
	if (!n)
		return 0;
	f->watch_prep = calloc(n, sizeof(*f->watch_prep));
	if (!f->watch_prep)
		return -ENOMEM;
	return each_file(f, prepare_file, f);
}

void feed_watch_prep_release(struct feed *f)
{
	for (uint32_t i = 0; i < f->n_sources; i++)
		feed_watch_prep_release(f->sources[i]);
	for (uint32_t i = 0; i < f->n_watch_prep; i++)
		source_watch_prep_drop(&f->watch_prep[i]);
	free(f->watch_prep);
	f->watch_prep = NULL;
	f->n_watch_prep = 0;
}

struct add_ctx {
	struct feed_watch *w;
	struct feed *owner, *f;
	uint32_t next; /* f's prep for the next file */
	int n;
};

static int watch_file(void *ctx, const char *path, const struct source_id *loaded)
{
	struct add_ctx *c = ctx;
	struct feed_watch *w = c->w;
	struct feed *owner = c->owner, *f = c->f;
	uint32_t id;
	int lease_err = 0;
	/* Readied by the loader (the same walk, in the same order); none: not looked up here, on the main loop. */
	struct source_watch_prep none = { .fd = -1, .err = -ENOTCONN };
	struct source_watch_prep *p = c->next < f->n_watch_prep ? &f->watch_prep[c->next] : &none;
	c->next++;
	int r = source_watch_add_prepared(w->sw, path, p, &id, &lease_err);
	if (lease_err == -EMFILE && !w->told_emfile) {
		w->told_emfile = true;
		log_warning("feed %s: %s and files past it are watched with inotify instead of read leases: out of file "
			    "descriptors or past the watch's share (a quarter of RLIMIT_NOFILE)", owner->name, path);
	}
	if (r < 0) {
		w->unwatched++;
		if ((r == -ENOSPC && w->told_enospc) || r == -ENOTCONN) /* not readied: the load said why, once */
			return 0;
		w->told_enospc |= r == -ENOSPC;
		log_warning("feed %s: cannot watch %s for changes (%s)%s; checked after each read and once a second only",
			    owner->name, path, strerror(-r),
			    r == -ENOSPC ? ": out of inotify watches (fs.inotify.max_user_watches), and so are the files "
					   "after it" : "");
		return 0;
	}
	if (id >= w->cap) {
		uint32_t cap = MAX(id + 1, MAX(w->cap * 2, 64u));
		struct feed **o = realloc(w->owner, cap * sizeof(*o));
		if (!o) {
			source_watch_remove(w->sw, id);
			return -ENOMEM;
		}
		memset(o + w->cap, 0, (cap - w->cap) * sizeof(*o));
		w->owner = o;
		w->cap = cap;
	}
	uint32_t *ids = realloc(f->watch_ids, (f->n_watch + 1) * sizeof(*ids));
	if (!ids) {
		source_watch_remove(w->sw, id);
		return -ENOMEM;
	}
	f->watch_ids = ids;
	f->watch_ids[f->n_watch++] = id;
	w->owner[id] = owner;
	if (r == SOURCE_WATCH_LEASE)
		w->leased++;
	c->n++;
	return 0;
}

static int add_feed(struct feed_watch *w, struct feed *owner, struct feed *f)
{
	int n = 0;
	f->watch = w;
	for (uint32_t i = 0; i < f->n_sources; i++) {
		int r = add_feed(w, owner, f->sources[i]);
		if (r < 0)
			return r;
		n += r;
	}
	struct add_ctx c = { .w = w, .owner = owner, .f = f };
	int r = each_file(f, watch_file, &c);
	feed_watch_prep_release(f); /* the descriptors the watch did not keep */
	return r < 0 ? r : n + c.n;
}

int feed_watch_add(struct feed_watch *w, struct feed *f)
{
	if (!w || f->state != FEED_READY || f->watch) {
		feed_watch_prep_release(f); /* not watched (watch_changes = off): nothing to keep open for it */
		return 0;
	}
	unsigned leased = w->leased, unwatched = w->unwatched;
	int n = add_feed(w, f, f);
	if (n < 0) {
		log_warning("feed %s: out of memory while watching its files; they are checked once a second only",
			    f->name);
		return n;
	}
	log_info("feed %s: %d files watched for changes, %u under read leases, %u with inotify, %u not watched "
		 "(%u distinct files watched by the daemon)", f->name, n, w->leased - leased,
		 (unsigned)n - (w->leased - leased), w->unwatched - unwatched, source_watch_files(w->sw));
	return n;
}

void feed_unwatch(struct feed *f)
{
	if (!f || !f->watch)
		return;
	struct feed_watch *w = f->watch;
	for (uint32_t i = 0; i < f->n_sources; i++)
		feed_unwatch(f->sources[i]);
	for (uint32_t i = 0; i < f->n_watch; i++) {
		uint32_t id = f->watch_ids[i];
		source_watch_remove(w->sw, id);
		if (id < w->cap)
			w->owner[id] = NULL;
	}
	free(f->watch_ids);
	f->watch_ids = NULL;
	f->n_watch = 0;
	f->watch = NULL;
}

void feed_watch_poll(struct feed_watch *w)
{
	if (w && source_watch_pending(w->sw))
		dispatch(w);
}
