/* SPDX-License-Identifier: MIT */
/*
 * The control protocol's codec (proto/wire.h): every message survives an
 * encode/decode round trip; decoders refuse every wrong length, unterminated
 * string and out-of-range field a hostile peer could send; encoders refuse
 * buffers that are too small and strings that do not fit; the header check
 * refuses anything that is not a feedd message of an allowed size. Also the
 * default socket path's precedence.
 */
#include <endian.h>

#include "proto/wire.h"
#include "unit.h"

/* Big enough for any message but STATUS_REPLY's payload. */
static uint8_t buf[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE + 64];

typedef int (*decode_fn)(const void *p, size_t len, void *ret);

/* Encodes into buf, checks the header says `type` with `size` payload bytes, returns the payload. */
static const uint8_t *encoded(int n, uint16_t type, size_t size)
{
	CHECK_INT(n, WIRE_HEADER_SIZE + (int)size);
	CHECK(memcmp(buf, "FEDW", 4) == 0, "header magic bytes are %02x %02x %02x %02x, expected \"FEDW\"", buf[0],
	      buf[1], buf[2], buf[3]);
	struct wire_header h = { 0 };
	CHECK_INT(wire_header_decode(buf, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &h), 0);
	CHECK_INT(h.version, WIRE_VERSION);
	CHECK_INT(h.type, type);
	CHECK_U64(h.length, size);
	return buf + WIRE_HEADER_SIZE;
}

/*
 * A decoder must refuse the payload at every shorter length and with one
 * byte too many. The payload is copied to a buffer of exactly `len` bytes so
 * that an overread past it would be a real bug, not a read of buf's tail.
 */
static void check_lengths(const char *what, const uint8_t *payload, size_t size, decode_fn decode, size_t retsize)
{
	uint8_t *copy = malloc(size + 1);
	void *out = malloc(retsize);
	REQUIRE(copy && out, "out of memory");
	for (size_t len = 0; len < size; len++) {
		memcpy(copy, payload, len);
		int r = decode(copy, len, out);
		CHECK(r == -EBADMSG, "%s: decode of %zu of %zu bytes returned %d, expected -EBADMSG", what, len, size,
		      r);
	}
	memcpy(copy, payload, size);
	copy[size] = 0;
	int r = decode(copy, size + 1, out);
	CHECK(r == -EBADMSG, "%s: decode with one trailing byte (%zu bytes) returned %d, expected -EBADMSG", what,
	      size + 1, r);
	free(copy);
	free(out);
}

/* The decoder must refuse a fixed string field filled without a NUL. */
static void check_unterminated(const char *what, const uint8_t *payload, size_t size, size_t str_off,
			       size_t str_size, decode_fn decode, size_t retsize)
{
	uint8_t *copy = malloc(size);
	void *out = malloc(retsize);
	REQUIRE(copy && out, "out of memory");
	memcpy(copy, payload, size);
	memset(copy + str_off, 'a', str_size);
	int r = decode(copy, size, out);
	CHECK(r == -EBADMSG, "%s: string at payload offset %zu filled without NUL: decode returned %d, expected -EBADMSG",
	      what, str_off, r);
	free(copy);
	free(out);
}

/* Every cap smaller than the message gives -ENOBUFS. */
#define CHECK_CAPS(what, total, call)                                                                  \
	do {                                                                                           \
		for (size_t cap = 0; cap < (size_t)(total); cap++) {                                   \
			int r_ = (call);                                                               \
			CHECK(r_ == -ENOBUFS, "%s: encode with cap %zu of %zu returned %d, expected -ENOBUFS", \
			      what, cap, (size_t)(total), r_);                                         \
		}                                                                                      \
	} while (0)

static int dec_hello(const void *p, size_t len, void *ret)
{
	return wire_decode_hello(p, len, ret);
}
static int dec_hello_reply(const void *p, size_t len, void *ret)
{
	return wire_decode_hello_reply(p, len, ret);
}
static int dec_attach(const void *p, size_t len, void *ret)
{
	return wire_decode_attach(p, len, ret);
}
static int dec_attach_reply(const void *p, size_t len, void *ret)
{
	return wire_decode_attach_reply(p, len, ret);
}
static int dec_error(const void *p, size_t len, void *ret)
{
	return wire_decode_error(p, len, ret);
}
static int dec_status(const void *p, size_t len, void *ret)
{
	return wire_decode_status(p, len, ret);
}

