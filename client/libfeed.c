/* SPDX-License-Identifier: MIT */
/*
 * libfeed: the client side of proto/wire.h and proto/ring_abi.h.
 *
 * The control socket is used only to connect, attach and learn why a stream
 * stopped; batches are taken from the mapped ring with two atomic loads and
 * released with one store, with a system call only when one side sleeps.
 * Everything read from the daemon (messages, ring geometry, slot headers) is
 * validated before use, and what was validated is copied first: the ring's
 * geometry once at attach (c->geo), a slot's header at each next(). Device
 * batches (the CUDA driver and the imported GPU buffers) are in device.c. Telemetry goes into the consumer page the daemon
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

#include "client/libfeed-internal.h"

_Static_assert(FEED_CURSOR_MAX_LEN == FEED_CURSOR_MAX, "public cursor size matches the ABI");

int client_fail(feed_client *c, int code, const char *fmt, ...)
{
	int saved = errno;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->error, sizeof(c->error), fmt, ap);
	va_end(ap);
	errno = saved;
	return code;
}

int client_send(feed_client *c, const void *buf, size_t len)
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
		if (k < 0 && errno == EINTR && c->intr)
			return -EINTR; /* reconnecting (reconnect.c): the caller's signal handler gets control back */
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
		/*
		 * A failed recvmsg leaves msg_controllen as it was and the buffer
		 * as the last call left it: walking it would take stale fd numbers
		 * (perhaps another thread's by now) for new ones, and close them.
		 */
		if (n < 0)
			return errno == ECONNRESET ? -ECONNRESET : -errno;
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
		if (n == 0)
			return -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int client_recv_msg(feed_client *c, int timeout_ms, void **ret_payload, size_t *ret_len, int *fds, unsigned max_fds,
		    unsigned *n_fds)
{
	uint8_t hb[WIRE_HEADER_SIZE];
	int r = recv_all(c, hb, sizeof(hb), timeout_ms, fds, max_fds, n_fds);
	if (r == -ECONNRESET)
		return client_fail(c, r, "feedd closed the connection (the daemon stopped or crashed)");
	if (r < 0)
		return client_fail(c, r, "reading from feedd: %s", feed_strerror(r));
	struct wire_header h;
	r = wire_header_decode(hb, sizeof(hb), WIRE_MAX_REPLY, &h);
	if (r == 0 && h.version != WIRE_VERSION)
		r = -EBADMSG;
	if (r < 0)
		return client_fail(c, -EPROTO, "feedd sent a malformed message header");
	void *payload = malloc(MAX(h.length, 1u));
	if (!payload)
		return client_fail(c, -ENOMEM, "out of memory");
	r = recv_all(c, payload, h.length, REPLY_TIMEOUT_MS, fds, max_fds, n_fds);
	if (r < 0) {
		free(payload);
		return client_fail(c, r, "reading from feedd: %s", feed_strerror(r));
	}
	if (h.type == WIRE_ERROR) {
		struct wire_error e;
		r = wire_decode_error(payload, h.length, &e);
		free(payload);
		if (r < 0)
			return client_fail(c, -EPROTO, "feedd sent a malformed error message");
		return client_fail(c, e.code, "%s", e.message);
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
	assert_return(ret, -EINVAL);
	return feed_client_connect_err(socket_path, NULL, 0, ret);
}

FEED_EXPORT int feed_client_connect_err(const char *socket_path, char *err, size_t errlen, feed_client **ret)
{
	assert_return(ret, -EINVAL);
	return client_connect(socket_path, false, REPLY_TIMEOUT_MS, err, errlen, ret);
}

int client_connect(const char *socket_path, bool intr, int reply_ms, char *err, size_t errlen, feed_client **ret)
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
	c->intr = intr;
	snprintf(c->socket_path, sizeof(c->socket_path), "%s", sa.sun_path);
	c->reconnect_timeout_ms = client_reconnect_default();
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int r = c->fd < 0 ? -errno : 0;
	if (r < 0)
		client_fail(c, r, "cannot create a socket: %s", feed_strerror(r));
	if (r == 0 && connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		r = -errno;
		client_fail(c, r, "cannot reach feedd at %s: %s", sa.sun_path, feed_strerror(r));
	}
	/* Before anything is sent: is it feedd at all, or another user's process in its place? */
	if (r == 0)
		r = client_check_daemon(c->fd, sa.sun_path, c->error, sizeof(c->error));
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
		r = n < 0 ? n : client_send(c, buf, (size_t)n);
		/*
		 * A daemon that refuses the connection (access control, a connection
		 * limit) sends its ERROR first and stops reading: the reason may be
		 * waiting even when the hello could not be sent.
		 */
		if (r < 0) {
			client_fail(c, r, "cannot send to feedd: %s", feed_strerror(r));
			r = 0;
		}
	}
	if (r == 0) {
		void *p;
		size_t len;
		int type = client_recv_msg(c, reply_ms, &p, &len, NULL, 0, NULL);
		if (type == WIRE_HELLO_REPLY) {
			struct wire_hello_reply hr;
			r = wire_decode_hello_reply(p, len, &hr) < 0 || hr.version != WIRE_VERSION ? -EPROTO : 0;
			if (r < 0)
				client_fail(c, r, "feedd sent a malformed HELLO_REPLY");
			c->daemon_pid = hr.daemon_pid;
			c->daemon_flags = hr.flags;
			free(p);
		} else {
			if (type >= 0)
				free(p);
			r = type < 0 ? type : client_fail(c, -EPROTO, "feedd answered HELLO with message type %d", type);
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

/*
 * Checks the ring's geometry against the reply before trusting any offset in
 * it, on a copy (the daemon may write the header at any time), and keeps the
 * copy in *ret: the only geometry used from then on.
 */
static int check_ring(feed_client *c, const struct wire_attach_reply *rep, struct ring_geometry *ret)
{
	struct feed_ring_header copy;
	memcpy(&copy, c->hdr, offsetof(struct feed_ring_header, head));
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	const struct feed_ring_header *h = &copy;
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
	*ret = (struct ring_geometry){
		.header_size = h->header_size,
		.slot_size = h->slot_size,
		.off_input_ids = h->off_input_ids,
		.off_labels = h->off_labels,
		.off_position_ids = h->off_position_ids,
		.off_cu_seqlens = h->off_cu_seqlens,
		.cu_capacity = h->cu_capacity,
	};
	if (h->state_capacity) {
		/* Elastic states longer than a cursor (ring_abi.h): the area must lie inside the slot. */
		uint64_t off = feed_slot_state_offset(h->off_cu_seqlens, h->cu_capacity);
		if (off + h->state_capacity > h->slot_size)
			return -EPROTO;
		ret->state_capacity = h->state_capacity;
		ret->off_state = (uint32_t)off;
	}
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

int client_attach(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor,
		  uint32_t flags, uint32_t device)
{
	int saved = errno, r;
	if (c->attached)
		return client_fail(c, -EALREADY, "this client is already attached");
	struct wire_attach a = { .rank = rank, .world = world, .flags = flags, .device = device };
	if (!feed || strlen(feed) >= sizeof(a.feed) || !*feed)
		return client_fail(c, -EINVAL, "feed name must be 1..%zu bytes", sizeof(a.feed) - 1);
	if (world == 0 || rank >= world)
		return client_fail(c, -EINVAL, "rank %u is not in world of size %u", rank, world);
	if (cursor && *cursor) {
		/* An elastic state may be longer than the field: sent ahead as STATE parts (state.c). */
		if ((r = client_put_cursor(c, cursor, a.cursor)) < 0)
			return r;
		a.flags |= WIRE_ATTACH_RESUME;
	}
	strcpy(a.feed, feed);
	memmove(c->feed, a.feed, sizeof(c->feed));
	c->rank = rank, c->world = world, c->attach_flags = flags, c->attach_device = device;
	if (cursor != c->start_cursor && cursor != c->long_start &&
	    client_keep_cursor(cursor ? cursor : "", cursor ? strlen(cursor) : 0, c->start_cursor,
			       sizeof(c->start_cursor), &c->long_start) < 0)
		return client_fail(c, -ENOMEM, "out of memory");
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ATTACH_SIZE];
	int n = wire_encode_attach(buf, sizeof(buf), &a);
	if (n < 0)
		return client_fail(c, n, "cannot encode the attach request");
	r = client_send(c, buf, (size_t)n);
	if (r < 0)
		return client_fail(c, r, "sending to feedd: %s", feed_strerror(r));

	int fds[WIRE_ATTACH_FDS] = { -1, -1, -1, -1 };
	unsigned n_fds = 0;
	void *p = NULL;
	size_t len;
	int type = client_recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, fds, WIRE_ATTACH_FDS, &n_fds);
	struct wire_attach_reply rep;
	if (type < 0) {
		r = type;
		goto out;
	}
	if (type != WIRE_ATTACH_REPLY || wire_decode_attach_reply(p, len, &rep) < 0 || n_fds != WIRE_ATTACH_FDS ||
	    rep.consumer_size != FEED_CONSUMER_PAGE_SIZE) {
		r = client_fail(c, -EPROTO, "feedd sent an unexpected reply to attach");
		goto out;
	}
	c->ring_size = rep.ring_size;
	void *m;
	r = map_fd(fds[0], c->ring_size, PROT_READ, &m);
	if (r < 0) {
		r = client_fail(c, r, "cannot map the batch ring: %s", feed_strerror(r));
		goto out;
	}
	c->hdr = m;
	r = map_fd(fds[1], FEED_CONSUMER_PAGE_SIZE, PROT_READ | PROT_WRITE, &m);
	if (r < 0) {
		r = client_fail(c, r, "cannot map the consumer page: %s", feed_strerror(r));
		goto out;
	}
	c->cons = m;
	struct ring_geometry geo;
	if (check_ring(c, &rep, &geo) < 0 || c->cons->magic != FEED_CONSUMER_MAGIC) {
		r = client_fail(c, -EPROTO, "the batch ring feedd sent is inconsistent");
		goto out;
	}
	c->data_efd = fds[2];
	c->space_efd = fds[3];
	fds[2] = fds[3] = -1;
	c->slot_count = rep.slot_count;
	c->geo = geo;
	c->batch_size = rep.batch_size;
	c->seq_len = rep.seq_len;
	c->first_batch = rep.first_batch;
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
	int type = client_recv_msg(c, 1000, &p, &len, NULL, 0, NULL);
	if (type >= 0) {
		free(p);
		type = client_fail(c, -EPROTO, "feedd sent an unexpected message");
	}
	if (type == -ETIMEDOUT)
		type = client_fail(c, fallback, "the stream stopped: %s", feed_strerror(fallback));
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
	assert_return(c && ret, -EINVAL);
	int saved = errno;
	if (c->stopped)
		return c->stopped;
	if (!c->attached && !c->resuming)
		return client_fail(c, -ENOTCONN, "not attached to a feed");
	if (c->next_seq - c->tail >= c->slot_count)
		return client_fail(c, -ENOBUFS, "all %u slots are held: release a batch first", c->slot_count);

	uint64_t t0 = now_ns();
	if (c->last_return_ns && c->cons)
		record(&c->cons->step_ns_total, &c->cons->last_step_ns, c->cons->hist_step, t0 - c->last_return_ns);
	uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : t0 + (uint64_t)timeout_ms * NSEC_PER_MSEC;
	int r = 0;
#define RSEQ (c->next_seq - c->seq_base) /* the next sequence in the current ring */

	/* A reconnect a signal interrupted (reconnect.c) goes on first. */
	if (c->resuming) {
		if (!client_resume(c, &r))
			goto out;
		deadline = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;
	}
	for (;;) {
		/* A withdrawn ring (a shard changed) delivers nothing more, published or not. */
		if (__atomic_load_n(&c->hdr->head, __ATOMIC_ACQUIRE) > RSEQ &&
		    __atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE) != FEED_RING_WITHDRAWN)
			break;
		uint32_t state = __atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE);
		if (state != FEED_RING_RUNNING) {
			r = stream_stopped(c, state == FEED_RING_STOPPING ? -ESHUTDOWN : state == FEED_RING_WITHDRAWN ? -ESTALE : -EIO);
			if (!client_resume(c, &r))
				goto out;
			deadline = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;
			continue;
		}
		uint64_t now = now_ns();
		if (now >= deadline) {
			r = client_fail(c, -ETIMEDOUT, "no batch within %d ms", timeout_ms);
			goto out;
		}
		/* A daemon waiting for half the ring may be waiting on batches we hold: wake it. */
		if (__atomic_load_n(&c->hdr->producer_waiting, __ATOMIC_RELAXED))
			kick_producer(c);
		/* Announce that we sleep, then look once more: the daemon kicks only sleepers. */
		__atomic_store_n(&c->cons->consumer_waiting, 1, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		if (__atomic_load_n(&c->hdr->head, __ATOMIC_ACQUIRE) > RSEQ ||
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
			r = client_fail(c, -errno, "poll: %s", feed_strerror(-errno));
			goto out;
		}
		if (k > 0 && (pfd[0].revents & POLLIN)) {
			uint64_t v;
			ssize_t _unused_ n = read(c->data_efd, &v, sizeof(v));
		}
		if (k > 0 && pfd[1].revents) {
			/* The daemon only speaks now to say the stream ended, or it hung up. */
			if (__atomic_load_n(&c->hdr->head, __ATOMIC_ACQUIRE) > RSEQ)
				continue; /* the loop's head takes it, unless the ring was withdrawn */
			r = stream_stopped(c, -ECONNRESET);
			if (!client_resume(c, &r))
				goto out;
			deadline = timeout_ms < 0 ? UINT64_MAX : now_ns() + (uint64_t)timeout_ms * NSEC_PER_MSEC;
		}
	}

	/* Geometry from the attach, the slot's header copied before it is checked: nothing is read twice. */
	const struct ring_geometry *g = &c->geo;
	const uint8_t *slot = (const uint8_t *)c->hdr + g->header_size + (size_t)(RSEQ % c->slot_count) * g->slot_size;
	const struct feed_slot_header *shared = (const struct feed_slot_header *)slot;
	struct feed_slot_header copy;
	memcpy(&copy, shared, offsetof(struct feed_slot_header, cursor));
	__atomic_thread_fence(__ATOMIC_ACQUIRE); /* the checks and the batch use the copy, not a second read */
	/* Taken: the state, read after the slot, decides whether it was withdrawn (proto/ring_abi.h). */
	if (__atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE) == FEED_RING_WITHDRAWN) {
		r = stream_stopped(c, -ESTALE);
		goto out;
	}
	const struct feed_slot_header *h = &copy;
	if (h->seq != RSEQ || h->batch_size != c->batch_size || h->seq_len != c->seq_len ||
	    h->n_cu_seqlens < 2 || h->n_cu_seqlens > g->cu_capacity || !memchr(shared->cursor, 0, sizeof(shared->cursor))) {
		r = client_fail(c, -EPROTO, "slot %llu of the ring is inconsistent", (unsigned long long)c->next_seq);
		c->stopped = r;
		goto out;
	}
	/* An elastic state longer than a cursor is in the slot's state area. */
	const char *cursor = shared->cursor;
	c->held_cap = sizeof(shared->cursor);
	if (g->state_capacity && strcmp(shared->cursor, FEED_CURSOR_IN_STATE_AREA) == 0) {
		cursor = (const char *)slot + g->off_state;
		c->held_cap = g->state_capacity;
		if (!memchr(cursor, 0, g->state_capacity)) {
			r = client_fail(c, -EPROTO, "slot %llu of the ring is inconsistent", (unsigned long long)c->next_seq);
			c->stopped = r;
			goto out;
		}
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
		.cursor = cursor,
		.seq = c->next_seq,
	};
	c->next_seq++;
	/* The cursor is copied out only when its slot is released: next() stays small. */
	c->held_cursor = cursor;
	__atomic_store_n(&c->cons->delivered, c->cons->delivered + 1, __ATOMIC_RELAXED);
	__atomic_store_n(&c->cons->last_delivered_batch, h->batch_index + 1, __ATOMIC_RELAXED);
