/* SPDX-License-Identifier: MIT */
/*
 * Ring creation and the index protocol. Memory order: the producer fills a
 * slot, then stores head with release; the client loads head with acquire
 * before reading the slot. The waiting flags use sequentially consistent
 * fences so that "store index; fence; load flag" on one side and "store flag;
 * fence; load index" on the other cannot both miss each other.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/ring/ring.h"
#include "proto/macro.h"

#define PAGE 4096u
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

struct slot_layout {
	uint32_t off_input_ids, off_labels, off_position_ids, off_cu_seqlens, cu_capacity;
	size_t size;
};

static int layout(uint32_t B, uint32_t L, uint32_t state_bytes, struct slot_layout *ret)
{
	uint64_t n = (uint64_t)B * L;
	if (B == 0 || L == 0 || n + 1 > INT32_MAX)
		return -EINVAL;
	uint64_t arr = ALIGN_UP(n * 4, (uint64_t)64);
	uint64_t cu = ALIGN_UP((n + 1) * 4, (uint64_t)64);
	uint64_t size = FEED_SLOT_HEADER_SIZE + 3 * arr + cu;
	if (state_bytes)
		size = feed_slot_state_offset((uint32_t)(FEED_SLOT_HEADER_SIZE + 3 * arr), (uint32_t)(n + 1)) + state_bytes;
	size = ALIGN_UP(size, (uint64_t)PAGE);
	if (size > UINT32_MAX)
		return -EINVAL;
	*ret = (struct slot_layout){
		.off_input_ids = FEED_SLOT_HEADER_SIZE,
		.off_labels = (uint32_t)(FEED_SLOT_HEADER_SIZE + arr),
		.off_position_ids = (uint32_t)(FEED_SLOT_HEADER_SIZE + 2 * arr),
		.off_cu_seqlens = (uint32_t)(FEED_SLOT_HEADER_SIZE + 3 * arr),
		.cu_capacity = (uint32_t)(n + 1),
		.size = (size_t)size,
	};
	return 0;
}

size_t ring_slot_bytes(uint32_t batch_size, uint32_t seq_len)
{
	struct slot_layout l;
	return layout(batch_size, seq_len, 0, &l) < 0 ? 0 : l.size;
}

/*
 * The pool (ring.h): idle ring memories, newest first. Main thread only, as
 * ring_new and ring_free are.
 */
struct idle_ring {
	struct idle_ring *next;
	int fd;
	void *map;
	size_t size;
	uint32_t owner;
	uint64_t since_ns; /* given back at */
};

struct ring_pool {
	unsigned refs;     /* the creator's and one per ring made while lending */
	bool closed;       /* ring_pool_free was called: rings given back are freed */
	size_t max_bytes, idle_bytes;
	struct idle_ring *idle;
	struct ring_pool_counters n;
};

/* The pool ring_new takes from and its owner (ring_pool_lend); NULL: none. */
static struct ring_pool *lending;
static uint32_t lending_owner;

static void idle_ring_free(struct ring_pool *p, struct idle_ring *e)
{
	munmap(e->map, e->size);
	close(e->fd);
	p->idle_bytes -= e->size;
	p->n.freed++;
	free(e);
}

static void pool_unref(struct ring_pool *p)
{
	if (p && --p->refs == 0) {
		assert(!p->idle && lending != p);
		free(p);
	}
}

int ring_pool_new(size_t max_bytes, struct ring_pool **ret)
{
	struct ring_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->refs = 1;
	p->max_bytes = max_bytes;
	*ret = p;
	return 0;
}

struct ring_pool *ring_pool_free(struct ring_pool *p)
{
	if (!p)
		return NULL;
	if (lending == p)
		lending = NULL;
	ring_pool_trim(p, UINT64_MAX);
	p->closed = true;
	pool_unref(p);
	return NULL;
}

void ring_pool_lend(struct ring_pool *p, uint32_t owner)
{
	lending = p;
	lending_owner = owner;
}

size_t ring_pool_trim(struct ring_pool *p, uint64_t before_ns)
{
	size_t freed = 0;
	if (!p)
		return 0;
	for (struct idle_ring **pp = &p->idle; *pp;) {
		struct idle_ring *e = *pp;
		if (e->since_ns < before_ns) {
			*pp = e->next;
			freed += e->size;
			idle_ring_free(p, e);
		} else {
			pp = &e->next;
		}
	}
	return freed;
}

void ring_pool_counters(const struct ring_pool *p, struct ring_pool_counters *ret)
{
	*ret = p->n;
	ret->idle_bytes = p->idle_bytes;
}

