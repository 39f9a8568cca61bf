/* SPDX-License-Identifier: MIT */
/*
 * A device attachment across a daemon that dies: libfeed must attach again
 * as a device attachment and import the new daemon's buffers and events
 * (issue 17). No GPU: the daemon is a forked child on a real socket with
 * real memfds (its "device memory" is a memfd exported as a VMM fd), and
 * the CUDA driver is tests/unit/fake-cuda (libcuda.so.1 on LD_LIBRARY_PATH),
 * which maps that fd so device addresses can be read back, and counts the
 * imports, releases, events and records. The device copy of each batch
 * differs from its host copy (+1000 per daemon generation), so reading the
 * right device buffer is what the test sees.
 *
 * Two daemons in turn on one socket: the first publishes batches 0 and 1,
 * (of 3 slots) then closes everything (a SIGKILL as the client sees it); the second must
 * get an ATTACH with the device flags and the cursor of batch 1, and
 * publishes batches 2 and 3. Batch 1 is held across the reconnect: its
 * host view stays valid, its device buffer stays imported until it is
 * released, and no event of the dead daemon is recorded for it.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "feed/feed.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"
#include "proto/wire.h"
#include "tests/unit/fake-cuda/fake-cuda.h"
#include "tests/unit/fake-daemon.h"
#include "tests/unit/unit.h"

#define B 1
#define L 8
#define SLOTS 3 /* each daemon publishes 2: the second ring starts at client sequence 2, not a multiple of 3 */
#define PUBLISHED 2
#define SLOT_SIZE 4096
#define RING_SIZE (FEED_RING_HEADER_SIZE + SLOTS * SLOT_SIZE)
#define OFF_INPUT_IDS 1024

static char sock_path[108];

/* The host copy of batch b's input_ids[j], and its device copy as daemon generation gen staged it. */
static int32_t host_value(uint64_t b, unsigned j)
{
	return (int32_t)(b * 10 + j);
}

static int32_t device_value(unsigned gen, uint64_t b, unsigned j)
{
	return (int32_t)(1000 * (gen + 1)) + host_value(b, j);
}

/* An event's handle: "EV", the daemon generation, the slot, 0 for `ready` and 1 for `release`. */
static void event_handle(uint8_t *h, unsigned gen, unsigned slot, unsigned release)
{
	memset(h, 0, WIRE_IPC_HANDLE_SIZE);
	h[0] = 'E', h[1] = 'V', h[2] = (uint8_t)gen, h[3] = (uint8_t)slot, h[4] = (uint8_t)release;
}

/*
 * One daemon generation: answers HELLO and the ATTACH (which must be a
 * device attach, resumed at `want_cursor` when that is set), publishes
 * batches first..first+1 in slots 0 and 1 of a new ring and their device
 * copies in a new "device" memfd, then waits for a byte on `go` and closes
 * everything.
 */