out:;
#undef RSEQ
	uint64_t t1 = now_ns();
	if (c->cons)
		record(&c->cons->wait_ns_total, &c->cons->last_wait_ns, c->cons->hist_wait, t1 - t0);
	else
		c->carry.wait_ns_total += t1 - t0;
	c->last_return_ns = t1;
	errno = saved;
	return r;
}

FEED_EXPORT int feed_client_release(feed_client *c, const struct feed_batch *b)
{
	assert_return(c, -EINVAL);
	if (!b || b->seq != c->tail || c->tail >= c->next_seq || (!c->attached && b->seq >= c->seq_base))
		return client_fail(c, -EINVAL, "release the oldest batch held, once");
	if (b->seq + 1 == c->next_seq) {
		/* Bounded: the daemon may have rewritten the slot's cursor since next() checked it. */
		size_t n = strnlen(c->held_cursor, MAX(c->held_cap, sizeof(c->cursor)) - 1);
		if (client_keep_cursor(c->held_cursor, n, c->cursor, sizeof(c->cursor), &c->long_cursor) < 0)
			return client_fail(c, -ENOMEM, "out of memory keeping the cursor");
	}
	/* The daemon's next copy into this slot waits on `release`: it must be recorded before tail moves. */
	if (c->dev)
		device_release(c, b->seq, NULL, true);
	c->tail++;
	if (c->tail <= c->seq_base) { /* a batch of a ring whose daemon went away */
		client_retired_free(c, false);
		return 0;
	}
	__atomic_store_n(&c->cons->tail, c->tail - c->seq_base, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (__atomic_load_n(&c->hdr->producer_waiting, __ATOMIC_RELAXED) &&
	    c->tail >= __atomic_load_n(&c->hdr->wake_tail, __ATOMIC_RELAXED))
		kick_producer(c);
	return 0;
}

FEED_EXPORT const char *feed_client_cursor(const feed_client *c)
{
	assert_return(c, NULL);
	/* While the last batch is held its slot is stable; after release the copy is. */
	return c->next_seq > c->tail ? c->held_cursor : c->long_cursor ? c->long_cursor : c->cursor;
}

FEED_EXPORT uint32_t feed_client_slots(const feed_client *c)
{
	assert_return(c, 0);
	return c->slot_count;
}

int client_request_text(feed_client *c, const uint8_t *msg, int n, int reply_type, const char *what, char **ret)
{
	int saved = errno;
	int r = n < 0 ? n : client_send(c, msg, (size_t)n);
	if (r < 0) {
		errno = saved;
		return client_fail(c, r, "sending to feedd: %s", feed_strerror(r));
	}
	void *p;
	size_t len;
	int type = client_recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, NULL, 0, NULL);
	errno = saved;
	if (type < 0)
		return type;
	if (type != reply_type) {
		free(p);
		return client_fail(c, -EPROTO, "feedd sent an unexpected reply to %s", what);
	}
	char *text = realloc(p, len + 1);
	if (!text) {
		free(p);
		return client_fail(c, -ENOMEM, "out of memory");
	}
	text[len] = 0;
	*ret = text;
	return 0;
}

