/* SPDX-License-Identifier: MIT */
/*
 * Connection framing (daemon/server/conn.c) on a minimal real server: no
 * feeds, one worker, a socket in a temporary directory, driven by running its
 * event loop between the client's writes. What a client is promised: a
 * request may arrive in any number of pieces, several requests in one write
 * are each answered, and a peer that breaks the framing (bytes that are not a
 * feedd message, a message over WIRE_MAX_REQUEST, file descriptors, a request
 * before HELLO, an unknown type) is dropped, counted under its reason, and
 * the fds it passed are closed. Nothing leaks an fd.
 */
#include <dirent.h>
#include <endian.h>
#include <event2/event.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "daemon/server/server.h"
#include "proto/wire.h"
#include "unit.h"

struct rig {
	struct event_base *base;
	struct producer *producer;
	struct server *srv;
	char dir[48], path[96];
};

/* Runs the server's loop for ms milliseconds. */
static void pump(struct rig *r, int ms)
{
	struct timeval tv = { .tv_sec = 0, .tv_usec = ms * 1000 };
	event_base_loopexit(r->base, &tv);
	event_base_dispatch(r->base);
}

static void rig_start(struct rig *r)
{
	snprintf(r->dir, sizeof(r->dir), "/tmp/feedd-test-conn-XXXXXX");
	REQUIRE(mkdtemp(r->dir), "mkdtemp: %s", strerror(errno));
	snprintf(r->path, sizeof(r->path), "%s/feedd.sock", r->dir);
	r->base = event_base_new();
	REQUIRE(r->base, "event_base_new failed");
	int e = producer_new(r->base, 1, IO_ENGINE_PREAD, 4, &r->producer);
	REQUIRE(e == 0, "producer_new: %s", strerror(-e));
	struct conf conf = {
		.ring_slots = 8,
		.socket_mode = 0600,
		.socket_group = -1,
		.max_connections = 64,
		.max_connections_per_uid = 64,
		/* as feedd.conf must (1..3600): at 0 the once-a-second tick closed any connection it found before its HELLO */
		.handshake_timeout_s = 30,
		.diagnosis = CONF_DIAGNOSIS_DEFAULTS,
	};
	struct server_config cfg = { .socket_path = r->path, .listen_fd = -1, .gpu_status = "unavailable: test" };
	char err[256] = "";
	e = server_new(r->base, &cfg, &conf, r->producer, NULL, 0, &r->srv, err, sizeof(err));
	REQUIRE(e == 0, "server_new: %s (%s)", strerror(-e), err);
}

static void rig_stop(struct rig *r)
{
	r->srv = server_free(r->srv);
	r->producer = producer_free(r->producer);
	event_base_free(r->base);
	rmdir(r->dir);
}

static struct server_counters counters(struct rig *r)
{
	struct status_input in;
	REQUIRE(server_snapshot(r->srv, &in) == 0, "server_snapshot failed");
	struct server_counters n = in.counters;
	status_input_clear(&in);
	return n;
}

static int client(struct rig *r)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	REQUIRE(fd >= 0, "socket: %s", strerror(errno));
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", r->path);
	REQUIRE(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s", strerror(errno));
	pump(r, 10); /* accepted */
	return fd;
}

static size_t hello(uint8_t *buf, size_t cap)
{
	struct wire_hello h = { .min_version = WIRE_VERSION, .max_version = WIRE_VERSION, .pid = (uint32_t)getpid() };
	snprintf(h.name, sizeof(h.name), "test-conn");
	int n = wire_encode_hello(buf, cap, &h);
	REQUIRE(n > 0, "wire_encode_hello: %d", n);
	return (size_t)n;
}

static size_t status_req(uint8_t *buf, size_t cap)
{
	struct wire_status st = { 0 };
	int n = wire_encode_status(buf, cap, &st);
	REQUIRE(n > 0, "wire_encode_status: %d", n);
	return (size_t)n;
}

/* A raw header: any magic, version, type and length. */
static void header(uint8_t *buf, uint32_t magic, uint16_t version, uint16_t type, uint32_t length)
{
	memset(buf, 0, WIRE_HEADER_SIZE);
	magic = htole32(magic);
	version = htole16(version);
	type = htole16(type);
	length = htole32(length);
	memcpy(buf, &magic, 4);
	memcpy(buf + 4, &version, 2);
	memcpy(buf + 6, &type, 2);
	memcpy(buf + 8, &length, 4);
}

/*
 * Reads one whole message the daemon sent, running the loop while it comes.
 * Returns its type (payload length in *ret_len), 0 at EOF, -1 when nothing came.
 */
