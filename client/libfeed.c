/* SPDX-License-Identifier: MIT */
/*
 * libfeed: the client side of proto/wire.h and proto/ring_abi.h.
 *
 * The control socket is used only to connect, attach and learn why a stream
 * stopped; batches are taken from the mapped ring with two atomic loads and
 * released with one store, with a system call only when one side sleeps.
 * Everything read from the daemon (messages, ring geometry, slot headers) is
 * validated before use. Telemetry goes into the consumer page the daemon
 * reads: no message per batch.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "feed/feed.h"
#include "proto/macro.h"
#include "proto/ring_abi.h"
#include "proto/wire.h"

/* Device batches need CUDA's headers (only them); a target that compiles this file without them gets none. */
#if HAVE_CUDA && __has_include(<cuda.h>)
#define FEED_CUDA 1
#else
#define FEED_CUDA 0
#endif
#if FEED_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#endif

#define FEED_EXPORT __attribute__((visibility("default")))
#define REPLY_TIMEOUT_MS 30000

_Static_assert(FEED_CURSOR_MAX_LEN == FEED_CURSOR_MAX, "public cursor size matches the ABI");

struct feed_client {
	int fd;
	char error[WIRE_MESSAGE_MAX + 64];
	uint32_t daemon_pid;

	bool attached;
	int stopped; /* the code that ended the stream, 0 while it flows */
	struct feed_ring_header *hdr;
	size_t ring_size;
	struct feed_consumer_page *cons;
	int data_efd, space_efd;
	uint32_t slot_count, slot_size, batch_size, seq_len;
	uint64_t first_batch;
	uint64_t next_seq; /* next sequence to hand out */
	uint64_t tail;     /* sequences released */
	uint64_t last_return_ns;
	int device;              /* the GPU batches are staged on, -1: host batches only */
	struct device_ring *dev; /* that GPU's buffers and events (device_attach) */
	const char *held_cursor;       /* cursor of the last batch delivered, in its slot */
	char cursor[FEED_CURSOR_MAX];  /* a copy, made when that batch is released */
};

/* Records a message for feed_client_error() and returns code. Keeps errno. */
static int fail(feed_client *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(feed_client *c, int code, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->error, sizeof(c->error), fmt, ap);
	va_end(ap);
	errno = saved;
	return code;
}

static int send_all(feed_client *c, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno == -EPIPE ? -ECONNRESET : -errno;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Receives exactly len bytes, collecting passed fds into fds/n_fds (closing
 * any beyond max_fds). Waits at most timeout_ms per chunk.
 */
static int recv_all(feed_client *c, void *buf, size_t len, int timeout_ms, int *fds, unsigned max_fds,
		    unsigned *n_fds)
{
	uint8_t *p = buf;
	while (len > 0) {
		struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
		int k = poll(&pfd, 1, timeout_ms);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -ETIMEDOUT;
		struct iovec iov = { .iov_base = p, .iov_len = len };
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int) * 8)];
		} cm;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
				     .msg_controllen = sizeof(cm.buf) };
		ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
			if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
				continue;
			size_t m = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int got[8];
			memcpy(got, CMSG_DATA(h), MIN(m, ARRAY_SIZE(got)) * sizeof(int));
			for (size_t i = 0; i < MIN(m, ARRAY_SIZE(got)); i++) {
				if (n_fds && *n_fds < max_fds)
					fds[(*n_fds)++] = got[i];
				else
					close(got[i]);
			}
		}
		if (n < 0)
			return errno == ECONNRESET ? -ECONNRESET : -errno;
		if (n == 0)
			return -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Reads one message. Returns its type with the payload in *ret_payload
 * (malloc'd, caller frees), or a negative code. An ERROR message is turned
 * into its code, with its text recorded.
 */
static int recv_msg(feed_client *c, int timeout_ms, void **ret_payload, size_t *ret_len, int *fds, unsigned max_fds,
		    unsigned *n_fds)
{
	uint8_t hb[WIRE_HEADER_SIZE];
	int r = recv_all(c, hb, sizeof(hb), timeout_ms, fds, max_fds, n_fds);
	if (r == -ECONNRESET)
		return fail(c, r, "feedd closed the connection (the daemon stopped or crashed)");
	if (r < 0)
		return fail(c, r, "reading from feedd: %s", feed_strerror(r));
	struct wire_header h;
	r = wire_header_decode(hb, sizeof(hb), WIRE_MAX_REPLY, &h);
	if (r == 0 && h.version != WIRE_VERSION)
		r = -EBADMSG;
	if (r < 0)
		return fail(c, -EPROTO, "feedd sent a malformed message header");
	void *payload = malloc(MAX(h.length, 1u));
	if (!payload)
		return fail(c, -ENOMEM, "out of memory");
	r = recv_all(c, payload, h.length, REPLY_TIMEOUT_MS, fds, max_fds, n_fds);
	if (r < 0) {
		free(payload);
		return fail(c, r, "reading from feedd: %s", feed_strerror(r));
	}
	if (h.type == WIRE_ERROR) {
		struct wire_error e;
		r = wire_decode_error(payload, h.length, &e);
		free(payload);
		if (r < 0)
			return fail(c, -EPROTO, "feedd sent a malformed error message");
		return fail(c, e.code, "%s", e.message);
	}
	*ret_payload = payload;
	*ret_len = h.length;
	return h.type;
}

/* Writes one line into err (may be NULL) and returns code. */
static int connect_fail(char *err, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int connect_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

FEED_EXPORT int feed_client_connect(const char *socket_path, feed_client **ret)
{
	return feed_client_connect_err(socket_path, NULL, 0, ret);
}

FEED_EXPORT int feed_client_connect_err(const char *socket_path, char *err, size_t errlen, feed_client **ret)
{
	int saved = errno;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (wire_socket_path(socket_path, sa.sun_path, sizeof(sa.sun_path)) < 0)
		return connect_fail(err, errlen, -ENAMETOOLONG, "the socket path is longer than %zu bytes",
				    sizeof(sa.sun_path) - 1);

	feed_client *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = saved;
		return connect_fail(err, errlen, -ENOMEM, "out of memory");
	}
	c->data_efd = c->space_efd = -1;
	c->device = -1;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int r = c->fd < 0 ? -errno : 0;
	if (r < 0)
		fail(c, r, "cannot create a socket: %s", feed_strerror(r));
	if (r == 0 && connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		fail(c, r, "cannot reach feedd at %s: %s", sa.sun_path, feed_strerror(r));
	}
	if (r == 0) {
		struct wire_hello h = { .min_version = WIRE_VERSION, .max_version = WIRE_VERSION,
					.pid = (uint32_t)getpid() };
		char comm[64] = "";
		FILE *f = fopen("/proc/self/comm", "re");
		if (f) {
			if (fgets(comm, sizeof(comm), f))
				comm[strcspn(comm, "\n")] = 0;
			fclose(f);
		}
		snprintf(h.name, sizeof(h.name), "%.31s", comm);
		uint8_t buf[WIRE_HEADER_SIZE + WIRE_HELLO_SIZE];
		int n = wire_encode_hello(buf, sizeof(buf), &h);
		r = n < 0 ? n : send_all(c, buf, (size_t)n);
		/*
		 * A daemon that refuses the connection (access control, a connection
		 * limit) sends its ERROR first and stops reading: the reason may be
		 * waiting even when the hello could not be sent.
		 */
		if (r < 0) {
			fail(c, r, "cannot send to feedd: %s", feed_strerror(r));
			r = 0;
		}
	}
	if (r == 0) {
		void *p;
		size_t len;
		int type = recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, NULL, 0, NULL);
		if (type == WIRE_HELLO_REPLY) {
			struct wire_hello_reply hr;
			r = wire_decode_hello_reply(p, len, &hr) < 0 || hr.version != WIRE_VERSION ? -EPROTO : 0;
			if (r < 0)
				fail(c, r, "feedd sent a malformed HELLO_REPLY");
			c->daemon_pid = hr.daemon_pid;
			free(p);
		} else {
			if (type >= 0)
				free(p);
			r = type < 0 ? type : fail(c, -EPROTO, "feedd answered HELLO with message type %d", type);
		}
	}
	if (r < 0) {
		if (err && errlen)
			snprintf(err, errlen, "%s", c->error[0] ? c->error : feed_strerror(r));
		feed_client_close(c);
		errno = saved;
		return r;
	}
	c->error[0] = 0;
	*ret = c;
	errno = saved;
	return 0;
}

