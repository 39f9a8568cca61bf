/* SPDX-License-Identifier: MIT */
/*
 * The fetcher (remote.h): one per process. Objects are interned by URL and
 * ETag, so every feed, rank and worker of the node that reads an object
 * shares its blocks: a byte is fetched once per node. Blocks are 1 MiB,
 * aligned; a block is WANTED (a GET for it queued or in flight), READY (in
 * memory, on the LRU unless pinned by a reader) or FAILED. Neighbouring
 * wanted blocks go out as one range GET (up to JOB_MAX_BLOCKS), demand before
 * read-ahead (the plan's, remote_prefetch, and the bandwidth-delay product's
 * after each read). Fetched blocks also go to cache_dir/s3/ (diskcache.h).
 *
 * Locking: one mutex (F.lock) over everything here; the engine thread drops
 * it around curl calls and disk writes, readers around their memcpy (their
 * blocks pinned).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/source/diskcache.h"
#include "daemon/source/s3.h"
#include "proto/macro.h"

#define BLOCK_SHIFT 20
#define BLOCK ((uint64_t)1 << BLOCK_SHIFT)
#define JOB_MAX_BLOCKS 8

enum { B_WANTED, B_READY, B_FAILED };

struct block {
	struct remote_object *obj;
	uint64_t idx;
	int state, err;
	uint8_t *data;
	size_t len;
	unsigned pins;
	struct job *job;           /* WANTED: the GET that brings it */
	struct block *prev, *next; /* the LRU, READY blocks only */
};

struct remote_object {
	char *name;
	struct s3_target t;
	char etag[160];
	uint64_t size, n_blocks;
	struct block **blocks;
	unsigned refs;
	bool stale;
	bool whole; /* read ahead to its end already */
	uint64_t probed_ns; /* its last If-Match probe (remote_prefetch) */
	char *disk_key;    /* HASH(URL)-HASH(ETag): its blocks' names in the disk cache */
	struct remote_object *next;
};

struct job {
	struct remote_object *obj; /* a reference */
	uint64_t b0, n, off, want, got;
	uint8_t *buf;
	unsigned attempt;
	bool demand;
	bool started;              /* on the multi handle (else queued) */
	uint64_t not_before;
	CURL *easy;
	struct curl_slist *hdrs;
	struct job *next;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t thread;
	bool started, stop;
	bool cancelled; /* remote_cancel(): nobody waits for a block any more */
	CURLM *multi;
	struct job *demand, *ahead; /* queued, not started */
	struct job *running;        /* on the multi handle */
	uint64_t ahead_bytes;       /* read-ahead bytes in flight */
	struct remote_object *objects;
	struct block lru;
	struct diskcache *disk; /* cache_dir/s3; NULL: none */
	pthread_mutex_t disk_lock; /* held while writing to it (F.lock dropped) or replacing it */
	struct job *to_disk;    /* done, their blocks still to write */
	char *disk_dir;         /* the cache_dir it is over */
	struct remote_stats st;
} F = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .disk_lock = PTHREAD_MUTEX_INITIALIZER };

void fetch_count_request(bool retry, bool throttled, bool failed)
{
	pthread_mutex_lock(&F.lock);
	F.st.requests++, F.st.retries += retry, F.st.throttled += throttled, F.st.errors += failed;
	pthread_mutex_unlock(&F.lock);
}

/* ---- blocks and the LRU ---------------------------------------------------- */

static void lru_unlink(struct block *b)
{
	if (b->prev) {
		b->prev->next = b->next;
		b->next->prev = b->prev;
		b->prev = b->next = NULL;
	}
}

static void lru_push(struct block *b)
{
	lru_unlink(b);
	b->prev = F.lru.prev;
	b->next = &F.lru;
	F.lru.prev->next = b;
	F.lru.prev = b;
}

static void block_free(struct block *b)
{
	lru_unlink(b);
	if (b->state == B_READY)
		F.st.memory_bytes -= b->len;
	b->obj->blocks[b->idx] = NULL;
	free(b->data);
	free(b);
}