static int recv_msg(struct rig *r, int fd, uint8_t *buf, size_t cap, uint32_t *ret_len)
{
	size_t have = 0, want = WIRE_HEADER_SIZE;
	for (int tries = 0; tries < 200 && have < want; tries++) {
		ssize_t n = recv(fd, buf + have, MIN(want, cap) - have, MSG_DONTWAIT);
		if (n == 0)
			return 0;
		if (n < 0) {
			pump(r, 5);
			continue;
		}
		have += (size_t)n;
		if (have >= WIRE_HEADER_SIZE && want == WIRE_HEADER_SIZE) {
			uint32_t len;
			memcpy(&len, buf + 8, 4);
			want = WIRE_HEADER_SIZE + le32toh(len);
			REQUIRE(want <= cap, "reply of %zu bytes", want);
		}
	}
	if (have < want)
		return -1;
	uint16_t type;
	memcpy(&type, buf + 6, 2);
	*ret_len = (uint32_t)(want - WIRE_HEADER_SIZE);
	return le16toh(type);
}

/* Whether the daemon closed the connection (after running its loop a little). */
static bool dropped(struct rig *r, int fd)
{
	uint8_t b[256];
	for (int tries = 0; tries < 100; tries++) {
		pump(r, 5);
		ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return true;
	}
	return false;
}