/* Checks the ring's geometry against the reply before trusting any offset in it. */
static int check_ring(feed_client *c, const struct wire_attach_reply *rep)
{
	const struct feed_ring_header *h = c->hdr;
	uint64_t n = (uint64_t)rep->batch_size * rep->seq_len;
	if (h->magic != FEED_RING_MAGIC || h->version != FEED_RING_VERSION)
		return -EPROTO;
	if (h->slot_count != rep->slot_count || h->batch_size != rep->batch_size || h->seq_len != rep->seq_len ||
	    h->slot_count < 2 || n == 0 || n + 1 > INT32_MAX)
		return -EPROTO;
	if (h->header_size < sizeof(*h) || (uint64_t)h->header_size + (uint64_t)h->slot_size * h->slot_count > c->ring_size)
		return -EPROTO;
	/* Page multiples (ring_abi.h): a slot header must be aligned for its u64 fields (found by fuzz-ring). */
	if (h->header_size % 4096 || h->slot_size % 4096)
		return -EPROTO;
	uint64_t arrays[3] = { h->off_input_ids, h->off_labels, h->off_position_ids };
	for (size_t i = 0; i < 3; i++)
		if (arrays[i] < FEED_SLOT_HEADER_SIZE || arrays[i] % 4 || arrays[i] + 4 * n > h->slot_size)
			return -EPROTO;
	if (h->cu_capacity < n + 1 || h->off_cu_seqlens < FEED_SLOT_HEADER_SIZE || h->off_cu_seqlens % 4 ||
	    (uint64_t)h->off_cu_seqlens + 4ull * h->cu_capacity > h->slot_size)
		return -EPROTO;
	return 0;
}

/* Maps a sealed memfd of at least `size` bytes. */
static int map_fd(int fd, size_t size, int prot, void **ret)
{
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	int seals = fcntl(fd, F_GET_SEALS);
	/* Without a shrink seal the daemon could truncate the file under us: SIGBUS. */
	if ((uint64_t)st.st_size < size || seals < 0 || !(seals & F_SEAL_SHRINK))
		return -EPROTO;
	void *m = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED)
		return -errno;
	*ret = m;
	return 0;
}

static int device_attach(feed_client *c, const struct wire_attach *a);

