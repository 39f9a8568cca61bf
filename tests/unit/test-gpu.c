/* SPDX-License-Identifier: MIT */
/*
 * GPU staging without a GPU: the per-slot state machine (daemon/gpu/staging),
 * its DEVICE_REPLY, and the crash paths, driven through the backend
 * interface with the host simulation (streams are threads, events counters).
 * A client thread plays the trainer: it opens the slots from the decoded
 * DEVICE_REPLY, makes its stream wait on `ready`, runs a "kernel" (a copy
 * out of the device buffer) and records `release` before moving its tail,
 * exactly as libfeed does. Copies are slowed down so that a missing wait
 * on either side shows up as wrong bytes.
 */
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>

#include "daemon/gpu/gpu.h"
#include "daemon/gpu/staging.h"
#include "daemon/ring/ring.h"
#include "proto/macro.h"
#include "proto/wire.h"
#include "unit.h"

#define CHECK_WINDOW 16 /* batches the client verifies at once */

struct fixture {
	struct gpu_backend *b;
	struct ring *ring;
	struct staging *st;
	int wake_fd;
	uint64_t head, tail; /* as in the ring: head by the "daemon", tail by the client (atomics) */
};

/* The bytes of batch seq: the slot header's counts and a pattern in every array. */
static void fill(struct ring *r, uint64_t seq)
{
	const struct feed_ring_header *g = r->hdr;
	uint8_t *slot = ring_slot(r, seq);
	struct feed_slot_header *h = (struct feed_slot_header *)slot;
	h->seq = seq;
	h->n_cu_seqlens = 2 + (uint32_t)(seq % 5);
	int32_t *a = (int32_t *)(slot + g->off_input_ids);
	size_t words = (g->off_cu_seqlens - g->off_input_ids) / 4 + h->n_cu_seqlens;
	for (size_t i = 0; i < words; i++)
		a[i] = (int32_t)(seq * 2654435761u + i);
}

static size_t used_bytes(const struct ring *r, uint64_t seq)
{
	const struct feed_slot_header *h = (const struct feed_slot_header *)ring_slot(r, seq);
	return r->hdr->off_cu_seqlens + 4u * h->n_cu_seqlens;
}

static void fixture_init(struct fixture *f, uint32_t slots)
{
	*f = (struct fixture){ .wake_fd = -1 };
	REQUIRE(gpu_backend_sim_new(1, &f->b) == 0, "sim backend");
	struct ring_geometry g = { .slot_count = slots, .batch_size = 2, .seq_len = 32, .rank = 0, .world = 1 };
	REQUIRE(ring_new(&g, &f->ring) == 0, "ring_new");
	f->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	char err[256];
	int r = staging_new(f->b, 0, f->ring->hdr, f->ring->size, f->wake_fd, &f->st, err, sizeof(err));
	REQUIRE(r == 0, "staging_new: %d %s", r, err);
}

static void fixture_done(struct fixture *f)
{
	bool leaked = true;
	f->st = staging_free(f->st, &leaked);
	CHECK(!leaked, "staging_free kept memory although every copy could finish");
	CHECK_INT(gpu_backend_sim_live_objects(f->b), 0);
	ring_free(f->ring);
	close(f->wake_fd);
	gpu_backend_free(f->b);
}

/* The host simulation (built only into the tests) as the GPU layer's backend. */
static int open_sim(struct gpu **ret)
{
	struct gpu_backend *b;
	int r = gpu_backend_sim_new(1, &b);
	return r < 0 ? r : gpu_open_backend(b, ret);
}

/* What the client learns from DEVICE_REPLY, decoded from the bytes on the wire. */
struct client_view {
	uint8_t *dev;
	size_t stride;
	uint32_t slots;
	struct gpu_event **ready, **release;
};