static unsigned open_fds(void)
{
	unsigned n = 0;
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static uint8_t reply[WIRE_MAX_REPLY + WIRE_HEADER_SIZE];

/* HELLO one byte at a time (the header itself split 16 ways), then HELLO's reply; then STATUS, then DETACH. */
static void test_split(struct rig *r)
{
	int fd = client(r);
	uint8_t m[WIRE_MAX_REQUEST];
	size_t n = hello(m, sizeof(m));
	for (size_t i = 0; i < n; i++) {
		CHECK(send(fd, m + i, 1, MSG_NOSIGNAL) == 1, "send byte %zu: %s", i, strerror(errno));
		pump(r, 2);
		/* Nothing is answered before the last byte. */
		if (i + 1 < n)
			CHECK(recv(fd, reply, 1, MSG_DONTWAIT | MSG_PEEK) < 0, "a reply after %zu of %zu bytes", i + 1, n);
	}
	uint32_t len = 0;
	CHECK_INT(recv_msg(r, fd, reply, sizeof(reply), &len), WIRE_HELLO_REPLY);
	CHECK_INT(len, WIRE_HELLO_REPLY_SIZE);
	struct wire_hello_reply hr;
	CHECK_INT(wire_decode_hello_reply(reply + WIRE_HEADER_SIZE, len, &hr), 0);
	CHECK_INT(hr.version, WIRE_VERSION);
	CHECK_INT(hr.daemon_pid, getpid());

	n = status_req(m, sizeof(m));
	CHECK(send(fd, m, 5, MSG_NOSIGNAL) == 5, "send: %s", strerror(errno));
	pump(r, 5);
	CHECK(send(fd, m + 5, n - 5, MSG_NOSIGNAL) == (ssize_t)(n - 5), "send: %s", strerror(errno));
	CHECK_INT(recv_msg(r, fd, reply, sizeof(reply), &len), WIRE_STATUS_REPLY);
	CHECK(len > 20 && memcmp(reply + WIRE_HEADER_SIZE, "{\"daemon\":", 10) == 0, "status document: %.40s",
	      (const char *)reply + WIRE_HEADER_SIZE);

	n = (size_t)wire_encode_detach(m, sizeof(m));
	CHECK(send(fd, m, n, MSG_NOSIGNAL) == (ssize_t)n, "send: %s", strerror(errno));
	CHECK(dropped(r, fd), "DETACH did not close the connection");
	close(fd);
	CHECK_U64(counters(r).protocol_errors, 0);
}

/* HELLO, STATUS and STATUS in one write: three replies, in order. */
static void test_batched(struct rig *r)
{
	int fd = client(r);
	uint8_t m[WIRE_MAX_REQUEST];
	size_t n = hello(m, sizeof(m));
	n += status_req(m + n, sizeof(m) - n);
	n += status_req(m + n, sizeof(m) - n);
	CHECK(send(fd, m, n, MSG_NOSIGNAL) == (ssize_t)n, "send: %s", strerror(errno));
	uint32_t len;
	CHECK_INT(recv_msg(r, fd, reply, sizeof(reply), &len), WIRE_HELLO_REPLY);
	CHECK_INT(recv_msg(r, fd, reply, sizeof(reply), &len), WIRE_STATUS_REPLY);
	CHECK_INT(recv_msg(r, fd, reply, sizeof(reply), &len), WIRE_STATUS_REPLY);
	close(fd);
	pump(r, 5);
	CHECK_U64(counters(r).protocol_errors, 0);
}

/* Sends bytes after HELLO (or instead of it) and checks the daemon drops the peer under `field`. */
static void expect_drop(struct rig *r, bool say_hello, const uint8_t *bytes, size_t n, size_t field, const char *what)
{
	struct server_counters before = counters(r);
	int fd = client(r);
	uint8_t m[WIRE_MAX_REQUEST];
	if (say_hello) {
		size_t h = hello(m, sizeof(m));
		CHECK(send(fd, m, h, MSG_NOSIGNAL) == (ssize_t)h, "send: %s", strerror(errno));
		uint32_t len;
		CHECK_INT(recv_msg(r, fd, reply, sizeof(reply), &len), WIRE_HELLO_REPLY);
	}
	CHECK(send(fd, bytes, n, MSG_NOSIGNAL) == (ssize_t)n, "%s: send: %s", what, strerror(errno));
	CHECK(dropped(r, fd), "%s: the connection was not dropped", what);
	close(fd);
	struct server_counters after = counters(r);
	uint64_t b = *(const uint64_t *)((const char *)&before + field), a = *(const uint64_t *)((const char *)&after + field);
	CHECK(a == b + 1, "%s: counter went %" PRIu64 " -> %" PRIu64 ", expected +1", what, b, a);
	CHECK(after.protocol_errors == before.protocol_errors + 1, "%s: protocol_errors %" PRIu64 " -> %" PRIu64, what,
	      before.protocol_errors, after.protocol_errors);
}

static void test_violations(struct rig *r)
{
	static uint8_t m[2 * WIRE_MAX_REQUEST];
	/* One byte over WIRE_MAX_REQUEST: refused on the header alone, before the payload. */
	header(m, WIRE_MAGIC, WIRE_VERSION, WIRE_STATUS, WIRE_MAX_REQUEST - WIRE_HEADER_SIZE + 1);
	expect_drop(r, true, m, WIRE_HEADER_SIZE, offsetof(struct server_counters, oversized), "oversized header");
	/* ... and with its payload sent too (the input buffer must not overflow). */
	memset(m + WIRE_HEADER_SIZE, 'x', WIRE_MAX_REQUEST);
	expect_drop(r, true, m, WIRE_MAX_REQUEST + 1, offsetof(struct server_counters, oversized), "oversized message");
	/* Exactly WIRE_MAX_REQUEST fits the framing: it is read whole, then refused as a malformed STATUS. */
	header(m, WIRE_MAGIC, WIRE_VERSION, WIRE_STATUS, WIRE_MAX_REQUEST - WIRE_HEADER_SIZE);
	expect_drop(r, true, m, WIRE_MAX_REQUEST, offsetof(struct server_counters, bad_message), "largest request");

	header(m, 0x50545448 /* "HTTP" */, WIRE_VERSION, WIRE_STATUS, 0);
	expect_drop(r, true, m, WIRE_HEADER_SIZE, offsetof(struct server_counters, bad_magic), "bad magic");
	header(m, WIRE_MAGIC, WIRE_VERSION, 999, 0);
	expect_drop(r, true, m, WIRE_HEADER_SIZE, offsetof(struct server_counters, unknown_type), "unknown type");
	header(m, WIRE_MAGIC, WIRE_VERSION + 1, WIRE_STATUS, WIRE_STATUS_SIZE);
	memset(m + WIRE_HEADER_SIZE, 0, WIRE_STATUS_SIZE);
	expect_drop(r, true, m, WIRE_HEADER_SIZE + WIRE_STATUS_SIZE, offsetof(struct server_counters, bad_version),
		    "another version after HELLO");
	/* A request before HELLO. */
	size_t n = status_req(m, sizeof(m));
	expect_drop(r, false, m, n, offsetof(struct server_counters, bad_message), "STATUS before HELLO");
	/* A second HELLO. */
	n = hello(m, sizeof(m));
	expect_drop(r, true, m, n, offsetof(struct server_counters, bad_message), "second HELLO");
}

/* A HELLO that carries an fd: dropped, and the daemon closed its copy of the fd. */
static void test_passed_fd(struct rig *r)
{
	struct server_counters before = counters(r);
	int fd = client(r);
	int p[2];
	REQUIRE(pipe2(p, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));
	uint8_t m[WIRE_MAX_REQUEST];
	size_t n = hello(m, sizeof(m));
	struct iovec iov = { .iov_base = m, .iov_len = n };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	memset(&cm, 0, sizeof(cm));
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf) };
	struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
	h->cmsg_level = SOL_SOCKET;
	h->cmsg_type = SCM_RIGHTS;
	h->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(h), &p[0], sizeof(int));
	CHECK(sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)n, "sendmsg: %s", strerror(errno));
	close(p[0]); /* the daemon's copy is now the only read end */
	CHECK(dropped(r, fd), "a HELLO with an fd was not dropped");
	close(fd);
	struct server_counters after = counters(r);
	CHECK_U64(after.passed_fds, before.passed_fds + 1);
	/* The daemon closed the read end it received: writing to the pipe finds no reader. */
	char c = 'x';
	CHECK(write(p[1], &c, 1) < 0 && errno == EPIPE, "the passed fd is still open in the daemon");
	close(p[1]);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	unsigned fds = open_fds();
	struct rig r = { 0 };
	rig_start(&r);
	test_split(&r);
	test_batched(&r);
	test_violations(&r);
	test_passed_fd(&r);
	rig_stop(&r);
	CHECK(open_fds() == fds, "%u fds open at the end, %u at the start", open_fds(), fds);
	return unit_exit("conn");
}