/* ATTACH with wire flags (WIRE_ATTACH_DEVICE: the device half follows, device_attach). */
static int attach(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor,
		  uint32_t flags, uint32_t device)
{
	int saved = errno, r;
	if (c->attached)
		return fail(c, -EALREADY, "this client is already attached");
	struct wire_attach a = { .rank = rank, .world = world, .flags = flags, .device = device };
	if (!feed || strlen(feed) >= sizeof(a.feed) || !*feed)
		return fail(c, -EINVAL, "feed name must be 1..%zu bytes", sizeof(a.feed) - 1);
	if (world == 0 || rank >= world)
		return fail(c, -EINVAL, "rank %u is not in world of size %u", rank, world);
	if (cursor && *cursor) {
		if (strlen(cursor) >= sizeof(a.cursor))
			return fail(c, -EINVAL, "cursor is too long");
		strcpy(a.cursor, cursor);
		a.flags |= WIRE_ATTACH_RESUME;
	}
	strcpy(a.feed, feed);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE];
	int n = wire_encode_attach(buf, sizeof(buf), &a);
	if (n < 0)
		return fail(c, n, "cannot encode the attach request");
	r = send_all(c, buf, (size_t)n);
	if (r < 0)
		return fail(c, r, "sending to feedd: %s", feed_strerror(r));

	int fds[WIRE_ATTACH_FDS] = { -1, -1, -1, -1 };
	unsigned n_fds = 0;
	void *p = NULL;
	size_t len;
	int type = recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, fds, WIRE_ATTACH_FDS, &n_fds);
	struct wire_attach_reply rep;
	if (type < 0) {
		r = type;
		goto out;
	}
	if (type != WIRE_ATTACH_REPLY || wire_decode_attach_reply(p, len, &rep) < 0 || n_fds != WIRE_ATTACH_FDS ||
	    rep.consumer_size != FEED_CONSUMER_PAGE_SIZE) {
		r = fail(c, -EPROTO, "feedd sent an unexpected reply to attach");
		goto out;
	}
	c->ring_size = rep.ring_size;
	void *m;
	r = map_fd(fds[0], c->ring_size, PROT_READ, &m);
	if (r < 0) {
		r = fail(c, r, "cannot map the batch ring: %s", feed_strerror(r));
		goto out;
	}
	c->hdr = m;
	r = map_fd(fds[1], FEED_CONSUMER_PAGE_SIZE, PROT_READ | PROT_WRITE, &m);
	if (r < 0) {
		r = fail(c, r, "cannot map the consumer page: %s", feed_strerror(r));
		goto out;
	}
	c->cons = m;
	if (check_ring(c, &rep) < 0 || c->cons->magic != FEED_CONSUMER_MAGIC) {
		r = fail(c, -EPROTO, "the batch ring feedd sent is inconsistent");
		goto out;
	}
	c->data_efd = fds[2];
	c->space_efd = fds[3];
	fds[2] = fds[3] = -1;
	c->slot_count = rep.slot_count;
	c->slot_size = c->hdr->slot_size;
	c->batch_size = rep.batch_size;
	c->seq_len = rep.seq_len;
	c->first_batch = rep.first_batch;
	c->next_seq = c->tail = 0;
	c->attached = true;
	c->error[0] = 0;
	r = (flags & WIRE_ATTACH_DEVICE) ? device_attach(c, &a) : 0;
out:
	free(p);
	/* The mappings keep the memfds alive; the fds themselves are not needed. */
	for (unsigned i = 0; i < WIRE_ATTACH_FDS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (r < 0 && !c->attached) {
		if (c->hdr)
			munmap(c->hdr, c->ring_size);
		if (c->cons)
			munmap(c->cons, FEED_CONSUMER_PAGE_SIZE);
		c->hdr = NULL;
		c->cons = NULL;
	}
	errno = saved;
	return r;
}

/* Why the stream stopped: reads the daemon's ERROR message if it sent one. */
static int stream_stopped(feed_client *c, int fallback)
{
	if (c->stopped)
		return c->stopped;
	void *p = NULL;
	size_t len;
	int type = recv_msg(c, 1000, &p, &len, NULL, 0, NULL);
	if (type >= 0) {
		free(p);
		type = fail(c, -EPROTO, "feedd sent an unexpected message");
	}
	if (type == -ETIMEDOUT)
		type = fail(c, fallback, "the stream stopped: %s", feed_strerror(fallback));
	c->stopped = type;
	return type;
}

static void kick_producer(feed_client *c)
{
	int saved = errno;
	uint64_t one = 1;
	ssize_t _unused_ n = write(c->space_efd, &one, sizeof(one));
	errno = saved;
}

static void record(uint64_t *total, uint64_t *last, uint64_t *hist, uint64_t v)
{
	__atomic_store_n(total, *total + v, __ATOMIC_RELAXED);
	__atomic_store_n(last, v, __ATOMIC_RELAXED);
	unsigned b = feed_hist_bucket(v);
	__atomic_store_n(&hist[b], hist[b] + 1, __ATOMIC_RELAXED);
}