static void test_hello(void)
{
	struct wire_hello m = { .min_version = 1, .max_version = 7, .pid = 0xfedcba98 }, d;
	memset(m.name, 'n', sizeof(m.name) - 1); /* the longest name that fits */
	m.name[sizeof(m.name) - 1] = 0;
	const uint8_t *p = encoded(wire_encode_hello(buf, sizeof(buf), &m), WIRE_HELLO, WIRE_HELLO_SIZE);
	memset(&d, 0x55, sizeof(d));
	CHECK_INT(wire_decode_hello(p, WIRE_HELLO_SIZE, &d), 0);
	CHECK_INT(d.min_version, 1);
	CHECK_INT(d.max_version, 7);
	CHECK_U64(d.pid, 0xfedcba98);
	CHECK_STR(d.name, m.name);
	/* Little-endian on the wire, whatever the host. */
	CHECK(p[0] == 1 && p[1] == 0 && p[2] == 7 && p[3] == 0 && p[4] == 0x98 && p[7] == 0xfe,
	      "hello fields are not little-endian at their offsets");

	check_lengths("hello", p, WIRE_HELLO_SIZE, dec_hello, sizeof(d));
	check_unterminated("hello.name", p, WIRE_HELLO_SIZE, 8, 32, dec_hello, sizeof(d));

	/* A range that is empty cannot be negotiated. */
	struct wire_hello bad = { .min_version = 3, .max_version = 2 };
	p = encoded(wire_encode_hello(buf, sizeof(buf), &bad), WIRE_HELLO, WIRE_HELLO_SIZE);
	CHECK_INT(wire_decode_hello(p, WIRE_HELLO_SIZE, &d), -EBADMSG);

	CHECK_CAPS("hello", WIRE_HEADER_SIZE + WIRE_HELLO_SIZE, wire_encode_hello(buf, cap, &m));
	memset(m.name, 'x', sizeof(m.name)); /* no room for the NUL */
	CHECK_INT(wire_encode_hello(buf, sizeof(buf), &m), -ENAMETOOLONG);
}

static void test_hello_reply(void)
{
	struct wire_hello_reply m = { .version = 1, .daemon_pid = 4242, .flags = WIRE_DAEMON_GPU }, d;
	strcpy(m.daemon_version, "0.1.0");
	const uint8_t *p =
		encoded(wire_encode_hello_reply(buf, sizeof(buf), &m), WIRE_HELLO_REPLY, WIRE_HELLO_REPLY_SIZE);
	memset(&d, 0x55, sizeof(d));
	CHECK_INT(wire_decode_hello_reply(p, WIRE_HELLO_REPLY_SIZE, &d), 0);
	CHECK_INT(d.version, 1);
	CHECK_U64(d.daemon_pid, 4242);
	CHECK_U64(d.flags, WIRE_DAEMON_GPU);
	CHECK_STR(d.daemon_version, "0.1.0");

	check_lengths("hello_reply", p, WIRE_HELLO_REPLY_SIZE, dec_hello_reply, sizeof(d));
	check_unterminated("hello_reply.daemon_version", p, WIRE_HELLO_REPLY_SIZE, 12, 32, dec_hello_reply,
			   sizeof(d));

	CHECK_CAPS("hello_reply", WIRE_HEADER_SIZE + WIRE_HELLO_REPLY_SIZE, wire_encode_hello_reply(buf, cap, &m));
	memset(m.daemon_version, 'v', sizeof(m.daemon_version));
	CHECK_INT(wire_encode_hello_reply(buf, sizeof(buf), &m), -ENAMETOOLONG);
}

/* Encodes an attach as given (the encoder does not validate) and expects the decoder to refuse it. */
static void attach_rejected(const char *why, const struct wire_attach *m)
{
	struct wire_attach d;
	int n = wire_encode_attach(buf, sizeof(buf), m);
	CHECK(n == WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE, "%s: encode returned %d", why, n);
	int r = wire_decode_attach(buf + WIRE_HEADER_SIZE, WIRE_ATTACH_SIZE, &d);
	CHECK(r == -EBADMSG, "attach with %s: decode returned %d, expected -EBADMSG", why, r);
}

