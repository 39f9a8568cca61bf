/* SPDX-License-Identifier: MIT */
/*
 * libfeed against a hostile daemon. A forked child plays feedd on a real
 * socket with real memfds (encoded with proto/wire.c, so only the daemon's
 * behaviour is fake) and the parent drives libfeed's public API:
 *
 *  - a daemon that passes the ATTACH_REPLY fds and then resets the connection
 *    mid-message: libfeed must close each fd it received once, and no fd it
 *    did not receive. `close` is interposed: every close libfeed makes is
 *    followed by an open that takes the freed number, as another thread of
 *    the trainer would, and those files must still be open afterwards;
 *  - a daemon that rewrites the ring's geometry (header_size, slot_size,
 *    offsets, cu_capacity) after the attach was validated: next() must keep
 *    to the geometry it validated, never read outside the mapping;
 *  - NULL for every pointer argument of the public API: -EINVAL (or a NULL /
 *    zero result), never a crash.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "feed/feed.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"
#include "proto/wire.h"
#include "tests/unit/fake-daemon.h"
#include "tests/unit/unit.h"

/* ---- close() as seen by libfeed ---- */

static bool race;          /* after each close, take the freed number, as another thread would */
static int others[64];     /* the fds taken that way: "another thread's" files */
static unsigned n_others;

__attribute__((visibility("default"))) int close(int fd);
__attribute__((visibility("default"))) int close(int fd)
{
	int r = (int)syscall(SYS_close, fd);
	if (race && r == 0 && n_others < ARRAY_SIZE(others)) {
		int o = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (o >= 0)
			others[n_others++] = o;
	}
	return r;
}

static void others_check_and_close(const char *what)
{
	for (unsigned i = 0; i < n_others; i++) {
		CHECK(fcntl(others[i], F_GETFD) >= 0, "%s: libfeed closed fd %d, which it did not own", what, others[i]);
		syscall(SYS_close, others[i]);
	}
	n_others = 0;
}

/* ---- the fake daemon ---- */

#define B 1
#define L 8
#define SLOTS 2
#define SLOT_SIZE 4096
#define RING_SIZE (FEED_RING_HEADER_SIZE + SLOTS * SLOT_SIZE)

static char sock_path[108];

static int listen_on(const char *dir)
{
	snprintf(sock_path, sizeof(sock_path), "%s/fake.sock", dir);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 4) < 0) {
		perror("fake daemon: listen");
		exit(1);
	}
	return fd;
}

/*
 * The reset: ATTACH_REPLY's header alone, then 8 bytes of its payload with
 * the four fds, then the connection closes with the client's ATTACH unread
 * (so the client's next read fails with ECONNRESET, not EOF).
 */