FEED_EXPORT int feed_client_next(feed_client *c, int timeout_ms, struct feed_batch *ret)
{
	int saved = errno;
	if (!c->attached)
		return fail(c, -ENOTCONN, "not attached to a feed");
	if (c->stopped)
		return c->stopped;
	if (c->next_seq - c->tail >= c->slot_count)
		return fail(c, -ENOBUFS, "all %u slots are held: release a batch first", c->slot_count);

	uint64_t t0 = now_ns();
	if (c->last_return_ns)
		record(&c->cons->step_ns_total, &c->cons->last_step_ns, c->cons->hist_step, t0 - c->last_return_ns);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : t0 + (uint64_t)timeout_ms * NSEC_PER_MSEC;
	int r = 0;

	for (;;) {
		if (__atomic_load_n(&c->hdr->head, __ATOMIC_ACQUIRE) > c->next_seq)
			break;
		uint32_t state = __atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE);
		if (state != FEED_RING_RUNNING) {
			r = stream_stopped(c, state == FEED_RING_STOPPING ? -ESHUTDOWN : -EIO);
			goto out;
		}
		uint64_t now = now_ns();
		if (now >= deadline) {
			r = fail(c, -ETIMEDOUT, "no batch within %d ms", timeout_ms);
			goto out;
		}
		/* A daemon waiting for half the ring may be waiting on batches we hold: wake it. */
		if (__atomic_load_n(&c->hdr->producer_waiting, __ATOMIC_RELAXED))
			kick_producer(c);
		/* Announce that we sleep, then look once more: the daemon kicks only sleepers. */
		__atomic_store_n(&c->cons->consumer_waiting, 1, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(&c->hdr->head, __ATOMIC_ACQUIRE) > c->next_seq ||
		    __atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE) != FEED_RING_RUNNING) {
			__atomic_store_n(&c->cons->consumer_waiting, 0, __ATOMIC_RELAXED);
			continue;
		}
		struct pollfd pfd[2] = { { .fd = c->data_efd, .events = POLLIN }, { .fd = c->fd, .events = POLLIN } };
		uint64_t left = deadline - now;
		int wait_ms = deadline == UINT64_MAX ? -1 : (int)MIN((left + NSEC_PER_MSEC - 1) / NSEC_PER_MSEC, (uint64_t)INT32_MAX);
		int k = poll(pfd, 2, wait_ms);
		__atomic_store_n(&c->cons->consumer_waiting, 0, __ATOMIC_RELAXED);
		if (k < 0 && errno != EINTR) {
			r = fail(c, -errno, "poll: %s", feed_strerror(-errno));
			goto out;
		}
		if (k > 0 && (pfd[0].revents & POLLIN)) {
			uint64_t v;
			ssize_t _unused_ n = read(c->data_efd, &v, sizeof(v));
		}
		if (k > 0 && pfd[1].revents) {
			/* The daemon only speaks now to say the stream ended, or it hung up. */
			if (__atomic_load_n(&c->hdr->head, __ATOMIC_ACQUIRE) > c->next_seq)
				break;
			r = stream_stopped(c, -ECONNRESET);
			goto out;
		}
	}

	const uint8_t *slot = (const uint8_t *)c->hdr + c->hdr->header_size + (size_t)(c->next_seq % c->slot_count) * c->slot_size;
	const struct feed_slot_header *h = (const struct feed_slot_header *)slot;
	const struct feed_ring_header *g = c->hdr;
	if (h->seq != c->next_seq || h->batch_size != c->batch_size || h->seq_len != c->seq_len ||
	    h->n_cu_seqlens < 2 || h->n_cu_seqlens > g->cu_capacity || !memchr(h->cursor, 0, sizeof(h->cursor))) {
		r = fail(c, -EPROTO, "slot %llu of the ring is inconsistent", (unsigned long long)c->next_seq);
		c->stopped = r;
		goto out;
	}
	*ret = (struct feed_batch){
		.index = h->batch_index,
		.epoch = h->epoch,
		.rank = h->rank,
		.world = h->world,
		.batch_size = h->batch_size,
		.seq_len = h->seq_len,
		.input_ids = (const int32_t *)(slot + g->off_input_ids),
		.labels = (const int32_t *)(slot + g->off_labels),
		.position_ids = (const int32_t *)(slot + g->off_position_ids),
		.cu_seqlens = (const int32_t *)(slot + g->off_cu_seqlens),
		.n_cu_seqlens = h->n_cu_seqlens,
		.n_docs = h->n_docs,
		.cursor = h->cursor,
		.seq = c->next_seq,
	};
	c->next_seq++;
	/* The cursor is copied out only when its slot is released: next() stays small. */
	c->held_cursor = h->cursor;
	__atomic_store_n(&c->cons->delivered, c->cons->delivered + 1, __ATOMIC_RELAXED);
	__atomic_store_n(&c->cons->last_delivered_batch, h->batch_index + 1, __ATOMIC_RELAXED);
out:;
	uint64_t t1 = now_ns();
	record(&c->cons->wait_ns_total, &c->cons->last_wait_ns, c->cons->hist_wait, t1 - t0);
	c->last_return_ns = t1;
	errno = saved;
	return r;
}

/*
 * Device batches. The daemon copies each batch into a buffer on the client's
 * GPU and records the slot's `ready` event; next() hands out the host view,
 * feed_client_device_batch() makes the caller's stream wait on `ready` (no
 * CPU wait), and releasing records `release` on the caller's stream before
 * tail moves, so the daemon's next copy into that buffer waits for the
 * client's kernels. The CUDA driver is loaded at run time (dlopen of
 * libcuda.so.1): libfeed itself links no CUDA library and works without one.
 * Events and buffers are opened once per attach and closed with the client.
 */