static void client_view_open(struct fixture *f, struct client_view *v)
{
	struct wire_device_reply rep, d;
	staging_reply(f->st, &rep);
	size_t cap = WIRE_HEADER_SIZE + WIRE_DEVICE_REPLY_SIZE(rep.slot_count);
	uint8_t *buf = malloc(cap);
	int n = wire_encode_device_reply(buf, cap, &rep);
	CHECK_INT(n, (int)cap);
	CHECK_INT(wire_decode_device_reply(buf + WIRE_HEADER_SIZE, cap - WIRE_HEADER_SIZE, &d), 0);
	CHECK_INT(d.slot_count, f->ring->slot_count);
	CHECK_U64(d.slot_stride, f->ring->slot_size);
	CHECK(d.mem_size >= d.slot_stride * d.slot_count, "device allocation smaller than its slots");
	struct gpu_mem *m;
	memcpy(&m, d.mem_handle, sizeof(m));
	v->dev = gpu_backend_sim_mem_ptr(m);
	v->stride = d.slot_stride;
	v->slots = d.slot_count;
	v->ready = calloc(v->slots, sizeof(*v->ready));
	v->release = calloc(v->slots, sizeof(*v->release));
	for (uint32_t i = 0; i < v->slots; i++) {
		v->ready[i] = gpu_backend_sim_event_from_handle(d.handles + (size_t)i * 2 * WIRE_IPC_HANDLE_SIZE);
		v->release[i] = gpu_backend_sim_event_from_handle(d.handles + ((size_t)i * 2 + 1) * WIRE_IPC_HANDLE_SIZE);
		CHECK(v->ready[i] && v->release[i], "slot %u: event handles do not name events", i);
	}
	free(buf);
}

static void client_view_close(struct client_view *v)
{
	free(v->ready);
	free(v->release);
}

struct client {
	struct fixture *f;
	struct client_view v;
	uint64_t batches;
	struct gpu_stream *stream;
	struct gpu_mem *out; /* CHECK_WINDOW slots of the consumer kernel's output */
	uint64_t wrong;
};

static void *client_run(void *arg)
{
	struct client *c = arg;
	struct gpu_backend *b = c->f->b;
	const struct ring *r = c->f->ring;
	uint8_t *out = gpu_backend_sim_mem_ptr(c->out);
	for (uint64_t seq = 0; seq < c->batches; seq++) {
		while (__atomic_load_n(&c->f->head, __ATOMIC_ACQUIRE) <= seq)
			usleep(50);
		uint32_t s = (uint32_t)(seq % c->v.slots);
		size_t len = used_bytes(r, seq); /* the host slot header is stable until release */
		CHECK_INT(b->ops->wait(b, c->stream, c->v.ready[s]), 0);
		/* The "kernel": reads the device buffer after the wait. */
		CHECK_INT(b->ops->copy_h2d(b, c->stream, c->out, (seq % CHECK_WINDOW) * c->v.stride,
					    c->v.dev + (size_t)s * c->v.stride, len), 0);
		CHECK_INT(b->ops->record(b, c->stream, c->v.release[s]), 0);
		/* Released with the kernel still queued, as a trainer does. */
		__atomic_store_n(&c->f->tail, seq + 1, __ATOMIC_RELEASE);
		if ((seq + 1) % CHECK_WINDOW == 0 || seq + 1 == c->batches) {
			gpu_backend_sim_stream_sync(b, c->stream);
			for (uint64_t k = seq - seq % CHECK_WINDOW; k <= seq; k++) {
				/* Expected bytes, rebuilt from the pattern (the host slot may hold a later batch now). */
				const int32_t *got = (const int32_t *)(out + (k % CHECK_WINDOW) * c->v.stride +
								       r->hdr->off_input_ids);
				uint32_t n_cu = 2 + (uint32_t)(k % 5);
				size_t words = (r->hdr->off_cu_seqlens - r->hdr->off_input_ids) / 4 + n_cu;
				for (size_t i = 0; i < words; i++)
					if (got[i] != (int32_t)(k * 2654435761u + i)) {
						if (c->wrong++ < 5)
							fprintf(stderr, "batch %" PRIu64 " word %zu differs\n", k, i);
						break;
					}
			}
		}
	}
	return NULL;
}

