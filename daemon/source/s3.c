/* SPDX-License-Identifier: MIT */
/*
 * S3 addressing, credentials and signatures (s3.h), and the requests made
 * once per object or pattern at load: HEAD and ListObjectsV2. Credentials
 * come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
 * AWS_SESSION_TOKEN), else a profile of a credentials file; they go into
 * signatures only, never into a message, a log line or the status.
 */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/source/s3.h"
#include "daemon/source/sigv4.h"
#include "proto/macro.h"

static pthread_mutex_t conf_lock = PTHREAD_MUTEX_INITIALIZER;
static void listed_clear(void);
static bool configured;
static struct s3_settings settings;
static struct {
	char *access_key, *secret_key, *session_token;
} creds;

static void settings_clear(void)
{
	free(settings.endpoint);
	free(settings.region);
	free(settings.credentials_file);
	free(settings.profile);
	free(settings.cache_dir);
	settings = (struct s3_settings){ 0 };
	if (creds.secret_key)
		explicit_bzero(creds.secret_key, strlen(creds.secret_key));
	free(creds.access_key);
	free(creds.secret_key);
	free(creds.session_token);
	creds.access_key = creds.secret_key = creds.session_token = NULL;
}

static char *dup_or(const char *a, const char *env, const char *dflt)
{
	const char *v = a && *a ? a : (env && getenv(env) && *getenv(env) ? getenv(env) : dflt);
	return v ? strdup(v) : NULL;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = 0;
	return s;
}

/* A profile's keys from an ~/.aws/credentials-style file; quietly nothing when absent. */
static void load_profile(const char *path, const char *profile)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return;
	char line[1024];
	bool in = false;
	while (fgets(line, sizeof(line), f)) {
		char *l = trim(line);
		if (*l == '[') {
			char *end = strchr(l, ']');
			if (end)
				*end = 0;
			char *name = trim(l + 1);
			if (strncmp(name, "profile ", 8) == 0)
				name = trim(name + 8);
			in = strcmp(name, profile) == 0;
			continue;
		}
		char *eq = strchr(l, '=');
		if (!in || !eq || *l == '#' || *l == ';')
			continue;
		*eq = 0;
		char *k = trim(l), *v = trim(eq + 1);
		char **dst = strcmp(k, "aws_access_key_id") == 0	 ? &creds.access_key :
			     strcmp(k, "aws_secret_access_key") == 0 ? &creds.secret_key :
			     strcmp(k, "aws_session_token") == 0	 ? &creds.session_token :
									   NULL;
		if (dst) {
			free(*dst);
			*dst = strdup(v);
		}
	}
	explicit_bzero(line, sizeof(line));
	fclose(f);
}

