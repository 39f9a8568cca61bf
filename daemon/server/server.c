/* SPDX-License-Identifier: MIT */
/*
 * Connections and their messages. Input is read with recvmsg so that file
 * descriptors a client passes unasked are seen (and closed, and the client
 * dropped); output is a queue of messages, each with the fds it carries, sent
 * with sendmsg as the socket accepts it.
 */
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "daemon/log/log.h"
#include "daemon/server/server.h"
#include "daemon/server/status.h"
#include "proto/macro.h"
#include "proto/wire.h"

#define MAX_OUT_BYTES (16u << 20) /* a client that does not read its replies is dropped */

struct out_msg {
	struct out_msg *next;
	size_t len, off;
	int fds[WIRE_ATTACH_FDS];
	unsigned n_fds;
	uint8_t data[];
};

struct conn {
	struct server *srv;
	struct conn *prev, *next;
	int fd;
	struct event *rev, *wev;
	uint8_t in[WIRE_MAX_REQUEST];
	size_t in_len;
	struct out_msg *out_head, *out_tail;
	size_t out_bytes;
	bool hello, closing;
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[32];
	struct session *session;
	uint64_t connect_ns;
	/* a rate over the last status interval */
	uint64_t rate_delivered, rate_ns;
	double tokens_per_s;
};

struct server {
	struct event_base *base;
	struct server_config cfg;
	char *path;
	int listen_fd;
	struct event *listen_ev, *tick_ev;
	struct producer *producer;
	struct feed **feeds;
	size_t n_feeds;
	struct conn *conns;
	uint64_t next_id;
	uint64_t start_ns;
	uint64_t accepted, protocol_errors;
};

static void conn_free(struct conn *c);

static void conn_drop(struct conn *c, const char *why)
{
	if (why) {
		c->srv->protocol_errors++;
		log_warning("client %" PRIu64 " (pid %d, uid %u): %s; disconnecting", c->id, (int)c->pid,
			    (unsigned)c->uid, why);
	}
	conn_free(c);
}

static void conn_free(struct conn *c)
{
	struct server *s = c->srv;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	if (c->session) {
		log_info("client %" PRIu64 " (pid %d) detached from feed %s rank %u/%u", c->id, (int)c->pid,
			 c->session->feed->name, c->session->rank, c->session->world);
		c->session = session_close(c->session);
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
	close(c->fd);
	free(c);
}

/* Sends queued output. Returns 0, or -EPIPE etc. when the peer is gone. */
static int flush_out(struct conn *c)
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

/* Queues a message; takes ownership of fds (dup'd by the caller). */
static int queue(struct conn *c, const void *data, size_t len, const int *fds, unsigned n_fds)
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

static void send_error(struct conn *c, int code, const char *fmt, ...) _printf_(3, 4);
static void send_error(struct conn *c, int code, const char *fmt, ...)
{
	struct wire_error e = { .code = code < 0 ? code : -EIO };
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e.message, sizeof(e.message), fmt, ap);
	va_end(ap);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ERROR_SIZE];
	int n = wire_encode_error(buf, sizeof(buf), &e);
	if (n > 0)
		queue(c, buf, (size_t)n, NULL, 0);
}

static struct feed *find_feed(struct server *s, const char *name)
{
	for (size_t i = 0; i < s->n_feeds; i++)
		if (strcmp(s->feeds[i]->name, name) == 0)
			return s->feeds[i];
	return NULL;
}

static void on_session_fail(struct session *sess, int code, const char *msg, void *userdata)
{
	struct conn *c = userdata;
	send_error(c, code, "%s", msg);
	/* A client that broke the ring protocol is dropped; freeing happens from the write event, not here. */
	if (code == -EPROTO)
		c->closing = true;
	event_active(c->wev, EV_WRITE, 0);
}

static int handle_hello(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_hello h;
	if (wire_decode_hello(p, len, &h) < 0)
		return -EBADMSG;
	if (h.min_version > WIRE_VERSION || h.max_version < WIRE_VERSION) {
		send_error(c, -EPROTONOSUPPORT, "protocol versions %u..%u are not supported (this daemon speaks %u)",
			   h.min_version, h.max_version, WIRE_VERSION);
		c->closing = true;
		return 0;
	}
	snprintf(c->name, sizeof(c->name), "%s", h.name);
	c->hello = true;
	struct wire_hello_reply r = { .version = WIRE_VERSION, .daemon_pid = (uint32_t)getpid() };
	snprintf(r.daemon_version, sizeof(r.daemon_version), "%s", FEEDD_VERSION);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_HELLO_REPLY_SIZE];
	int n = wire_encode_hello_reply(buf, sizeof(buf), &r);
	return n < 0 ? n : queue(c, buf, (size_t)n, NULL, 0);
}