/* Waits for the wake eventfd (the session's space eventfd in the daemon). */
static bool wait_wake(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, ms) != 1)
		return false;
	uint64_t v;
	ssize_t _unused_ n = read(fd, &v, sizeof(v));
	return true;
}

/* The daemon's loop, reduced to staging: fill when allowed, stage, publish. */
static void produce(struct fixture *f, uint64_t batches)
{
	uint32_t n = f->ring->slot_count;
	for (uint64_t seq = 0; seq < batches; seq++) {
		for (;;) {
			uint64_t tail = __atomic_load_n(&f->tail, __ATOMIC_ACQUIRE);
			if (seq - tail >= n) {
				usleep(50);
				continue;
			}
			int r = staging_host_reusable(f->st, seq);
			CHECK(r >= 0, "staging_host_reusable: %d", r);
			if (r != 0)
				break;
			CHECK(wait_wake(f->wake_fd, 10000), "no kick after the pending copy of slot %" PRIu64, seq % n);
		}
		fill(f->ring, seq);
		int r = staging_publish(f->st, seq, __atomic_load_n(&f->tail, __ATOMIC_ACQUIRE));
		CHECK_INT(r, 0);
		__atomic_store_n(&f->head, seq + 1, __ATOMIC_RELEASE);
	}
}

static void test_batches_arrive_bit_for_bit(uint32_t slots, uint64_t batches, unsigned delay_us)
{
	struct fixture f;
	fixture_init(&f, slots);
	gpu_backend_sim_set_copy_delay(f.b, delay_us);
	struct client c = { .f = &f, .batches = batches };
	client_view_open(&f, &c.v);
	size_t real;
	struct gpu_mem_export x;
	REQUIRE(f.b->ops->stream_new(f.b, 0, &c.stream) == 0, "client stream");
	REQUIRE(f.b->ops->mem_new(f.b, 0, c.v.stride * CHECK_WINDOW, &c.out, &real, &x) == 0, "client output");
	pthread_t t;
	REQUIRE(pthread_create(&t, NULL, client_run, &c) == 0, "client thread");
	produce(&f, batches);
	pthread_join(t, NULL);
	CHECK_U64(c.wrong, 0);
	CHECK_U64(f.st->next_seq, batches);
	CHECK_INT(f.b->ops->stream_free(f.b, c.stream), 0);
	f.b->ops->mem_free(f.b, c.out);
	client_view_close(&c.v);
	fixture_done(&f);
}

/* A publish that would break the alternation is refused, and refusing changes nothing. */
static void test_alternation_is_enforced(void)
{
	struct fixture f;
	fixture_init(&f, 4);
	fill(f.ring, 0);
	CHECK_INT(staging_publish(f.st, 1, 0), -EINVAL); /* out of order */
	CHECK_INT(staging_publish(f.st, 0, 0), 0);
	CHECK_INT(staging_publish(f.st, 0, 0), -EINVAL); /* twice */
	for (uint64_t seq = 1; seq < 4; seq++) {
		fill(f.ring, seq);
		CHECK_INT(staging_publish(f.st, seq, 0), 0);
	}
	/* Slot 0 holds batch 0, not released: batch 4 must not be staged over it. */
	CHECK_INT(staging_publish(f.st, 4, 0), -EBUSY);
	CHECK_INT(staging_publish(f.st, 4, 5), -EBUSY); /* a tail past the batch is nonsense */
	CHECK_U64(f.st->next_seq, 4);
	CHECK_INT(staging_publish(f.st, 4, 1), 0);
	CHECK_INT(f.st->slots[0].state, STAGING_SLOT_PUBLISHED);
	CHECK_U64(f.st->slots[0].seq, 4);
	fixture_done(&f);
}

/*
 * A client that releases before the daemon's copy of that batch ran: the
 * host slot must not be refilled until the copy has read it, and the daemon
 * is woken (not polled) when it has.
 */