static void test_attach(void)
{
	struct wire_attach m = { .rank = 2, .world = 3, .flags = 0 }, d;
	strcpy(m.feed, "pretrain");
	const uint8_t *p = encoded(wire_encode_attach(buf, sizeof(buf), &m), WIRE_ATTACH, WIRE_ATTACH_SIZE);
	memset(&d, 0x55, sizeof(d));
	CHECK_INT(wire_decode_attach(p, WIRE_ATTACH_SIZE, &d), 0);
	CHECK_U64(d.rank, 2);
	CHECK_U64(d.world, 3);
	CHECK_U64(d.flags, 0);
	CHECK_STR(d.feed, "pretrain");
	CHECK_STR(d.cursor, "");
	check_lengths("attach", p, WIRE_ATTACH_SIZE, dec_attach, sizeof(d));
	check_unterminated("attach.feed", p, WIRE_ATTACH_SIZE, 16, WIRE_NAME_MAX, dec_attach, sizeof(d));

	/* With a cursor: the longest ones that fit. */
	struct wire_attach c = { .rank = 0, .world = 1, .flags = WIRE_ATTACH_RESUME };
	memset(c.feed, 'f', sizeof(c.feed) - 1);
	memset(c.cursor, 'c', sizeof(c.cursor) - 1);
	p = encoded(wire_encode_attach(buf, sizeof(buf), &c), WIRE_ATTACH, WIRE_ATTACH_SIZE);
	memset(&d, 0x55, sizeof(d));
	CHECK_INT(wire_decode_attach(p, WIRE_ATTACH_SIZE, &d), 0);
	CHECK_U64(d.flags, WIRE_ATTACH_RESUME);
	CHECK_STR(d.feed, c.feed);
	CHECK_STR(d.cursor, c.cursor);
	check_lengths("attach+cursor", p, WIRE_ATTACH_SIZE, dec_attach, sizeof(d));
	check_unterminated("attach.cursor", p, WIRE_ATTACH_SIZE, 16 + WIRE_NAME_MAX, FEED_CURSOR_MAX, dec_attach,
			   sizeof(d));

	struct wire_attach bad = m;
	bad.rank = 3; /* == world */
	attach_rejected("rank == world", &bad);
	bad.rank = 7;
	attach_rejected("rank > world", &bad);
	bad = m;
	bad.world = 0;
	bad.rank = 0;
	attach_rejected("world == 0", &bad);
	bad = m;
	bad.feed[0] = 0;
	attach_rejected("an empty feed name", &bad);
	bad = m;
	bad.flags = WIRE_ATTACH_RESUME; /* but no cursor */
	attach_rejected("RESUME and no cursor", &bad);
	bad = c;
	bad.flags = 0; /* a cursor, but no RESUME */
	attach_rejected("a cursor without RESUME", &bad);
	bad = m;
	bad.flags = 1u << 3;
	attach_rejected("unknown flag bit 3", &bad);
	bad = c;
	bad.flags = WIRE_ATTACH_RESUME | 1u << 31;
	attach_rejected("unknown flag bit 31", &bad);

	/* The device word after flags must be 0 without WIRE_ATTACH_DEVICE. */
	p = encoded(wire_encode_attach(buf, sizeof(buf), &m), WIRE_ATTACH, WIRE_ATTACH_SIZE);
	buf[WIRE_HEADER_SIZE + 12] = 1;
	CHECK_INT(wire_decode_attach(buf + WIRE_HEADER_SIZE, WIRE_ATTACH_SIZE, &d), -EBADMSG);

	CHECK_CAPS("attach", WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE, wire_encode_attach(buf, cap, &c));
	bad = m;
	memset(bad.feed, 'f', sizeof(bad.feed));
	CHECK_INT(wire_encode_attach(buf, sizeof(buf), &bad), -ENAMETOOLONG);
	bad = c;
	memset(bad.cursor, 'c', sizeof(bad.cursor));
	CHECK_INT(wire_encode_attach(buf, sizeof(buf), &bad), -ENAMETOOLONG);
}