struct device_ring {
#if FEED_CUDA
	void *lib;
	struct {
		PFN_cuInit_v2000 init;
		PFN_cuDeviceGet_v2000 device_get;
		PFN_cuDevicePrimaryCtxRetain_v7000 retain;
		PFN_cuDevicePrimaryCtxRelease_v11000 unretain;
		PFN_cuCtxPushCurrent_v4000 push;
		PFN_cuCtxPopCurrent_v4000 pop;
		PFN_cuIpcOpenEventHandle_v4010 open_event;
		PFN_cuEventDestroy_v4000 event_destroy;
		PFN_cuStreamWaitEvent_v3020 wait;
		PFN_cuEventRecord_v2000 record;
		PFN_cuIpcOpenMemHandle_v11000 open_mem;
		PFN_cuIpcCloseMemHandle_v4010 close_mem;
		PFN_cuMemImportFromShareableHandle_v10020 import;
		PFN_cuMemAddressReserve_v10020 reserve;
		PFN_cuMemMap_v10020 map;
		PFN_cuMemSetAccess_v10020 set_access;
		PFN_cuMemUnmap_v10020 unmap;
		PFN_cuMemAddressFree_v10020 address_free;
		PFN_cuMemRelease_v10020 mem_release;
	} cu;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr base;
	size_t size, stride;
	bool vmm, reserved, mapped, imported;
	CUmemGenericAllocationHandle handle;
	uint32_t slots;
	CUevent *ready, *release;
	uint8_t *recorded; /* per slot: `release` recorded for its current batch (atomic) */
#endif
	int kind; /* WIRE_DEVICE_* */
};

#if FEED_CUDA
static bool cu_entry(struct device_ring *d, PFN_cuGetProcAddress_v12000 get, const char *name, void **fn)
{
	CUdriverProcAddressQueryResult q;
	return get(name, fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS && q == CU_GET_PROC_ADDRESS_SUCCESS &&
	       *fn;
}

/* Loads the driver and its entry points. Returns 0, or -ENODEV with the reason in c's error. */
static int cu_load(feed_client *c, struct device_ring *d)
{
	d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!d->lib)
		return fail(c, -ENODEV, "cannot load the CUDA driver (libcuda.so.1): %s", dlerror());
	PFN_cuGetProcAddress_v12000 get;
	*(void **)&get = dlsym(d->lib, "cuGetProcAddress_v2"); /* POSIX's way to take a function from dlsym */
	if (!get)
		return fail(c, -ENODEV, "the CUDA driver is older than 12.0 (no cuGetProcAddress_v2)");
#define E(field, name) cu_entry(d, get, name, (void **)&d->cu.field)
	if (!(E(init, "cuInit") && E(device_get, "cuDeviceGet") && E(retain, "cuDevicePrimaryCtxRetain") &&
	      E(unretain, "cuDevicePrimaryCtxRelease") && E(push, "cuCtxPushCurrent") && E(pop, "cuCtxPopCurrent") &&
	      E(open_event, "cuIpcOpenEventHandle") && E(event_destroy, "cuEventDestroy") &&
	      E(wait, "cuStreamWaitEvent") && E(record, "cuEventRecord") && E(open_mem, "cuIpcOpenMemHandle") &&
	      E(close_mem, "cuIpcCloseMemHandle") && E(import, "cuMemImportFromShareableHandle") &&
	      E(reserve, "cuMemAddressReserve") && E(map, "cuMemMap") && E(set_access, "cuMemSetAccess") &&
	      E(unmap, "cuMemUnmap") && E(address_free, "cuMemAddressFree") && E(mem_release, "cuMemRelease")))
		return fail(c, -ENODEV, "the CUDA driver lacks an entry point libfeed needs");
#undef E
	return 0;
}

