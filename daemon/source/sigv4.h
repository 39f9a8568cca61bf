/* SPDX-License-Identifier: MIT */
/*
 * AWS Signature Version 4 for S3 requests without a body (GET, HEAD): the
 * canonical request, the string to sign and the Authorization header, as
 * https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html
 * describes. Pure functions of their inputs (no clock, no I/O), so the unit
 * test and the tests' checking proxy (@smithy/signature-v4) can compare them.
 */
#pragma once

#include <stddef.h>

struct sigv4_creds {
	const char *access_key;
	const char *secret_key;
	const char *session_token; /* NULL: none */
};

/* A header to sign: name in lower case, value trimmed. */
struct sigv4_header {
	const char *name;
	const char *value;
};

/*
 * Signs a request: method, the URI path as sent (already percent-encoded, not
 * encoded again: S3's rule), the query as sent ("a=1&b=2", each part encoded;
 * "" for none), the headers to sign (host, x-amz-date, x-amz-content-sha256,
 * and any other; any order), amz_date ("20261123T235900Z"), region.
 * Writes the Authorization header's value to out. Returns 0, or -ENOBUFS when
 * outlen is too small, -EINVAL for too many headers.
 */
int sigv4_authorization(const struct sigv4_creds *c, const char *region, const char *method, const char *path,
			const char *query, const struct sigv4_header *headers, size_t n_headers, const char *amz_date,
			char *out, size_t outlen);

/*
 * Percent-encodes s as RFC 3986 (unreserved A-Z a-z 0-9 - _ . ~ kept; '/' kept
 * when keep_slash). Returns a new string (caller frees) or NULL.
 */
char *sigv4_uri_encode(const char *s, int keep_slash);

/* The hex SHA-256 of the empty payload: GET and HEAD bodies. */
#define SIGV4_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