static int handle_attach(struct conn *c, const uint8_t *p, size_t len)
{
	struct server *s = c->srv;
	struct wire_attach a;
	if (wire_decode_attach(p, len, &a) < 0)
		return -EBADMSG;
	if (c->session) {
		send_error(c, -EALREADY, "this connection is already attached to feed %s", c->session->feed->name);
		return 0;
	}
	struct feed *f = find_feed(s, a.feed);
	if (!f || f->draining) {
		send_error(c, -ENOENT, "no feed named '%s'", a.feed);
		return 0;
	}
	struct cursor cur;
	if (a.cursor[0] && cursor_parse(a.cursor, &cur) < 0) {
		send_error(c, -EINVAL, "cursor '%.64s' is malformed or damaged (bad check digits)", a.cursor);
		return 0;
	}
	char err[512];
	struct session *sess;
	int r = session_new(s->producer, f, a.rank, a.world, a.cursor[0] ? &cur : NULL, s->cfg.ring_slots,
			    on_session_fail, c, &sess, err, sizeof(err));
	if (r < 0) {
		log_warning("client %" PRIu64 " (pid %d): attach to feed %s rank %u/%u refused: %s", c->id, (int)c->pid,
			    a.feed, a.rank, a.world, err);
		send_error(c, r, "%s", err);
		return 0;
	}
	c->session = sess;

	struct ring *ring = sess->ring;
	int fds[WIRE_ATTACH_FDS] = { -1, -1, -1, -1 };
	int src[WIRE_ATTACH_FDS] = { ring->ring_fd, ring->consumer_fd, ring->data_efd, ring->space_efd };
	for (unsigned i = 0; i < WIRE_ATTACH_FDS; i++) {
		fds[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
		if (fds[i] < 0) {
			r = -errno;
			for (unsigned k = 0; k < i; k++)
				close(fds[k]);
			c->session = session_close(c->session);
			send_error(c, r, "cannot pass the ring: %s", strerror(-r));
			return 0;
		}
	}
	struct wire_attach_reply rep = {
		.ring_size = ring->size,
		.consumer_size = FEED_CONSUMER_PAGE_SIZE,
		.fingerprint = f->fingerprint,
		.first_batch = sess->first_batch,
		.slot_count = ring->slot_count,
		.batch_size = f->conf.batch_size,
		.seq_len = f->conf.seq_len,
		.n_fds = WIRE_ATTACH_FDS,
	};
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ATTACH_REPLY_SIZE];
	int n = wire_encode_attach_reply(buf, sizeof(buf), &rep);
	log_info("client %" PRIu64 " (pid %d, %s) attached to feed %s rank %u/%u%s%s", c->id, (int)c->pid, c->name,
		 f->name, a.rank, a.world, a.cursor[0] ? " at cursor " : "", a.cursor);
	return n < 0 ? n : queue(c, buf, (size_t)n, fds, WIRE_ATTACH_FDS);
}

static int handle_status(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_status st;
	if (wire_decode_status(p, len, &st) < 0)
		return -EBADMSG;
	_cleanup_free_ char *json = server_status_json(c->srv);
	if (!json) {
		send_error(c, -ENOMEM, "cannot build the status document");
		return 0;
	}
	size_t jl = strlen(json);
	_cleanup_free_ uint8_t *buf = malloc(WIRE_HEADER_SIZE + jl);
	if (!buf)
		return -ENOMEM;
	int n = wire_encode_status_reply_header(buf, WIRE_HEADER_SIZE, jl);
	if (n < 0)
		return n;
	memcpy(buf + WIRE_HEADER_SIZE, json, jl);
	return queue(c, buf, WIRE_HEADER_SIZE + jl, NULL, 0);
}

