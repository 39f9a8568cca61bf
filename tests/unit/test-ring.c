/* SPDX-License-Identifier: MIT */
/*
 * The daemon's side of a batch ring (daemon/ring/ring.h). What a client is
 * promised: the ring memfd cannot be written, resized or unsealed by anyone
 * it is passed to; the consumer page can be written; the header describes a
 * slot layout that fits; a nonsensical tail is refused; and the data eventfd
 * is kicked exactly when the client says it sleeps. A ring whose memory
 * comes from the pool (ring_pool) keeps all of that, carries nothing of its
 * previous client's, and never goes to another uid.
 */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "daemon/ring/ring.h"
#include "unit.h"

static uint64_t efd_read(int fd, int *ret_errno)
{
	uint64_t v = 0;
	ssize_t n = read(fd, &v, sizeof(v));
	*ret_errno = n < 0 ? errno : 0;
	return n == sizeof(v) ? v : 0;
}

static void test_seals(void)
{
	struct ring_geometry g = { .slot_count = 3, .batch_size = 2, .seq_len = 100, .rank = 1, .world = 2 };
	struct ring *r = NULL;
	int e = ring_new(&g, &r);
	REQUIRE(e == 0 && r, "ring_new returned %d", e);

	int seals = fcntl(r->ring_fd, F_GET_SEALS);
	int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	CHECK(seals >= 0 && (seals & want) == want, "ring seals are %#x, expected at least %#x", seals, want);
	CHECK((fcntl(r->ring_fd, F_GETFD) & FD_CLOEXEC) != 0, "ring fd is not O_CLOEXEC");

	struct stat st;
	CHECK(fstat(r->ring_fd, &st) == 0 && (size_t)st.st_size == r->size, "ring memfd is %lld bytes, ring says %zu",
	      (long long)st.st_size, r->size);
	CHECK(r->size == (size_t)FEED_RING_HEADER_SIZE + (size_t)r->slot_count * r->slot_size,
	      "ring size %zu is not header + %u slots of %u", r->size, r->slot_count, r->slot_size);

	/* A client must not get a writable view of the ring, by any route. */
	void *m = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED, r->ring_fd, 0);
	CHECK(m == MAP_FAILED && errno == EPERM, "writable shared mapping of the ring: %s",
	      m == MAP_FAILED ? strerror(errno) : "succeeded");
	if (m != MAP_FAILED)
		munmap(m, r->size);

	m = mmap(NULL, r->size, PROT_READ, MAP_SHARED, r->ring_fd, 0);
	CHECK(m != MAP_FAILED, "read-only mapping of the ring failed: %s", strerror(errno));
	if (m != MAP_FAILED) {
		const struct feed_ring_header *h = m;
		CHECK_U64(h->magic, FEED_RING_MAGIC); /* the client sees what the daemon wrote */
		CHECK(mprotect(m, r->size, PROT_READ | PROT_WRITE) < 0, "mprotect of a read-only ring mapping to "
		      "PROT_WRITE succeeded");
		munmap(m, r->size);
	}

	uint8_t byte = 1;
	CHECK(pwrite(r->ring_fd, &byte, 1, 0) < 0, "pwrite to the ring memfd succeeded");
	CHECK(write(r->ring_fd, &byte, 1) < 0, "write to the ring memfd succeeded");
	CHECK(ftruncate(r->ring_fd, (off_t)r->size + 4096) < 0, "growing the ring memfd succeeded");
	CHECK(ftruncate(r->ring_fd, (off_t)r->size - 4096) < 0, "shrinking the ring memfd succeeded");
	CHECK(ftruncate(r->ring_fd, 0) < 0, "truncating the ring memfd to 0 succeeded");
	CHECK(fcntl(r->ring_fd, F_ADD_SEALS, 0) < 0 || fcntl(r->ring_fd, F_GET_SEALS) == seals,
	      "seals could be changed");

	/* The consumer page is the client's to write, but not to resize. */
	seals = fcntl(r->consumer_fd, F_GET_SEALS);
	CHECK(seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) == (F_SEAL_SHRINK | F_SEAL_GROW),
	      "consumer page seals are %#x", seals);
	CHECK(!(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)), "consumer page is sealed against writes (%#x)", seals);
	struct feed_consumer_page *c =
		mmap(NULL, FEED_CONSUMER_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, r->consumer_fd, 0);
	CHECK(c != MAP_FAILED, "writable mapping of the consumer page failed: %s", strerror(errno));
	if (c != MAP_FAILED) {
		CHECK_U64(c->magic, FEED_CONSUMER_MAGIC);
		CHECK_U64(c->version, FEED_RING_VERSION);
		c->tail = 0; /* writes through the client's view reach the daemon's */
		c->consumer_waiting = 7;
		CHECK_U64(r->cons->consumer_waiting, 7);
		c->consumer_waiting = 0;
		munmap(c, FEED_CONSUMER_PAGE_SIZE);
	}
	CHECK(ftruncate(r->consumer_fd, FEED_CONSUMER_PAGE_SIZE * 2) < 0, "growing the consumer page succeeded");
	ring_free(r);
}

