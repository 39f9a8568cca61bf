/* SPDX-License-Identifier: MIT */
/*
 * The source layer: local files, read by the thread's io_reader (io_uring,
 * else pread), and URLs (s3://, http(s)://), read through the process's one
 * fetcher (remote.h). A source is one or the other (remote != NULL); a
 * reader's batch may mix both: source_submit() splits it, source_complete()
 * runs the local part on the io_uring and waits for the remote part.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/io/sums.h"
#include "daemon/source/fdshare.h"
#include "daemon/source/remote.h"
#include "daemon/source/source-internal.h"
#include "daemon/source/source.h"
#include "proto/macro.h"


/* The reader's stats: its io_reader's, plus its remote reads (a batch in flight at once: its depth). */
static void refresh(struct source_reader *r)
{
	const struct io_stats *l = io_reader_stats(r->io);
	r->stats = (struct io_stats){ .reads = l->reads + r->remote.reads, .submits = l->submits + r->remote.submits,
				      .bytes = l->bytes + r->remote.bytes, .wait_ns = l->wait_ns + r->remote.wait_ns,
				      .max_inflight = MAX(l->max_inflight, r->remote.max_inflight),
				      .depth_sum = l->depth_sum + r->remote.depth_sum,
				      .depth_n = l->depth_n + r->remote.depth_n };
}

static void count_remote(struct source_reader *r, const struct remote_read *q, size_t n, uint64_t t0)
{
	uint64_t bytes = 0;
	for (size_t i = 0; i < n; i++)
		bytes += q[i].len;
	r->remote.reads += n;
	r->remote.submits++;
	r->remote.bytes += bytes;
	r->remote.wait_ns += now_ns() - t0;
	r->remote.max_inflight = MAX(r->remote.max_inflight, (uint64_t)n);
	r->remote.depth_sum += n;
	r->remote.depth_n++;
	refresh(r);
}

static void id_of(const struct stat *st, struct source_id *id)
{
	*id = (struct source_id){ .dev = st->st_dev, .ino = st->st_ino, .size = (uint64_t)st->st_size,
				  .mtime = st->st_mtim, .ctime = st->st_ctim };
}

static _Thread_local void (*progress_fn)(void *userdata, const char *name);
static _Thread_local void *progress_userdata;

void source_set_progress(void (*fn)(void *userdata, const char *name), void *userdata)
{
	progress_fn = fn;
	progress_userdata = userdata;
}

void source_progress(const char *name)
{
	if (progress_fn)
		progress_fn(progress_userdata, name);
}

static void progress(const char *name)
{
	source_progress(name);
}

/* "scheme://..." names an object store; anything else is a path. */
static bool is_url(const char *name)
{
	return remote_is_url(name);
}

static int open_remote(const char *name, struct source **ret, char *err, size_t errlen)
{
	struct source *s = calloc(1, sizeof(*s));
	if (!s || !(s->name = strdup(name))) {
		free(s);
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	s->fd = -1;
	/* Identity: size, ETag (as a hash, in ino) and Last-Modified (mtime). */
	int r = remote_open(name, &s->remote, &s->id.size, &s->id.ino, &s->id.mtime, err, errlen);
	if (r < 0) {
		free(s->name);
		free(s);
		return r;
	}
	s->id.ctime = s->id.mtime;
	*ret = s;
	return 0;
}

bool source_is_remote(const char *name)
{
	return is_url(name);
}

bool source_known_absent(const char *name)
{
	return is_url(name) && remote_known_absent(name);
}

int source_open(const char *name, struct source **ret, char *err, size_t errlen)
{
	progress(name);
	if (is_url(name))
		return open_remote(name, ret, err, errlen);
	/* O_NONBLOCK: a FIFO opened for reading would wait for a writer, forever. */
	_cleanup_close_ int fd = open(name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0 && errno == EWOULDBLOCK)
		/* Another process holds a lease: only regular files have one, so waiting for its break is bounded. */
		fd = open(name, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		int r = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", name, strerror(-r));
		return r;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "%s: not a regular file (a %s)", name,
			 S_ISFIFO(st.st_mode) ? "FIFO" : S_ISDIR(st.st_mode) ? "directory" : S_ISSOCK(st.st_mode) ? "socket" :
			 "device");
		return -EINVAL;
	}
	/* io_uring honours O_NONBLOCK on regular files too (-EAGAIN for uncached pages): off again. */
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
		int r = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", name, strerror(-r));
		return r;
	}
	struct source *s = calloc(1, sizeof(*s));
	if (!s || !(s->name = strdup(name))) {
		free(s);
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	id_of(&st, &s->id);
	s->fd = fdshare_take(TAKE_FD(fd), &s->id); /* one fd per file per daemon (fdshare.c) */
	*ret = s;
	return 0;
}