static void test_host_slot_waits_for_its_copy(void)
{
	struct fixture f;
	fixture_init(&f, 2);
	gpu_backend_sim_set_copy_delay(f.b, 300 * 1000);
	fill(f.ring, 0);
	CHECK_INT(staging_host_reusable(f.st, 0), 1);
	CHECK_INT(staging_publish(f.st, 0, 0), 0);
	fill(f.ring, 1);
	CHECK_INT(staging_publish(f.st, 1, 0), 0);
	/* The client released batch 0 at once; its copy is still sleeping. */
	CHECK_INT(staging_host_reusable(f.st, 2), 0);
	CHECK_INT(staging_host_reusable(f.st, 2), 0); /* asking again queues no second kick */
	CHECK(wait_wake(f.wake_fd, 10000), "no kick once the copy of batch 0 ran");
	CHECK_INT(staging_host_reusable(f.st, 2), 1);
	gpu_backend_sim_set_copy_delay(f.b, 0);
	fixture_done(&f);
}

/*
 * Crash paths: a client that dies after recording `release` on a stream
 * that will never run it leaves the daemon's copy stream waiting forever.
 * Tearing the staging down must not hang and must free every buffer and
 * event the daemon made.
 */
static void test_dead_client_does_not_hang_teardown(void)
{
	struct fixture f;
	fixture_init(&f, 2);
	struct client_view v;
	client_view_open(&f, &v);
	struct gpu_stream *cs;
	REQUIRE(f.b->ops->stream_new(f.b, 0, &cs) == 0, "client stream");
	for (uint64_t seq = 0; seq < 2; seq++) {
		fill(f.ring, seq);
		CHECK_INT(staging_publish(f.st, seq, 0), 0);
	}
	gpu_backend_sim_stream_stall(f.b, cs); /* the process dies: its stream runs nothing more */
	CHECK_INT(f.b->ops->wait(f.b, cs, v.ready[0]), 0);
	CHECK_INT(f.b->ops->record(f.b, cs, v.release[0]), 0);
	/* tail moved to 1 before the death; the daemon stages batch 2 behind a release that never completes */
	CHECK_INT(staging_host_reusable(f.st, 2) >= 0, 1);
	fill(f.ring, 2);
	CHECK_INT(staging_publish(f.st, 2, 1), 0);
	client_view_close(&v);
	/* The connection's teardown: returns, and nothing of the daemon's is left but the dead client's stream. */
	bool leaked = false;
	f.st = staging_free(f.st, &leaked);
	CHECK(!leaked, "the copy stream gave up its waits, so its memory could go");
	CHECK_INT(gpu_backend_sim_live_objects(f.b), 1);
	CHECK_INT(f.b->ops->stream_free(f.b, cs), 0);
	fixture_done(&f);
}

/*
 * A client dies with a `release` recorded behind work that never runs, and a
 * copy of the daemon's waits on it. Retiring its staging must neither block
 * the main thread nor unmap the pinned ring under that copy: both stay in
 * the graveyard, the tick's reap leaves them while the copy is pending, and
 * frees them (ring included) once the driver resolves the dead stream.
 */