static void test_attach_reply(void)
{
	struct wire_attach_reply m = {
		.ring_size = UINT64_C(0x0102030405060708),
		.consumer_size = 8192,
		.fingerprint = UINT64_MAX,
		.first_batch = UINT64_C(1) << 40,
		.slot_count = 4,
		.batch_size = 8,
		.seq_len = 4096,
		.n_fds = WIRE_ATTACH_FDS,
	}, d;
	const uint8_t *p =
		encoded(wire_encode_attach_reply(buf, sizeof(buf), &m), WIRE_ATTACH_REPLY, WIRE_ATTACH_REPLY_SIZE);
	memset(&d, 0x55, sizeof(d));
	CHECK_INT(wire_decode_attach_reply(p, WIRE_ATTACH_REPLY_SIZE, &d), 0);
	CHECK_U64(d.ring_size, m.ring_size);
	CHECK_U64(d.consumer_size, m.consumer_size);
	CHECK_U64(d.fingerprint, m.fingerprint);
	CHECK_U64(d.first_batch, m.first_batch);
	CHECK_U64(d.slot_count, 4);
	CHECK_U64(d.batch_size, 8);
	CHECK_U64(d.seq_len, 4096);
	CHECK_U64(d.n_fds, WIRE_ATTACH_FDS);
	CHECK(p[0] == 0x08 && p[7] == 0x01, "ring_size is not little-endian at payload offset 0");
	check_lengths("attach_reply", p, WIRE_ATTACH_REPLY_SIZE, dec_attach_reply, sizeof(d));

	/* The client counts on exactly WIRE_ATTACH_FDS descriptors. */
	struct wire_attach_reply bad = m;
	bad.n_fds = 3;
	p = encoded(wire_encode_attach_reply(buf, sizeof(buf), &bad), WIRE_ATTACH_REPLY, WIRE_ATTACH_REPLY_SIZE);
	CHECK_INT(wire_decode_attach_reply(p, WIRE_ATTACH_REPLY_SIZE, &d), -EBADMSG);

	CHECK_CAPS("attach_reply", WIRE_HEADER_SIZE + WIRE_ATTACH_REPLY_SIZE, wire_encode_attach_reply(buf, cap, &m));
}

static void test_error(void)
{
	static struct wire_error m, d;
	m.code = -ESTALE;
	memset(m.message, 'm', sizeof(m.message) - 1);
	const uint8_t *p = encoded(wire_encode_error(buf, sizeof(buf), &m), WIRE_ERROR, WIRE_ERROR_SIZE);
	memset(&d, 0x55, sizeof(d));
	CHECK_INT(wire_decode_error(p, WIRE_ERROR_SIZE, &d), 0);
	CHECK_INT(d.code, -ESTALE);
	CHECK_STR(d.message, m.message);
	check_lengths("error", p, WIRE_ERROR_SIZE, dec_error, sizeof(d));
	check_unterminated("error.message", p, WIRE_ERROR_SIZE, 8, WIRE_MESSAGE_MAX, dec_error, sizeof(d));

	/* An error carries a negative errno; 0 or positive is not an error. */
	struct wire_error ok = { .code = 0 };
	p = encoded(wire_encode_error(buf, sizeof(buf), &ok), WIRE_ERROR, WIRE_ERROR_SIZE);
	CHECK_INT(wire_decode_error(p, WIRE_ERROR_SIZE, &d), -EBADMSG);

	CHECK_CAPS("error", WIRE_HEADER_SIZE + WIRE_ERROR_SIZE, wire_encode_error(buf, cap, &m));
	memset(m.message, 'm', sizeof(m.message));
	CHECK_INT(wire_encode_error(buf, sizeof(buf), &m), -ENAMETOOLONG);
}