static void evict(void)
{
	struct s3_settings s;
	s3_settings(&s);
	for (struct block *b = F.lru.next; b != &F.lru && F.st.memory_bytes > s.memory_bytes;) {
		struct block *next = b->next;
		if (!b->pins)
			block_free(b);
		b = next;
	}
}

static size_t block_len(const struct remote_object *o, uint64_t idx)
{
	return (size_t)MIN(BLOCK, o->size - idx * BLOCK);
}

/* ---- the engine thread ----------------------------------------------------- */

static size_t job_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
	struct job *j = ud;
	size_t n = size * nmemb;
	long status = 0;
	curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &status);
	if (status < 200 || status >= 300)
		return n; /* an error's body (403, 412, 503...): not the object's bytes */
	if (j->got + n > j->want)
		return 0; /* more than asked for: the range was ignored */
	memcpy(j->buf + j->got, ptr, n);
	j->got += n;
	return n;
}

static void enqueue(struct job *j)
{
	struct job **pp = j->demand ? &F.demand : &F.ahead;
	while (*pp)
		pp = &(*pp)->next;
	j->next = NULL;
	*pp = j;
}

static void unref_locked(struct remote_object *o);
static void job_free(struct job *j)
{
	if (j->easy)
		curl_easy_cleanup(j->easy);
	curl_slist_free_all(j->hdrs);
	free(j->buf);
	unref_locked(j->obj);
	free(j);
}

static void fail_blocks(struct job *j, int err)
{
	for (uint64_t i = 0; i < j->n; i++) {
		struct block *b = j->obj->blocks[j->b0 + i];
		b->state = B_FAILED;
		b->err = err;
		b->job = NULL;
	}
	pthread_cond_broadcast(&F.cond);
}

/* Starts j on the multi handle; F.lock held. */
static void job_start(struct job *j)
{
	char range[64];
	snprintf(range, sizeof(range), "bytes=%" PRIu64 "-%" PRIu64, j->off, j->off + j->want - 1);
	j->got = 0;
	curl_slist_free_all(j->hdrs);
	j->hdrs = s3_headers(&j->obj->t, "GET", NULL, range, j->obj->etag[0] ? j->obj->etag : NULL);
	if (!j->easy)
		j->easy = s3_easy();
	if (!j->hdrs || !j->easy) {
		F.ahead_bytes -= j->demand ? 0 : j->want;
		F.st.errors++;
		fail_blocks(j, j->hdrs ? -ENOMEM : -ENOKEY);
		job_free(j);
		return;
	}
	curl_easy_setopt(j->easy, CURLOPT_URL, j->obj->t.url);
	curl_easy_setopt(j->easy, CURLOPT_HTTPHEADER, j->hdrs);
	curl_easy_setopt(j->easy, CURLOPT_WRITEFUNCTION, job_write);
	curl_easy_setopt(j->easy, CURLOPT_WRITEDATA, j);
	curl_easy_setopt(j->easy, CURLOPT_PRIVATE, j);
	F.st.requests++;
	F.st.retries += j->attempt > 0;
	F.st.inflight++;
	j->started = true;
	j->next = F.running;
	F.running = j;
	curl_multi_add_handle(F.multi, j->easy);
}

static void measure(struct job *j)
{
	curl_off_t ttfb = 0, total = 0;
	curl_easy_getinfo(j->easy, CURLINFO_STARTTRANSFER_TIME_T, &ttfb);
	curl_easy_getinfo(j->easy, CURLINFO_TOTAL_TIME_T, &total);
	double lat = (double)ttfb / 1e6;
	/* One connection's rate once the bytes flow: what a request in flight delivers. */
	if (total > ttfb && j->want >= BLOCK) {
		double rate = (double)j->want * 1e6 / (double)(total - ttfb);
		F.st.bandwidth = F.st.bandwidth ? 0.8 * F.st.bandwidth + 0.2 * rate : rate;
	}
	F.st.latency_s = F.st.latency_s ? 0.8 * F.st.latency_s + 0.2 * lat : lat;
	/* Enough bytes ahead to cover one round trip at the rate seen, twice over. */
	struct s3_settings s;
	s3_settings(&s);
	double bdp = 2.0 * F.st.bandwidth * F.st.latency_s;
	uint64_t ra = (uint64_t)bdp;
	ra = MAX(ra, 2 * BLOCK);
	ra = MIN(ra, MIN(UINT64_C(64) << 20, s.memory_bytes / 4));
	F.st.readahead_bytes = ra;
}