/* Opens the daemon's buffers and events in this process, on the device's primary context. */
static int cu_open(feed_client *c, struct device_ring *d, const struct wire_device_reply *rep, int fd)
{
	CUresult e;
	if ((e = d->cu.init(0)) != CUDA_SUCCESS || (e = d->cu.device_get(&d->dev, (int)rep->device)) != CUDA_SUCCESS)
		return fail(c, -ENODEV, "cuda:%u: cannot open the device (CUDA error %d)", rep->device, (int)e);
	if ((e = d->cu.retain(&d->ctx, d->dev)) != CUDA_SUCCESS)
		return fail(c, -ENODEV, "cuda:%u: cannot retain its context (CUDA error %d)", rep->device, (int)e);
	d->cu.push(d->ctx);
	int r = 0;
	d->size = rep->mem_size;
	d->stride = rep->slot_stride;
	d->slots = rep->slot_count;
	if (rep->kind == WIRE_DEVICE_VMM) {
		d->vmm = true;
		e = d->cu.import(&d->handle, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
		d->imported = e == CUDA_SUCCESS;
		if (e == CUDA_SUCCESS && (e = d->cu.reserve(&d->base, d->size, 0, 0, 0)) == CUDA_SUCCESS)
			d->reserved = true;
		if (e == CUDA_SUCCESS && (e = d->cu.map(d->base, d->size, 0, d->handle, 0)) == CUDA_SUCCESS)
			d->mapped = true;
		CUmemAccessDesc access = { .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)rep->device },
					   .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		if (e == CUDA_SUCCESS)
			e = d->cu.set_access(d->base, d->size, &access, 1);
	} else {
		CUipcMemHandle h;
		memcpy(&h, rep->mem_handle, sizeof(h));
		e = d->cu.open_mem(&d->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		d->mapped = e == CUDA_SUCCESS;
	}
	if (e != CUDA_SUCCESS)
		r = fail(c, -EIO, "cuda:%u: cannot open the batch buffers (CUDA error %d)", rep->device, (int)e);
	d->ready = r ? NULL : calloc(d->slots, sizeof(*d->ready));
	d->release = r ? NULL : calloc(d->slots, sizeof(*d->release));
	d->recorded = r ? NULL : calloc(d->slots, 1);
	if (!r && (!d->ready || !d->release || !d->recorded))
		r = fail(c, -ENOMEM, "out of memory");
	for (uint32_t i = 0; r == 0 && i < d->slots; i++) {
		CUipcEventHandle h;
		memcpy(&h, rep->handles + (size_t)i * 2 * WIRE_IPC_HANDLE_SIZE, sizeof(h));
		e = d->cu.open_event(&d->ready[i], h);
		if (e == CUDA_SUCCESS) {
			memcpy(&h, rep->handles + ((size_t)i * 2 + 1) * WIRE_IPC_HANDLE_SIZE, sizeof(h));
			e = d->cu.open_event(&d->release[i], h);
		}
		if (e != CUDA_SUCCESS)
			r = fail(c, -EIO, "cuda:%u: cannot open the events of slot %u (CUDA error %d)", rep->device, i,
				 (int)e);
	}
	CUcontext popped;
	d->cu.pop(&popped);
	return r;
}
#endif

/* Frees what device_attach opened. Only while the daemon lives: its events are not ours to touch after. */
static void device_close(feed_client *c)
{
	struct device_ring *d = c->dev;
	if (!d)
		return;
#if FEED_CUDA
	if (d->ctx) {
		d->cu.push(d->ctx);
		for (uint32_t i = 0; i < d->slots; i++) {
			if (d->ready && d->ready[i])
				d->cu.event_destroy(d->ready[i]);
			if (d->release && d->release[i])
				d->cu.event_destroy(d->release[i]);
		}
		if (d->vmm) {
			if (d->mapped)
				d->cu.unmap(d->base, d->size);
			if (d->reserved)
				d->cu.address_free(d->base, d->size);
			if (d->imported)
				d->cu.mem_release(d->handle);
		} else if (d->mapped) {
			d->cu.close_mem(d->base);
		}
		CUcontext popped;
		d->cu.pop(&popped);
		d->cu.unretain(d->dev);
	}
	free(d->ready);
	free(d->release);
	free(d->recorded);
	if (d->lib)
		dlclose(d->lib);
#endif
	free(d);
	c->dev = NULL;
	c->device = -1;
}

/*
 * Reads the DEVICE_REPLY that follows the ATTACH_REPLY and opens what it
 * names. Host batches instead (device -1, the reason in feed_client_error())
 * when the daemon has no GPU staging or this process cannot open it, if the
 * client allowed that; otherwise an error (the attachment stays unusable:
 * close the client).
 */
static int device_attach(feed_client *c, const struct wire_attach *a)
{
	bool fallback = a->flags & WIRE_ATTACH_HOST_FALLBACK;
	int fd = -1;
	unsigned n_fds = 0;
	void *p = NULL;
	size_t len;
	int type = recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, &fd, 1, &n_fds);
	if (type < 0)
		return type;
	struct wire_device_reply rep;
	int r = type == WIRE_DEVICE_REPLY && wire_decode_device_reply(p, len, &rep) == 0 && n_fds == rep.n_fds &&
			rep.slot_count == (rep.kind == WIRE_DEVICE_HOST ? 0 : c->slot_count) &&
			rep.slot_stride * rep.slot_count <= rep.mem_size && rep.slot_stride >= c->slot_size * !!rep.slot_count
		? 0 : fail(c, -EPROTO, "feedd sent an unexpected reply to a device attach");
	if (r == 0 && rep.kind == WIRE_DEVICE_HOST)
		r = fail(c, -ENODEV, "%s", rep.reason);
	struct device_ring *d = NULL;
	if (r == 0) {
		d = calloc(1, sizeof(*d));
		r = d ? 0 : fail(c, -ENOMEM, "out of memory");
	}
#if FEED_CUDA
	if (r == 0) {
		c->dev = d;
		d->kind = (int)rep.kind;
		r = cu_load(c, d);
		if (r == 0)
			r = cu_open(c, d, &rep, fd);
		if (r == 0)
			c->device = (int)rep.device;
	}
#else
	if (r == 0) {
		free(d);
		r = fail(c, -ENODEV, "this libfeed was built without CUDA support");
	}
#endif
	if (fd >= 0)
		close(fd); /* the imported handle keeps the memory */
	free(p);
	if (r < 0 && c->dev)
		device_close(c);
	/* Host batches still flow through the ring; a caller who allowed that keeps them, with the reason. */
	if (r < 0 && r != -EPROTO && fallback)
		return 0;
	if (r < 0)
		c->stopped = r;
	return r;
}

/* Records `release` of the slot of seq on stream (NULL: the legacy default stream), once per batch. */
static void device_release(feed_client *c, uint64_t seq, void *stream, bool at_release)
{
#if FEED_CUDA
	struct device_ring *d = c->dev;
	uint32_t s = (uint32_t)(seq % d->slots);
	if (__atomic_exchange_n(&d->recorded[s], 1, __ATOMIC_ACQ_REL))
		goto out;
	/* After the daemon died its events are gone (using them is undefined): record nothing. */
	if (c->stopped == -ECONNRESET)
		goto out;
	d->cu.push(d->ctx);
	d->cu.record(d->release[s], stream ? (CUstream)stream : CU_STREAM_LEGACY);
	CUcontext popped;
	d->cu.pop(&popped);
out:
	/* Released: the slot's next batch starts unrecorded. */
	if (at_release)
		__atomic_store_n(&d->recorded[s], 0, __ATOMIC_RELEASE);
#endif
}