static void fake_generation(int lfd, unsigned gen, uint64_t first, const char *want_cursor, int go)
{
	int fd = fake_hello(lfd);
	uint8_t out[WIRE_HEADER_SIZE + WIRE_DEVICE_REPLY_SIZE(SLOTS)];
	int n;

	uint8_t in[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE];
	read_exact(fd, in, sizeof(in));
	struct wire_attach a;
	if (wire_decode_attach(in + WIRE_HEADER_SIZE, WIRE_ATTACH_SIZE, &a) < 0 || !(a.flags & WIRE_ATTACH_DEVICE) ||
	    a.device != 0)
		_exit(10 + (int)gen);
	if (want_cursor ? !(a.flags & WIRE_ATTACH_RESUME) || strcmp(a.cursor, want_cursor) != 0
			: (a.flags & WIRE_ATTACH_RESUME) != 0)
		_exit(20 + (int)gen);

	int ring = sealed_memfd("ring", RING_SIZE), cons = sealed_memfd("consumer", FEED_CONSUMER_PAGE_SIZE);
	int dmem = sealed_memfd("device", SLOTS * SLOT_SIZE);
	struct feed_ring_header *h = mmap(NULL, RING_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
	struct feed_consumer_page *cp = mmap(NULL, FEED_CONSUMER_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, cons, 0);
	uint8_t *dev = mmap(NULL, SLOTS * SLOT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, dmem, 0);
	if (h == MAP_FAILED || cp == MAP_FAILED || dev == MAP_FAILED)
		_exit(6);
	*h = (struct feed_ring_header){ .magic = FEED_RING_MAGIC, .version = FEED_RING_VERSION,
					.header_size = FEED_RING_HEADER_SIZE, .slot_count = SLOTS, .slot_size = SLOT_SIZE,
					.batch_size = B, .seq_len = L, .off_input_ids = OFF_INPUT_IDS, .off_labels = 1088,
					.off_position_ids = 1152, .off_cu_seqlens = 1216, .cu_capacity = B * L + 1,
					.world = 1, .state = FEED_RING_RUNNING };
	cp->magic = FEED_CONSUMER_MAGIC;
	cp->version = FEED_RING_VERSION;
	for (unsigned s = 0; s < PUBLISHED; s++) {
		uint8_t *slot = (uint8_t *)h + FEED_RING_HEADER_SIZE + s * SLOT_SIZE;
		struct feed_slot_header *sh = (struct feed_slot_header *)slot;
		*sh = (struct feed_slot_header){ .seq = s, .batch_index = first + s, .world = 1, .batch_size = B,
						 .seq_len = L, .n_cu_seqlens = 2 };
		snprintf(sh->cursor, sizeof(sh->cursor), "cur-%llu", (unsigned long long)(first + s + 1));
		int32_t *cu = (int32_t *)(slot + 1216);
		cu[0] = 0, cu[1] = L;
		for (unsigned j = 0; j < L; j++) {
			((int32_t *)(slot + OFF_INPUT_IDS))[j] = host_value(first + s, j);
			((int32_t *)(dev + s * SLOT_SIZE + OFF_INPUT_IDS))[j] = device_value(gen, first + s, j);
		}
	}
	__atomic_store_n(&h->head, PUBLISHED, __ATOMIC_RELEASE);

	struct wire_attach_reply rep = { .ring_size = RING_SIZE, .consumer_size = FEED_CONSUMER_PAGE_SIZE,
					 .first_batch = first, .slot_count = SLOTS, .batch_size = B, .seq_len = L,
					 .n_fds = WIRE_ATTACH_FDS };
	n = wire_encode_attach_reply(out, sizeof(out), &rep);
	int fds[4] = { ring, cons, eventfd(0, EFD_CLOEXEC), eventfd(0, EFD_CLOEXEC) };
	send_msg(fd, out, (size_t)n, fds, 4);

	uint8_t handles[2 * WIRE_IPC_HANDLE_SIZE * SLOTS];
	for (unsigned s = 0; s < SLOTS; s++) {
		event_handle(handles + (2 * s) * WIRE_IPC_HANDLE_SIZE, gen, s, 0);
		event_handle(handles + (2 * s + 1) * WIRE_IPC_HANDLE_SIZE, gen, s, 1);
	}
	struct wire_device_reply dr = { .kind = WIRE_DEVICE_VMM, .device = 0, .mem_size = SLOTS * SLOT_SIZE,
					.slot_stride = SLOT_SIZE, .slot_count = SLOTS, .n_fds = 1, .handles = handles };
	n = wire_encode_device_reply(out, sizeof(out), &dr);
	if (n < 0)
		_exit(7);
	send_msg(fd, out, (size_t)n, &dmem, 1);

	char b;
	read_exact(go, &b, 1);
	/* As a SIGKILL leaves it: the connection closes, no ERROR is sent, the ring says nothing. */
	close(fd);
	close(ring);
	close(cons);
	close(dmem);
}

static bool is_event(const uint8_t *h, unsigned gen, unsigned slot, unsigned release)
{
	return h[0] == 'E' && h[1] == 'V' && h[2] == gen && h[3] == slot && h[4] == release;
}

static const int32_t *device_ids(feed_client *c, const struct feed_batch *b, int *ret)
{
	struct feed_device_batch db;
	*ret = feed_client_device_batch(c, b, NULL, &db);
	return *ret == 0 ? (const int32_t *)(uintptr_t)db.input_ids : NULL;
}

static void check_batch(feed_client *c, const struct feed_batch *b, uint64_t index, unsigned gen,
			const struct fake_cuda_state *st)
{
	CHECK_INT(b->index, (int64_t)index);
	CHECK_INT(b->input_ids[3], host_value(index, 3));
	int r;
	const int32_t *d = device_ids(c, b, &r);
	CHECK(r == 0, "batch %llu: device_batch: %d (%s)", (unsigned long long)index, r, feed_client_error(c));
	if (d) {
		CHECK(d[0] == device_value(gen, index, 0) && d[L - 1] == device_value(gen, index, L - 1),
		      "batch %llu: the device view reads %d, not daemon %u's copy %d", (unsigned long long)index, d[0],
		      gen, device_value(gen, index, 0));
		CHECK(is_event(st->last_wait, gen, (unsigned)((index - PUBLISHED * gen) % SLOTS), 0),
		      "batch %llu: the stream waited on another event than daemon %u's `ready` of its slot",
		      (unsigned long long)index, gen);
	}
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	/* The test's own reference keeps the fake driver (and its counters) loaded across libfeed's dlclose. */
	void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	struct fake_cuda_state *(*state_of)(void) = NULL;
	if (drv)
		*(void **)&state_of = dlsym(drv, "fake_cuda_state"); /* POSIX's way to take a function from dlsym */
	if (!state_of) {
		fprintf(stderr, "skip: libcuda.so.1 is not tests/unit/fake-cuda (run through meson: LD_LIBRARY_PATH)\n");
		return UNIT_SKIP;
	}
	const struct fake_cuda_state *st = state_of();

	char dir[] = "/tmp/test-libfeed-device-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(sock_path, sizeof(sock_path), "%s/fake.sock", dir);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int go[2];
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0 || pipe2(go, O_CLOEXEC) < 0) {
		perror("listen");
		return 1;
	}
	pid_t pid = fork();
	if (pid == 0) {
		alarm(20); /* a client that never comes back must not leave the fake daemon waiting */
		fake_generation(lfd, 0, 0, NULL, go[0]);
		fake_generation(lfd, 1, 2, "cur-2", go[0]);
		_exit(0);
	}
	close(lfd);

	feed_client *c;
	int r = feed_client_connect(sock_path, &c);
	CHECK_INT(r, 0);
	if (r == 0)
		r = feed_client_attach_device(c, "web", 0, 1, NULL, 0, 0);
	CHECK(r == 0, "device attach: %d (%s)", r, r ? feed_client_error(c) : "");
	if (r == 0) {
		CHECK_INT(feed_client_device(c), 0);
		CHECK(st->imports == 1 && st->events_opened == 2 * SLOTS, "first import: %u buffers, %u events",
		      st->imports, st->events_opened);
		struct feed_batch b0, b1, b2, b3;
		r = feed_client_next(c, 5000, &b0);
		CHECK_INT(r, 0);
		if (r == 0) {
			check_batch(c, &b0, 0, 0, st);
			CHECK_INT(feed_client_release(c, &b0), 0);
			CHECK(st->records == 1 && is_event(st->last_record, 0, 0, 1), "release of batch 0: %u records",
			      st->records);
		}
		if (r == 0)
			r = feed_client_next(c, 5000, &b1);
		CHECK_INT(r, 0);
		if (r == 0) {
			check_batch(c, &b1, 1, 0, st);
			/* Batch 1 is held; the first daemon goes away; the next next() reconnects. */
			CHECK(write(go[1], "x", 1) == 1, "write");
			r = feed_client_next(c, 5000, &b2);
			CHECK(r == 0, "next() across the daemon's death: %d (%s)", r, feed_client_error(c));
		}
		if (r == 0) {
			uint64_t n = 0, ns = 0;
			feed_client_reconnect_stats(c, &n, &ns);
			CHECK(n == 1 && ns > 0, "reconnects %llu in %llu ns", (unsigned long long)n, (unsigned long long)ns);
			CHECK_INT(feed_client_device(c), 0);
			CHECK(st->imports == 2 && st->events_opened == 4 * SLOTS, "re-import: %u buffers, %u events in all",
			      st->imports, st->events_opened);
			CHECK(st->mem_releases == 0 && st->events_destroyed == 0,
			      "the old daemon's buffer was released under held batch 1");
			check_batch(c, &b2, 2, 1, st);
			/* The held batch: its host view still reads, its device view is refused (take it before). */
			CHECK_INT(b1.input_ids[3], host_value(1, 3));
			int rr;
			CHECK(device_ids(c, &b1, &rr) == NULL && rr == -ESHUTDOWN, "device view of a dead daemon's batch: %d",
			      rr);
			unsigned records = st->records;
			CHECK_INT(feed_client_release(c, &b1), 0);
			CHECK(st->records == records, "an event of the dead daemon was recorded");
			CHECK(st->mem_releases == 1 && st->events_destroyed == 2 * SLOTS && st->unmaps == 1,
			      "once batch 1 is released the old buffer goes: %u releases, %u events destroyed",
			      st->mem_releases, st->events_destroyed);
			CHECK_INT(feed_client_release(c, &b2), 0);
			CHECK(is_event(st->last_record, 1, 0, 1), "batch 2's release is not daemon 1's slot 0 `release`");
			r = feed_client_next(c, 5000, &b3);
			CHECK_INT(r, 0);
		}
		if (r == 0) {
			check_batch(c, &b3, 3, 1, st);
			CHECK_INT(feed_client_release(c, &b3), 0);
			CHECK(is_event(st->last_record, 1, 1, 1), "batch 3's release is not daemon 1's slot 1 `release`");
		}
	}
	feed_client_close(c);
	CHECK(st->imports == 2 && st->mem_releases == 2 && st->events_destroyed == 4 * SLOTS && st->contexts == 0,
	      "after close: %u imports, %u releases, %u of %u events destroyed, %u contexts", st->imports,
	      st->mem_releases, st->events_destroyed, st->events_opened, st->contexts);
	if (write(go[1], "x", 1) != 1)
		perror("write");
	if (unit_failures)
		kill(pid, SIGKILL); /* it may wait for a reconnect that never came */
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(unit_failures || (WIFEXITED(status) && WEXITSTATUS(status) == 0), "the fake daemon failed: status %d",
	      status);
	unlink(sock_path);
	rmdir(dir);
	return unit_exit("libfeed-device");
}
