/* SPDX-License-Identifier: MIT */
/*
 * One connection and its messages. Input is read with recvmsg so that file
 * descriptors a client passes unasked are seen (and closed, and the client
 * dropped); output is a queue of messages, each with the fds it carries, sent
 * with sendmsg as the socket accepts it. Input is bounded by one request
 * (WIRE_MAX_REQUEST), output by MAX_OUT_BYTES; a client over either, or one
 * that sends anything but a well-formed request, is dropped and counted.
 */
#include <assert.h>
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/server/server-internal.h"

void conn_drop(struct conn *c, uint64_t *counter, const char *why)
{
	if (why) {
		c->srv->n.protocol_errors++;
		if (counter)
			(*counter)++;
		log_warning("client %" PRIu64 " (pid %d, uid %u): %s; disconnecting", c->id, (int)c->pid,
			    (unsigned)c->uid, why);
	}
	conn_free(c);
}

/*
 * conn_reading and conn_status are where the server reads a session's state
 * (besides handle_attach, which wires it, and server_stuck's progress check):
 * everything else works from what they return.
 */
void conn_reading(const struct conn *c, uint64_t now, struct telemetry_reading *ret)
{
	const struct session *s = c->session;
	const struct ring *r = session_ring(s);
	ring_read_consumer(r, session_published(s), &ret->cons);
	ret->published = session_published(s);
	ret->tail = r->tail;
	ret->full_ns = session_full_ns(s, now);
	ret->failed = session_failed(s);
	ret->pid = c->pid;
}

void conn_status(struct conn *c, uint64_t now, struct status_client *ret)
{
	struct session *s = c->session;
	struct status_client sc = {
		.id = c->id,
		.pid = c->pid,
		.uid = c->uid,
		.name = c->name,
		.connected_ns = now - c->connect_ns,
		.tokens_per_s = c->tokens_per_s,
		.stall_pct_tick = c->stall_pct,
		.stuck = c->stuck,
		.idle_ns = now - c->idle_since_ns,
		.memory = c->memory,
		.feed = c->feed,
		.rank = c->rank,
		.world = c->world,
		.ring_slots = session_ring(s)->slot_count,
		.first_batch = session_first_batch(s),
		.failed = session_failed(s),
		.opening = session_opening(s),
		.gpu = session_staging(s) != NULL,
		.attached_ns = now - session_attach_ns(s),
		.fill = session_fill(s),
		.epoch = session_epoch(s),
	};
	if (session_staging(s))
		gpu_client_view(session_staging(s), &sc.gpu_view);
	conn_reading(c, now, &sc.reading);
	const struct ring_consumer *rc = &sc.reading.cons;
	sc.published = sc.reading.published;
	sc.delivered = rc->delivered;
	sc.wait_ns = rc->wait_ns;
	sc.step_ns = rc->step_ns;
	sc.h2d_ns = rc->h2d_ns;
	sc.reports = rc->reports;
	sc.reported_step_ns = rc->reported_step_ns;
	sc.reconnects = rc->reconnects;
	sc.reconnect_ns = rc->reconnect_ns;
	sc.full_ns = sc.reading.full_ns;
	/* In double: two client-written totals may overflow a u64 sum. */
	double w = (double)sc.wait_ns, st = (double)sc.step_ns;
	sc.stall_pct = w + st > 0 ? 100.0 * w / (w + st) : 0.0;
	*ret = sc;
	/* The view borrows the reading's histograms: point it at the caller's copy. */
	telemetry_client_view(&c->tm, &ret->reading, now, &ret->tv);
}

void conn_set_memory(struct conn *c, uint64_t memory)
{
	struct server *s = c->srv;
	struct uid_slot *u = c->uid_counted ? listen_uid_slot(s, c->uid) : NULL;
	s->memory = s->memory - c->memory + memory;
	if (u)
		u->memory = u->memory - c->memory + memory;
	c->memory = memory;
}