int source_open_mem(const char *name, void *bytes, size_t len, struct source **ret, char *err, size_t errlen)
{
	struct source *s = calloc(1, sizeof(*s));
	if (!s || !(s->name = strdup(name))) {
		free(s);
		free(bytes);
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	s->fd = -1;
	s->mem = bytes;
	s->id.size = (int64_t)len;
	*ret = s;
	return 0;
}

struct source *source_close(struct source *s)
{
	if (!s)
		return NULL;
	if (s->fd >= 0)
		fdshare_drop(s->fd, &s->id);
	sums_free(s->sums);
	remote_unref(s->remote);
	free(s->mem);
	free(s->with_name);
	source_close(s->with);
	free(s->name);
	free(s);
	return NULL;
}

int source_check_with(struct source *s, struct source *also)
{
	free(s->with_name);
	s->with_name = NULL;
	s->with = source_close(s->with);
	if (!also || also->fd < 0) {
		source_close(also);
		return 0;
	}
	/*
	 * Kept open (an fstat per check, as for s itself) while the daemon holds
	 * few files; past a quarter of RLIMIT_NOFILE, let go and checked by
	 * name, so that 10,000s of shards hold one descriptor each.
	 */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && fdshare_count() < rl.rlim_cur / 4) {
		s->with = also;
		return 0;
	}
	s->with_name = strdup(also->name);
	s->with_id = also->id;
	source_close(also);
	return s->with_name ? 0 : -ENOMEM;
}

static bool unchanged(const struct source *s, const struct source_id *now)
{
	/*
	 * A cache entry of feedd's own is checked block by block on every
	 * read (verify_finish), which catches changed bytes whatever the
	 * timestamps say, and its mtime moves with each use (cache.c). A
	 * user's file, sums or not, keeps its whole identity.
	 */
	const struct source_id *was = &s->id;
	return s->cache_entry && s->sums ? now->dev == was->dev && now->ino == was->ino && now->size == was->size
					 : source_id_equal(now, was);
}

const char *source_name(const struct source *s)
{
	return s->name;
}

uint64_t source_size(const struct source *s)
{
	return s->id.size;
}

const struct source_id *source_identity(const struct source *s)
{
	return &s->id;
}

int source_identify(const char *name, struct source_id *ret)
{
	struct stat st;
	if (is_url(name))
		return -EPROTONOSUPPORT;
	progress(name);
	if (stat(name, &st) < 0)
		return -errno;
	id_of(&st, ret);
	return 0;
}

bool source_id_equal(const struct source_id *a, const struct source_id *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
	       a->mtime.tv_nsec == b->mtime.tv_nsec && a->ctime.tv_sec == b->ctime.tv_sec &&
	       a->ctime.tv_nsec == b->ctime.tv_nsec;
}