_Static_assert(FEED_STATUS_NO_HISTORY == WIRE_STATUS_NO_HISTORY && FEED_STATUS_NO_SINCE_ATTACH == WIRE_STATUS_NO_SINCE_ATTACH,
	       "public status flags are the wire's");

FEED_EXPORT int feed_client_status_flags(feed_client *c, unsigned flags, char **ret_json)
{
	assert_return(c && ret_json, -EINVAL);
	assert_return(!(flags & ~(FEED_STATUS_NO_HISTORY | FEED_STATUS_NO_SINCE_ATTACH)), -EINVAL);
	struct wire_status st = { .flags = flags };
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_STATUS_SIZE];
	int n = wire_encode_status(buf, sizeof(buf), &st);
	return client_request_text(c, buf, n, WIRE_STATUS_REPLY, "status", ret_json);
}

FEED_EXPORT int feed_client_status(feed_client *c, char **ret_json)
{
	return feed_client_status_flags(c, 0, ret_json);
}

/*
 * A reload loads every feed of the new config before it answers (off feedd's
 * main loop, which gives up on a load stuck for load_timeout_s): wait long.
 */
#define RELOAD_TIMEOUT_MS (10 * 60 * 1000)

/* Sends an operator command (encoded in buf) and waits for its ADMIN_REPLY. */
static int admin_request(feed_client *c, const uint8_t *buf, int n, int timeout_ms, char **ret_message)
{
	int r = n < 0 ? n : client_send(c, buf, (size_t)n);
	if (r < 0)
		return client_fail(c, r, "sending to feedd: %s", feed_strerror(r));
	void *p;
	size_t len;
	int type = client_recv_msg(c, timeout_ms, &p, &len, NULL, 0, NULL);
	if (type < 0)
		return type;
	struct wire_admin_reply rep;
	r = type == WIRE_ADMIN_REPLY ? wire_decode_admin_reply(p, len, &rep) : -EPROTO;
	free(p);
	if (r < 0)
		return client_fail(c, -EPROTO, "feedd sent an unexpected reply");
	char *m = strdup(rep.message);
	if (!m)
		return client_fail(c, -ENOMEM, "out of memory");
	snprintf(c->error, sizeof(c->error), "%s", rep.message);
	*ret_message = m;
	return 0;
}