/* A transfer ended (F.lock held): its blocks ready, or retried, or failed. */
static void job_done(struct job *j, CURLcode res)
{
	long status = 0;
	curl_easy_getinfo(j->easy, CURLINFO_RESPONSE_CODE, &status);
	curl_multi_remove_handle(F.multi, j->easy);
	for (struct job **pp = &F.running; *pp; pp = &(*pp)->next)
		if (*pp == j) {
			*pp = j->next;
			break;
		}
	F.st.inflight--;
	F.ahead_bytes -= j->demand ? 0 : j->want;
	bool whole = status == 200 && j->off == 0 && j->want == j->obj->size;
	if (res == CURLE_OK && (status == 206 || whole) && j->got == j->want) {
		F.st.bytes += j->want;
		measure(j);
		for (uint64_t i = 0; i < j->n; i++) {
			struct block *b = j->obj->blocks[j->b0 + i];
			b->data = malloc(b->len);
			if (!b->data) {
				b->state = B_FAILED;
				b->err = -ENOMEM;
				continue;
			}
			memcpy(b->data, j->buf + i * BLOCK, b->len);
			b->state = B_READY;
			b->job = NULL;
			F.st.memory_bytes += b->len;
			lru_push(b);
		}
		pthread_cond_broadcast(&F.cond);
		if (F.disk && j->obj->disk_key) {
			j->next = F.to_disk;
			F.to_disk = j;
		} else {
			job_free(j);
		}
		evict();
		return;
	}
	if (res == CURLE_OK && status >= 200 && status < 300)
		res = CURLE_PARTIAL_FILE; /* a short body: retried like a reset */
	F.st.throttled += res == CURLE_OK && (status == 429 || status == 503);
	if (s3_retryable(res, status) && j->attempt + 1 < S3_MAX_ATTEMPTS) {
		j->attempt++;
		j->not_before = now_ns() + s3_backoff_ns(j->attempt);
		curl_easy_cleanup(j->easy); /* a fresh handle: nothing of the old request */
		j->easy = NULL;
		j->started = false;
		enqueue(j);
		return;
	}
	F.st.errors++;
	int err = res != CURLE_OK ? -EIO :
		  status == 412	  ? -ESTALE :
		  status == 416	  ? -ENODATA :
		  status == 404	  ? -ENOENT :
		  status == 403	  ? -EACCES :
				    -EIO;
	if (err == -ESTALE || err == -ENOENT) /* a new ETag, or deleted */
		j->obj->stale = true;
	fail_blocks(j, err);
	job_free(j);
}

/*
 * Writes the blocks of finished transfers to the disk tier with F.lock
 * dropped (the main loop takes it for status and checks), then frees them.
 * Engine thread only; F.disk_lock keeps the tier from being replaced meanwhile.
 */
static void disk_flush(void)
{
	pthread_mutex_lock(&F.lock);
	struct job *w = F.to_disk;
	F.to_disk = NULL;
	pthread_mutex_unlock(&F.lock);
	while (w) {
		struct job *next = w->next;
		pthread_mutex_lock(&F.disk_lock);
		for (uint64_t i = 0; F.disk && i < w->n; i++)
			diskcache_store(F.disk, w->obj->disk_key, w->b0 + i, w->buf + i * BLOCK, block_len(w->obj, w->b0 + i));
		uint64_t bytes = diskcache_bytes(F.disk);
		pthread_mutex_unlock(&F.disk_lock);
		pthread_mutex_lock(&F.lock);
		F.st.disk_bytes = bytes;
		job_free(w);
		pthread_mutex_unlock(&F.lock);
		w = next;
	}
}