void conn_free(struct conn *c)
{
	struct server *s = c->srv;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->n_conns--;
	s->n_reserved -= c->reserved;
	c->explain = session_explain_cancel(c->explain);
	unsigned *mine = c->uid_counted ? listen_uid_count(s, c->uid) : NULL;
	if (mine && *mine)
		(*mine)--;
	if (c->session) {
		log_info("client %" PRIu64 " (pid %d) detached from feed %s rank %u/%u", c->id, (int)c->pid,
			 c->feed->name, c->rank, c->world);
		telemetry_client_detach(&c->tm);
		server_detached(s, c->feed);
		c->session = session_close(c->session);
		conn_set_memory(c, 0);
		s->departed++;
	}
	while (c->out_head) {
		struct out_msg *m = c->out_head;
		c->out_head = m->next;
		for (unsigned i = 0; i < m->n_fds; i++)
			close(m->fds[i]);
		free(m);
	}
	if (c->rev)
		event_free(c->rev);
	if (c->wev)
		event_free(c->wev);
	if (c->pidev)
		event_free(c->pidev);
	if (c->pidfd >= 0)
		close(c->pidfd);
	close(c->fd);
	assert(!telemetry_client_tracked(&c->tm)); /* detached with its session */
	free(c->groups);
	free(c->state);
	free(c);
}

int conn_flush(struct conn *c)
{
	while (c->out_head) {
		struct out_msg *m = c->out_head;
		struct iovec iov = { .iov_base = m->data + m->off, .iov_len = m->len - m->off };
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int) * WIRE_ATTACH_FDS)];
		} cm;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (m->n_fds && m->off == 0) {
			memset(&cm, 0, sizeof(cm));
			mh.msg_control = cm.buf;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * m->n_fds);
			struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
			h->cmsg_level = SOL_SOCKET;
			h->cmsg_type = SCM_RIGHTS;
			h->cmsg_len = CMSG_LEN(sizeof(int) * m->n_fds);
			memcpy(CMSG_DATA(h), m->fds, sizeof(int) * m->n_fds);
		}
		ssize_t n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR) {
				event_add(c->wev, NULL);
				return 0;
			}
			return -errno;
		}
		if (m->off == 0) {
			/* The fds went with the first byte; ours are no longer needed. */
			for (unsigned i = 0; i < m->n_fds; i++)
				close(m->fds[i]);
			m->n_fds = 0;
		}
		m->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (m->off < m->len)
			continue;
		c->out_head = m->next;
		if (!c->out_head)
			c->out_tail = NULL;
		free(m);
	}
	event_del(c->wev);
	return 0;
}

int conn_queue(struct conn *c, const void *data, size_t len, const int *fds, unsigned n_fds)
{
	if (c->out_bytes + len > MAX_OUT_BYTES) {
		for (unsigned i = 0; i < n_fds; i++)
			close(fds[i]);
		return -ENOBUFS;
	}
	struct out_msg *m = malloc(sizeof(*m) + len);
	if (!m) {
		for (unsigned i = 0; i < n_fds; i++)
			close(fds[i]);
		return -ENOMEM;
	}
	m->next = NULL;
	m->len = len;
	m->off = 0;
	m->n_fds = n_fds;
	if (n_fds) /* fds may be NULL: memcpy(x, NULL, 0) is undefined (UBSan) */
		memcpy(m->fds, fds, sizeof(int) * n_fds);
	memcpy(m->data, data, len);
	if (c->out_tail)
		c->out_tail->next = m;
	else
		c->out_head = m;
	c->out_tail = m;
	c->out_bytes += len;
	return 0;
}

int conn_encode_error(uint8_t *buf, size_t cap, int code, const char *fmt, va_list ap)
{
	struct wire_error e = { .code = code < 0 ? code : -EIO };
	vsnprintf(e.message, sizeof(e.message), fmt, ap);
	return wire_encode_error(buf, cap, &e);
}

void conn_send_error(struct conn *c, int code, const char *fmt, ...)
{
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ERROR_SIZE];
	va_list ap;
	va_start(ap, fmt);
	int n = conn_encode_error(buf, sizeof(buf), code, fmt, ap);
	va_end(ap);
	if (n > 0)
		conn_queue(c, buf, (size_t)n, NULL, 0);
}