/* Handles one complete message. Returns 0, or negative to drop the client. */
static int dispatch(struct conn *c, const struct wire_header *h, const uint8_t *payload)
{
	if (!c->hello && h->type != WIRE_HELLO)
		return -EPROTO;
	switch (h->type) {
	case WIRE_HELLO:
		return c->hello ? -EPROTO : handle_hello(c, payload, h->length);
	case WIRE_ATTACH:
		return handle_attach(c, payload, h->length);
	case WIRE_STATUS:
		return handle_status(c, payload, h->length);
	case WIRE_DETACH:
		if (h->length != 0)
			return -EBADMSG;
		c->closing = true;
		return 0;
	default:
		return -EPROTO; /* a daemon-to-client type, sent by a client */
	}
}

static void on_read(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	struct iovec iov = { .iov_base = c->in + c->in_len, .iov_len = sizeof(c->in) - c->in_len };
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 8)];
	} cm;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf) };
	ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;

	bool got_fds = false;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
			size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int fds[8];
			memcpy(fds, CMSG_DATA(h), MIN(k, ARRAY_SIZE(fds)) * sizeof(int));
			for (size_t i = 0; i < MIN(k, ARRAY_SIZE(fds)); i++)
				close(fds[i]);
			got_fds = true;
		}
	}
	if (got_fds || (mh.msg_flags & MSG_CTRUNC)) {
		conn_drop(c, "sent file descriptors, which no request carries");
		return;
	}
	if (n <= 0) {
		conn_drop(c, NULL); /* EOF or reset: the client went away */
		return;
	}
	c->in_len += (size_t)n;

	while (c->in_len >= WIRE_HEADER_SIZE) {
		struct wire_header h;
		int r = wire_header_decode(c->in, c->in_len, WIRE_MAX_REQUEST - WIRE_HEADER_SIZE, &h);
		/* Only HELLO may come from another protocol version: it is how versions are settled. */
		if (r == 0 && h.version != WIRE_VERSION && h.type != WIRE_HELLO)
			r = -EBADMSG;
		if (r < 0) {
			conn_drop(c, r == -EMSGSIZE ? "message too large" : "bad message header (magic, version or type)");
			return;
		}
		size_t total = WIRE_HEADER_SIZE + h.length;
		if (c->in_len < total)
			break;
		r = dispatch(c, &h, c->in + WIRE_HEADER_SIZE);
		if (r < 0) {
			char why[96];
			snprintf(why, sizeof(why), "malformed or unexpected %s message (%u bytes)", wire_type_name(h.type),
				 h.length);
			conn_drop(c, why);
			return;
		}
		memmove(c->in, c->in + total, c->in_len - total);
		c->in_len -= total;
	}
	if (flush_out(c) < 0 || (c->closing && !c->out_head))
		conn_drop(c, NULL);
}

static void on_write(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	if (flush_out(c) < 0 || (c->closing && !c->out_head))
		conn_drop(c, NULL);
}

static void on_accept(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	for (;;) {
		int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (cfd < 0) {
			if (errno != EAGAIN && errno != EINTR)
				log_warning_errno(-errno, "accept on %s failed", s->path);
			return;
		}
		struct conn *c = calloc(1, sizeof(*c));
		if (!c) {
			close(cfd);
			continue;
		}
		c->srv = s;
		c->fd = cfd;
		c->id = ++s->next_id;
		c->connect_ns = now_ns();
		struct ucred cred;
		socklen_t cl = sizeof(cred);
		if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
			c->pid = cred.pid;
			c->uid = cred.uid;
			c->gid = cred.gid;
		}
		c->rev = event_new(s->base, cfd, EV_READ | EV_PERSIST, on_read, c);
		c->wev = event_new(s->base, cfd, EV_WRITE, on_write, c);
		c->next = s->conns;
		if (s->conns)
			s->conns->prev = c;
		s->conns = c;
		if (!c->rev || !c->wev || event_add(c->rev, NULL) < 0) {
			conn_free(c);
			continue;
		}
		s->accepted++;
	}
}

/* Once a second: shards still unchanged? and the clients' delivery rates. */
static void on_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i];
		if (f->state != FEED_READY || feed_check(f) == 0)
			continue;
		for (struct conn *c = s->conns, *next; c; c = next) {
			next = c->next;
			if (c->session && c->session->feed == f)
				session_fail(c->session, f->error_code, f->error);
		}
	}
	uint64_t now = now_ns();
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		uint64_t d = MIN(__atomic_load_n(&c->session->ring->cons->delivered, __ATOMIC_RELAXED),
				 c->session->published);
		if (c->rate_ns && now > c->rate_ns) {
			uint64_t per = (uint64_t)c->session->feed->conf.batch_size * c->session->feed->conf.seq_len;
			c->tokens_per_s = (double)(d - MIN(d, c->rate_delivered)) * (double)per /
					  ((double)(now - c->rate_ns) / 1e9);
		}
		c->rate_delivered = d;
		c->rate_ns = now;
	}
}