static void *engine(void *arg _unused_)
{
	pthread_mutex_lock(&F.lock);
	while (!F.stop) {
		struct s3_settings s;
		s3_settings(&s);
		uint64_t now = now_ns(), wake = now + 200000000u;
		/*
		 * Demand first; read-ahead in order (the plan's: this window, then
		 * the next) with at most a few bandwidth-delay products in flight,
		 * so the bytes needed first are not slowed by those needed later.
		 */
		uint64_t ahead_cap = MAX(4 * F.st.readahead_bytes, UINT64_C(16) << 20);
		for (struct job **q = &F.demand; q; q = q == &F.demand ? &F.ahead : NULL) {
			for (struct job **pp = q; *pp && F.st.inflight < s.max_requests;) {
				struct job *j = *pp;
				if (!j->demand && F.ahead_bytes >= ahead_cap)
					break;
				if (j->not_before > now) {
					wake = MIN(wake, j->not_before);
					pp = &j->next;
					continue;
				}
				*pp = j->next;
				F.ahead_bytes += j->demand ? 0 : j->want;
				job_start(j);
			}
		}
		pthread_mutex_unlock(&F.lock);
		int running = 0;
		curl_multi_perform(F.multi, &running);
		CURLMsg *m;
		int left;
		while ((m = curl_multi_info_read(F.multi, &left))) {
			if (m->msg != CURLMSG_DONE)
				continue;
			struct job *j = NULL;
			CURL *e = m->easy_handle;
			CURLcode res = m->data.result;
			curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&j);
			pthread_mutex_lock(&F.lock);
			job_done(j, res);
			pthread_mutex_unlock(&F.lock);
		}
		disk_flush();
		int ms = (int)MIN((wake - MIN(wake, now_ns())) / 1000000u + 1, 200u);
		curl_multi_poll(F.multi, NULL, 0, ms, NULL);
		pthread_mutex_lock(&F.lock);
	}
	pthread_mutex_unlock(&F.lock);
	return NULL;
}

/* F.lock held. */
static int engine_start(void)
{
	if (F.started)
		return 0;
	F.lru.prev = F.lru.next = &F.lru;
	F.multi = s3_multi_init();
	if (!F.multi)
		return -ENOMEM;
	struct s3_settings s;
	s3_settings(&s);
	curl_multi_setopt(F.multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)s.max_requests);
	F.stop = false;
	if (pthread_create(&F.thread, NULL, engine, NULL) != 0) {
		curl_multi_cleanup(F.multi);
		F.multi = NULL;
		return -EAGAIN;
	}
	F.started = true;
	return 0;
}

void remote_cancel(void)
{
	pthread_mutex_lock(&F.lock);
	F.cancelled = true;
	pthread_cond_broadcast(&F.cond);
	pthread_mutex_unlock(&F.lock);
}

void remote_shutdown(void)
{
	pthread_mutex_lock(&F.lock);
	if (!F.started) {
		pthread_mutex_unlock(&F.lock);
		return;
	}
	F.stop = true;
	curl_multi_wakeup(F.multi);
	pthread_mutex_unlock(&F.lock);
	pthread_join(F.thread, NULL);
	pthread_mutex_lock(&F.lock);
	/* Queued and running transfers end here (an exit, with nobody waiting). */
	for (struct job **q = &F.demand; q; q = q == &F.demand ? &F.ahead : q == &F.ahead ? &F.running : NULL)
		while (*q) {
			struct job *j = *q;
			*q = j->next;
			if (j->started)
				curl_multi_remove_handle(F.multi, j->easy);
			fail_blocks(j, -ECANCELED);
			job_free(j);
		}
	while (F.to_disk) {
		struct job *j = F.to_disk;
		F.to_disk = j->next;
		job_free(j);
	}
	curl_multi_cleanup(F.multi);
	F.multi = NULL;
	F.started = false;
	F.disk = diskcache_free(F.disk);
	free(F.disk_dir);
	F.disk_dir = NULL;
	pthread_mutex_unlock(&F.lock);
}

/* ---- objects ---------------------------------------------------------------- */