static void check_geometry(uint32_t slots, uint32_t B, uint32_t L)
{
	struct ring_geometry g = { .slot_count = slots, .batch_size = B, .seq_len = L, .rank = 0, .world = 1 };
	struct ring *r = NULL;
	int e = ring_new(&g, &r);
	CHECK(e == 0, "ring_new(%u slots, B %u, L %u) returned %d", slots, B, L, e);
	if (e < 0)
		return;
	const struct feed_ring_header *h = r->hdr;
	uint64_t n = (uint64_t)B * L;
	CHECK_U64(h->magic, FEED_RING_MAGIC);
	CHECK_U64(h->version, FEED_RING_VERSION);
	CHECK_U64(h->header_size, FEED_RING_HEADER_SIZE);
	CHECK_U64(h->slot_count, slots);
	CHECK_U64(h->batch_size, B);
	CHECK_U64(h->seq_len, L);
	CHECK_U64(h->rank, 0);
	CHECK_U64(h->world, 1);
	CHECK_U64(h->head, 0);
	CHECK_U64(h->state, FEED_RING_RUNNING);
	CHECK_U64(h->daemon_pid, (uint64_t)getpid());
	CHECK_U64(h->cu_capacity, n + 1);
	CHECK(h->slot_size % 4096 == 0, "slot size %u is not page-aligned", h->slot_size);
	CHECK_U64(h->slot_size, ring_slot_bytes(B, L));
	const uint32_t offs[] = { h->off_input_ids, h->off_labels, h->off_position_ids, h->off_cu_seqlens };
	const uint64_t lens[] = { 4 * n, 4 * n, 4 * n, 4 * (n + 1) };
	for (int i = 0; i < 4; i++) {
		CHECK(offs[i] % 64 == 0, "B %u L %u: array %d at offset %u is not 64-byte aligned", B, L, i, offs[i]);
		CHECK(offs[i] >= FEED_SLOT_HEADER_SIZE, "B %u L %u: array %d at %u overlaps the slot header", B, L, i,
		      offs[i]);
		CHECK(offs[i] + lens[i] <= h->slot_size, "B %u L %u: array %d (%u + %" PRIu64 ") ends past the %u-byte slot",
		      B, L, i, offs[i], lens[i], h->slot_size);
		for (int j = 0; j < 4; j++)
			if (i != j)
				CHECK(offs[i] + lens[i] <= offs[j] || offs[j] + lens[j] <= offs[i],
				      "B %u L %u: arrays %d and %d overlap", B, L, i, j);
	}
	/* Slots follow the header back to back, and the last ends at the end of the ring. */
	for (uint64_t seq = 0; seq < 2 * slots; seq++) {
		uint8_t *s = ring_slot(r, seq);
		CHECK(s == (uint8_t *)h + FEED_RING_HEADER_SIZE + (seq % slots) * h->slot_size,
		      "slot of seq %" PRIu64 " is at the wrong place", seq);
	}
	CHECK((size_t)(ring_slot(r, slots - 1) + h->slot_size - (uint8_t *)h) == r->size,
	      "the last slot does not end at the ring's end");
	/* Every slot is really there and writable by the daemon. */
	memset(ring_slot(r, slots - 1), 0xab, h->slot_size);
	ring_free(r);
}