static void test_dead_client_staging_waits_in_the_graveyard(void)
{
	struct gpu *g;
	REQUIRE(open_sim(&g) == 0, "gpu_open sim");
	struct fixture f = { .b = g->backend, .wake_fd = -1 };
	struct ring_geometry geo = { .slot_count = 2, .batch_size = 2, .seq_len = 32, .rank = 0, .world = 1 };
	REQUIRE(ring_new(&geo, &f.ring) == 0, "ring");
	char err[512] = "";
	REQUIRE(gpu_attach(g, f.ring, 0, &f.st, err, sizeof(err)) == 0, "gpu_attach: %s", err);
	struct client_view v;
	client_view_open(&f, &v);
	struct gpu_stream *cs;
	REQUIRE(f.b->ops->stream_new(f.b, 0, &cs) == 0, "client stream");
	for (uint64_t seq = 0; seq < 2; seq++) {
		fill(f.ring, seq);
		CHECK_INT(staging_publish(f.st, seq, 0), 0);
	}
	gpu_backend_sim_stream_stall(f.b, cs); /* the process dies with its release queued, not run */
	CHECK_INT(f.b->ops->wait(f.b, cs, v.ready[0]), 0);
	CHECK_INT(f.b->ops->record(f.b, cs, v.release[0]), 0);
	fill(f.ring, 2);
	CHECK_INT(staging_publish(f.st, 2, 1), 0); /* waits on that release */
	client_view_close(&v);

	uint64_t t0 = now_ns();
	CHECK_INT(gpu_retire(f.st, f.ring), 1);
	CHECK(now_ns() - t0 < 100 * NSEC_PER_MSEC, "retiring blocked the main thread");
	uint64_t bytes = 0;
	CHECK_INT(gpu_graveyard_count(g, &bytes), 1);
	CHECK(bytes > 0, "the graveyard's device bytes are counted");
	CHECK(g->used[0] > 0, "device memory under a pending copy still counts against gpu_memory_max");
	gpu_reap(g);
	CHECK_INT(gpu_graveyard_count(g, NULL), 1);
	/* Still mapped: the pending copy may read it. */
	CHECK_INT(f.ring->hdr->slot_count, 2);

	gpu_backend_sim_stream_resume(f.b, cs); /* the driver resolves the dead client's work */
	uint64_t deadline = now_ns() + 5 * NSEC_PER_SEC;
	while (gpu_graveyard_count(g, NULL) && now_ns() < deadline) {
		gpu_reap(g);
		usleep(1000);
	}
	CHECK_INT(gpu_graveyard_count(g, NULL), 0);
	CHECK_U64(g->used[0], 0);
	CHECK_INT(gpu_backend_sim_live_objects(f.b), 1); /* the client's own stream */
	CHECK_INT(f.b->ops->stream_free(f.b, cs), 0);
	gpu_free(g);
}

/*
 * Which device staging uses. An ordinal the daemon does not have is refused
 * with a message naming it, before anything is created. Staging for cuda:1
 * touches cuda:1 alone: pinning the ring first must not create a context on
 * device 0 (CUDA's runtime does, when cudaHostRegister runs with no current
 * device), which would hold memory on another rank's GPU and fail under
 * EXCLUSIVE_PROCESS compute mode.
 */
static void test_staging_uses_the_clients_device_only(void)
{
	struct gpu_backend *b;
	REQUIRE(gpu_backend_sim_new(2, &b) == 0, "sim");
	struct ring_geometry g = { .slot_count = 2, .batch_size = 1, .seq_len = 8, .rank = 0, .world = 1 };
	struct ring *r;
	REQUIRE(ring_new(&g, &r) == 0, "ring");
	struct staging *st = NULL;
	char err[256] = "";
	CHECK_INT(staging_new(b, 3, r->hdr, r->size, r->space_efd, &st, err, sizeof(err)), -ENODEV);
	CHECK_CONTAINS(err, "cuda:3");
	CHECK(!st, "no staging on failure");
	CHECK_INT(gpu_backend_sim_live_objects(b), 0);
	CHECK_U64(gpu_backend_sim_devices_touched(b), 0);

	CHECK_INT(staging_new(b, 1, r->hdr, r->size, r->space_efd, &st, err, sizeof(err)), 0);
	CHECK_U64(gpu_backend_sim_devices_touched(b), UINT64_C(1) << 1);
	bool leaked = true;
	st = staging_free(st, &leaked);
	CHECK(!leaked, "staging_free kept memory");
	ring_free(r);
	gpu_backend_free(b);
}

/*
 * A device whose compute mode (or missing support) rules staging out is
 * refused at attach with the reason, before anything is created on it; the
 * host fallback carries the same reason.
 */