int remote_open(const char *url, struct remote_object **ret, uint64_t *ret_size, uint64_t *ret_tag,
		struct timespec *ret_mtime, char *err, size_t errlen)
{
	if (strncmp(url, "s3://", 5) != 0 && strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
		snprintf(err, errlen, "%s: no source implementation serves this URL scheme (s3://, http://, https://)", url);
		return -EPROTONOSUPPORT;
	}
	char etag[160];
	uint64_t size;
	struct timespec mtime;
	/* A listing just said what the object is (one LIST per 1000 keys); else ask. */
	int r = s3_listed(url, &size, etag, sizeof(etag), &mtime);
	if (r < 0)
		r = s3_head(url, &size, etag, sizeof(etag), &mtime, err, errlen);
	if (r < 0)
		return r;
	pthread_mutex_lock(&F.lock);
	r = engine_start();
	struct remote_object *o = NULL;
	for (o = F.objects; r == 0 && o; o = o->next)
		if (!o->stale && o->size == size && strcmp(o->name, url) == 0 && strcmp(o->etag, etag) == 0)
			break;
	if (r == 0 && o) {
		o->refs++;
	} else if (r == 0) {
		o = calloc(1, sizeof(*o));
		r = -ENOMEM;
		if (o && (o->name = strdup(url)) && s3_target_of(url, &o->t) == 0) {
			o->size = size;
			o->n_blocks = (size + BLOCK - 1) / BLOCK;
			o->blocks = calloc(MAX(o->n_blocks, 1u), sizeof(*o->blocks));
			snprintf(o->etag, sizeof(o->etag), "%s", etag);
			o->refs = 1;
			struct s3_settings s;
			s3_settings(&s);
			/* The disk tier follows cache_dir (a reload may move it). */
			if (s.cache_dir && (!F.disk_dir || strcmp(F.disk_dir, s.cache_dir) != 0)) {
				pthread_mutex_lock(&F.disk_lock);
				F.disk = diskcache_free(F.disk);
				free(F.disk_dir);
				F.disk_dir = strdup(s.cache_dir);
				F.disk = F.disk_dir ? diskcache_new(s.cache_dir, s.cache_max_bytes) : NULL;
				pthread_mutex_unlock(&F.disk_lock);
			}
			if (s.cache_dir && asprintf(&o->disk_key, "%016" PRIx64 "-%016" PRIx64, s3_hash(url), s3_hash(etag)) < 0)
				o->disk_key = NULL;
			if (o->blocks) {
				o->next = F.objects;
				F.objects = o;
				r = 0;
			}
		}
		if (r < 0 && o) {
			s3_target_done(&o->t);
			free(o->name);
			free(o->blocks);
			free(o);
		}
	}
	pthread_mutex_unlock(&F.lock);
	if (r < 0) {
		snprintf(err, errlen, "%s: cannot open: %s", url, strerror(-r));
		return r;
	}
	*ret = o;
	*ret_size = size;
	*ret_tag = s3_hash(etag);
	*ret_mtime = mtime;
	return 0;
}

/* F.lock held. */
static void unref_locked(struct remote_object *o)
{
	if (--o->refs)
		return;
	for (uint64_t i = 0; i < o->n_blocks; i++)
		if (o->blocks[i])
			block_free(o->blocks[i]);
	for (struct remote_object **pp = &F.objects; *pp; pp = &(*pp)->next)
		if (*pp == o) {
			*pp = o->next;
			break;
		}
	s3_target_done(&o->t);
	free(o->disk_key);
	free(o->blocks);
	free(o->name);
	free(o);
}

struct remote_object *remote_unref(struct remote_object *o)
{
	pthread_mutex_lock(&F.lock);
	if (o)
		unref_locked(o);
	pthread_mutex_unlock(&F.lock);
	return NULL;
}

int remote_check(const char *url, uint64_t tag, char *err, size_t errlen)
{
	int r = 0;
	pthread_mutex_lock(&F.lock);
	for (struct remote_object *o = F.objects; o; o = o->next)
		if (o->stale && s3_hash(o->etag) == tag && strcmp(o->name, url) == 0) {
			snprintf(err, errlen, "%s: changed while serving (its ETag %s no longer matches)", url, o->etag);
			r = -ESTALE;
			break;
		}
	pthread_mutex_unlock(&F.lock);
	return r;
}

void remote_stats(struct remote_stats *ret)
{
	pthread_mutex_lock(&F.lock);
	*ret = F.st;
	pthread_mutex_unlock(&F.lock);
}

/* ---- reads -------------------------------------------------------------------- */