FEED_EXPORT int feed_client_reload(feed_client *c, char **ret_message)
{
	assert_return(c && ret_message, -EINVAL);
	int saved = errno;
	struct wire_reload m = { 0 };
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_RELOAD_SIZE];
	int r = admin_request(c, buf, wire_encode_reload(buf, sizeof(buf), &m), RELOAD_TIMEOUT_MS, ret_message);
	errno = saved;
	return r;
}

FEED_EXPORT int feed_client_drain(feed_client *c, const char *feed, char **ret_message)
{
	assert_return(c && ret_message, -EINVAL);
	int saved = errno;
	struct wire_drain m;
	if (!feed || strlen(feed) >= sizeof(m.feed) || !feed[0]) {
		errno = saved;
		return client_fail(c, -EINVAL, "a feed name is 1..%zu bytes", sizeof(m.feed) - 1);
	}
	snprintf(m.feed, sizeof(m.feed), "%s", feed);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_DRAIN_SIZE];
	int r = admin_request(c, buf, wire_encode_drain(buf, sizeof(buf), &m), REPLY_TIMEOUT_MS, ret_message);
	errno = saved;
	return r;
}

FEED_EXPORT int feed_client_attach(feed_client *c, const char *feed, uint32_t rank, uint32_t world,
				   const char *cursor)
{
	assert_return(c, -EINVAL);
	return client_attach(c, feed, rank, world, cursor, 0, 0);
}