bool remote_is_url(const char *name)
{
	const char *p = strstr(name, "://");
	if (!p || p == name)
		return false;
	for (const char *q = name; q < p; q++)
		if (!((*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '+' || *q == '-' || *q == '.'))
			return false;
	return true;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

int remote_configure(const struct remote_conf *c)
{
	pthread_once(&curl_once, curl_init);
	pthread_mutex_lock(&conf_lock);
	settings_clear();
	listed_clear();
	const char *env_ep = getenv("AWS_ENDPOINT_URL_S3") ? "AWS_ENDPOINT_URL_S3" : "AWS_ENDPOINT_URL";
	settings.endpoint = dup_or(c->endpoint, env_ep, NULL);
	settings.region = dup_or(c->region, getenv("AWS_REGION") ? "AWS_REGION" : "AWS_DEFAULT_REGION", "us-east-1");
	settings.profile = dup_or(c->profile, "AWS_PROFILE", "default");
	settings.credentials_file = dup_or(c->credentials_file, "AWS_SHARED_CREDENTIALS_FILE", NULL);
	if (!settings.credentials_file && getenv("HOME") &&
	    asprintf(&settings.credentials_file, "%s/.aws/credentials", getenv("HOME")) < 0)
		settings.credentials_file = NULL;
	settings.cache_dir = c->cache_dir ? strdup(c->cache_dir) : NULL;
	settings.path_style = c->path_style;
	settings.max_requests = c->max_requests ? c->max_requests : 64;
	settings.memory_bytes = c->memory_bytes ? c->memory_bytes : UINT64_C(256) << 20;
	settings.cache_max_bytes = c->cache_max_bytes ? c->cache_max_bytes : UINT64_C(4) << 30;

	/* The environment's keys first, as every AWS SDK does; a credentials file named in the config wins. */
	if (!c->credentials_file && getenv("AWS_ACCESS_KEY_ID") && getenv("AWS_SECRET_ACCESS_KEY")) {
		creds.access_key = strdup(getenv("AWS_ACCESS_KEY_ID"));
		creds.secret_key = strdup(getenv("AWS_SECRET_ACCESS_KEY"));
		if (getenv("AWS_SESSION_TOKEN") && *getenv("AWS_SESSION_TOKEN"))
			creds.session_token = strdup(getenv("AWS_SESSION_TOKEN"));
	} else if (settings.credentials_file && settings.profile) {
		load_profile(settings.credentials_file, settings.profile);
	}
	bool ok = settings.region && settings.profile && settings.max_requests;
	configured = ok;
	pthread_mutex_unlock(&conf_lock);
	return ok ? 0 : -ENOMEM;
}

/* A program that never called remote_configure() (feedctl, a test) gets the environment's settings. */
static void ensure_configured(void)
{
	pthread_mutex_lock(&conf_lock);
	bool done = configured;
	pthread_mutex_unlock(&conf_lock);
	if (!done)
		remote_configure(&(struct remote_conf){ 0 });
}

void s3_settings(struct s3_settings *ret)
{
	pthread_mutex_lock(&conf_lock);
	*ret = settings;
	pthread_mutex_unlock(&conf_lock);
}

int s3_split(const char *url, char **ret_bucket, char **ret_key)
{
	if (strncmp(url, "s3://", 5) != 0)
		return -EINVAL;
	const char *b = url + 5, *slash = strchr(b, '/');
	size_t bn = slash ? (size_t)(slash - b) : strlen(b);
	if (bn == 0)
		return -EINVAL;
	char *bucket = strndup(b, bn), *key = strdup(slash ? slash + 1 : "");
	if (!bucket || !key) {
		free(bucket);
		free(key);
		return -ENOMEM;
	}
	*ret_bucket = bucket;
	*ret_key = key;
	return 0;
}

void s3_target_done(struct s3_target *t)
{
	free(t->url);
	free(t->host);
	free(t->path);
	*t = (struct s3_target){ 0 };
}

int s3_target_of(const char *url, struct s3_target *ret)
{
	struct s3_target t = { 0 };
	ensure_configured();
	if (strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0) {
		const char *h = strstr(url, "://") + 3, *slash = strchr(h, '/');
		t.url = strdup(url);
		t.host = slash ? strndup(h, (size_t)(slash - h)) : strdup(h);
		t.path = strdup(slash ? slash : "/");
		if (!t.url || !t.host || !t.path) {
			s3_target_done(&t);
			return -ENOMEM;
		}
		*ret = t;
		return 0;
	}
	_cleanup_free_ char *bucket = NULL, *key = NULL;
	int r = s3_split(url, &bucket, &key);
	if (r < 0)
		return r;
	_cleanup_free_ char *ekey = sigv4_uri_encode(key, 1);
	if (!ekey)
		return -ENOMEM;
	pthread_mutex_lock(&conf_lock);
	const char *ep = settings.endpoint;
	_cleanup_free_ char *dflt = NULL;
	if (!ep && asprintf(&dflt, "https://s3.%s.amazonaws.com", settings.region) >= 0)
		ep = dflt;
	bool path_style = settings.path_style || !dflt ? settings.path_style : false;
	t.sign = creds.access_key && creds.secret_key;
	pthread_mutex_unlock(&conf_lock);
	if (!ep)
		return -ENOMEM;
	const char *sep = strstr(ep, "://");
	if (!sep)
		return -EINVAL;
	_cleanup_free_ char *scheme = strndup(ep, (size_t)(sep - ep));
	const char *host = sep + 3;
	size_t hn = strcspn(host, "/");
	if (path_style) {
		r = asprintf(&t.path, "/%s%s%s", bucket, *key ? "/" : "", ekey);
		if (r >= 0)
			t.host = strndup(host, hn);
	} else {
		r = asprintf(&t.path, "/%s", ekey);
		if (r >= 0 && asprintf(&t.host, "%s.%.*s", bucket, (int)hn, host) < 0)
			t.host = NULL;
	}
	if (r < 0 || !t.host || !scheme || asprintf(&t.url, "%s://%s%s", scheme, t.host, t.path) < 0) {
		t.url = NULL;
		s3_target_done(&t);
		return -ENOMEM;
	}
	*ret = t;
	return 0;
}

static struct curl_slist *append(struct curl_slist *l, bool *ok, const char *name, const char *v)
{
	char line[4096];
	snprintf(line, sizeof(line), "%s%s", name, v);
	struct curl_slist *n = curl_slist_append(l, line);
	explicit_bzero(line, sizeof(line));
	if (!n) {
		*ok = false;
		return l;
	}
	return n;
}

struct curl_slist *s3_headers(const struct s3_target *t, const char *method, const char *query, const char *range,
			      const char *if_match)
{
	bool ok = true;
	struct curl_slist *l = NULL;
	l = append(l, &ok, "Host: ", t->host);
	if (range)
		l = append(l, &ok, "Range: ", range);
	if (if_match)
		l = append(l, &ok, "If-Match: ", if_match);
	/* No "Expect: 100-continue", no Accept: curl's default "*" "/" "*" is not signed. */
	l = append(l, &ok, "Accept:", "");
	if (t->sign) {
		char date[32];
		time_t now = time(NULL);
		struct tm tm;
		gmtime_r(&now, &tm);
		strftime(date, sizeof(date), "%Y%m%dT%H%M%SZ", &tm);
		l = append(l, &ok, "x-amz-date: ", date);
		l = append(l, &ok, "x-amz-content-sha256: ", SIGV4_EMPTY_SHA256);
		struct sigv4_header h[6];
		size_t n = 0;
		h[n++] = (struct sigv4_header){ "host", t->host };
		h[n++] = (struct sigv4_header){ "x-amz-date", date };
		h[n++] = (struct sigv4_header){ "x-amz-content-sha256", SIGV4_EMPTY_SHA256 };
		if (range)
			h[n++] = (struct sigv4_header){ "range", range };
		if (if_match)
			h[n++] = (struct sigv4_header){ "if-match", if_match };
		char auth[1024];
		pthread_mutex_lock(&conf_lock);
		struct sigv4_creds c = { creds.access_key, creds.secret_key, creds.session_token };
		if (c.session_token) {
			h[n++] = (struct sigv4_header){ "x-amz-security-token", c.session_token };
			l = append(l, &ok, "x-amz-security-token: ", c.session_token);
		}
		int r = c.access_key ? sigv4_authorization(&c, settings.region, method, t->path, query ? query : "", h, n,
							   date, auth, sizeof(auth)) :
				       -ENOKEY;
		pthread_mutex_unlock(&conf_lock);
		if (r < 0)
			ok = false;
		else
			l = append(l, &ok, "Authorization: ", auth);
		explicit_bzero(auth, sizeof(auth));
	}
	if (!ok) {
		curl_slist_free_all(l);
		return NULL;
	}
	return l;
}

/* libcurl's sockets, close-on-exec like every fd of feedd. */
static curl_socket_t open_socket(void *clientp, curlsocktype purpose, struct curl_sockaddr *a)
{
	(void)clientp;
	(void)purpose;
	return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

CURL *s3_easy(void)
{
	CURL *e = curl_easy_init();
	if (!e)
		return NULL;
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	/* A stalled transfer (under 1 KiB/s for 20 s) is a timeout, retried like a reset. */
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 20L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
	return e;
}

/*
 * libcurl makes its multi handle's wake-up socket pair without
 * SOCK_CLOEXEC: the fds that appear across curl_multi_init() are made
 * close-on-exec, like every fd of feedd (its other sockets come from
 * s3_easy()'s open function).
 */
CURLM *s3_multi_init(void)
{
	uint64_t before[16] = { 0 };
	for (int fd = 0; fd < 1024; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			before[fd / 64] |= UINT64_C(1) << (fd % 64);
	CURLM *m = curl_multi_init();
	for (int fd = 0; m && fd < 1024; fd++) {
		int fl = fcntl(fd, F_GETFD);
		if (fl >= 0 && !(before[fd / 64] & (UINT64_C(1) << (fd % 64))) && !(fl & FD_CLOEXEC))
			fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	}
	return m;
}

uint64_t s3_hash(const char *s)
{
	uint64_t h = UINT64_C(1469598103934665603);
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * UINT64_C(1099511628211);
	return h;
}

bool s3_retryable(CURLcode res, long status)
{
	switch (res) {
	case CURLE_OK:
		return status >= 500 || status == 429 || status == 408;
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_RECV_ERROR:
	case CURLE_SEND_ERROR:
	case CURLE_COULDNT_CONNECT:
	case CURLE_PARTIAL_FILE:
	case CURLE_GOT_NOTHING:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_WRITE_ERROR: /* our short-read check */
		return true;
	default:
		return false;
	}
}

uint64_t s3_backoff_ns(unsigned attempt)
{
	/* Capped exponential backoff with full jitter: uniform in [base, min(cap, 50 ms * 2^attempt)]. */
	uint64_t cap = UINT64_C(50000000) << MIN(attempt, 6u);
	cap = MIN(cap, UINT64_C(2000000000));
	uint64_t lo = UINT64_C(10000000);
	return lo + (uint64_t)((double)(cap - lo) * ((double)random() / (double)RAND_MAX));
}

int s3_status_error(long status, const char *url, char *err, size_t errlen)
{
	if (status == 404) {
		snprintf(err, errlen, "%s: not found (HTTP 404: no such key or bucket)", url);
		return -ENOENT;
	}
	if (status == 403 || status == 401) {
		snprintf(err, errlen, "%s: access denied (HTTP %ld: check the credentials, region and bucket policy)", url,
			 status);
		return -EACCES;
	}
	if (status == 412) {
		snprintf(err, errlen, "%s: changed while serving (its ETag no longer matches)", url);
		return -ESTALE;
	}
	snprintf(err, errlen, "%s: HTTP %ld", url, status);
	return -EIO;
}

/* Runs e to completion with retries; the body (if want_body) into *body. Returns the final CURLcode/status. */
struct membuf {
	char *p;
	size_t n, cap;
};

static size_t mem_write(char *ptr, size_t size, size_t nmemb, void *ud)
{
	struct membuf *b = ud;
	size_t n = size * nmemb;
	if (b->n + n + 1 > b->cap) {
		size_t cap = MAX(b->cap * 2, b->n + n + 1 + 4096);
		char *q = realloc(b->p, cap);
		if (!q)
			return 0;
		b->p = q;
		b->cap = cap;
	}
	memcpy(b->p + b->n, ptr, n);
	b->n += n;
	b->p[b->n] = 0;
	return n;
}

static int perform(const char *display, const struct s3_target *t, const char *method, const char *query,
		   struct membuf *body, CURL **ret_easy, char *err, size_t errlen)
{
	for (unsigned attempt = 0;; attempt++) {
		CURL *e = s3_easy();
		if (!e)
			return -ENOMEM;
		_cleanup_free_ char *url = NULL;
		if (asprintf(&url, "%s%s%s", t->url, query && *query ? "?" : "", query ? query : "") < 0) {
			curl_easy_cleanup(e);
			return -ENOMEM;
		}
		struct curl_slist *h = s3_headers(t, method, query, NULL, NULL);
		if (!h) {
			curl_easy_cleanup(e);
			snprintf(err, errlen, "%s: cannot sign the request (no usable credentials)", display);
			return -ENOKEY;
		}
		curl_easy_setopt(e, CURLOPT_URL, url);
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
		if (strcmp(method, "HEAD") == 0)
			curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
		if (body) {
			body->n = 0;
			curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, mem_write);
			curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
		}
		CURLcode res = curl_easy_perform(e);
		long status = 0;
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
		curl_slist_free_all(h);
		bool retry = s3_retryable(res, status) && attempt + 1 < S3_MAX_ATTEMPTS;
		bool ok = res == CURLE_OK && status >= 200 && status < 300;
		fetch_count_request(attempt > 0, res == CURLE_OK && (status == 429 || status == 503), !ok && !retry);
		if (ok) {
			*ret_easy = e;
			return 0;
		}
		if (!retry) {
			curl_easy_cleanup(e);
			if (res != CURLE_OK) {
				snprintf(err, errlen, "%s: %s", display, curl_easy_strerror(res));
				return -EIO;
			}
			return s3_status_error(status, display, err, errlen);
		}
		curl_easy_cleanup(e);
		uint64_t ns = s3_backoff_ns(attempt);
		nanosleep(&(struct timespec){ .tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000) },
			  NULL);
	}
}

int s3_head(const char *url, uint64_t *ret_size, char *etag, size_t etaglen, struct timespec *ret_mtime, char *err,
	    size_t errlen)
{
	struct s3_target t;
	int r = s3_target_of(url, &t);
	if (r < 0) {
		snprintf(err, errlen, "%s: not an object URL (s3://BUCKET/KEY or http(s)://...)", url);
		return r == -ENOMEM ? r : -EPROTONOSUPPORT;
	}
	CURL *e = NULL;
	r = perform(url, &t, "HEAD", NULL, NULL, &e, err, errlen);
	s3_target_done(&t);
	if (r < 0)
		return r;
	curl_off_t len = -1;
	curl_easy_getinfo(e, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
	struct curl_header *h = NULL;
	etag[0] = 0;
	if (curl_easy_header(e, "ETag", 0, CURLH_HEADER, -1, &h) == CURLHE_OK)
		snprintf(etag, etaglen, "%s", h->value);
	long filetime = -1;
	*ret_mtime = (struct timespec){ 0 };
	if (curl_easy_header(e, "Last-Modified", 0, CURLH_HEADER, -1, &h) == CURLHE_OK)
		filetime = (long)curl_getdate(h->value, NULL);
	if (filetime > 0)
		ret_mtime->tv_sec = filetime;
	curl_easy_cleanup(e);
	if (len < 0) {
		snprintf(err, errlen, "%s: the server gave no size (Content-Length) for it", url);
		return -EIO;
	}
	*ret_size = (uint64_t)len;
	return 0;
}

/* The text of <tag>...</tag> after *at, XML entities decoded; NULL when there is none. */
static char *xml_next(const char *body, const char **at, const char *tag)
{
	char open[64], close[64];
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	const char *a = strstr(*at, open);
	if (!a)
		return NULL;
	a += strlen(open);
	const char *b = strstr(a, close);
	if (!b)
		return NULL;
	*at = b + strlen(close);
	char *out = malloc((size_t)(b - a) + 1), *o = out;
	if (!out)
		return NULL;
	static const struct {
		const char *ent;
		char ch;
	} ents[] = { { "&amp;", '&' }, { "&lt;", '<' }, { "&gt;", '>' }, { "&quot;", '"' }, { "&apos;", '\'' } };
	for (const char *p = a; p < b;) {
		size_t k;
		for (k = 0; k < ARRAY_SIZE(ents); k++)
			if (strncmp(p, ents[k].ent, strlen(ents[k].ent)) == 0)
				break;
		if (k < ARRAY_SIZE(ents)) {
			*o++ = ents[k].ch;
			p += strlen(ents[k].ent);
		} else {
			*o++ = *p++;
		}
	}
	*o = 0;
	(void)body;
	return out;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * What a listing said of each object (size, ETag, Last-Modified), kept until
 * remote_open() takes it: a feed of N shards costs one LIST per 1000 keys
 * rather than N HEADs. Cleared at each remote_configure() (each load).
 */
struct listed {
	char *url;
	uint64_t size;
	char etag[160];
	time_t mtime;
	struct listed *next;
};
static struct listed *listed;
/* The URL prefixes ("s3://bucket/prefix") whose every key a listing of this load returned. */
static char **covered;
static size_t n_covered;

static void listed_clear(void)
{
	for (size_t i = 0; i < n_covered; i++)
		free(covered[i]);
	free(covered);
	covered = NULL;
	n_covered = 0;
	while (listed) {
		struct listed *l = listed;
		listed = l->next;
		free(l->url);
		free(l);
	}
}

static void remember(const char *bucket, const char *key, const char *item)
{
	const char *at = item;
	_cleanup_free_ char *etag = xml_next(item, &at, "ETag");
	at = item;
	_cleanup_free_ char *size = xml_next(item, &at, "Size");
	at = item;
	_cleanup_free_ char *lm = xml_next(item, &at, "LastModified");
	struct tm tm = { 0 };
	if (!etag || !size || !lm || !strptime(lm, "%Y-%m-%dT%H:%M:%S", &tm))
		return;
	struct listed *l = calloc(1, sizeof(*l));
	if (!l || asprintf(&l->url, "s3://%s/%s", bucket, key) < 0) {
		free(l);
		return;
	}
	l->size = strtoull(size, NULL, 10);
	snprintf(l->etag, sizeof(l->etag), "%s", etag);
	l->mtime = timegm(&tm);
	pthread_mutex_lock(&conf_lock);
	l->next = listed;
	listed = l;
	pthread_mutex_unlock(&conf_lock);
}

int s3_listed(const char *url, uint64_t *ret_size, char *etag, size_t etaglen, struct timespec *ret_mtime)
{
	int r = -ENOENT;
	pthread_mutex_lock(&conf_lock);
	for (struct listed **pp = &listed; *pp; pp = &(*pp)->next) {
		struct listed *l = *pp;
		if (strcmp(l->url, url) != 0)
			continue;
		/* Kept (until the next load): another feed of this load may open the same object. */
		*ret_size = l->size;
		snprintf(etag, etaglen, "%s", l->etag);
		*ret_mtime = (struct timespec){ .tv_sec = l->mtime };
		r = 0;
		break;
	}
	pthread_mutex_unlock(&conf_lock);
	return r;
}

bool remote_known_absent(const char *url)
{
	bool absent = false;
	pthread_mutex_lock(&conf_lock);
	for (size_t i = 0; i < n_covered && !absent; i++)
		absent = strncmp(url, covered[i], strlen(covered[i])) == 0;
	for (struct listed *l = listed; l && absent; l = l->next)
		absent = strcmp(l->url, url) != 0;
	pthread_mutex_unlock(&conf_lock);
	return absent;
}

/* Every key under url_prefix is in `listed` now. */
static void cover(const char *bucket, const char *prefix)
{
	char *u = NULL;
	if (asprintf(&u, "s3://%s/%s", bucket, prefix) < 0)
		return;
	pthread_mutex_lock(&conf_lock);
	char **g = realloc(covered, (n_covered + 1) * sizeof(*g));
	if (g) {
		covered = g;
		covered[n_covered++] = u;
		u = NULL;
	}
	pthread_mutex_unlock(&conf_lock);
	free(u);
}

int remote_list(const char *pattern, char ***ret, size_t *ret_n, char *err, size_t errlen)
{
	bool glob = strpbrk(pattern, "*?[") != NULL;
	if (strncmp(pattern, "s3://", 5) != 0 || !glob) {
		if (glob) {
			snprintf(err, errlen, "shards: '%s': only s3:// URLs may hold a pattern", pattern);
			return -EINVAL;
		}
		char **one = malloc(sizeof(*one));
		if (!one || !(one[0] = strdup(pattern))) {
			free(one);
			return -ENOMEM;
		}
		*ret = one;
		*ret_n = 1;
		return 0;
	}
	_cleanup_free_ char *bucket = NULL, *keypat = NULL, *bucket_url = NULL;
	int r = s3_split(pattern, &bucket, &keypat);
	if (r < 0 || asprintf(&bucket_url, "s3://%s", bucket) < 0) {
		snprintf(err, errlen, "shards: '%s' is not s3://BUCKET/KEY", pattern);
		return r < 0 ? r : -ENOMEM;
	}
	struct s3_target t;
	if ((r = s3_target_of(bucket_url, &t)) < 0)
		return r;
	/* The bucket itself: no trailing slash (path style "/bucket", virtual host "/"). */
	size_t pl = strlen(t.path);
	if (pl > 1 && t.path[pl - 1] == '/') {
		t.path[pl - 1] = 0;
		t.url[strlen(t.url) - 1] = 0;
	}
	_cleanup_free_ char *prefix = strndup(keypat, strcspn(keypat, "*?["));
	_cleanup_free_ char *eprefix = prefix ? sigv4_uri_encode(prefix, 0) : NULL;
	char **names = NULL;
	size_t n = 0, cap = 0;
	char *token = NULL;
	struct membuf body = { 0 };
	for (;;) {
		_cleanup_free_ char *etok = token ? sigv4_uri_encode(token, 0) : NULL, *query = NULL;
		if (!eprefix || asprintf(&query, "continuation-token=%s&list-type=2&prefix=%s", etok ? etok : "",
					 eprefix) < 0) {
			r = -ENOMEM;
			break;
		}
		if (!token) {
			free(query);
			if (asprintf(&query, "list-type=2&prefix=%s", eprefix) < 0) {
				query = NULL;
				r = -ENOMEM;
				break;
			}
		}
		CURL *e = NULL;
		r = perform(pattern, &t, "GET", query, &body, &e, err, errlen);
		if (r < 0)
			break;
		curl_easy_cleanup(e);
		const char *at = body.p ? body.p : "";
		char *item;
		while ((item = xml_next(body.p, &at, "Contents"))) {
			const char *in = item;
			char *key = xml_next(item, &in, "Key");
			if (key)
				remember(bucket, key, item);
			free(item);
			if (!key || fnmatch(keypat, key, FNM_PATHNAME) != 0) {
				free(key);
				continue;
			}
			if (n == cap) {
				cap = MAX(cap * 2, (size_t)64);
				char **g = realloc(names, cap * sizeof(*names));
				if (!g) {
					free(key);
					r = -ENOMEM;
					goto done;
				}
				names = g;
			}
			if (asprintf(&names[n], "s3://%s/%s", bucket, key) < 0) {
				free(key);
				r = -ENOMEM;
				goto done;
			}
			n++;
			free(key);
		}
		at = body.p ? body.p : "";
		_cleanup_free_ char *trunc = xml_next(body.p, &at, "IsTruncated");
		free(token);
		at = body.p ? body.p : "";
		token = trunc && strcmp(trunc, "true") == 0 ? xml_next(body.p, &at, "NextContinuationToken") : NULL;
		if (!token)
			break;
	}
done:
	free(token);
	free(body.p);
	s3_target_done(&t);
	if (r == 0 && n == 0) {
		snprintf(err, errlen, "shards: '%s' matches no object", pattern);
		r = -ENOENT;
	}
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			free(names[i]);
		free(names);
		return r;
	}
	cover(bucket, prefix);
	/* The contract's order: names sorted by bytes (docs/sample-order.md §1.1). */
	qsort(names, n, sizeof(*names), cmp_str);
	*ret = names;
	*ret_n = n;
	return 0;
}