static void test_status_detach(void)
{
	struct wire_status m = { .flags = 0 }, d = { .flags = 99 };
	const uint8_t *p = encoded(wire_encode_status(buf, sizeof(buf), &m), WIRE_STATUS, WIRE_STATUS_SIZE);
	CHECK_INT(wire_decode_status(p, WIRE_STATUS_SIZE, &d), 0);
	CHECK_U64(d.flags, 0);
	check_lengths("status", p, WIRE_STATUS_SIZE, dec_status, sizeof(d));
	buf[WIRE_HEADER_SIZE + 4] = 1; /* reserved */
	CHECK_INT(wire_decode_status(buf + WIRE_HEADER_SIZE, WIRE_STATUS_SIZE, &d), -EBADMSG);
	CHECK_CAPS("status", WIRE_HEADER_SIZE + WIRE_STATUS_SIZE, wire_encode_status(buf, cap, &m));

	encoded(wire_encode_detach(buf, sizeof(buf)), WIRE_DETACH, 0);
	CHECK_CAPS("detach", WIRE_HEADER_SIZE, wire_encode_detach(buf, cap));

	/* STATUS_REPLY: a header whose length is the JSON that follows; bigger than a request may be. */
	struct wire_header h = { 0 };
	CHECK_INT(wire_encode_status_reply_header(buf, sizeof(buf), 100000), WIRE_HEADER_SIZE);
	CHECK_INT(wire_header_decode(buf, WIRE_HEADER_SIZE, WIRE_MAX_REPLY, &h), 0);
	CHECK_INT(h.type, WIRE_STATUS_REPLY);
	CHECK_U64(h.length, 100000);
	CHECK_INT(wire_header_decode(buf, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &h), -EMSGSIZE);
	CHECK_INT(wire_encode_status_reply_header(buf, sizeof(buf), 0), WIRE_HEADER_SIZE);
	CHECK_INT(wire_header_decode(buf, WIRE_HEADER_SIZE, WIRE_MAX_REPLY, &h), 0);
	CHECK_U64(h.length, 0);
	CHECK_CAPS("status_reply header", WIRE_HEADER_SIZE, wire_encode_status_reply_header(buf, cap, 10));
	CHECK_INT(wire_encode_status_reply_header(buf, sizeof(buf), (size_t)WIRE_MAX_REPLY + 1), -EMSGSIZE);
}

static int dec_epoch_info(const void *p, size_t len, void *ret)
{
	return wire_decode_epoch_info(p, len, ret);
}

static int dec_epoch_info_reply(const void *p, size_t len, void *ret)
{
	return wire_decode_epoch_info_reply(p, len, ret);
}

static void test_epoch_info(void)
{
	struct wire_epoch_info m = { .flags = 0 }, d;
	snprintf(m.cursor, sizeof(m.cursor), "fc1-00000000000000aa-2-1-5-3-0-7-0-12345678");
	const uint8_t *p = encoded(wire_encode_epoch_info(buf, sizeof(buf), &m), WIRE_EPOCH_INFO, WIRE_EPOCH_INFO_SIZE);
	CHECK_INT(wire_decode_epoch_info(p, WIRE_EPOCH_INFO_SIZE, &d), 0);
	CHECK_STR(d.cursor, m.cursor);
	check_lengths("epoch_info", p, WIRE_EPOCH_INFO_SIZE, dec_epoch_info, sizeof(d));
	buf[WIRE_HEADER_SIZE + 4] = 1; /* reserved */
	CHECK_INT(wire_decode_epoch_info(buf + WIRE_HEADER_SIZE, WIRE_EPOCH_INFO_SIZE, &d), -EBADMSG);
	buf[WIRE_HEADER_SIZE + 4] = 0;
	buf[WIRE_HEADER_SIZE] = 1; /* flags */
	CHECK_INT(wire_decode_epoch_info(buf + WIRE_HEADER_SIZE, WIRE_EPOCH_INFO_SIZE, &d), -EBADMSG);
	memset(buf + WIRE_HEADER_SIZE, 'x', WIRE_EPOCH_INFO_SIZE); /* an unterminated cursor */
	memset(buf + WIRE_HEADER_SIZE, 0, 8);
	CHECK_INT(wire_decode_epoch_info(buf + WIRE_HEADER_SIZE, WIRE_EPOCH_INFO_SIZE, &d), -EBADMSG);
	CHECK_CAPS("epoch_info", WIRE_HEADER_SIZE + WIRE_EPOCH_INFO_SIZE, wire_encode_epoch_info(buf, cap, &m));

	struct wire_epoch_info_reply r = { .epoch = 3, .batches = UINT64_C(0x100000001), .first_batch = 77,
					   .units = 123456 }, dr;
	p = encoded(wire_encode_epoch_info_reply(buf, sizeof(buf), &r), WIRE_EPOCH_INFO_REPLY,
		    WIRE_EPOCH_INFO_REPLY_SIZE);
	CHECK_INT(wire_decode_epoch_info_reply(p, WIRE_EPOCH_INFO_REPLY_SIZE, &dr), 0);
	CHECK_U64(dr.epoch, 3);
	CHECK_U64(dr.batches, UINT64_C(0x100000001));
	CHECK_U64(dr.first_batch, 77);
	CHECK_U64(dr.units, 123456);
	check_lengths("epoch_info_reply", p, WIRE_EPOCH_INFO_REPLY_SIZE, dec_epoch_info_reply, sizeof(dr));
	CHECK_CAPS("epoch_info_reply", WIRE_HEADER_SIZE + WIRE_EPOCH_INFO_REPLY_SIZE,
		   wire_encode_epoch_info_reply(buf, cap, &r));
	CHECK_STR(wire_type_name(WIRE_EPOCH_INFO), "EPOCH_INFO");
}