int source_map(const struct source *s, const void **ret, size_t *ret_len)
{
	if (s->fd < 0)
		return -EOPNOTSUPP;
	if (s->id.size == 0 || s->id.size > SIZE_MAX)
		return -EINVAL;
	void *p = mmap(NULL, (size_t)s->id.size, PROT_READ, MAP_SHARED, s->fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	*ret = p;
	*ret_len = (size_t)s->id.size;
	return 0;
}

void source_unmap(const void *p, size_t len)
{
	if (p)
		munmap((void *)p, len);
}

int source_check(const char *name, const struct source_id *was, char *err, size_t errlen)
{
	/* An object: what its reads found (If-Match), without blocking the caller on a request. */
	if (is_url(name))
		return remote_check(name, was->ino, err, errlen);
	struct source_id now;
	int r = source_identify(name, &now);
	if (r < 0) {
		snprintf(err, errlen, "%s: changed while serving: %s", name, strerror(-r));
		return -ESTALE;
	}
	if (!source_id_equal(&now, was)) {
		snprintf(err, errlen, "%s: changed while serving (size %llu -> %llu, or replaced or rewritten)", name,
			 (unsigned long long)was->size, (unsigned long long)now.size);
		return -ESTALE;
	}
	return 0;
}

static int cmp_path(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A URL pattern's objects, appended to *paths (sorted by key bytes, each once). */
static int glob_remote(const char *pattern, char ***paths, size_t *n, char *err, size_t errlen)
{
	char **names = NULL;
	size_t k = 0;
	int r = remote_list(pattern, &names, &k, err, errlen);
	if (r < 0)
		return r;
	char **grown = realloc(*paths, (*n + k) * sizeof(**paths));
	if (!grown)
		r = -ENOMEM;
	else
		*paths = grown;
	for (size_t i = 0; i < k; i++) {
		for (size_t j = 0; r == 0 && j < *n; j++)
			if (strcmp((*paths)[j], names[i]) == 0) {
				snprintf(err, errlen, "shards: %s is listed twice", names[i]);
				r = -EINVAL;
			}
		if (r < 0)
			free(names[i]);
		else
			(*paths)[(*n)++] = names[i];
	}
	free(names);
	return r;
}

int source_glob(const char *const *patterns, size_t n_patterns, char ***ret, size_t *ret_n, char *err, size_t errlen)
{
	char **paths = NULL;
	size_t n = 0;
	int r = 0;
	for (size_t g = 0; g < n_patterns; g++) {
		if (is_url(patterns[g])) {
			r = glob_remote(patterns[g], &paths, &n, err, errlen);
			if (r < 0)
				goto fail;
			continue;
		}
		glob_t gl = { 0 };
		progress(patterns[g]);
		int e = glob(patterns[g], GLOB_NOSORT, NULL, &gl);
		if (e == GLOB_NOMATCH) {
			snprintf(err, errlen, "shards: '%s' matches no file", patterns[g]);
			r = -ENOENT;
		} else if (e != 0) {
			snprintf(err, errlen, "shards: cannot expand '%s'", patterns[g]);
			r = e == GLOB_NOSPACE ? -ENOMEM : -EIO;
		}
		if (r < 0) {
			globfree(&gl);
			goto fail;
		}
		qsort(gl.gl_pathv, gl.gl_pathc, sizeof(char *), cmp_path);
		char **grown = realloc(paths, (n + gl.gl_pathc) * sizeof(*paths));
		if (!grown) {
			globfree(&gl);
			r = -ENOMEM;
			goto fail;
		}
		paths = grown;
		for (size_t i = 0; i < gl.gl_pathc; i++) {
			/* Canonical paths: the fingerprint must not depend on how the config spells them. */
			progress(gl.gl_pathv[i]);
			char *real = realpath(gl.gl_pathv[i], NULL);
			if (!real) {
				r = -errno;
				snprintf(err, errlen, "shards: %s: %s", gl.gl_pathv[i], strerror(-r));
				globfree(&gl);
				goto fail;
			}
			paths[n++] = real;
		}
		globfree(&gl);
	}
	/* Each path once: sorted pointers compared with their neighbours (a pairwise check was seconds at 30,000 shards). */
	if (n > 1) {
		char **sorted = malloc(n * sizeof(*sorted));
		if (!sorted) {
			r = -ENOMEM;
			goto fail;
		}
		memcpy(sorted, paths, n * sizeof(*sorted));
		qsort(sorted, n, sizeof(*sorted), cmp_path);
		for (size_t i = 1; i < n && r == 0; i++)
			if (strcmp(sorted[i - 1], sorted[i]) == 0) {
				snprintf(err, errlen, "shards: %s is listed twice", sorted[i]);
				r = -EINVAL;
			}
		free(sorted);
		if (r < 0)
			goto fail;
	}
	*ret = paths;
	*ret_n = n;
	return 0;
fail:
	for (size_t i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	return r;
}

int source_reader_new(enum io_engine engine, unsigned depth, struct source_reader **ret)
{
	struct source_reader *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	int e = io_reader_new(engine, depth, &r->io);
	if (e < 0) {
		free(r);
		return e;
	}
	refresh(r);
	*ret = r;
	return 0;
}

struct source_reader *source_reader_free(struct source_reader *r)
{
	if (!r)
		return NULL;
	io_reader_free(r->io);
	free(r->reqs);
	free(r->srcs);
	free(r->vr);
	for (size_t i = 0; i < r->n_bounce; i++)
		free(r->bounce[i].p);
	free(r->bounce);
	free(r->spare.p);
	free(r->wide);
	free(r->lidx);
	free(r->rreads);
	free(r->ridx);
	free(r);
	return NULL;
}

const char *source_reader_engine(const struct source_reader *r)
{
	return io_reader_engine(r->io);
}

int source_reader_fallback(const struct source_reader *r)
{
	return io_reader_fallback(r->io);
}

const struct io_stats *source_reader_stats(const struct source_reader *r)
{
	return &r->stats;
}

int source_submit(struct source_reader *r, const struct source_read *reads, size_t n)
{
	struct source_read *widened = NULL;
	const size_t n_vr = r->n_vr;
	if (source_verify_plan(r, reads, n, &widened) < 0)
		return -ENOMEM;
	if (widened)
		reads = widened;
	size_t base = r->n_sub;
	if (r->n + n > r->cap) {
		size_t cap = MAX(r->n + n, MAX(r->cap * 2, (size_t)16));
		struct io_req *q = realloc(r->reqs, cap * sizeof(*q));
		if (q)
			r->reqs = q;
		size_t *x = realloc(r->lidx, cap * sizeof(*x));
		if (x)
			r->lidx = x;
		struct source **o = realloc(r->srcs, cap * sizeof(*o));
		if (o)
			r->srcs = o;
		if (!q || !x || !o) {
			r->n_vr = n_vr; /* nothing queued: the plan is undone (its buffer goes at completion) */
			return -ENOMEM;
		}
		r->cap = cap;
	}
	size_t remote = 0;
	for (size_t i = 0; i < n; i++)
		remote += reads[i].src->remote != NULL;
	if (remote && r->rn + remote > r->rcap) {
		size_t cap = MAX(r->rn + remote, MAX(r->rcap * 2, (size_t)16));
		struct remote_read *q = realloc(r->rreads, cap * sizeof(*q));
		if (q)
			r->rreads = q;
		size_t *x = realloc(r->ridx, cap * sizeof(*x));
		if (x)
			r->ridx = x;
		if (!q || !x) {
			r->n_vr = n_vr;
			return -ENOMEM;
		}
		r->rcap = cap;
	}
	if (n)
		progress(reads[0].src->name);
	for (size_t i = 0; i < n; i++) {
		if (reads[i].src->mem) {
			/* In memory: read now; one past the end fails at completion, as a file's short read does. */
			const struct source *m = reads[i].src;
			const uint64_t size = (uint64_t)m->id.size;
			if (reads[i].offset <= size && reads[i].len <= size - reads[i].offset)
				memcpy(reads[i].dst, m->mem + reads[i].offset, reads[i].len);
			else if (!r->mem_err) {
				r->mem_err = -ENODATA;
				r->mem_failed = base + i;
			}
			continue;
		}
		if (reads[i].src->remote) {
			r->ridx[r->rn] = base + i;
			r->rreads[r->rn++] = (struct remote_read){ .obj = reads[i].src->remote, .offset = reads[i].offset,
								   .len = reads[i].len, .dst = reads[i].dst };
			continue;
		}
		r->lidx[r->n] = base + i;
		r->srcs[r->n] = reads[i].src;
		r->reqs[r->n++] = (struct io_req){ .fd = reads[i].src->fd, .offset = reads[i].offset,
						   .len = reads[i].len, .dst = reads[i].dst };
	}
	r->n_sub += n;
	return 0;
}

/*
 * After the local reads: is each file still the one opened? A write moves
 * the inode's ctime before it copies its first byte into the page cache, so
 * bytes read from a write in progress are caught here, synchronously,
 * whatever the change watch has seen yet (docs/reliability.md). Cache
 * entries are checked by their sums instead (same file, same size here).
 * Objects in storage are pinned by their ETag instead (fetch.c).
 */
static int recheck(struct source_reader *r, size_t n, size_t *ret_failed)
{
	/* Each file once per batch: reads in shuffled order alternate between a few files (a small recent set). */
	const struct source *seen[8] = { NULL };
	for (size_t i = 0; i < n; i++) {
		bool again = false;
		for (size_t k = 0; k < ARRAY_SIZE(seen) && !again; k++)
			again = seen[k] == r->srcs[i];
		if (again)
			continue;
		seen[i % ARRAY_SIZE(seen)] = r->srcs[i];
		struct stat st;
		struct source_id now;
		if (fstat(r->srcs[i]->fd, &st) < 0)
			continue; /* cannot fail on an open fd; the periodic check has the last word */
		id_of(&st, &now);
		bool same = unchanged(r->srcs[i], &now);
		/*
		 * The file that says where these bytes are (a Megatron .idx,
		 * mapped): the same check, on its descriptor, or by its name
		 * when it was let go (source_check_with). Gone or replaced
		 * counts as changed.
		 */
		const struct source *x = r->srcs[i];
		bool file_same = same;
		if (same && x->with && fstat(x->with->fd, &st) == 0) {
			id_of(&st, &now);
			same = unchanged(x->with, &now);
		} else if (same && x->with_name) {
			same = stat(x->with_name, &st) == 0;
			if (same) {
				id_of(&st, &now);
				same = source_id_equal(&now, &x->with_id);
			}
		}
		/* The index moved, not the file read: the message names the index (source_reader_stale). */
		if (file_same && !same)
			snprintf(r->stale, sizeof(r->stale),
				 "%s: changed while serving: written while %s was read by it (its ctime moved); batches laid out by it are withdrawn",
				 x->with ? x->with->name : x->with_name, x->name);
		if (!same) {
			if (ret_failed)
				*ret_failed = r->lidx[i];
			return -ESTALE;
		}
	}
	return 0;
}

int source_complete(struct source_reader *r, size_t *ret_failed)
{
	/* Local files: the whole batch in flight at once on the thread's io_uring. */
	size_t n = r->n, rn = r->rn, failed = 0;
	r->n = r->rn = 0;
	r->stale[0] = 0;
	int e = n ? io_reader_run(r->io, r->reqs, n, &failed) : 0;
	refresh(r);
	if (e < 0 && ret_failed)
		*ret_failed = r->lidx[failed];
	/* A file written while it was read is -ESTALE, before its sums could call it damaged. */
	if (e == 0 && n)
		e = recheck(r, n, ret_failed);
	if (e == 0 && rn) {
		/* Objects: the fetcher has them in flight, many at once, shared with every other reader. */
		uint64_t t0 = now_ns();
		e = remote_read_many(r->rreads, rn, &failed);
		count_remote(r, r->rreads, rn, t0);
		if (e < 0 && ret_failed)
			*ret_failed = r->ridx[failed];
	}
	if (e == 0)
		e = source_verify_finish(r, ret_failed);
	source_verify_clear(r);
	if (e == 0 && r->mem_err) {
		e = r->mem_err;
		if (ret_failed)
			*ret_failed = r->mem_failed;
	}
	r->mem_err = 0;
	return e;
}

void source_prefetch(struct source *s, uint64_t offset, uint64_t len)
{
	if (s->remote)
		remote_prefetch(s->remote, offset, len);
}

int source_read(struct source_reader *r, const struct source_read *reads, size_t n, size_t *ret_failed)
{
	int e = source_submit(r, reads, n);
	return e < 0 ? e : source_complete(r, ret_failed);
}

int source_read_all(struct source_reader *r, struct source *s, void **ret)
{
	progress(s->name);
	void *buf = NULL;
	int e;
	if (s->remote) {
		if (!(buf = malloc(MAX(s->id.size, 1u))))
			return -ENOMEM;
		struct remote_read q = { .obj = s->remote, .offset = 0, .len = (size_t)s->id.size, .dst = buf };
		uint64_t t0 = now_ns();
		e = remote_read_many(&q, 1, NULL);
		count_remote(r, &q, 1, t0);
	} else {
		e = io_reader_read_file(r->io, s->fd, (size_t)s->id.size, &buf);
		refresh(r);
	}
	if (e < 0) {
		free(buf);
		return e;
	}
	uint64_t bad = 0;
	if (s->sums && sums_verify(s->sums, 0, buf, (size_t)s->sums->data_size, &bad) < 0) {
		snprintf(r->why, sizeof(r->why), "%s: block at byte %" PRIu64 " does not match its checksum: the file is damaged or changed",
			 s->name, bad);
		free(buf);
		return -EUCLEAN;
	}
	*ret = buf;
	return 0;
}

void source_read_error(char *err, size_t errlen, int r, const char *name, const char *index, uint64_t offset,
		       uint64_t len)
{
	if (r == -EUCLEAN)
		snprintf(err, errlen, "%s: read at byte %" PRIu64 ": a block does not match its checksum", name, offset);
	else if (r == -ENODATA)
		snprintf(err, errlen, "%s: ends before byte %" PRIu64 " that its %s points to: the file changed while serving",
			 name, offset + len, index);
	else if (r == -ESTALE)
		snprintf(err, errlen, is_url(name) ? "%s: changed while serving (its ETag no longer matches, read at byte %" PRIu64 ")"
						   : "%s: changed while serving: written while bytes %" PRIu64 "..%" PRIu64
						     " were read (its ctime moved); batches read from it are withdrawn",
			 name, offset, offset + len);
	else
		snprintf(err, errlen, "%s: read at byte %" PRIu64 " failed: %s", name, offset, strerror(-r));
}