/*
 * Gives r's memory back to its pool: wiped (nothing of its client's batches
 * stays in it, header included) and kept for the next ring of its owner and
 * size. The oldest idle rings make room. Returns whether the pool took it.
 */
static bool pool_give(struct ring *r)
{
	struct ring_pool *p = r->pool;
	if (p->closed || r->size > p->max_bytes)
		return false;
	struct idle_ring *e = malloc(sizeof(*e));
	if (!e)
		return false;
	memset(r->hdr, 0, r->size);
	*e = (struct idle_ring){ .fd = r->ring_fd, .map = r->hdr, .size = r->size, .owner = r->owner,
				 .since_ns = now_ns() };
	/* Room for it: the oldest go first (the list is newest first). */
	while (p->idle_bytes + e->size > p->max_bytes) {
		struct idle_ring **pp = &p->idle;
		while ((*pp)->next)
			pp = &(*pp)->next;
		struct idle_ring *old = *pp;
		*pp = NULL;
		idle_ring_free(p, old);
	}
	e->next = p->idle;
	p->idle = e;
	p->idle_bytes += e->size;
	r->ring_fd = -1;
	r->hdr = NULL;
	return true;
}

/* An idle ring of owner and exactly size bytes, taken out of p (newest first: its pages are the warmest); NULL: none. */
static struct idle_ring *pool_take(struct ring_pool *p, uint32_t owner, size_t size)
{
	for (struct idle_ring **pp = &p->idle; *pp; pp = &(*pp)->next) {
		struct idle_ring *e = *pp;
		if (e->owner == owner && e->size == size) {
			*pp = e->next;
			p->idle_bytes -= e->size;
			return e;
		}
	}
	return NULL;
}

struct ring *ring_free(struct ring *r)
{
	if (!r)
		return NULL;
	if (r->pool && r->made && r->released)
		pool_give(r);
	pool_unref(r->pool);
	if (r->hdr)
		munmap(r->hdr, r->size);
	if (r->cons)
		munmap(r->cons, FEED_CONSUMER_PAGE_SIZE);
	int fds[] = { r->ring_fd, r->consumer_fd, r->data_efd, r->space_efd };
	for (size_t i = 0; i < ARRAY_SIZE(fds); i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(r);
	return NULL;
}

/* A memfd of `size` bytes whose pages are allocated now. */
static int reserved_memfd(const char *name, size_t size)
{
	_cleanup_close_ int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0)
		return -errno;
	if (fallocate(fd, 0, 0, (off_t)size) < 0)
		return errno == ENOSPC ? -ENOMEM : -errno;
	return TAKE_FD(fd);
}