static int flush(struct job **jp)
{
	struct job *j = *jp;
	if (!j)
		return 0;
	*jp = NULL;
	j->buf = malloc(j->want);
	if (!j->buf) {
		fail_blocks(j, -ENOMEM);
		job_free(j);
		return -ENOMEM;
	}
	enqueue(j);
	return 0;
}

/* Block idx of o, wanted: created (from disk, else queued into *jp) if missing. F.lock held. */
static struct block *want(struct remote_object *o, uint64_t idx, bool demand, struct job **jp)
{
	struct block *b = o->blocks[idx];
	if (b) {
		if (demand && b->state == B_READY) {
			F.st.hits++;
			lru_push(b);
		} else if (demand && b->job && !b->job->started && !b->job->demand) {
			/* Read-ahead still queued is needed now: it goes with the demand. */
			struct job **pp = &F.ahead;
			while (*pp && *pp != b->job)
				pp = &(*pp)->next;
			if (*pp) {
				*pp = b->job->next;
				b->job->demand = true;
				enqueue(b->job);
			}
		}
		return b;
	}
	b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	*b = (struct block){ .obj = o, .idx = idx, .state = B_WANTED, .len = block_len(o, idx) };
	o->blocks[idx] = b;
	/* From the disk tier when it holds the block whole. */
	if (F.disk && o->disk_key && (b->data = malloc(b->len)) &&
	    diskcache_load(F.disk, o->disk_key, idx, b->data, b->len)) {
		b->state = B_READY;
		F.st.memory_bytes += b->len;
		F.st.hits += demand;
		F.st.disk_hits++;
		lru_push(b);
		return b;
	}
	free(b->data);
	b->data = NULL;
	F.st.misses += demand;
	struct job *j = *jp;
	if (j && j->obj == o && j->b0 + j->n == idx && j->n < JOB_MAX_BLOCKS) {
		j->n++;
		j->want += b->len;
		b->job = j;
		return b;
	}
	flush(jp);
	j = calloc(1, sizeof(*j));
	if (!j) {
		o->blocks[idx] = NULL;
		free(b);
		return NULL;
	}
	*j = (struct job){ .obj = o, .b0 = idx, .n = 1, .off = idx * BLOCK, .want = b->len, .demand = demand };
	b->job = j;
	o->refs++;
	*jp = j;
	return b;
}

void remote_prefetch(struct remote_object *o, uint64_t offset, uint64_t len)
{
	struct s3_settings set;
	s3_settings(&set);
	if (offset >= o->size || !len)
		return;
	len = MIN(MIN(len, o->size - offset), set.memory_bytes / 8);
	struct job *j = NULL;
	pthread_mutex_lock(&F.lock);
	uint64_t b1 = (offset + len - 1) >> BLOCK_SHIFT;
	for (uint64_t b = offset >> BLOCK_SHIFT; b <= b1; b++)
		if (!o->blocks[b] && !want(o, b, false, &j))
			break;
	/*
	 * Blocks held already are not fetched again, so a 1-byte GET with
	 * If-Match (at most every 30 s) tells whether the object changed since.
	 */
	if (!j && o->etag[0] && now_ns() - o->probed_ns > UINT64_C(30000000000) && (j = calloc(1, sizeof(*j)))) {
		/* Byte 1, not 0: some servers (s3rver) read "bytes=0-0" as the whole object. */
		*j = (struct job){ .obj = o, .off = o->size > 1, .want = 1, .demand = false };
		o->refs++;
		o->probed_ns = now_ns();
	}
	flush(&j);
	if (offset == 0 && len == o->size)
		o->whole = true;
	if (F.multi)
		curl_multi_wakeup(F.multi);
	pthread_mutex_unlock(&F.lock);
}

