/* SPDX-License-Identifier: MIT */
/*
 * AWS Signature Version 4 (see sigv4.h), over OpenSSL's SHA-256 and HMAC.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/sha.h>

#include "daemon/source/sigv4.h"
#include "proto/macro.h"

#define MAX_HEADERS 16

static void hex(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = 0;
}

static int hmac(const void *key, size_t keylen, const char *msg, unsigned char out[32])
{
	size_t outlen = 0;
	if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA256", NULL, key, keylen, (const unsigned char *)msg, strlen(msg), out, 32,
		       &outlen) ||
	    outlen != 32)
		return -EIO;
	return 0;
}

char *sigv4_uri_encode(const char *s, int keep_slash)
{
	size_t n = strlen(s);
	char *out = malloc(3 * n + 1), *o = out;
	if (!out)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned char ch = *p;
		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
		    ch == '_' || ch == '.' || ch == '~' || (keep_slash && ch == '/'))
			*o++ = (char)ch;
		else
			o += sprintf(o, "%%%02X", ch);
	}
	*o = 0;
	return out;
}

static int cmp_header(const void *a, const void *b)
{
	return strcmp(((const struct sigv4_header *)a)->name, ((const struct sigv4_header *)b)->name);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends to a bounded buffer; false once it is full. */
struct buf {
	char *p;
	size_t len, cap;
};

static bool put(struct buf *b, const char *s)
{
	size_t n = strlen(s);
	if (b->len + n + 1 > b->cap)
		return false;
	memcpy(b->p + b->len, s, n + 1);
	b->len += n;
	return true;
}

/* The query's parameters sorted by name (then value): the canonical query string. */
static bool put_query(struct buf *b, const char *query)
{
	char copy[2048];
	if (strlen(query) >= sizeof(copy))
		return false;
	strcpy(copy, query);
	char *parts[64];
	size_t n = 0;
	for (char *save = NULL, *t = strtok_r(copy, "&", &save); t; t = strtok_r(NULL, "&", &save)) {
		if (n == ARRAY_SIZE(parts))
			return false;
		parts[n++] = t;
	}
	qsort(parts, n, sizeof(*parts), cmp_str);
	for (size_t i = 0; i < n; i++) {
		if (i && !put(b, "&"))
			return false;
		if (!put(b, parts[i]))
			return false;
		if (!strchr(parts[i], '=') && !put(b, "="))
			return false;
	}
	return true;
}

int sigv4_authorization(const struct sigv4_creds *c, const char *region, const char *method, const char *path,
			const char *query, const struct sigv4_header *headers, size_t n_headers, const char *amz_date,
			char *out, size_t outlen)
{
	if (n_headers > MAX_HEADERS)
		return -EINVAL;
	struct sigv4_header h[MAX_HEADERS];
	memcpy(h, headers, n_headers * sizeof(*h));
	qsort(h, n_headers, sizeof(*h), cmp_header);

	char creq_mem[8192], signed_mem[512];
	struct buf creq = { creq_mem, 0, sizeof(creq_mem) }, sh = { signed_mem, 0, sizeof(signed_mem) };
	bool ok = put(&creq, method) && put(&creq, "\n") && put(&creq, path) && put(&creq, "\n") &&
		  put_query(&creq, query) && put(&creq, "\n");
	const char *payload = SIGV4_EMPTY_SHA256;
	for (size_t i = 0; ok && i < n_headers; i++) {
		ok = put(&creq, h[i].name) && put(&creq, ":") && put(&creq, h[i].value) && put(&creq, "\n") &&
		     (i == 0 || put(&sh, ";")) && put(&sh, h[i].name);
		if (strcmp(h[i].name, "x-amz-content-sha256") == 0)
			payload = h[i].value;
	}
	ok = ok && put(&creq, "\n") && put(&creq, signed_mem) && put(&creq, "\n") && put(&creq, payload);
	if (!ok)
		return -ENOBUFS;

	unsigned char digest[32];
	char creq_hex[65], date[9], scope[128], sts[512];
	SHA256((const unsigned char *)creq_mem, creq.len, digest);
	hex(digest, 32, creq_hex);
	snprintf(date, sizeof(date), "%.8s", amz_date);
	if ((size_t)snprintf(scope, sizeof(scope), "%s/%s/s3/aws4_request", date, region) >= sizeof(scope))
		return -ENOBUFS;
	snprintf(sts, sizeof(sts), "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, creq_hex);

	char ksecret[256];
	if ((size_t)snprintf(ksecret, sizeof(ksecret), "AWS4%s", c->secret_key) >= sizeof(ksecret))
		return -ENOBUFS;
	unsigned char k1[32], k2[32], k3[32], k4[32], sig[32];
	int r = hmac(ksecret, strlen(ksecret), date, k1);
	if (r == 0)
		r = hmac(k1, 32, region, k2);
	if (r == 0)
		r = hmac(k2, 32, "s3", k3);
	if (r == 0)
		r = hmac(k3, 32, "aws4_request", k4);
	if (r == 0)
		r = hmac(k4, 32, sts, sig);
	explicit_bzero(ksecret, sizeof(ksecret));
	explicit_bzero(k1, sizeof(k1));
	explicit_bzero(k4, sizeof(k4));
	if (r < 0)
		return r;
	char sig_hex[65];
	hex(sig, 32, sig_hex);
	if ((size_t)snprintf(out, outlen, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
			     c->access_key, scope, signed_mem, sig_hex) >= outlen)
		return -ENOBUFS;
	return 0;
}