/* Says what is wrong with a header wire_header_decode refused, and which counter it goes to. */
static uint64_t *classify_header(struct conn *c, int r, char *why, size_t len)
{
	struct server *s = c->srv;
	uint32_t magic, length;
	uint16_t version, type;
	memcpy(&magic, c->in, 4);
	memcpy(&version, c->in + 4, 2);
	memcpy(&type, c->in + 6, 2);
	memcpy(&length, c->in + 8, 4);
	if (le32toh(magic) != WIRE_MAGIC) {
		snprintf(why, len, "sent bytes that are not a feedd message (magic %08x)", le32toh(magic));
		return &s->n.bad_magic;
	}
	if (r == -EMSGSIZE) {
		snprintf(why, len, "sent a message of %u bytes; requests are at most %u", le32toh(length),
			 WIRE_MAX_REQUEST - WIRE_HEADER_SIZE);
		return &s->n.oversized;
	}
	if (le16toh(type) == 0 || le16toh(type) >= _WIRE_TYPE_MAX) {
		snprintf(why, len, "sent unknown message type %u", le16toh(type));
		return &s->n.unknown_type;
	}
	if (r == 0 || le16toh(version) == 0) {
		snprintf(why, len, "sent a %s message of protocol version %u (this daemon speaks %u)",
			 wire_type_name(le16toh(type)), le16toh(version), WIRE_VERSION);
		return &s->n.bad_version;
	}
	snprintf(why, len, "sent a message header with a non-zero reserved word");
	return &s->n.bad_message;
}

static void conn_read(struct conn *c)
{
	struct iovec iov = { .iov_base = c->in + c->in_len, .iov_len = sizeof(c->in) - c->in_len };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 8)];
	} cm;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf) };
	ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;

	bool got_fds = false;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); n >= 0 && h; h = CMSG_NXTHDR(&mh, h)) {
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
			size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fds[8];
			memcpy(fds, CMSG_DATA(h), MIN(k, ARRAY_SIZE(fds)) * sizeof(int));
			for (size_t i = 0; i < MIN(k, ARRAY_SIZE(fds)); i++)
				close(fds[i]);
			got_fds = true;
		}
	}
	if (n >= 0 && (got_fds || (mh.msg_flags & MSG_CTRUNC))) {
		conn_drop(c, &c->srv->n.passed_fds, "sent file descriptors, which no request carries");
		return;
	}
	if (n <= 0) {
		conn_drop(c, NULL, NULL); /* EOF or reset: the client went away */
		return;
	}
	c->in_len += (size_t)n;

	while (c->in_len >= WIRE_HEADER_SIZE) {
		struct wire_header h;
		int r = wire_header_decode(c->in, c->in_len, WIRE_MAX_REQUEST - WIRE_HEADER_SIZE, &h);
		/* Only HELLO may come from another protocol version: it is how versions are settled. */
		if (r < 0 || (h.version != WIRE_VERSION && h.type != WIRE_HELLO)) {
			char why[160];
			uint64_t *counter = classify_header(c, r, why, sizeof(why));
			conn_drop(c, counter, why);
			return;
		}
		size_t total = WIRE_HEADER_SIZE + h.length;
		if (c->in_len < total)
			break;
		r = request_dispatch(c, &h, c->in + WIRE_HEADER_SIZE);
		if (r < 0) {
			char why[96];
			if (r == -ENOBUFS) {
				conn_drop(c, &c->srv->n.unread_output, "leaves its replies unread (16 MiB queued)");
				return;
			}
			snprintf(why, sizeof(why), "malformed or unexpected %s message (%u bytes)", wire_type_name(h.type),
				 h.length);
			conn_drop(c, &c->srv->n.bad_message, why);
			return;
		}
		memmove(c->in, c->in + total, c->in_len - total);
		c->in_len -= total;
	}
	if (conn_flush(c) < 0 || (c->closing && !c->out_head))
		conn_drop(c, NULL, NULL);
}

void conn_on_read(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	const struct log_context *old = log_context_swap(&c->log);
	conn_read(c); /* may free c; the context is a copy's address until then */
	log_context_swap(old);
}

void conn_on_write(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	if (conn_flush(c) < 0 || (c->closing && !c->out_head))
		conn_drop(c, NULL, NULL);
}

/* The peer process exited: reclaim its session even if a child still holds the socket. */
void conn_on_peer_exit(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	c->srv->n.clients_reaped++;
	const struct log_context *old = log_context_swap(&c->log);
	log_info("client %" PRIu64 " (pid %d, uid %u): the process exited%s", c->id, (int)c->pid, (unsigned)c->uid,
		 c->session ? "; reclaiming its ring" : "");
	log_context_swap(old);
	conn_free(c);
}