static void test_unusable_device_is_refused_with_the_reason(void)
{
	struct gpu *g;
	REQUIRE(open_sim(&g) == 0, "gpu_open sim");
	gpu_backend_sim_set_unusable(g->backend, 0);
	struct ring_geometry geo = { .slot_count = 2, .batch_size = 1, .seq_len = 8, .rank = 0, .world = 1 };
	struct ring *r;
	REQUIRE(ring_new(&geo, &r) == 0, "ring");
	struct staging *st = NULL;
	char err[512] = "";
	CHECK_INT(gpu_attach(g, r, 0, &st, err, sizeof(err)), -EOPNOTSUPP);
	CHECK(!st, "no staging when refused");
	CHECK_CONTAINS(err, "cuda:0");
	CHECK_CONTAINS(err, "EXCLUSIVE_PROCESS");
	CHECK_U64(gpu_backend_sim_devices_touched(g->backend), 0);
	CHECK_INT(gpu_backend_sim_live_objects(g->backend), 0);
	ring_free(r);
	gpu_free(g);
}

/* Host-only: a daemon without a usable backend says why, and refuses device attaches with that reason. */
static void test_host_only(void)
{
	struct gpu *g;
	REQUIRE(gpu_open(&g) == 0, "gpu_open");
	if (!gpu_available(g)) {
		CHECK(strncmp(g->status, "unavailable: ", 13) == 0, "status '%s'", g->status);
		struct ring_geometry geo = { .slot_count = 2, .batch_size = 1, .seq_len = 8, .rank = 0, .world = 1 };
		struct ring *r;
		REQUIRE(ring_new(&geo, &r) == 0, "ring");
		struct staging *st = NULL;
		char err[512] = "";
		CHECK_INT(gpu_attach(g, r, 0, &st, err, sizeof(err)), -ENODEV);
		CHECK_CONTAINS(err, g->status + 13);
		ring_free(r);
	}
	gpu_free(g);
	REQUIRE(open_sim(&g) == 0, "gpu_open sim");
	CHECK(gpu_available(g), "the simulation is always available");
	CHECK_STR(g->status, "sim: 1 device");
	gpu_free(g);
}

/*
 * Device memory counts against gpu_memory_max: attaches fit until their
 * buffers would pass it, the one that would is refused with -EDQUOT and a
 * message naming the key and the figures, nothing of it stays allocated,
 * and a freed staging gives its bytes back. The host fallback turns the
 * refusal into host batches with the same reason.
 */
static void test_device_memory_limit(void)
{
	struct gpu *g;
	REQUIRE(open_sim(&g) == 0, "gpu_open sim");
	struct ring_geometry geo = { .slot_count = 4, .batch_size = 8, .seq_len = 4096, .rank = 0, .world = 1 };
	struct ring *r[3];
	for (unsigned i = 0; i < 3; i++)
		REQUIRE(ring_new(&geo, &r[i]) == 0, "ring");
	uint64_t each = ALIGN_UP((uint64_t)r[0]->hdr->slot_size * r[0]->hdr->slot_count, UINT64_C(2) << 20);
	gpu_configure(g, 2 * each);
	struct staging *st[3] = { NULL };
	char err[512] = "";
	CHECK_INT(gpu_attach(g, r[0], 0, &st[0], err, sizeof(err)), 0);
	CHECK_INT(gpu_attach(g, r[1], 0, &st[1], err, sizeof(err)), 0);
	CHECK_U64(g->used[0], st[0]->mem_size + st[1]->mem_size);
	unsigned live = gpu_backend_sim_live_objects(g->backend);
	CHECK_INT(gpu_attach(g, r[2], 0, &st[2], err, sizeof(err)), -EDQUOT);
	CHECK(!st[2], "no staging when refused");
	CHECK_CONTAINS(err, "gpu_memory_max");
	CHECK_CONTAINS(err, "cuda:0");
	char want[64];
	snprintf(want, sizeof(want), "%" PRIu64 " bytes", 2 * each);
	CHECK_CONTAINS(err, want);
	CHECK_INT(gpu_backend_sim_live_objects(g->backend), live);

	/* Asking for the host fallback: host batches, the reason in the reply. */
	struct wire_attach a = { .device = 0, .flags = WIRE_ATTACH_DEVICE | WIRE_ATTACH_HOST_FALLBACK };
	uint8_t *msg = NULL;
	size_t len = 0;
	int fd = -1;
	CHECK_INT(gpu_attach_reply(g, r[2], &a, &st[2], &msg, &len, &fd, err, sizeof(err)), 0);
	CHECK(!st[2], "host batches only");
	struct wire_header h;
	struct wire_device_reply rep;
	REQUIRE(wire_header_decode(msg, len, WIRE_MAX_REPLY, &h) == 0, "reply header");
	REQUIRE(wire_decode_device_reply(msg + WIRE_HEADER_SIZE, h.length, &rep) == 0, "reply");
	CHECK_INT(rep.kind, WIRE_DEVICE_HOST);
	CHECK_CONTAINS(rep.reason, "gpu_memory_max");
	free(msg);

	/* A client leaves: its bytes come back, and the third fits. */
	st[0] = staging_free(st[0], NULL);
	CHECK_U64(g->used[0], st[1]->mem_size);
	CHECK_INT(gpu_attach(g, r[2], 0, &st[2], err, sizeof(err)), 0);
	/* No limit (0): anything fits. */
	gpu_configure(g, 0);
	CHECK_INT(gpu_attach(g, r[0], 0, &st[0], err, sizeof(err)), 0);
	for (unsigned i = 0; i < 3; i++) {
		st[i] = staging_free(st[i], NULL);
		ring_free(r[i]);
	}
	CHECK_U64(g->used[0], 0);
	CHECK_INT(gpu_backend_sim_live_objects(g->backend), 0);
	gpu_free(g);
}