int ring_new(const struct ring_geometry *g, struct ring **ret)
{
	struct slot_layout l;
	int e = layout(g->batch_size, g->seq_len, g->state_bytes, &l);
	if (e < 0 || g->slot_count < 2 || g->world == 0 || g->rank >= g->world)
		return -EINVAL;
	if ((uint64_t)l.size * g->slot_count > SIZE_MAX / 2)
		return -ENOMEM;

	struct ring *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->ring_fd = r->consumer_fd = r->data_efd = r->space_efd = -1;
	r->slot_count = g->slot_count;
	r->slot_size = (uint32_t)l.size;
	r->size = FEED_RING_HEADER_SIZE + (size_t)l.size * g->slot_count;
	if (lending) {
		r->pool = lending;
		r->owner = lending_owner;
		lending->refs++;
	}

	/* The ring's memory: an idle one of the same owner and size (sealed, mapped, wiped), or a new one. */
	struct idle_ring *idle = r->pool ? pool_take(r->pool, r->owner, r->size) : NULL;
	if (idle) {
		r->ring_fd = idle->fd;
		r->hdr = idle->map;
		r->pool->n.reused++;
		free(idle);
	} else {
		if (r->pool)
			r->pool->n.made++;
		e = r->ring_fd = reserved_memfd("feedd-ring", r->size);
		if (e < 0)
			goto fail;
		void *m = mmap(NULL, r->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->ring_fd, 0);
		if (m == MAP_FAILED) {
			e = -errno;
			goto fail;
		}
		r->hdr = m;
		/* From here on nobody else can map the ring writable, resize it, or lift the seals. */
		if (fcntl(r->ring_fd, F_ADD_SEALS, SEALS) < 0) {
			e = -errno;
			goto fail;
		}
	}
	/*
	 * The consumer page and the eventfds are new for every attach, pooled or
	 * not: a departed client may still hold them (a forked child, a mapping
	 * kept), and the consumer page is the client's to write.
	 */
	e = r->consumer_fd = reserved_memfd("feedd-consumer", FEED_CONSUMER_PAGE_SIZE);
	if (e < 0)
		goto fail;
	r->data_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	r->space_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (r->data_efd < 0 || r->space_efd < 0) {
		e = -errno;
		goto fail;
	}
	void *m = mmap(NULL, FEED_CONSUMER_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, r->consumer_fd, 0);
	if (m == MAP_FAILED) {
		e = -errno;
		goto fail;
	}
	r->cons = m;
	if (fcntl(r->consumer_fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		e = -errno;
		goto fail;
	}

	*r->hdr = (struct feed_ring_header){
		.magic = FEED_RING_MAGIC,
		.version = FEED_RING_VERSION,
		.header_size = FEED_RING_HEADER_SIZE,
		.slot_count = g->slot_count,
		.slot_size = r->slot_size,
		.batch_size = g->batch_size,
		.seq_len = g->seq_len,
		.off_input_ids = l.off_input_ids,
		.off_labels = l.off_labels,
		.off_position_ids = l.off_position_ids,
		.off_cu_seqlens = l.off_cu_seqlens,
		.cu_capacity = l.cu_capacity,
		.rank = g->rank,
		.world = g->world,
		.state_capacity = g->state_bytes,
		.daemon_pid = (uint64_t)getpid(),
	};
	r->cons->magic = FEED_CONSUMER_MAGIC;
	r->cons->version = FEED_RING_VERSION;
	r->made = true;
	*ret = r;
	return 0;
fail:
	ring_free(r);
	return e;
}

static void kick(int efd)
{
	uint64_t one = 1;
	/* EAGAIN means the counter is already non-zero: the sleeper will wake anyway. */
	ssize_t _unused_ n = write(efd, &one, sizeof(one));
}

void ring_publish(struct ring *r, uint64_t head)
{
	__atomic_store_n(&r->hdr->head, head, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&r->cons->consumer_waiting, __ATOMIC_RELAXED))
		kick(r->data_efd);
}

int ring_refresh_tail(struct ring *r)
{
	uint64_t tail = __atomic_load_n(&r->cons->tail, __ATOMIC_ACQUIRE);
	uint64_t head = r->hdr->head;
	if (tail > head || tail < r->tail)
		return -EPROTO;
	r->tail = tail;
	return 0;
}

bool ring_wait_space(struct ring *r)
{
	uint64_t wake = r->tail + MAX(r->slot_count / 2, 1u);
	__atomic_store_n(&r->hdr->wake_tail, wake, __ATOMIC_RELAXED);
	__atomic_store_n(&r->hdr->producer_waiting, 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	uint64_t before = r->tail;
	if (ring_refresh_tail(r) < 0)
		return false;
	return r->tail != before;
}

void ring_space_ack(struct ring *r)
{
	uint64_t v;
	__atomic_store_n(&r->hdr->producer_waiting, 0, __ATOMIC_RELAXED);
	ssize_t _unused_ n = read(r->space_efd, &v, sizeof(v));
}

void ring_set_state(struct ring *r, uint32_t state, int error_code)
{
	r->hdr->error_code = error_code;
	__atomic_store_n(&r->hdr->state, state, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	kick(r->data_efd);
}

void ring_read_consumer(const struct ring *r, uint64_t published, struct ring_consumer *ret)
{
	const struct feed_consumer_page *cp = r->cons;
	ret->tail = MIN(__atomic_load_n(&cp->tail, __ATOMIC_RELAXED), published);
	ret->delivered = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), published);
	ret->waiting = __atomic_load_n(&cp->consumer_waiting, __ATOMIC_RELAXED) != 0;
	ret->wait_ns = __atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED);
	ret->step_ns = __atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED);
	ret->h2d_ns = __atomic_load_n(&cp->h2d_ns_total, __ATOMIC_RELAXED);
	ret->reports = __atomic_load_n(&cp->reports, __ATOMIC_RELAXED);
	ret->reported_step_ns = __atomic_load_n(&cp->reported_step_ns_total, __ATOMIC_RELAXED);
	ret->reconnects = __atomic_load_n(&cp->reconnects, __ATOMIC_RELAXED);
	ret->reconnect_ns = __atomic_load_n(&cp->reconnect_ns_total, __ATOMIC_RELAXED);
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++) {
		ret->hist_wait[b] = __atomic_load_n(&cp->hist_wait[b], __ATOMIC_RELAXED);
		ret->hist_step[b] = __atomic_load_n(&cp->hist_step[b], __ATOMIC_RELAXED);
	}
}