FEED_EXPORT int feed_client_device(const feed_client *c)
{
	return c->device;
}

FEED_EXPORT int feed_client_device_batch(feed_client *c, const struct feed_batch *b, void *stream,
					 struct feed_device_batch *ret)
{
	if (!c->dev || !b || b->seq < c->tail || b->seq >= c->next_seq)
		return fail(c, c->dev ? -EINVAL : -ENODEV, c->dev ? "not a batch this client holds" : "not attached to a device");
#if FEED_CUDA
	struct device_ring *d = c->dev;
	uint32_t s = (uint32_t)(b->seq % d->slots);
	d->cu.push(d->ctx);
	CUresult e = d->cu.wait(stream ? (CUstream)stream : CU_STREAM_LEGACY, d->ready[s], 0);
	CUcontext popped;
	d->cu.pop(&popped);
	if (e != CUDA_SUCCESS)
		return fail(c, -EIO, "cuStreamWaitEvent: CUDA error %d", (int)e);
	const struct feed_ring_header *g = c->hdr;
	CUdeviceptr base = d->base + (CUdeviceptr)s * d->stride;
	*ret = (struct feed_device_batch){
		.input_ids = (uint64_t)(base + g->off_input_ids),
		.labels = (uint64_t)(base + g->off_labels),
		.position_ids = (uint64_t)(base + g->off_position_ids),
		.cu_seqlens = (uint64_t)(base + g->off_cu_seqlens),
	};
	return 0;
#else
	(void)ret;
	(void)stream;
	return -ENODEV;
#endif
}

FEED_EXPORT int feed_client_device_done(feed_client *c, const struct feed_batch *b, void *stream)
{
	if (!c->dev || !b)
		return -ENODEV;
	device_release(c, b->seq, stream, false);
	return 0;
}

FEED_EXPORT int feed_client_release(feed_client *c, const struct feed_batch *b)
{
	if (!c->attached || !b || b->seq != c->tail || c->tail >= c->next_seq)
		return fail(c, -EINVAL, "release the oldest batch held, once");
	if (b->seq + 1 == c->next_seq)
		memcpy(c->cursor, c->held_cursor, strlen(c->held_cursor) + 1);
	/* The daemon's next copy into this slot waits on `release`: it must be recorded before tail moves. */
	if (c->dev)
		device_release(c, b->seq, NULL, true);
	c->tail++;
	__atomic_store_n(&c->cons->tail, c->tail, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->hdr->producer_waiting, __ATOMIC_RELAXED) &&
	    c->tail >= __atomic_load_n(&c->hdr->wake_tail, __ATOMIC_RELAXED))
		kick_producer(c);
	return 0;
}

FEED_EXPORT const char *feed_client_cursor(const feed_client *c)
{
	/* While the last batch is held its slot is stable; after release the copy is. */
	return c->next_seq > c->tail ? c->held_cursor : c->cursor;
}

FEED_EXPORT uint32_t feed_client_slots(const feed_client *c)
{
	return c->slot_count;
}

FEED_EXPORT int feed_client_report(feed_client *c, uint64_t step_ns, uint64_t h2d_ns)
{
	if (!c->attached)
		return fail(c, -ENOTCONN, "not attached to a feed");
	struct feed_consumer_page *p = c->cons;
	if (step_ns)
		__atomic_store_n(&p->reported_step_ns_total, p->reported_step_ns_total + step_ns, __ATOMIC_RELAXED);
	if (h2d_ns)
		__atomic_store_n(&p->h2d_ns_total, p->h2d_ns_total + h2d_ns, __ATOMIC_RELAXED);
	__atomic_store_n(&p->reports, p->reports + 1, __ATOMIC_RELAXED);
	return 0;
}

_Static_assert(FEED_HIST_BUCKETS == 256, "public histogram size matches the ABI");

FEED_EXPORT int feed_client_stats(const feed_client *c, struct feed_stats *ret)
{
	if (!c->attached)
		return -ENOTCONN;
	const struct feed_consumer_page *p = c->cons;
	*ret = (struct feed_stats){
		.delivered = p->delivered,
		.wait_ns_total = p->wait_ns_total,
		.step_ns_total = p->step_ns_total,
		.reported_step_ns_total = p->reported_step_ns_total,
		.h2d_ns_total = p->h2d_ns_total,
		.last_wait_ns = p->last_wait_ns,
		.last_step_ns = p->last_step_ns,
	};
	memcpy(ret->hist_wait, p->hist_wait, sizeof(ret->hist_wait));
	memcpy(ret->hist_step, p->hist_step, sizeof(ret->hist_step));
	return 0;
}

FEED_EXPORT uint64_t feed_stats_bucket_lower(unsigned b)
{
	return b >= FEED_HIST_BUCKETS ? UINT64_MAX : feed_hist_lower(b);
}

FEED_EXPORT int feed_client_status(feed_client *c, char **ret_json)
{
	int saved = errno;
	struct wire_status st = { 0 };
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_STATUS_SIZE];
	int n = wire_encode_status(buf, sizeof(buf), &st);
	int r = n < 0 ? n : send_all(c, buf, (size_t)n);
	if (r < 0) {
		errno = saved;
		return fail(c, r, "sending to feedd: %s", feed_strerror(r));
	}
	void *p;
	size_t len;
	int type = recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, NULL, 0, NULL);
	errno = saved;
	if (type < 0)
		return type;
	if (type != WIRE_STATUS_REPLY) {
		free(p);
		return fail(c, -EPROTO, "feedd sent an unexpected reply to status");
	}
	char *json = realloc(p, len + 1);
	if (!json) {
		free(p);
		return fail(c, -ENOMEM, "out of memory");
	}
	json[len] = 0;
	*ret_json = json;
	return 0;
}

