/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the control-message decoders of proto/wire.c, as the daemon
 * and libfeed run them on bytes from an untrusted peer.
 *
 * Input: the first byte picks the decoder (0-6), the rest is its payload; any
 * other first byte treats the rest as a stream of framed messages, decoded
 * one after another the way a connection reads them. Promises checked: no
 * decoder reads outside its input (ASan), an accepted message re-encodes to
 * the exact size and decodes again to the same values, and every accepted
 * string is NUL-terminated inside its field.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "proto/wire.h"
#include "tests/fuzz/fuzz.h"

unsigned long fuzz_accepted;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

static void check_str(const char *s, size_t size)
{
	assert(memchr(s, 0, size) != NULL);
}

/* Decodes one payload of `type`; an accepted one must survive encode + decode unchanged. */
static void decode_one(unsigned type, const uint8_t *p, size_t n)
{
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE + WIRE_ERROR_SIZE];
	int k;

	switch (type) {
	case WIRE_HELLO: {
		struct wire_hello a, b;
		if (wire_decode_hello(p, n, &a) < 0)
			return;
		assert(n == WIRE_HELLO_SIZE && a.min_version <= a.max_version);
		check_str(a.name, sizeof(a.name));
		k = wire_encode_hello(buf, sizeof(buf), &a);
		assert(k == WIRE_HEADER_SIZE + WIRE_HELLO_SIZE);
		assert(wire_decode_hello(buf + WIRE_HEADER_SIZE, (size_t)k - WIRE_HEADER_SIZE, &b) == 0);
		assert(a.min_version == b.min_version && a.max_version == b.max_version && a.pid == b.pid &&
		       strcmp(a.name, b.name) == 0);
		break;
	}
	case WIRE_HELLO_REPLY: {
		struct wire_hello_reply a, b;
		if (wire_decode_hello_reply(p, n, &a) < 0)
			return;
		check_str(a.daemon_version, sizeof(a.daemon_version));
		k = wire_encode_hello_reply(buf, sizeof(buf), &a);
		assert(k == WIRE_HEADER_SIZE + WIRE_HELLO_REPLY_SIZE);
		assert(wire_decode_hello_reply(buf + WIRE_HEADER_SIZE, (size_t)k - WIRE_HEADER_SIZE, &b) == 0);
		assert(a.version == b.version && a.daemon_pid == b.daemon_pid && a.flags == b.flags &&
		       strcmp(a.daemon_version, b.daemon_version) == 0);
		break;
	}
	case WIRE_ATTACH: {
		struct wire_attach a, b;
		if (wire_decode_attach(p, n, &a) < 0)
			return;
		/* What the daemon relies on before looking the feed up. */
		assert(a.world > 0 && a.rank < a.world && a.feed[0] != 0);
		check_str(a.feed, sizeof(a.feed));
		check_str(a.cursor, sizeof(a.cursor));
		assert(!!(a.flags & WIRE_ATTACH_RESUME) == (a.cursor[0] != 0));
		k = wire_encode_attach(buf, sizeof(buf), &a);
		assert(k == WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE);
		assert(wire_decode_attach(buf + WIRE_HEADER_SIZE, (size_t)k - WIRE_HEADER_SIZE, &b) == 0);
		assert(a.rank == b.rank && a.world == b.world && a.flags == b.flags && strcmp(a.feed, b.feed) == 0 &&
		       strcmp(a.cursor, b.cursor) == 0);
		break;
	}
	case WIRE_ATTACH_REPLY: {
		struct wire_attach_reply a, b;
		if (wire_decode_attach_reply(p, n, &a) < 0)
			return;
		assert(a.n_fds == WIRE_ATTACH_FDS);
		k = wire_encode_attach_reply(buf, sizeof(buf), &a);
		assert(k == WIRE_HEADER_SIZE + WIRE_ATTACH_REPLY_SIZE);
		assert(wire_decode_attach_reply(buf + WIRE_HEADER_SIZE, (size_t)k - WIRE_HEADER_SIZE, &b) == 0);
		assert(a.ring_size == b.ring_size && a.consumer_size == b.consumer_size &&
		       a.fingerprint == b.fingerprint && a.first_batch == b.first_batch && a.slot_count == b.slot_count &&
		       a.batch_size == b.batch_size && a.seq_len == b.seq_len);
		break;
	}
	case WIRE_ERROR: {
		struct wire_error a, b;
		if (wire_decode_error(p, n, &a) < 0)
			return;
		assert(a.code < 0);
		check_str(a.message, sizeof(a.message));
		k = wire_encode_error(buf, sizeof(buf), &a);
		assert(k == WIRE_HEADER_SIZE + WIRE_ERROR_SIZE);
		assert(wire_decode_error(buf + WIRE_HEADER_SIZE, (size_t)k - WIRE_HEADER_SIZE, &b) == 0);
		assert(a.code == b.code && strcmp(a.message, b.message) == 0);
		break;
	}
	case WIRE_STATUS: {
		struct wire_status a, b;
		if (wire_decode_status(p, n, &a) < 0)
			return;
		k = wire_encode_status(buf, sizeof(buf), &a);
		assert(k == WIRE_HEADER_SIZE + WIRE_STATUS_SIZE);
		assert(wire_decode_status(buf + WIRE_HEADER_SIZE, (size_t)k - WIRE_HEADER_SIZE, &b) == 0);
		assert(a.flags == b.flags);
		break;
	}
	default:
		return;
	}
	fuzz_accepted++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const unsigned types[] = { WIRE_HELLO, WIRE_HELLO_REPLY, WIRE_ATTACH, WIRE_ATTACH_REPLY,
					  WIRE_ERROR, WIRE_STATUS, WIRE_DETACH };
	if (size == 0)
		return 0;
	if (data[0] < sizeof(types) / sizeof(types[0])) {
		decode_one(types[data[0]], data + 1, size - 1);
		return 0;
	}
	/* A connection's byte stream: header, then exactly `length` payload bytes, repeated. */
	const uint8_t *p = data + 1;
	size_t left = size - 1;
	while (left >= WIRE_HEADER_SIZE) {
		struct wire_header h;
		int r = wire_header_decode(p, left, WIRE_MAX_REQUEST, &h);
		if (r < 0) {
			assert(r == -EBADMSG || r == -EMSGSIZE);
			break;
		}
		assert(h.version != 0 && h.type != 0 && h.type < _WIRE_TYPE_MAX && h.length <= WIRE_MAX_REQUEST);
		assert(wire_type_name(h.type) != NULL);
		p += WIRE_HEADER_SIZE;
		left -= WIRE_HEADER_SIZE;
		if (h.length > left)
			break;
		decode_one(h.type, p, h.length);
		p += h.length;
		left -= h.length;
	}
	return 0;
}
