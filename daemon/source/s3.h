/* SPDX-License-Identifier: MIT */
/*
 * Internal to the remote implementation (s3.c, fetch.c): how a URL becomes a
 * request (endpoint, addressing, signature) and the retry policy.
 */
#pragma once

#include <curl/curl.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/source/remote.h"

/* Where one object is: the URL to send, the Host header, the path signed. */
struct s3_target {
	char *url;  /* without query */
	char *host; /* host[:port] */
	char *path; /* percent-encoded, as sent */
	bool sign;  /* s3:// with credentials */
};

/* The settings now in force (s3.c). Read under s3_conf_lock(). */
struct s3_settings {
	char *endpoint, *region, *credentials_file, *profile, *cache_dir;
	bool path_style;
	unsigned max_requests;
	uint64_t memory_bytes, cache_max_bytes;
};

/* Splits s3://bucket/key. Returns 0 or -EINVAL; *ret_bucket and *ret_key are new strings. */
int s3_split(const char *url, char **ret_bucket, char **ret_key);
/* The target of url (s3:// or http(s)://; key NULL: the bucket itself, for a listing). */
int s3_target_of(const char *url, struct s3_target *ret);
void s3_target_done(struct s3_target *t);

/*
 * The headers of a request to t (Host, x-amz-*, Authorization when signed),
 * plus range and if_match when not NULL. Returns a new list or NULL.
 */
struct curl_slist *s3_headers(const struct s3_target *t, const char *method, const char *query, const char *range,
			      const char *if_match);
/* An easy handle set up the way every request is (timeouts, no signals, close-on-exec sockets). */
CURL *s3_easy(void);
/* FNV-1a of a string: names in the disk cache, ETag tags in identities. */
uint64_t s3_hash(const char *s);
/* curl_multi_init(), its wake-up sockets made close-on-exec. */
CURLM *s3_multi_init(void);

/* The settings (copied under the lock into *ret, strings borrowed until the next remote_configure). */
void s3_settings(struct s3_settings *ret);

/* Retry policy: whether this outcome is worth another try, and the wait before try `attempt` (ns). */
bool s3_retryable(CURLcode res, long status);
uint64_t s3_backoff_ns(unsigned attempt);
#define S3_MAX_ATTEMPTS 12

/* The errno of a final HTTP status, and a message naming url. */
int s3_status_error(long status, const char *url, char *err, size_t errlen);

/*
 * HEAD url (with retries): its size, ETag (as the server quotes it; "" when it
 * sends none) and Last-Modified. Returns 0 or s3_status_error()'s errno.
 */
int s3_head(const char *url, uint64_t *ret_size, char *etag, size_t etaglen, struct timespec *ret_mtime, char *err,
	    size_t errlen);

/*
 * What the last listing (remote_list) said of url, taken (given once):
 * 0, or -ENOENT when no listing named it (then HEAD it).
 */
int s3_listed(const char *url, uint64_t *ret_size, char *etag, size_t etaglen, struct timespec *ret_mtime);

/* Counted by the fetcher (fetch.c). */
void fetch_count_request(bool retry, bool throttled, bool failed);