/* Sends an operator command (encoded in buf) and waits for its ADMIN_REPLY. */
static int admin_request(feed_client *c, const uint8_t *buf, int n, char **ret_message)
{
	int r = n < 0 ? n : send_all(c, buf, (size_t)n);
	if (r < 0)
		return fail(c, r, "sending to feedd: %s", feed_strerror(r));
	void *p;
	size_t len;
	int type = recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, NULL, 0, NULL);
	if (type < 0)
		return type;
	struct wire_admin_reply rep;
	r = type == WIRE_ADMIN_REPLY ? wire_decode_admin_reply(p, len, &rep) : -EPROTO;
	free(p);
	if (r < 0)
		return fail(c, -EPROTO, "feedd sent an unexpected reply");
	char *m = strdup(rep.message);
	if (!m)
		return fail(c, -ENOMEM, "out of memory");
	snprintf(c->error, sizeof(c->error), "%s", rep.message);
	*ret_message = m;
	return 0;
}

FEED_EXPORT int feed_client_reload(feed_client *c, char **ret_message)
{
	int saved = errno;
	struct wire_reload m = { 0 };
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_RELOAD_SIZE];
	int r = admin_request(c, buf, wire_encode_reload(buf, sizeof(buf), &m), ret_message);
	errno = saved;
	return r;
}

FEED_EXPORT int feed_client_drain(feed_client *c, const char *feed, char **ret_message)
{
	int saved = errno;
	struct wire_drain m;
	if (!feed || strlen(feed) >= sizeof(m.feed) || !feed[0]) {
		errno = saved;
		return fail(c, -EINVAL, "a feed name is 1..%zu bytes", sizeof(m.feed) - 1);
	}
	snprintf(m.feed, sizeof(m.feed), "%s", feed);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_DRAIN_SIZE];
	int r = admin_request(c, buf, wire_encode_drain(buf, sizeof(buf), &m), ret_message);
	errno = saved;
	return r;
}

FEED_EXPORT int feed_client_attach(feed_client *c, const char *feed, uint32_t rank, uint32_t world,
				   const char *cursor)
{
	return attach(c, feed, rank, world, cursor, 0, 0);
}

FEED_EXPORT int feed_client_attach_device(feed_client *c, const char *feed, uint32_t rank, uint32_t world,
					  const char *cursor, int device, unsigned flags)
{
	if (device < 0 || device > WIRE_MAX_DEVICE || (flags & ~FEED_ATTACH_HOST_FALLBACK))
		return fail(c, -EINVAL, "device %d or flags 0x%x are not valid", device, flags);
	uint32_t wf = WIRE_ATTACH_DEVICE | ((flags & FEED_ATTACH_HOST_FALLBACK) ? WIRE_ATTACH_HOST_FALLBACK : 0);
	return attach(c, feed, rank, world, cursor, wf, (uint32_t)device);
}

FEED_EXPORT const char *feed_client_error(const feed_client *c)
{
	return c->error;
}

FEED_EXPORT feed_client *feed_client_close(feed_client *c)
{
	if (!c)
		return NULL;
	int saved = errno;
	if (c->fd >= 0) {
		if (c->attached) {
			uint8_t buf[WIRE_HEADER_SIZE];
			if (wire_encode_detach(buf, sizeof(buf)) > 0)
				(void)send(c->fd, buf, sizeof(buf), MSG_NOSIGNAL | MSG_DONTWAIT);
		}
		close(c->fd);
	}
	device_close(c);
	if (c->hdr)
		munmap(c->hdr, c->ring_size);
	if (c->cons)
		munmap(c->cons, FEED_CONSUMER_PAGE_SIZE);
	if (c->data_efd >= 0)
		close(c->data_efd);
	if (c->space_efd >= 0)
		close(c->space_efd);
	free(c);
	errno = saved;
	return NULL;
}

FEED_EXPORT const char *feed_strerror(int code)
{
	switch (code) {
	case 0:
		return "success";
	case -ENOENT:
		return "not found (no such feed, or no daemon socket)";
	case -ECONNREFUSED:
		return "feedd is not running (connection refused)";
	case -ECONNRESET:
		return "feedd closed the connection";
	case -ETIMEDOUT:
		return "timed out";
	case -ESHUTDOWN:
		return "feedd is stopping";
	case -ENOBUFS:
		return "every ring slot is held";
	case -EPROTO:
		return "protocol error";
	case -ENOTCONN:
		return "not attached";
	case -EINVAL:
		return "invalid argument";
	case -EALREADY:
		return "already attached";
	case -ESTALE:
		return "a shard changed on disk while being served";
	case -ENODATA:
		return "no data";
	case -EPROTONOSUPPORT:
		return "protocol version not supported";
	case -ENODEV:
		return "no GPU staging for that device (see feed_client_error)";
	case -EACCES:
		return "permission denied (the socket's mode, or feedd's allow_users / allow_groups)";
	case -EPERM:
		return "not permitted (operator commands need root, feedd's user or admin_users)";
	case -EUSERS:
		return "feedd's connection limit is reached";
	case -EDQUOT:
		return "feedd's ring memory limit is reached";
	default:
		return code < 0 ? "error (see feed_client_error)" : "not an error code";
	}
}
