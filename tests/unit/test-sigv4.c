/* SPDX-License-Identifier: MIT */
/*
 * The SigV4 signer against the worked examples of the S3 API reference
 * ("Signature Calculations for the Authorization Header": GET Object with a
 * range, and GET Bucket with a query), whose signatures AWS publishes. The
 * integration test (test_s3.py) checks live requests against
 * @smithy/signature-v4 as well.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/source/sigv4.h"
#include "unit.h"

static const struct sigv4_creds example = { "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", NULL };

static void test_get_object(void)
{
	const struct sigv4_header h[] = {
		{ "range", "bytes=0-9" },
		{ "x-amz-date", "20130524T000000Z" },
		{ "host", "examplebucket.s3.amazonaws.com" },
		{ "x-amz-content-sha256", SIGV4_EMPTY_SHA256 },
	};
	char auth[512];
	CHECK_INT(sigv4_authorization(&example, "us-east-1", "GET", "/test.txt", "", h, 4, "20130524T000000Z", auth,
				      sizeof(auth)),
		  0);
	CHECK_STR(auth, "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
			"SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
			"Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
	CHECK_INT(sigv4_authorization(&example, "us-east-1", "GET", "/test.txt", "", h, 4, "20130524T000000Z", auth, 40),
		  -ENOBUFS);
}

static void test_list_bucket(void)
{
	const struct sigv4_header h[] = {
		{ "host", "examplebucket.s3.amazonaws.com" },
		{ "x-amz-date", "20130524T000000Z" },
		{ "x-amz-content-sha256", SIGV4_EMPTY_SHA256 },
	};
	char auth[512];
	/* The query in any order: the canonical one is sorted. */
	CHECK_INT(sigv4_authorization(&example, "us-east-1", "GET", "/", "prefix=J&max-keys=2", h, 3, "20130524T000000Z",
				      auth, sizeof(auth)),
		  0);
	CHECK_CONTAINS(auth, "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

static void test_uri_encode(void)
{
	char *e = sigv4_uri_encode("a b/c~d_e.f-g+h=é", 1);
	CHECK_STR(e, "a%20b/c~d_e.f-g%2Bh%3D%C3%A9");
	free(e);
	e = sigv4_uri_encode("x/y", 0);
	CHECK_STR(e, "x%2Fy");
	free(e);
}

int main(void)
{
	test_get_object();
	test_list_bucket();
	test_uri_encode();
	return unit_exit("test-sigv4");
}