static void test_geometry(void)
{
	check_geometry(2, 1, 1);
	check_geometry(3, 2, 100);
	check_geometry(4, 8, 4096);
	check_geometry(2, 3, 17);

	struct ring *r = NULL;
	struct ring_geometry g = { .slot_count = 2, .batch_size = 65536, .seq_len = 32768, .rank = 0, .world = 1 };
	/* B*L + 1 = 2^31 + 1 does not fit the int32 cu_seqlens. */
	CHECK_INT(ring_new(&g, &r), -EINVAL);
	CHECK_U64(ring_slot_bytes(65536, 32768), 0);
	g.batch_size = 2;
	g.seq_len = 1073741824; /* B*L = 2^31 */
	CHECK_INT(ring_new(&g, &r), -EINVAL);
	g = (struct ring_geometry){ .slot_count = 1, .batch_size = 2, .seq_len = 8, .rank = 0, .world = 1 };
	CHECK_INT(ring_new(&g, &r), -EINVAL);
	g.slot_count = 0;
	CHECK_INT(ring_new(&g, &r), -EINVAL);
	g = (struct ring_geometry){ .slot_count = 2, .batch_size = 0, .seq_len = 8, .rank = 0, .world = 1 };
	CHECK_INT(ring_new(&g, &r), -EINVAL);
	g = (struct ring_geometry){ .slot_count = 2, .batch_size = 2, .seq_len = 8, .rank = 1, .world = 1 };
	CHECK_INT(ring_new(&g, &r), -EINVAL);
}

static void test_indices(void)
{
	struct ring_geometry g = { .slot_count = 4, .batch_size = 2, .seq_len = 16, .rank = 0, .world = 1 };
	struct ring *r = NULL;
	int e = ring_new(&g, &r);
	REQUIRE(e == 0, "ring_new returned %d", e);
	int err;

	/* Nobody waits: publishing costs no system call and leaves the eventfd empty. */
	r->cons->consumer_waiting = 0;
	ring_publish(r, 1);
	CHECK_U64(r->hdr->head, 1);
	efd_read(r->data_efd, &err);
	CHECK(err == EAGAIN, "data eventfd was kicked though the client was not waiting (%s)", strerror(err));

	/* The client sleeps: publishing kicks it. */
	r->cons->consumer_waiting = 1;
	ring_publish(r, 3);
	CHECK_U64(r->hdr->head, 3);
	uint64_t v = efd_read(r->data_efd, &err);
	CHECK(err == 0 && v >= 1, "data eventfd was not kicked for a waiting client (%s)", strerror(err));
	r->cons->consumer_waiting = 0;
	ring_publish(r, 4);
	efd_read(r->data_efd, &err);
	CHECK(err == EAGAIN, "data eventfd kicked after the client stopped waiting");

	/* Tails: forward up to head is fine; past head or backwards is a protocol error. */
	r->cons->tail = 2;
	CHECK_INT(ring_refresh_tail(r), 0);
	CHECK_U64(r->tail, 2);
	r->cons->tail = 5;
	CHECK_INT(ring_refresh_tail(r), -EPROTO);
	CHECK_U64(r->tail, 2);
	r->cons->tail = 1;
	CHECK_INT(ring_refresh_tail(r), -EPROTO);
	CHECK_U64(r->tail, 2);
	r->cons->tail = UINT64_MAX;
	CHECK_INT(ring_refresh_tail(r), -EPROTO);
	r->cons->tail = 4;
	CHECK_INT(ring_refresh_tail(r), 0);
	CHECK_U64(r->tail, 4);
	r->cons->tail = 4;
	CHECK_INT(ring_refresh_tail(r), 0);

	/* Waiting for space: the flag is raised, and space released meanwhile is noticed. */
	ring_publish(r, 8);
	CHECK(!ring_wait_space(r), "ring_wait_space saw space although the tail did not move");
	CHECK_U64(r->hdr->producer_waiting, 1);
	r->cons->tail = 6;
	CHECK(ring_wait_space(r), "ring_wait_space missed a tail that moved");
	uint64_t one = 1;
	CHECK(write(r->space_efd, &one, sizeof(one)) == sizeof(one), "kicking the space eventfd failed");
	ring_space_ack(r);
	CHECK_U64(r->hdr->producer_waiting, 0);
	efd_read(r->space_efd, &err);
	CHECK(err == EAGAIN, "ring_space_ack left the space eventfd readable");

	/* A failure reaches the client through the header and a kick, waiting or not. */
	ring_set_state(r, FEED_RING_FAILED, -ESTALE);
	CHECK_U64(r->hdr->state, FEED_RING_FAILED);
	CHECK_INT(r->hdr->error_code, -ESTALE);
	v = efd_read(r->data_efd, &err);
	CHECK(err == 0 && v >= 1, "ring_set_state did not kick the data eventfd");
	ring_free(r);
}