static void fake_reset(int lfd)
{
	int fd = fake_hello(lfd);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	poll(&p, 1, 10000); /* the ATTACH has arrived: leave it unread */
	struct wire_attach_reply rep = { .ring_size = RING_SIZE, .consumer_size = FEED_CONSUMER_PAGE_SIZE,
					 .slot_count = SLOTS, .batch_size = B, .seq_len = L, .n_fds = 4 };
	uint8_t out[WIRE_HEADER_SIZE + WIRE_ATTACH_REPLY_SIZE];
	wire_encode_attach_reply(out, sizeof(out), &rep);
	int fds[4];
	for (unsigned i = 0; i < 4; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	send_msg(fd, out, WIRE_HEADER_SIZE, NULL, 0);
	usleep(100 * 1000); /* two reads on the client's side: the header, then the payload with the fds */
	send_msg(fd, out + WIRE_HEADER_SIZE, 8, fds, 4);
	usleep(100 * 1000);
	_exit(0);
}

static void test_reset_mid_attach(const char *dir)
{
	int lfd = listen_on(dir);
	pid_t pid = fork();
	if (pid == 0)
		fake_reset(lfd);
	syscall(SYS_close, lfd);

	feed_client *c;
	int r = feed_client_connect(sock_path, &c);
	CHECK_INT(r, 0);
	if (r < 0)
		goto out;
	race = true;
	r = feed_client_attach(c, "web", 0, 1, NULL);
	race = false;
	CHECK(r == -ECONNRESET || r == -EPROTO, "attach to a daemon that reset: %d (%s)", r, feed_client_error(c));
	/* libfeed closed each received fd once: 4 closes, 4 numbers taken by "another thread", all still open. */
	CHECK_INT(n_others, 4);
	others_check_and_close("connection reset mid-attach");
	feed_client_close(c);
out:
	waitpid(pid, NULL, 0);
	unlink(sock_path);
}

/*
 * The rewrite: a valid ring, attached and validated; once the client says so
 * (a byte on `go`), the daemon moves header_size, slot_size and every offset
 * past the mapping and publishes one batch (in slot 0 where the geometry of
 * the attach puts it).
 */
static void fake_rewrite(int lfd, int go, int done)
{
	int fd = fake_hello(lfd);
	uint8_t in[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE];
	read_exact(fd, in, sizeof(in));
	int ring = sealed_memfd("ring", RING_SIZE), cons = sealed_memfd("consumer", FEED_CONSUMER_PAGE_SIZE);
	struct feed_ring_header *h = mmap(NULL, RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
	struct feed_consumer_page *cp = mmap(NULL, FEED_CONSUMER_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, cons, 0);
	if (h == MAP_FAILED || cp == MAP_FAILED)
		_exit(6);
	*h = (struct feed_ring_header){ .magic = FEED_RING_MAGIC, .version = FEED_RING_VERSION,
					.header_size = FEED_RING_HEADER_SIZE, .slot_count = SLOTS, .slot_size = SLOT_SIZE,
					.batch_size = B, .seq_len = L, .off_input_ids = 1024, .off_labels = 1088,
					.off_position_ids = 1152, .off_cu_seqlens = 1216, .cu_capacity = B * L + 1,
					.world = 1, .state = FEED_RING_RUNNING };
	cp->magic = FEED_CONSUMER_MAGIC;
	cp->version = FEED_RING_VERSION;
	struct wire_attach_reply rep = { .ring_size = RING_SIZE, .consumer_size = FEED_CONSUMER_PAGE_SIZE,
					 .slot_count = SLOTS, .batch_size = B, .seq_len = L, .n_fds = 4 };
	uint8_t out[WIRE_HEADER_SIZE + WIRE_ATTACH_REPLY_SIZE];
	int n = wire_encode_attach_reply(out, sizeof(out), &rep);
	int fds[4] = { ring, cons, eventfd(0, EFD_CLOEXEC), eventfd(0, EFD_CLOEXEC) };
	send_msg(fd, out, (size_t)n, fds, 4);

	char b;
	read_exact(go, &b, 1);
	uint8_t *slot = (uint8_t *)h + FEED_RING_HEADER_SIZE;
	struct feed_slot_header *s = (struct feed_slot_header *)slot;
	*s = (struct feed_slot_header){ .seq = 0, .batch_index = 0, .world = 1, .batch_size = B, .seq_len = L,
					.n_cu_seqlens = 2 };
	int32_t *cu = (int32_t *)(slot + 1216);
	cu[0] = 0;
	cu[1] = L;
	for (unsigned i = 0; i < L; i++)
		((int32_t *)(slot + 1024))[i] = (int32_t)(100 + i);
	h->header_size = 0x7fff0000u;
	h->slot_size = 0x10000000u;
	h->off_input_ids = h->off_labels = h->off_position_ids = h->off_cu_seqlens = 0x0ffff000u;
	h->cu_capacity = UINT32_MAX;
	__atomic_store_n(&h->head, 1, __ATOMIC_RELEASE);
	if (write(done, "x", 1) != 1)
		_exit(7);
	read_exact(go, &b, 1); /* hold the connection until the client is done */
	_exit(0);
}

/* Where this process maps the fake daemon's ring (memfd "ring"), from /proc/self/maps; NULL if not found. */
static const void *ring_mapping(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	unsigned long lo = 0, hi = 0;
	bool found = false;
	while (f && !found && fgets(line, sizeof(line), f))
		found = strstr(line, "/memfd:ring ") && sscanf(line, "%lx-%lx", &lo, &hi) == 2 && hi - lo == RING_SIZE;
	if (f)
		fclose(f);
	return found ? (const void *)lo : NULL;
}

static bool inside(const void *p, size_t len, const void *base, size_t size)
{
	return (const uint8_t *)p >= (const uint8_t *)base && (const uint8_t *)p + len <= (const uint8_t *)base + size;
}

static void test_geometry_rewritten_after_attach(const char *dir)
{
	int go[2], done[2];
	if (pipe2(go, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) {
		perror("pipe2");
		exit(1);
	}
	int lfd = listen_on(dir);
	pid_t pid = fork();
	if (pid == 0)
		fake_rewrite(lfd, go[0], done[1]);
	syscall(SYS_close, lfd);

	feed_client *c;
	int r = feed_client_connect(sock_path, &c);
	CHECK_INT(r, 0);
	if (r == 0)
		r = feed_client_attach(c, "web", 0, 1, NULL);
	CHECK(r == 0, "attach to the fake daemon: %d (%s)", r, r ? feed_client_error(c) : "");
	if (r == 0) {
		/* The fake daemon's HELLO_REPLY lacks WIRE_DAEMON_EPOCH_INFO: an old daemon, never asked. */
		struct feed_epoch_info info;
		CHECK_INT(feed_client_epoch_info(c, NULL, &info), -EOPNOTSUPP);
		CHECK_CONTAINS(feed_client_error(c), "too old");
	}
	if (r == 0) {
		char b;
		if (write(go[1], "x", 1) != 1 || read(done[0], &b, 1) != 1)
			CHECK(false, "the fake daemon did not rewrite the ring");
		const void *base = ring_mapping();
		CHECK(base != NULL, "cannot find the ring's mapping in /proc/self/maps");
		struct feed_batch batch;
		r = feed_client_next(c, 2000, &batch);
		CHECK(r == 0 || r == -EPROTO, "next() after the geometry changed: %d (%s)", r, feed_client_error(c));
		if (r == 0) {
			CHECK(inside(batch.input_ids, 4 * B * L, base, RING_SIZE) &&
				      inside(batch.labels, 4 * B * L, base, RING_SIZE) &&
				      inside(batch.position_ids, 4 * B * L, base, RING_SIZE) &&
				      inside(batch.cu_seqlens, 4 * batch.n_cu_seqlens, base, RING_SIZE),
			      "next() hands out arrays outside slot 0 of the ring");
			CHECK_INT(batch.input_ids[0], 100);
			CHECK_INT(batch.input_ids[L - 1], 100 + L - 1);
			CHECK_INT(batch.cu_seqlens[1], L);
		}
	}
	if (write(go[1], "x", 1) < 0)
		perror("write");
	feed_client_close(c);
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the fake daemon failed: status %d", status);
	unlink(sock_path);
}

/* ---- NULL arguments ---- */

static void test_null_arguments(void)
{
	feed_client *c = NULL;
	struct feed_batch b = { 0 };
	struct feed_stats st;
	struct feed_device_batch db;
	char *s = NULL;
	CHECK_INT(feed_client_connect(NULL, NULL), -EINVAL);
	CHECK_INT(feed_client_connect_err(NULL, NULL, 0, NULL), -EINVAL);
	CHECK_INT(feed_client_attach(NULL, "web", 0, 1, NULL), -EINVAL);
	CHECK_INT(feed_client_attach_device(NULL, "web", 0, 1, NULL, 0, 0), -EINVAL);
	CHECK_INT(feed_client_next(NULL, 0, &b), -EINVAL);
	CHECK_INT(feed_client_release(NULL, &b), -EINVAL);
	CHECK(feed_client_cursor(NULL) == NULL, "feed_client_cursor(NULL)");
	CHECK_INT(feed_client_slots(NULL), 0);
	CHECK_INT(feed_client_report(NULL, 1, 1), -EINVAL);
	CHECK_INT(feed_client_stats(NULL, &st), -EINVAL);
	CHECK_INT(feed_client_status(NULL, &s), -EINVAL);
	CHECK_INT(feed_client_status_flags(NULL, FEED_STATUS_NO_HISTORY, &s), -EINVAL);
	CHECK_INT(feed_client_reload(NULL, &s), -EINVAL);
	CHECK_INT(feed_client_drain(NULL, "web", &s), -EINVAL);
	CHECK_INT(feed_client_device(NULL), -EINVAL);
	CHECK_INT(feed_client_device_batch(NULL, &b, NULL, &db), -EINVAL);
	CHECK_INT(feed_client_device_done(NULL, &b, NULL), -EINVAL);
	CHECK_INT(feed_client_set_reconnect_timeout(NULL, 1000), -EINVAL);
	CHECK_INT(feed_client_reconnect_stats(NULL, NULL, NULL), -EINVAL);
	CHECK(feed_client_error(NULL) != NULL, "feed_client_error(NULL) is a string");
	CHECK(feed_client_close(NULL) == NULL, "feed_client_close(NULL)");
	(void)c;
}

/* The same on a connected client: NULL outputs. */
static void test_null_outputs(const char *dir)
{
	int lfd = listen_on(dir);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = fake_hello(lfd);
		char b;
		while (read(fd, &b, 1) > 0)
			;
		_exit(0);
	}
	syscall(SYS_close, lfd);
	feed_client *c;
	int r = feed_client_connect(sock_path, &c);
	CHECK_INT(r, 0);
	if (r == 0) {
		CHECK_INT(feed_client_next(c, 0, NULL), -EINVAL);
		CHECK_INT(feed_client_release(c, NULL), -EINVAL);
		CHECK_INT(feed_client_stats(c, NULL), -EINVAL);
		CHECK_INT(feed_client_status(c, NULL), -EINVAL);
		CHECK_INT(feed_client_status_flags(c, FEED_STATUS_NO_HISTORY, NULL), -EINVAL);
		char *s = NULL;
		CHECK_INT(feed_client_status_flags(c, 4, &s), -EINVAL);
		CHECK_INT(feed_client_reload(c, NULL), -EINVAL);
		CHECK_INT(feed_client_drain(c, "web", NULL), -EINVAL);
		CHECK_INT(feed_client_attach(c, NULL, 0, 1, NULL), -EINVAL);
		CHECK_INT(feed_client_device_batch(c, NULL, NULL, NULL), -EINVAL);
		CHECK_INT(feed_client_epoch_info(c, NULL, NULL), -EINVAL);
		struct feed_epoch_info info;
		CHECK_INT(feed_client_epoch_info(c, NULL, &info), -ENOTCONN);
		CHECK_INT(feed_client_set_reconnect_timeout(c, -1), -EINVAL);
		CHECK_INT(feed_client_set_reconnect_timeout(c, 0), 0);
		CHECK_INT(feed_client_reconnect_stats(c, NULL, NULL), 0);
		uint64_t n = 7, ns = 7;
		CHECK_INT(feed_client_reconnect_stats(c, &n, &ns), 0);
		CHECK(n == 0 && ns == 0, "no reconnect yet");
		feed_client_close(c);
	}
	waitpid(pid, NULL, 0);
	unlink(sock_path);
}

int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : ""; /* reset, geometry or null: one test alone */
	signal(SIGPIPE, SIG_IGN);
	char dir[] = "/tmp/test-libfeed-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	if (!*only || strcmp(only, "reset") == 0)
		test_reset_mid_attach(dir);
	if (!*only || strcmp(only, "geometry") == 0)
		test_geometry_rewritten_after_attach(dir);
	if (!*only || strcmp(only, "null") == 0) {
		test_null_arguments();
		test_null_outputs(dir);
	}
	rmdir(dir);
	return unit_exit("test-libfeed");
}