FEED_EXPORT int feed_client_attach_device(feed_client *c, const char *feed, uint32_t rank, uint32_t world,
					  const char *cursor, int device, unsigned flags)
{
	assert_return(c, -EINVAL);
	if (device < 0 || device > WIRE_MAX_DEVICE || (flags & ~FEED_ATTACH_HOST_FALLBACK))
		return client_fail(c, -EINVAL, "device %d or flags 0x%x are not valid", device, flags);
	uint32_t wf = WIRE_ATTACH_DEVICE | ((flags & FEED_ATTACH_HOST_FALLBACK) ? WIRE_ATTACH_HOST_FALLBACK : 0);
	return client_attach(c, feed, rank, world, cursor, wf, (uint32_t)device);
}

FEED_EXPORT const char *feed_client_error(const feed_client *c)
{
	assert_return(c, "no client (NULL)");
	return c->error;
}

FEED_EXPORT feed_client *feed_client_close(feed_client *c)
{
	if (!c)
		return NULL;
	int saved = errno;
	/* Unmapped before DETACH: the daemon may then wipe the ring and give its memory to this uid's next one. */
	device_close(c);
	if (c->hdr)
		munmap(c->hdr, c->ring_size);
	if (c->cons)
		munmap(c->cons, FEED_CONSUMER_PAGE_SIZE);
	if (c->fd >= 0) {
		if (c->attached) {
			uint8_t buf[WIRE_HEADER_SIZE];
			if (wire_encode_detach(buf, sizeof(buf)) > 0)
				(void)send(c->fd, buf, sizeof(buf), MSG_NOSIGNAL | MSG_DONTWAIT);
		}
		close(c->fd);
	}
	if (c->data_efd >= 0)
		close(c->data_efd);
	if (c->space_efd >= 0)
		close(c->space_efd);
	client_retired_free(c, true);
	free(c->long_cursor);
	free(c->long_start);
	free(c->resume_cursor);
	free(c);
	errno = saved;
	return NULL;
}