/* Binds path: never through a symlink; a stale socket is replaced, a live one is an error. */
static int bind_socket(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path %s is too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);

	_cleanup_free_ char *dir = strdup(path);
	if (!dir)
		return -ENOMEM;
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
			int e = -errno;
			snprintf(err, errlen, "cannot create %s: %s", dir, strerror(-e));
			return e;
		}
	}

	struct stat st;
	if (lstat(path, &st) == 0) {
		if (S_ISLNK(st.st_mode)) {
			snprintf(err, errlen, "%s is a symbolic link; refusing to bind through it", path);
			return -ELOOP;
		}
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "%s exists and is not a socket", path);
			return -EEXIST;
		}
		_cleanup_close_ int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			snprintf(err, errlen, "%s: another feedd is already listening there", path);
			return -EADDRINUSE;
		}
		unlink(path);
	}

	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0660) < 0 || listen(fd, 128) < 0) {
		int e = -errno;
		snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(-e));
		return e;
	}
	return TAKE_FD(fd);
}

int server_new(struct event_base *base, const struct server_config *cfg, struct producer *producer,
	       struct feed **feeds, size_t n_feeds, struct server **ret, char *err, size_t errlen)
{
	struct server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->base = base;
	s->cfg = *cfg;
	s->producer = producer;
	s->start_ns = now_ns();
	s->listen_fd = -1;
	s->path = strdup(cfg->socket_path);
	s->feeds = calloc(MAX(n_feeds, 1u), sizeof(*s->feeds));
	if (!s->path || !s->feeds) {
		server_free(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n_feeds; i++)
		s->feeds[s->n_feeds++] = feed_ref(feeds[i]);

	int r = bind_socket(s->path, err, errlen);
	if (r < 0) {
		free(s->path);
		s->path = NULL; /* not ours to unlink */
		server_free(s);
		return r;
	}
	s->listen_fd = r;
	s->listen_ev = event_new(base, s->listen_fd, EV_READ | EV_PERSIST, on_accept, s);
	s->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, s);
	struct timeval second = { .tv_sec = 1 };
	if (!s->listen_ev || !s->tick_ev || event_add(s->listen_ev, NULL) < 0 || event_add(s->tick_ev, &second) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	log_info("listening on %s", s->path);
	*ret = s;
	return 0;
}

struct server *server_free(struct server *s)
{
	if (!s)
		return NULL;
	if (s->listen_ev)
		event_free(s->listen_ev);
	if (s->tick_ev)
		event_free(s->tick_ev);
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		if (s->path)
			unlink(s->path);
	}
	/* Tell every attached client why its stream ends, then let go. */
	while (s->conns) {
		struct conn *c = s->conns;
		if (c->session) {
			session_stop(c->session);
			send_error(c, -ESHUTDOWN, "feedd is stopping");
			flush_out(c);
		}
		conn_free(c);
	}
	for (size_t i = 0; i < s->n_feeds; i++)
		feed_unref(s->feeds[i]);
	free(s->feeds);
	free(s->path);
	free(s);
	return NULL;
}

char *server_status_json(struct server *s)
{
	struct status_input in = {
		.socket_path = s->path,
		.uptime_ns = now_ns() - s->start_ns,
		.pool = producer_pool(s->producer),
		.gpu_status = s->cfg.gpu_status,
		.feeds = s->feeds,
		.n_feeds = s->n_feeds,
		.accepted = s->accepted,
		.protocol_errors = s->protocol_errors,
	};
	size_t n = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		n += c->session != NULL;
	_cleanup_free_ struct status_client *clients = calloc(MAX(n, 1u), sizeof(*clients));
	if (!clients)
		return NULL;
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		clients[in.n_clients++] = (struct status_client){
			.id = c->id,
			.pid = c->pid,
			.uid = c->uid,
			.name = c->name,
			.session = c->session,
			.connected_ns = now_ns() - c->connect_ns,
			.tokens_per_s = c->tokens_per_s,
		};
	}
	in.clients = clients;
	return status_json(&in);
}