static ino_t inode(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* A ring of uid `owner` made while lending from p. */
static struct ring *pooled_ring(struct ring_pool *p, uint32_t owner, const struct ring_geometry *g)
{
	struct ring *r = NULL;
	ring_pool_lend(p, owner);
	int e = ring_new(g, &r);
	ring_pool_lend(NULL, 0);
	REQUIRE(e == 0 && r, "ring_new (lending for uid %u) returned %d", owner, e);
	return r;
}

/* Every byte of r's slots and the header past its geometry and indices: what a client could read that the daemon did not write for it. */
static bool slots_zero(const struct ring *r)
{
	const uint8_t *b = (const uint8_t *)r->hdr + FEED_RING_HEADER_SIZE;
	for (size_t i = 0; i < r->size - FEED_RING_HEADER_SIZE; i++)
		if (b[i])
			return false;
	return true;
}

static void test_pool(void)
{
	struct ring_geometry g = { .slot_count = 4, .batch_size = 2, .seq_len = 64, .rank = 1, .world = 2 };
	struct ring_pool *p = NULL;
	REQUIRE(ring_pool_new(4u << 20, &p) == 0, "ring_pool_new");
	struct ring_pool_counters n;

	/* A client of uid 1000 fills its ring, with a failure and a waiting producer in the header, and leaves. */
	struct ring *a = pooled_ring(p, 1000, &g);
	ino_t ino_a = inode(a->ring_fd);
	for (uint32_t s = 0; s < a->slot_count; s++)
		memset(ring_slot(a, s), 0xa5, a->slot_size);
	ring_publish(a, 4);
	a->hdr->wake_tail = 3;
	a->hdr->producer_waiting = 1;
	ring_set_state(a, FEED_RING_FAILED, -EIO);
	int data_efd_a = a->data_efd;
	struct stat cons_a;
	CHECK(fstat(a->consumer_fd, &cons_a) == 0, "fstat consumer page");
	/* What the client was sent and kept: the ring fd, read-only. */
	int kept = fcntl(a->ring_fd, F_DUPFD_CLOEXEC, 3);
	a->released = true; /* it said DETACH, its mapping gone */
	a = ring_free(a);
	ring_pool_counters(p, &n);
	CHECK_U64(n.idle_bytes, ring_slot_bytes(2, 64) * 4 + FEED_RING_HEADER_SIZE);

	/* Another uid never gets it: a ring of its own. */
	struct ring *b = pooled_ring(p, 1001, &g);
	CHECK(inode(b->ring_fd) != ino_a, "uid 1001 was given uid 1000's ring memory");
	/* Nor a ring of another size. */
	struct ring_geometry g2 = g;
	g2.seq_len = 128;
	struct ring *c = pooled_ring(p, 1000, &g2);
	CHECK(inode(c->ring_fd) != ino_a, "a ring of another size was given uid 1000's ring memory");
	c->released = true;
	c = ring_free(c);

	/* The same uid does: its memory, wiped, its header new, seals kept; the consumer page and eventfds new. */
	struct ring *a2 = pooled_ring(p, 1000, &g);
	CHECK(inode(a2->ring_fd) == ino_a, "uid 1000's next ring of the same size did not reuse its idle memory");
	CHECK(slots_zero(a2), "a reused ring still holds bytes of its previous client's batches");
	CHECK_U64(a2->hdr->magic, FEED_RING_MAGIC);
	CHECK_U64(a2->hdr->head, 0);
	CHECK_U64(a2->hdr->state, FEED_RING_RUNNING);
	CHECK_INT(a2->hdr->error_code, 0);
	CHECK_U64(a2->hdr->producer_waiting, 0);
	CHECK_U64(a2->hdr->wake_tail, 0);
	CHECK_U64(a2->hdr->rank, 1);
	CHECK_U64(a2->hdr->slot_count, 4);
	int seals = fcntl(a2->ring_fd, F_GET_SEALS);
	int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;
	CHECK(seals >= 0 && (seals & want) == want, "a reused ring's seals are %#x", seals);
	struct stat cons;
	CHECK(fstat(a2->consumer_fd, &cons) == 0 && cons.st_ino != cons_a.st_ino,
	      "a reused ring kept its previous client's consumer page");
	int err;
	efd_read(a2->data_efd, &err);
	CHECK(err == EAGAIN, "a reused ring's data eventfd carries its previous client's kicks");
	(void)data_efd_a;
	/* The departed client's fd maps what the daemon writes now: zeros until it publishes, and only read-only. */
	void *m = mmap(NULL, a2->size, PROT_READ | PROT_WRITE, MAP_SHARED, kept, 0);
	CHECK(m == MAP_FAILED, "the ring fd kept by a departed client maps writable");
	close(kept);
	ring_pool_counters(p, &n);
	CHECK_U64(n.reused, 1);
	CHECK_U64(n.idle_bytes, ring_slot_bytes(2, 128) * 4 + FEED_RING_HEADER_SIZE); /* c's, of the other size */

	/* Trimmed when idle: nothing kept, every fd closed. */
	a2->released = b->released = true;
	a2 = ring_free(a2);
	b = ring_free(b);
	ring_pool_counters(p, &n);
	CHECK(n.idle_bytes > 0, "freed rings were not kept");
	CHECK(ring_pool_trim(p, 0) == 0, "ring_pool_trim(0) let go of rings given back after 0");
	CHECK(ring_pool_trim(p, UINT64_MAX) == n.idle_bytes, "ring_pool_trim(all) did not let go of every idle ring");
	ring_pool_counters(p, &n);
	CHECK_U64(n.idle_bytes, 0);

	/* At most max_bytes idle: the oldest go first. */
	struct ring_pool *small = NULL;
	REQUIRE(ring_pool_new(ring_slot_bytes(2, 64) * 4 + FEED_RING_HEADER_SIZE, &small) == 0, "ring_pool_new");
	struct ring *x = pooled_ring(small, 1, &g), *y = pooled_ring(small, 2, &g);
	ino_t ino_y = inode(y->ring_fd);
	x->released = y->released = true;
	x = ring_free(x);
	y = ring_free(y);
	ring_pool_counters(small, &n);
	CHECK_U64(n.freed, 1);
	struct ring *y2 = pooled_ring(small, 2, &g);
	CHECK(inode(y2->ring_fd) == ino_y, "the newest idle ring was let go instead of the oldest");

	/* A ring that outlives its pool frees itself whole. */
	small = ring_pool_free(small);
	y2 = ring_free(y2);
	p = ring_pool_free(p);

	/*
	 * A ring whose client did not release it (the connection lost, feedd
	 * stopping, the session failed) may still be mapped by the client,
	 * holding a batch or reading its last cursor from it: never wiped,
	 * never reused. (It was, and a client resumed from batch 0.)
	 */
	REQUIRE(ring_pool_new(4u << 20, &p) == 0, "ring_pool_new");
	struct ring *held = pooled_ring(p, 1000, &g);
	ino_t ino_held = inode(held->ring_fd);
	for (uint32_t s = 0; s < held->slot_count; s++)
		memset(ring_slot(held, s), 0x5a, held->slot_size);
	ring_publish(held, 2);
	const uint8_t *client = mmap(NULL, held->size, PROT_READ, MAP_SHARED, held->ring_fd, 0);
	REQUIRE(client != MAP_FAILED, "mmap the ring as a client does");
	const size_t slot0 = (size_t)(ring_slot(held, 0) - (uint8_t *)held->hdr), slot_size = held->slot_size;
	const size_t size = held->size;
	held = ring_free(held);
	ring_pool_counters(p, &n);
	CHECK_U64(n.idle_bytes, 0);
	bool intact = true;
	for (size_t i = 0; i < slot_size; i++)
		intact &= client[slot0 + i] == 0x5a;
	CHECK(intact, "a ring freed while its client may map it was wiped under the client");
	struct ring *next = pooled_ring(p, 1000, &g);
	CHECK(inode(next->ring_fd) != ino_held, "a ring its client did not release was given to the uid's next ring");
	next = ring_free(next);
	munmap((void *)client, size);
	p = ring_pool_free(p);

	/* Without lending, no pool: rings are made and freed whole, as before. */
	struct ring *plain = NULL;
	REQUIRE(ring_new(&g, &plain) == 0, "ring_new");
	CHECK(plain->pool == NULL, "a ring made without lending has a pool");
	ring_free(plain);
}

int main(void)
{
	test_seals();
	test_geometry();
	test_indices();
	test_pool();
	return unit_exit("test-ring");
}