/*
 * The per-client counters of status ("gpu"): every copy and its bytes, the
 * release waits of reused slots, and the copies' time on the stream's own
 * clock (timer events read without blocking).
 */
static void test_counters(void)
{
	struct fixture f;
	fixture_init(&f, 2);
	gpu_backend_sim_set_copy_delay(f.b, 2000);
	uint64_t bytes = 0;
	for (uint64_t seq = 0; seq < 6; seq++) {
		while (staging_host_reusable(f.st, seq) == 0)
			CHECK(wait_wake(f.wake_fd, 10000), "no kick");
		fill(f.ring, seq);
		bytes += used_bytes(f.ring, seq);
		CHECK_INT(staging_publish(f.st, seq, seq >= 2 ? seq - 1 : 0), 0);
	}
	gpu_backend_sim_stream_sync(f.b, f.st->stream);
	staging_collect(f.st);
	CHECK_U64(f.st->n.copies, 6);
	CHECK_U64(f.st->n.bytes, bytes);
	CHECK_U64(f.st->n.waits, 4); /* batches 2..5 reuse a slot */
	CHECK_U64(f.st->n.timed, 6);
	/* Each copy slept 2 ms on the stream before copying: the timers saw at least that. */
	CHECK(f.st->n.h2d_ns >= 6 * 2000000u, "h2d_ns %" PRIu64, f.st->n.h2d_ns);
	struct gpu_client_view v;
	gpu_client_view(f.st, &v);
	CHECK(v.n.copies == 6, "view copies %" PRIu64, v.n.copies);
	CHECK(v.n.waits == 4, "view events waited %" PRIu64, v.n.waits);
	CHECK(v.n.h2d_ns >= 12000000u, "view h2d_ns %" PRIu64, v.n.h2d_ns);
	gpu_backend_sim_set_copy_delay(f.b, 0);
	fixture_done(&f);
}