int remote_read_many(const struct remote_read *reads, size_t n, size_t *ret_failed)
{
	int r = 0;
	size_t failed = 0;
	struct job *j = NULL;
	pthread_mutex_lock(&F.lock);
	/* Pin every block the reads need, and queue those missing. */
	size_t pinned = 0;
	for (; pinned < n; pinned++) {
		const struct remote_read *q = &reads[pinned];
		if (q->offset + q->len > q->obj->size) {
			r = -ENODATA;
			break;
		}
		if (!q->len)
			continue;
		uint64_t b0 = q->offset >> BLOCK_SHIFT, b1 = (q->offset + q->len - 1) >> BLOCK_SHIFT;
		uint64_t b;
		for (b = b0; b <= b1; b++) {
			struct block *blk = want(q->obj, b, true, &j);
			if (!blk)
				break;
			blk->pins++;
		}
		if (b <= b1) {
			/* Unpin what this read pinned, then the earlier reads below. */
			for (uint64_t c = b0; c < b; c++)
				q->obj->blocks[c]->pins--;
			r = -ENOMEM;
			break;
		}
	}
	if (r < 0)
		failed = pinned;
	flush(&j);
	/*
	 * Read ahead. The plan says what comes: documents are shuffled among the
	 * shards of one window, and a window's shards are read to the end before
	 * the next (docs/sample-order.md), so a shard touched is a shard wholly
	 * needed soon: one that fits a quarter of the memory bound is fetched
	 * whole from its first read. A larger one is read ahead of each read by
	 * the bandwidth-delay product.
	 */
	struct s3_settings set;
	s3_settings(&set);
	uint64_t ra = MAX(F.st.readahead_bytes, 2 * BLOCK) >> BLOCK_SHIFT;
	for (size_t i = 0; r == 0 && i < n; i++) {
		const struct remote_read *q = &reads[i];
		if ((i + 1 < n && reads[i + 1].obj == q->obj) || !q->len)
			continue;
		uint64_t last = (q->offset + q->len - 1) >> BLOCK_SHIFT, from = last + 1, to = last + ra;
		if (q->obj->size <= set.memory_bytes / 4 && !q->obj->whole) {
			q->obj->whole = true;
			from = 0;
			to = q->obj->n_blocks;
		}
		for (uint64_t b = from; b <= to && b < q->obj->n_blocks; b++)
			if (!q->obj->blocks[b] && !want(q->obj, b, false, &j))
				break;
		flush(&j);
	}
	curl_multi_wakeup(F.multi);

	/* Wait, then copy with the lock dropped (the blocks stay pinned). */
	for (size_t i = 0; r == 0 && i < pinned; i++) {
		const struct remote_read *q = &reads[i];
		if (!q->len)
			continue;
		for (uint64_t b = q->offset >> BLOCK_SHIFT; b <= (q->offset + q->len - 1) >> BLOCK_SHIFT; b++) {
			struct block *blk = q->obj->blocks[b];
			while (blk->state == B_WANTED && !F.cancelled)
				pthread_cond_wait(&F.cond, &F.lock);
			if ((blk->state == B_FAILED || F.cancelled) && r == 0) {
				r = blk->state == B_FAILED ? blk->err : -ECANCELED;
				failed = i;
			}
		}
	}
	pthread_mutex_unlock(&F.lock);
	for (size_t i = 0; r == 0 && i < pinned; i++) {
		const struct remote_read *q = &reads[i];
		uint64_t at = q->offset, end = q->offset + q->len;
		uint8_t *dst = q->dst;
		while (at < end) {
			struct block *blk = q->obj->blocks[at >> BLOCK_SHIFT];
			uint64_t in = at & (BLOCK - 1), k = MIN(end - at, blk->len - in);
			memcpy(dst, blk->data + in, k);
			dst += k;
			at += k;
		}
	}
	pthread_mutex_lock(&F.lock);
	for (size_t i = 0; i < pinned; i++) {
		const struct remote_read *q = &reads[i];
		if (!q->len)
			continue;
		for (uint64_t b = q->offset >> BLOCK_SHIFT; b <= (q->offset + q->len - 1) >> BLOCK_SHIFT; b++) {
			struct block *blk = q->obj->blocks[b];
			blk->pins--;
			/* A failure is not kept: a later read asks again (a stale object fails again anyway). */
			if (!blk->pins && blk->state == B_FAILED)
				block_free(blk);
		}
	}
	evict();
	pthread_mutex_unlock(&F.lock);
	if (r < 0 && ret_failed)
		*ret_failed = failed;
	return r;
}
