/* SPDX-License-Identifier: MIT */
/*
 * The source layer's second implementation: objects in S3-compatible storage
 * (s3://bucket/key) and plain HTTP(S) range reads (https://host/path), seen
 * from source.c. One process-wide fetcher (fetch.c) serves every feed, rank
 * and worker thread: objects are shared by URL and ETag, their bytes held in
 * 1 MiB blocks fetched once per node, and a thread of its own drives a curl
 * multi handle (many requests in flight, connections reused), so no caller
 * but the one that waits for its own bytes ever blocks.
 *
 *   remote_open()       HEAD: size, ETag and Last-Modified, pinned; every
 *                       later range GET carries If-Match, so a changed
 *                       object fails its reads with -ESTALE.
 *   remote_read_many()  blocks until the ranges are in memory; requests the
 *                       missing blocks (neighbours coalesced into one GET)
 *                       and reads ahead by the measured bandwidth-delay
 *                       product.
 *   remote_list()       a pattern's matches from ListObjectsV2, sorted by
 *                       key bytes.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct remote_conf {
	const char *endpoint;         /* "http://127.0.0.1:9000"; NULL: AWS (https://s3.REGION.amazonaws.com) */
	const char *region;           /* NULL: $AWS_REGION, else us-east-1 */
	bool path_style;              /* endpoint/bucket/key rather than bucket.endpoint/key */
	const char *credentials_file; /* NULL: $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials */
	const char *profile;          /* NULL: $AWS_PROFILE, else default */
	unsigned max_requests;        /* requests in flight at once; 0: 64 */
	uint64_t memory_bytes;        /* fetched blocks kept in memory; 0: 256 MiB */
	const char *cache_dir;        /* fetched blocks kept on disk too; NULL: none */
	uint64_t cache_max_bytes;     /* bound of that; 0: 4 GiB */
};

struct remote_object;

struct remote_read {
	struct remote_object *obj;
	uint64_t offset;
	size_t len;
	void *dst;
};

struct remote_stats {
	uint64_t bytes;      /* fetched from the store */
	uint64_t requests;   /* GETs, HEADs and LISTs sent (retries included) */
	uint64_t retries;
	uint64_t throttled;  /* 429 and 503 answers */
	uint64_t errors;     /* requests that failed for good */
	uint64_t hits;       /* blocks found in memory or on disk */
	uint64_t disk_hits;
	uint64_t misses;
	unsigned inflight;
	uint64_t readahead_bytes; /* the measured bandwidth-delay product, as read-ahead */
	double bandwidth;    /* bytes/s, recent */
	double latency_s;    /* time to first byte, recent */
	uint64_t memory_bytes;
	uint64_t disk_bytes;
};

/* Whether name is "scheme://...". */
bool remote_is_url(const char *name);

/*
 * Sets how objects are reached (copied); the environment fills what conf
 * leaves NULL. May be called again (a reload): later opens use the new
 * settings. Returns 0 or -ENOMEM.
 */
int remote_configure(const struct remote_conf *conf);
/*
 * At exit, before the workers are joined: reads waiting for blocks return
 * -ECANCELED now rather than after the store's retries. Then
 * remote_shutdown() stops the fetcher's thread and frees everything.
 */
void remote_cancel(void);
void remote_shutdown(void);

/*
 * Opens url (s3:// or http(s)://). Returns 0 with a reference in *ret, its
 * size, ETag hash and Last-Modified in *ret_size, *ret_tag, *ret_mtime; or a
 * negative errno with a message naming the URL (never a credential) in err:
 * -ENOENT (404), -EACCES (403), -EPROTONOSUPPORT, -EIO.
 */
int remote_open(const char *url, struct remote_object **ret, uint64_t *ret_size, uint64_t *ret_tag,
		struct timespec *ret_mtime, char *err, size_t errlen);
struct remote_object *remote_unref(struct remote_object *o);

/*
 * Reads n ranges. Returns 0; or a negative errno with *ret_failed the index
 * of a failing read: -ESTALE (the object changed: If-Match failed), -ENODATA
 * (past its end), -EACCES, -ENOENT, -EIO (retries exhausted).
 */
int remote_read_many(const struct remote_read *reads, size_t n, size_t *ret_failed);

/*
 * Starts fetching [offset, offset + len) of o (at most an eighth of the
 * memory bound) as read-ahead, without waiting: the plan's hint that the
 * bytes come soon (the shards of the next shuffle window).
 */
void remote_prefetch(struct remote_object *o, uint64_t offset, uint64_t len);

/*
 * Without I/O (the main loop calls it): -ESTALE with a message when a read of
 * url as opened with ETag hash tag found it changed (If-Match failed), else 0.
 */
int remote_check(const char *url, uint64_t tag, char *err, size_t errlen);

/* Like source_glob for one URL pattern (globs only in the key). */
int remote_list(const char *pattern, char ***ret, size_t *ret_n, char *err, size_t errlen);
/*
 * Whether url is known not to exist without asking: a listing of this load
 * (remote_list) covered its prefix and did not return it. False when
 * unknown. For optional companions (a shard's X.bin.sums): no request, no
 * 404 counted as an error.
 */
bool remote_known_absent(const char *url);

void remote_stats(struct remote_stats *ret);