static void put_le16(uint8_t *p, uint16_t v)
{
	v = htole16(v);
	memcpy(p, &v, 2);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

/* A header as a peer could send it. */
static void raw_header(uint8_t *h, uint32_t magic, uint16_t version, uint16_t type, uint32_t length,
		       uint32_t reserved)
{
	put_le32(h, magic);
	put_le16(h + 4, version);
	put_le16(h + 6, type);
	put_le32(h + 8, length);
	put_le32(h + 12, reserved);
}

static void test_header(void)
{
	uint8_t h[WIRE_HEADER_SIZE + 4];
	struct wire_header d;

	for (uint16_t t = 1; t < _WIRE_TYPE_MAX; t++) {
		raw_header(h, WIRE_MAGIC, WIRE_VERSION, t, 40, 0);
		d = (struct wire_header){ 0 };
		CHECK_INT(wire_header_decode(h, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &d), 0);
		CHECK_INT(d.type, t);
		CHECK_U64(d.length, 40);
		CHECK(strcmp(wire_type_name(t), "unknown") != 0, "type %u has no name", t);
	}
	CHECK_STR(wire_type_name(WIRE_ATTACH), "ATTACH");
	CHECK_STR(wire_type_name(_WIRE_TYPE_MAX), "unknown");

	/* Exactly max is allowed, one more is not. */
	raw_header(h, WIRE_MAGIC, WIRE_VERSION, WIRE_ATTACH, WIRE_MAX_REQUEST, 0);
	CHECK_INT(wire_header_decode(h, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &d), 0);
	raw_header(h, WIRE_MAGIC, WIRE_VERSION, WIRE_ATTACH, WIRE_MAX_REQUEST + 1, 0);
	CHECK_INT(wire_header_decode(h, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &d), -EMSGSIZE);
	raw_header(h, WIRE_MAGIC, WIRE_VERSION, WIRE_ATTACH, UINT32_MAX, 0);
	CHECK_INT(wire_header_decode(h, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &d), -EMSGSIZE);

	static const struct {
		const char *why;
		uint32_t magic;
		uint16_t version, type;
		uint32_t reserved;
	} bad[] = {
		{ "bad magic", 0x57444547, WIRE_VERSION, WIRE_HELLO, 0 },
		{ "byte-swapped magic", 0x46454457, WIRE_VERSION, WIRE_HELLO, 0 },
		{ "version 0", WIRE_MAGIC, 0, WIRE_HELLO, 0 },
		{ "type 0", WIRE_MAGIC, WIRE_VERSION, 0, 0 },
		{ "type _WIRE_TYPE_MAX", WIRE_MAGIC, WIRE_VERSION, _WIRE_TYPE_MAX, 0 },
		{ "type 0xffff", WIRE_MAGIC, WIRE_VERSION, 0xffff, 0 },
		{ "reserved 1", WIRE_MAGIC, WIRE_VERSION, WIRE_HELLO, 1 },
		{ "reserved 0x80000000", WIRE_MAGIC, WIRE_VERSION, WIRE_HELLO, 0x80000000u },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		raw_header(h, bad[i].magic, bad[i].version, bad[i].type, 8, bad[i].reserved);
		int r = wire_header_decode(h, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &d);
		CHECK(r == -EBADMSG, "header with %s: decode returned %d, expected -EBADMSG", bad[i].why, r);
	}

	/* Another version is decoded and returned: the server answers a HELLO of any version. */
	raw_header(h, WIRE_MAGIC, 2, WIRE_HELLO, 8, 0);
	int rv = wire_header_decode(h, WIRE_HEADER_SIZE, WIRE_MAX_REQUEST, &d);
	CHECK(rv == 0 && d.version == 2, "header with version 2: decode returned %d, version %u", rv, d.version);

	/* Fewer than 16 bytes is no header, even when what is there looks right. */
	raw_header(h, WIRE_MAGIC, WIRE_VERSION, WIRE_HELLO, 8, 0);
	for (size_t len = 0; len < WIRE_HEADER_SIZE; len++) {
		uint8_t *copy = malloc(len + 1);
		REQUIRE(copy, "out of memory");
		memcpy(copy, h, len);
		int r = wire_header_decode(copy, len, WIRE_MAX_REQUEST, &d);
		CHECK(r == -EBADMSG, "header of %zu bytes: decode returned %d, expected -EBADMSG", len, r);
		free(copy);
	}
	/* More bytes than the header (the payload follows) is fine. */
	CHECK_INT(wire_header_decode(h, sizeof(h), WIRE_MAX_REQUEST, &d), 0);
}

static void test_socket_path(void)
{
	char path[256];
	unsetenv("FEEDD_SOCKET");
	setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);

	CHECK_INT(wire_socket_path("/tmp/override.sock", path, sizeof(path)), 0);
	CHECK_STR(path, "/tmp/override.sock");

	setenv("FEEDD_SOCKET", "/tmp/env.sock", 1);
	CHECK_INT(wire_socket_path("/tmp/override.sock", path, sizeof(path)), 0);
	CHECK_STR(path, "/tmp/override.sock");
	CHECK_INT(wire_socket_path(NULL, path, sizeof(path)), 0);
	CHECK_STR(path, "/tmp/env.sock");
	CHECK_INT(wire_socket_path("", path, sizeof(path)), 0);
	CHECK_STR(path, "/tmp/env.sock");

	unsetenv("FEEDD_SOCKET");
	CHECK_INT(wire_socket_path(NULL, path, sizeof(path)), 0);
	if (geteuid() == 0)
		CHECK_STR(path, "/run/feedd/feedd.sock"); /* root ignores XDG_RUNTIME_DIR */
	else
		CHECK_STR(path, "/run/user/4242/feedd.sock");

	unsetenv("XDG_RUNTIME_DIR");
	CHECK_INT(wire_socket_path(NULL, path, sizeof(path)), 0);
	CHECK_STR(path, "/run/feedd/feedd.sock");

	/* A path that does not fit is an error, not a truncated path. */
	CHECK_INT(wire_socket_path("/tmp/override.sock", path, strlen("/tmp/override.sock")), -ENAMETOOLONG);
	CHECK_INT(wire_socket_path("/tmp/override.sock", path, strlen("/tmp/override.sock") + 1), 0);
	CHECK_INT(wire_socket_path(NULL, path, 8), -ENAMETOOLONG);

	/* The operator socket beside it: "-operator" before ".sock", else at the end; never truncated. */
	CHECK_INT(wire_operator_socket_path("/run/feedd/feedd.sock", path, sizeof(path)), 0);
	CHECK_STR(path, "/run/feedd/feedd-operator.sock");
	CHECK_INT(wire_operator_socket_path("/tmp/x", path, sizeof(path)), 0);
	CHECK_STR(path, "/tmp/x-operator");
	CHECK_INT(wire_operator_socket_path(".sock", path, sizeof(path)), 0);
	CHECK_STR(path, ".sock-operator");
	CHECK_INT(wire_operator_socket_path("/a.sock", path, strlen("/a-operator.sock")), -ENAMETOOLONG);
	CHECK_INT(wire_operator_socket_path("/a.sock", path, strlen("/a-operator.sock") + 1), 0);
}

int main(void)
{
	test_hello();
	test_hello_reply();
	test_attach();
	test_attach_reply();
	test_error();
	test_status_detach();
	test_epoch_info();
	test_header();
	test_socket_path();
	return unit_exit("test-wire");
}