/* DEVICE_REPLY and the ATTACH device fields reject what does not agree. */
static void test_wire(void)
{
	uint8_t handles[2 * 2 * WIRE_IPC_HANDLE_SIZE];
	memset(handles, 7, sizeof(handles));
	struct wire_device_reply m = { .kind = WIRE_DEVICE_VMM, .device = 1, .mem_size = 1 << 21, .slot_stride = 8192,
				       .slot_count = 2, .n_fds = 1, .handles = handles };
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_DEVICE_REPLY_SIZE(2)], p[sizeof(buf)];
	CHECK_INT(wire_encode_device_reply(buf, sizeof(buf), &m), (int)sizeof(buf));
	CHECK_INT(wire_encode_device_reply(buf, sizeof(buf) - 1, &m), -ENOBUFS);
	struct wire_device_reply d;
	size_t len = sizeof(buf) - WIRE_HEADER_SIZE;
	CHECK_INT(wire_decode_device_reply(buf + WIRE_HEADER_SIZE, len, &d), 0);
	CHECK(d.handles && memcmp(d.handles, handles, sizeof(handles)) == 0, "handles survive the trip");
	CHECK_INT(wire_decode_device_reply(buf + WIRE_HEADER_SIZE, len - 1, &d), -EBADMSG);
	struct {
		const char *what;
		size_t off;
		uint32_t value;
	} bad[] = {
		{ "unknown kind", 0, 9 },      { "VMM without its fd", 28, 0 }, { "one slot", 24, 1 },
		{ "stride 0", 16, 0 },
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		memcpy(p, buf, sizeof(buf));
		uint32_t v = htole32(bad[i].value);
		memcpy(p + WIRE_HEADER_SIZE + bad[i].off, &v, 4);
		if (bad[i].off == 16)
			memset(p + WIRE_HEADER_SIZE + 16, 0, 8);
		CHECK(wire_decode_device_reply(p + WIRE_HEADER_SIZE, len, &d) == -EBADMSG, "%s accepted", bad[i].what);
	}
	struct wire_device_reply host = { .kind = WIRE_DEVICE_HOST };
	snprintf(host.reason, sizeof(host.reason), "no driver");
	int n = wire_encode_device_reply(buf, sizeof(buf), &host);
	CHECK_INT(n, WIRE_HEADER_SIZE + WIRE_DEVICE_REPLY_FIXED);
	CHECK_INT(wire_decode_device_reply(buf + WIRE_HEADER_SIZE, (size_t)n - WIRE_HEADER_SIZE, &d), 0);
	CHECK_STR(d.reason, "no driver");

	struct wire_attach a = { .rank = 0, .world = 1, .flags = WIRE_ATTACH_DEVICE | WIRE_ATTACH_HOST_FALLBACK,
				 .device = 3 };
	strcpy(a.feed, "f");
	uint8_t ab[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE];
	struct wire_attach ad;
	CHECK_INT(wire_encode_attach(ab, sizeof(ab), &a), (int)sizeof(ab));
	CHECK_INT(wire_decode_attach(ab + WIRE_HEADER_SIZE, WIRE_ATTACH_SIZE, &ad), 0);
	CHECK_INT(ad.device, 3);
	CHECK_INT(ad.flags, WIRE_ATTACH_DEVICE | WIRE_ATTACH_HOST_FALLBACK);
	a.flags = WIRE_ATTACH_HOST_FALLBACK; /* fallback from what? */
	a.device = 0;
	wire_encode_attach(ab, sizeof(ab), &a);
	CHECK_INT(wire_decode_attach(ab + WIRE_HEADER_SIZE, WIRE_ATTACH_SIZE, &ad), -EBADMSG);
	a.flags = WIRE_ATTACH_DEVICE;
	a.device = WIRE_MAX_DEVICE + 1;
	wire_encode_attach(ab, sizeof(ab), &a);
	CHECK_INT(wire_decode_attach(ab + WIRE_HEADER_SIZE, WIRE_ATTACH_SIZE, &ad), -EBADMSG);
}

int main(void)
{
	test_wire();
	test_alternation_is_enforced();
	test_host_slot_waits_for_its_copy();
	test_staging_uses_the_clients_device_only();
	test_unusable_device_is_refused_with_the_reason();
	test_host_only();
	test_dead_client_does_not_hang_teardown();
	test_dead_client_staging_waits_in_the_graveyard();
	test_device_memory_limit();
	test_counters();
	/* Thousands of batches with every copy slowed down, a small ring, and a plain one. */
	test_batches_arrive_bit_for_bit(2, 600, 200);
	test_batches_arrive_bit_for_bit(4, 3000, 0);
	return unit_exit("gpu");
}
