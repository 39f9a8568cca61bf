/* SPDX-License-Identifier: MIT */
/*
 * Connections and their messages. Input is read with recvmsg so that file
 * descriptors a client passes unasked are seen (and closed, and the client
 * dropped); output is a queue of messages, each with the fds it carries, sent
 * with sendmsg as the socket accepts it.
 *
 * Each connection records its peer's credentials at accept (SO_PEERCRED,
 * SO_PEERGROUPS) and watches the peer process through a pidfd
 * (SO_PEERPIDFD, else pidfd_open of the peer's pid): a client that dies while
 * a child still holds its socket is reclaimed as soon as it exits.
 * Refusals of whole connections are logged once per reason per tick, with a
 * count of the ones not logged, so a flood cannot flood the log.
 */
#include <endian.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "daemon/log/log.h"
#include "daemon/sd/service.h"
#include "daemon/server/server.h"
#include "daemon/server/status.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/macro.h"
#include "proto/wire.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; glibc 2.36's headers predate it */
#endif

#define MAX_OUT_BYTES (16u << 20) /* a client that does not read its replies is dropped */
#define MAX_PEER_GROUPS 64

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
	int fd, pidfd;
	struct event *rev, *wev, *pidev;
	uint8_t in[WIRE_MAX_REQUEST];
	size_t in_len;
	struct out_msg *out_head, *out_tail;
	size_t out_bytes;
	bool hello, closing;
	uint64_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	gid_t groups[MAX_PEER_GROUPS];
	unsigned n_groups;
	char name[32];
	struct session *session;
	uint64_t memory; /* ring bytes this connection's session holds */
	struct log_context log;
	uint64_t connect_ns;
	/* a rate over the last status interval */
	uint64_t rate_delivered, rate_ns, rate_wait, rate_step;
	double tokens_per_s, stall_pct;
	/* consumption watch: released count (tail) and when it last moved */
	uint64_t idle_released, idle_since_ns;
	bool stuck;
	/* pipeline watch: published count and when it last moved */
	uint64_t prog_published, prog_since_ns;
};

/* A feed as the server serves it. */
struct served {
	struct feed *feed;
	bool removed; /* no longer in the config: let go when its last client detaches */
};

#define MAX_LINGER 256 /* refused connections kept half-open until the next tick */

/* Refusals of one kind: the first in a tick is logged, the rest counted and summed up at the tick. */
struct refusal_log {
	uint64_t suppressed;
	bool logged;
};

struct server {
	struct event_base *base;
	struct server_config cfg;
	char *path;
	bool own_path; /* bound by us: unlink at exit */
	int listen_fd;
	struct event *listen_ev, *tick_ev;
	struct producer *producer;
	struct served *feeds;
	size_t n_feeds;
	struct conn *conns;
	size_t n_conns;
	uint64_t next_id;
	uint64_t start_ns;
	struct server_counters n;
	struct refusal_log refusal_logs[3];
	int linger[MAX_LINGER]; /* refused: ERROR sent, write side shut, closed at the next tick */
	size_t n_linger;
	uint64_t memory; /* ring bytes of all sessions */

	/* policy, from the config (server_configure) */
	unsigned ring_slots;
	struct conf_ids allow, admin;
	unsigned max_connections, max_connections_per_uid;
	uint64_t client_memory_max, uid_memory_max, memory_max;
	unsigned stuck_client_s;
};

enum { REFUSE_CREDENTIALS, REFUSE_LIMIT, REFUSE_MEMORY };

static void conn_free(struct conn *c);

/* Drops a connection. `counter` (may be NULL) says which kind of protocol error it was. */
static void conn_drop(struct conn *c, uint64_t *counter, const char *why)
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

static void conn_free(struct conn *c)
{
	struct server *s = c->srv;
	if (c->prev)
		c->prev->next = c->next;
	else
		s->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	s->n_conns--;
	if (c->session) {
		log_info("client %" PRIu64 " (pid %d) detached from feed %s rank %u/%u", c->id, (int)c->pid,
			 c->session->feed->name, c->session->rank, c->session->world);
		telemetry_detach(c->session);
		c->session = session_close(c->session);
		s->memory -= c->memory;
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

static int encode_error(uint8_t *buf, size_t cap, int code, const char *fmt, va_list ap)
{
	struct wire_error e = { .code = code < 0 ? code : -EIO };
	vsnprintf(e.message, sizeof(e.message), fmt, ap);
	return wire_encode_error(buf, cap, &e);
}

static void send_error(struct conn *c, int code, const char *fmt, ...) _printf_(3, 4);
static void send_error(struct conn *c, int code, const char *fmt, ...)
{
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ERROR_SIZE];
	va_list ap;
	va_start(ap, fmt);
	int n = encode_error(buf, sizeof(buf), code, fmt, ap);
	va_end(ap);
	if (n > 0)
		queue(c, buf, (size_t)n, NULL, 0);
}

/* The feed that takes attaches under `name`; NULL, with *ret_draining set when only a draining one exists. */
static struct feed *find_feed(struct server *s, const char *name, bool *ret_draining)
{
	*ret_draining = false;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i].feed;
		if (strcmp(f->name, name) != 0)
			continue;
		if (!f->draining)
			return f;
		*ret_draining = true;
	}
	return NULL;
}

static void on_session_fail(struct session *sess, int code, const char *msg, void *userdata)
{
	struct conn *c = userdata;
	send_error(c, code, "%s", msg);
	/* A client that broke the ring protocol is dropped; freeing happens from the write event, not here. */
	if (code == -EPROTO) {
		c->srv->n.protocol_errors++;
		c->srv->n.ring_protocol++;
		c->closing = true;
	}
	event_active(c->wev, EV_WRITE, 0);
}

static bool has_id(const uint32_t *ids, size_t n, uint32_t id)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/* Whether the peer is listed in ids by uid, primary gid or a supplementary group. */
static bool peer_listed(const struct conn *c, const struct conf_ids *ids)
{
	if (has_id(ids->uids, ids->n_uids, c->uid) || has_id(ids->gids, ids->n_gids, c->gid))
		return true;
	for (unsigned i = 0; i < c->n_groups; i++)
		if (has_id(ids->gids, ids->n_gids, c->groups[i]))
			return true;
	return false;
}

/* Root and feedd's own user are always trusted. */
static bool peer_trusted(const struct conn *c)
{
	return c->uid == 0 || c->uid == geteuid();
}

static int handle_hello(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_hello h;
	if (wire_decode_hello(p, len, &h) < 0)
		return -EBADMSG;
	if (h.min_version > WIRE_VERSION || h.max_version < WIRE_VERSION) {
		c->srv->n.protocol_errors++;
		c->srv->n.bad_version++;
		log_warning("client %" PRIu64 " (pid %d, uid %u): speaks protocol versions %u..%u, not %u; disconnecting",
			    c->id, (int)c->pid, (unsigned)c->uid, h.min_version, h.max_version, WIRE_VERSION);
		send_error(c, -EPROTONOSUPPORT, "protocol versions %u..%u are not supported (this daemon speaks %u)",
			   h.min_version, h.max_version, WIRE_VERSION);
		c->closing = true;
		return 0;
	}
	snprintf(c->name, sizeof(c->name), "%s", h.name);
	c->hello = true;
	struct wire_hello_reply r = { .version = WIRE_VERSION, .daemon_pid = (uint32_t)getpid(),
				      .flags = gpu_available(c->srv->cfg.gpu) ? WIRE_DAEMON_GPU : 0 };
	snprintf(r.daemon_version, sizeof(r.daemon_version), "%s", FEEDD_VERSION);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_HELLO_REPLY_SIZE];
	int n = wire_encode_hello_reply(buf, sizeof(buf), &r);
	return n < 0 ? n : queue(c, buf, (size_t)n, NULL, 0);
}

static uint64_t uid_memory(struct server *s, uid_t uid)
{
	uint64_t m = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		if (c->uid == uid)
			m += c->memory;
	return m;
}

/* Refuses an attach whose ring would pass a memory limit. Returns 0, or -EDQUOT with the ERROR queued. */
static int check_memory(struct conn *c, const struct feed *f)
{
	struct server *s = c->srv;
	size_t slot = ring_slot_bytes(f->conf.batch_size, f->conf.seq_len);
	if (slot == 0)
		return 0; /* session_new explains what is wrong with the geometry */
	uint64_t need = FEED_RING_HEADER_SIZE + (uint64_t)slot * s->ring_slots + FEED_CONSUMER_PAGE_SIZE;
	const char *key = NULL;
	uint64_t limit = 0, have = 0;
	if (s->client_memory_max && need > s->client_memory_max) {
		key = "client_memory_max";
		limit = s->client_memory_max;
	} else if (s->uid_memory_max && (have = uid_memory(s, c->uid)) + need > s->uid_memory_max) {
		key = "uid_memory_max";
		limit = s->uid_memory_max;
	} else if (s->memory_max && (have = s->memory) + need > s->memory_max) {
		key = "memory_max";
		limit = s->memory_max;
	}
	if (!key)
		return 0;
	s->n.refused_memory++;
	log_warning("client %" PRIu64 " (pid %d, uid %u): attach to feed %s refused: a ring of %" PRIu64
		    " bytes with %" PRIu64 " in use passes %s = %" PRIu64,
		    c->id, (int)c->pid, (unsigned)c->uid, f->name, need, have, key, limit);
	send_error(c, -EDQUOT, "attach to feed %s refused: its ring needs %" PRIu64 " bytes, and with %" PRIu64
		   " bytes already in use that passes feedd's %s (%" PRIu64 " bytes)", f->name, need, have, key, limit);
	return -EDQUOT;
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
	bool draining;
	struct feed *f = find_feed(s, a.feed, &draining);
	if (!f) {
		if (draining)
			send_error(c, -ENOENT, "feed '%s' is draining (drained by an operator or removed from the config): "
				   "it takes no new attaches", a.feed);
		else
			send_error(c, -ENOENT, "no feed named '%s'", a.feed);
		return 0;
	}
	struct cursor cur;
	if (a.cursor[0] && cursor_parse(a.cursor, &cur) < 0) {
		send_error(c, -EINVAL, "cursor '%.64s' is malformed or damaged (bad check digits)", a.cursor);
		return 0;
	}
	if (check_memory(c, f) < 0)
		return 0;
	char err[512];
	struct session *sess;
	int r = session_new(s->producer, f, a.rank, a.world, a.cursor[0] ? &cur : NULL, s->ring_slots,
			    on_session_fail, c, &sess, err, sizeof(err));
	if (r < 0) {
		log_warning("client %" PRIu64 " (pid %d): attach to feed %s rank %u/%u refused: %s", c->id, (int)c->pid,
			    a.feed, a.rank, a.world, err);
		send_error(c, r, "%s", err);
		return 0;
	}
	/* GPU: the device half (daemon/gpu), or the reason there is none; refused before anything is sent. */
	_cleanup_free_ uint8_t *dev_msg = NULL;
	size_t dev_len = 0;
	int dev_fd = -1;
	if ((a.flags & WIRE_ATTACH_DEVICE) && (r = gpu_attach_reply(s->cfg.gpu, sess->ring, &a, &sess->staging, &dev_msg,
								      &dev_len, &dev_fd, err, sizeof(err))) < 0) {
		log_warning("client %" PRIu64 " (pid %d): attach to feed %s on cuda:%u refused: %s", c->id, (int)c->pid,
			    a.feed, a.device, err);
		session_close(sess);
		send_error(c, r, "%s", err);
		return 0;
	}
	c->session = sess;
	telemetry_attach(sess);
	c->memory = sess->ring->size + FEED_CONSUMER_PAGE_SIZE;
	s->memory += c->memory;
	c->log.feed = f->name;
	c->log.rank = a.rank;
	c->log.world = a.world;
	c->idle_released = 0;
	c->idle_since_ns = now_ns();

	struct ring *ring = sess->ring;
	int fds[WIRE_ATTACH_FDS] = { -1, -1, -1, -1 };
	int src[WIRE_ATTACH_FDS] = { ring->ring_fd, ring->consumer_fd, ring->data_efd, ring->space_efd };
	for (unsigned i = 0; i < WIRE_ATTACH_FDS; i++) {
		fds[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
		if (fds[i] < 0) {
			r = -errno;
			for (unsigned k = 0; k < i; k++)
				close(fds[k]);
			telemetry_detach(c->session);
			c->session = session_close(c->session);
			s->memory -= c->memory;
			c->memory = 0;
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
	r = n < 0 ? n : queue(c, buf, (size_t)n, fds, WIRE_ATTACH_FDS);
	if (r == 0 && dev_msg) {
		log_info("client %" PRIu64 " (pid %d): %s", c->id, (int)c->pid,
			 sess->staging ? "batches staged on its GPU" : "asked for a GPU, gets host batches (no GPU staging)");
		r = queue(c, dev_msg, dev_len, &dev_fd, dev_fd >= 0);
	} else if (dev_fd >= 0) {
		close(dev_fd);
	}
	return r;
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

static int admin_reply(struct conn *c, const char *msg)
{
	struct wire_admin_reply rep;
	snprintf(rep.message, sizeof(rep.message), "%s", msg);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ADMIN_REPLY_SIZE];
	int n = wire_encode_admin_reply(buf, sizeof(buf), &rep);
	return n < 0 ? n : queue(c, buf, (size_t)n, NULL, 0);
}

/* Operator commands need root, feedd's own user, or admin_users / admin_groups. Returns true when allowed. */
static bool admin_allowed(struct conn *c, const char *what)
{
	struct server *s = c->srv;
	if (peer_trusted(c) || peer_listed(c, &s->admin))
		return true;
	s->n.refused_admin++;
	log_warning("client %" PRIu64 " (pid %d, uid %u, gid %u): %s refused: not root, not feedd's user, "
		    "not in admin_users or admin_groups",
		    c->id, (int)c->pid, (unsigned)c->uid, (unsigned)c->gid, what);
	send_error(c, -EPERM, "%s is not allowed for uid %u: it needs root, feedd's own user, or an entry in "
		   "admin_users / admin_groups", what, (unsigned)c->uid);
	return false;
}

static int handle_reload(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_reload m;
	if (wire_decode_reload(p, len, &m) < 0)
		return -EBADMSG;
	if (!admin_allowed(c, "reload"))
		return 0;
	struct server *s = c->srv;
	log_notice("client %" PRIu64 " (pid %d, uid %u) asks for a reload", c->id, (int)c->pid, (unsigned)c->uid);
	char msg[WIRE_MESSAGE_MAX];
	int r = s->cfg.reload ? s->cfg.reload(s->cfg.userdata, msg, sizeof(msg)) : -EOPNOTSUPP;
	if (r < 0) {
		if (!s->cfg.reload)
			snprintf(msg, sizeof(msg), "this feedd cannot reload");
		send_error(c, r, "%s", msg);
		return 0;
	}
	return admin_reply(c, msg);
}

static int handle_drain(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_drain m;
	if (wire_decode_drain(p, len, &m) < 0)
		return -EBADMSG;
	if (!admin_allowed(c, "drain"))
		return 0;
	char msg[WIRE_MESSAGE_MAX];
	int r = server_drain(c->srv, m.feed, msg, sizeof(msg));
	if (r < 0) {
		send_error(c, r, "%s", msg);
		return 0;
	}
	log_notice("client %" PRIu64 " (pid %d, uid %u): %s", c->id, (int)c->pid, (unsigned)c->uid, msg);
	return admin_reply(c, msg);
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
	case WIRE_RELOAD:
		return handle_reload(c, payload, h->length);
	case WIRE_DRAIN:
		return handle_drain(c, payload, h->length);
	default:
		return -EPROTO; /* a daemon-to-client type, sent by a client */
	}
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
		r = dispatch(c, &h, c->in + WIRE_HEADER_SIZE);
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
	if (flush_out(c) < 0 || (c->closing && !c->out_head))
		conn_drop(c, NULL, NULL);
}

static void on_read(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	const struct log_context *old = log_context_swap(&c->log);
	conn_read(c); /* may free c; the context is a copy's address until then */
	log_context_swap(old);
}

static void on_write(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	if (flush_out(c) < 0 || (c->closing && !c->out_head))
		conn_drop(c, NULL, NULL);
}

/* The peer process exited: reclaim its session even if a child still holds the socket. */
static void on_peer_exit(evutil_socket_t fd, short what, void *userdata)
{
	struct conn *c = userdata;
	c->srv->n.clients_reaped++;
	const struct log_context *old = log_context_swap(&c->log);
	log_info("client %" PRIu64 " (pid %d, uid %u): the process exited%s", c->id, (int)c->pid, (unsigned)c->uid,
		 c->session ? "; reclaiming its ring" : "");
	log_context_swap(old);
	conn_free(c);
}

/* Logs a refused connection, unless one of its kind was logged this tick already. */
static void refusal_log(struct server *s, unsigned kind, const char *fmt, ...) _printf_(3, 4);
static void refusal_log(struct server *s, unsigned kind, const char *fmt, ...)
{
	struct refusal_log *rl = &s->refusal_logs[kind];
	if (rl->logged) {
		rl->suppressed++;
		return;
	}
	rl->logged = true;
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_warning("%s", line);
}

/* Closes a refused connection, reading what the client sent first (unread input would reset its reads). */
static void linger_close(int fd)
{
	uint8_t sink[WIRE_MAX_REQUEST];
	while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
		;
	close(fd);
}

/*
 * Answers a connection that is refused before it is served with one ERROR.
 * The socket is not closed at once: a client that connects and then sends
 * HELLO would find it closed and see a broken pipe instead of the reason.
 * Its write side is shut (the client reads the ERROR, then EOF) and it is
 * closed at the next tick; past MAX_LINGER of those, at once.
 */
static void refuse(struct server *s, int fd, int code, const char *fmt, ...) _printf_(4, 5);
static void refuse(struct server *s, int fd, int code, const char *fmt, ...)
{
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ERROR_SIZE];
	va_list ap;
	va_start(ap, fmt);
	int n = encode_error(buf, sizeof(buf), code, fmt, ap);
	va_end(ap);
	if (n > 0)
		(void)send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	shutdown(fd, SHUT_WR);
	if (s->n_linger < MAX_LINGER)
		s->linger[s->n_linger++] = fd;
	else
		linger_close(fd);
}

static unsigned uid_connections(struct server *s, uid_t uid)
{
	unsigned n = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		n += c->uid == uid;
	return n;
}

/* The peer's pidfd: from the socket when the kernel has SO_PEERPIDFD, else opened from its pid. */
static int peer_pidfd(int fd, pid_t pid)
{
	int pidfd = -1;
	socklen_t l = sizeof(pidfd);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &l) == 0 && pidfd >= 0) {
		if (fcntl(pidfd, F_SETFD, FD_CLOEXEC) < 0) {
			close(pidfd);
			return -errno;
		}
		return pidfd;
	}
	if (pid <= 0)
		return -ESRCH;
	/* Racy only if the peer died and its pid was reused between connect and here. */
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	return pidfd < 0 ? -errno : pidfd;
}

/* Sets up a connection for an accepted socket, or refuses it. */
static void accept_one(struct server *s, int cfd)
{
	s->n.accepted++;
	struct conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(cfd);
		return;
	}
	c->srv = s;
	c->fd = cfd;
	c->pidfd = -1;
	c->id = ++s->next_id;
	c->connect_ns = now_ns();
	c->pid = -1;
	c->uid = (uid_t)-1;
	c->gid = (gid_t)-1;
	struct ucred cred;
	socklen_t cl = sizeof(cred);
	if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
		c->pid = cred.pid;
		c->uid = cred.uid;
		c->gid = cred.gid;
	}
	socklen_t gl = sizeof(c->groups);
	if (getsockopt(cfd, SOL_SOCKET, SO_PEERGROUPS, c->groups, &gl) == 0)
		c->n_groups = gl / sizeof(gid_t);
	c->log = (struct log_context){ .client_id = c->id, .client_pid = c->pid, .client_uid = c->uid };

	bool restricted = s->allow.n_uids || s->allow.n_gids;
	if (restricted && !peer_trusted(c) && !peer_listed(c, &s->allow)) {
		s->n.refused_credentials++;
		refusal_log(s, REFUSE_CREDENTIALS, "connection from pid %d (uid %u, gid %u) refused: not in allow_users or allow_groups",
			    (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
		refuse(s, cfd, -EACCES, "uid %u is not allowed to use this feedd (allow_users / allow_groups)",
		       (unsigned)c->uid);
		free(c);
		return;
	}
	unsigned mine = uid_connections(s, c->uid);
	if (s->n_conns >= s->max_connections || mine >= s->max_connections_per_uid) {
		bool global = s->n_conns >= s->max_connections;
		s->n.refused_limit++;
		refusal_log(s, REFUSE_LIMIT, "connection from pid %d (uid %u) refused: %s (%u) reached", (int)c->pid,
			    (unsigned)c->uid, global ? "max_connections" : "max_connections_per_uid",
			    global ? s->max_connections : s->max_connections_per_uid);
		refuse(s, cfd, -EUSERS, "feedd has reached %s (%u connections%s); try again later",
		       global ? "max_connections" : "max_connections_per_uid",
		       global ? s->max_connections : s->max_connections_per_uid, global ? "" : " for this uid");
		free(c);
		return;
	}

	c->pidfd = peer_pidfd(cfd, c->pid);
	if (c->pidfd < 0)
		log_debug("client %" PRIu64 " (pid %d): no pidfd (%s); noticing its exit by EOF only", c->id,
			  (int)c->pid, strerror(-c->pidfd));
	c->rev = event_new(s->base, cfd, EV_READ | EV_PERSIST, on_read, c);
	c->wev = event_new(s->base, cfd, EV_WRITE, on_write, c);
	if (c->pidfd >= 0)
		c->pidev = event_new(s->base, c->pidfd, EV_READ, on_peer_exit, c);
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	if (!c->rev || !c->wev || event_add(c->rev, NULL) < 0 || (c->pidfd >= 0 && (!c->pidev || event_add(c->pidev, NULL) < 0)))
		conn_free(c);
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
		accept_one(s, cfd);
	}
}

/*
 * Reports a client that has had batches published and released none for
 * stuck_client_s; once per episode. (`released` is the client's tail, clamped.)
 */
static void watch_consumption(struct server *s, struct conn *c, uint64_t released, uint64_t now)
{
	if (released != c->idle_released || released >= c->session->published || c->session->failed) {
		if (c->stuck)
			log_info("client %" PRIu64 " (pid %d) on feed %s rank %u/%u consumes again", c->id, (int)c->pid,
				 c->session->feed->name, c->session->rank, c->session->world);
		c->idle_released = released;
		c->idle_since_ns = now;
		c->stuck = false;
		return;
	}
	if (c->stuck || !s->stuck_client_s || now - c->idle_since_ns < (uint64_t)s->stuck_client_s * NSEC_PER_SEC)
		return;
	c->stuck = true;
	s->n.stuck_clients++;
	log_warning("client %" PRIu64 " (pid %d, uid %u) on feed %s rank %u/%u has released no batch for %.0f s with %" PRIu64
		    " published (stuck_client_s = %u); it holds only its own ring, nobody else waits for it",
		    c->id, (int)c->pid, (unsigned)c->uid, c->session->feed->name, c->session->rank, c->session->world,
		    (double)(now - c->idle_since_ns) / 1e9, c->session->published - released, s->stuck_client_s);
}

/* Lets go of feeds that left the config once their last client is gone. */
static void drop_removed_feeds(struct server *s)
{
	size_t k = 0;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct served *sf = &s->feeds[i];
		if (sf->removed && sf->feed->clients == 0) {
			log_info("feed %s: last client gone; unloaded", sf->feed->name);
			feed_unref(sf->feed);
			continue;
		}
		s->feeds[k++] = *sf;
	}
	s->n_feeds = k;
}

/* Once a second: shards still unchanged? delivery rates, stuck clients, the service manager's status line. */
static void on_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i].feed;
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
		const struct feed_consumer_page *cp = c->session->ring->cons;
		uint64_t d = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), c->session->published);
		uint64_t wait = __atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED);
		uint64_t step = __atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED);
		if (c->rate_ns && now > c->rate_ns) {
			uint64_t per = (uint64_t)c->session->feed->conf.batch_size * c->session->feed->conf.seq_len;
			c->tokens_per_s = (double)(d - MIN(d, c->rate_delivered)) * (double)per /
					  ((double)(now - c->rate_ns) / 1e9);
			/* Client-written totals: a delta that goes backwards counts as none. */
			uint64_t dw = wait > c->rate_wait ? wait - c->rate_wait : 0;
			uint64_t ds = step > c->rate_step ? step - c->rate_step : 0;
			c->stall_pct = dw + ds ? 100.0 * (double)dw / (double)(dw + ds) : 0.0;
		}
		c->rate_delivered = d;
		c->rate_wait = wait;
		c->rate_step = step;
		c->rate_ns = now;
		uint64_t released = MIN(__atomic_load_n(&cp->tail, __ATOMIC_RELAXED), c->session->published);
		const struct log_context *old = log_context_swap(&c->log);
		watch_consumption(s, c, released, now);
		log_context_swap(old);
	}
	static const char *const kinds[] = { "not allowed", "over a connection limit", "over a memory limit" };
	for (unsigned k = 0; k < ARRAY_SIZE(s->refusal_logs); k++) {
		struct refusal_log *rl = &s->refusal_logs[k];
		if (rl->suppressed)
			log_warning("%" PRIu64 " more connections refused in the last second (%s)", rl->suppressed, kinds[k]);
		rl->suppressed = 0;
		rl->logged = false;
	}
	for (size_t i = 0; i < s->n_linger; i++)
		linger_close(s->linger[i]);
	s->n_linger = 0;
	drop_removed_feeds(s);
	telemetry_tick_begin();
	for (size_t i = 0; i < s->n_feeds; i++)
		telemetry_tick_feed(s->feeds[i].feed);
	telemetry_tick_end(producer_pool(s->producer));
	char line[256];
	server_status_line(s, line, sizeof(line));
	service_status(line);
}

/* Binds path: never through a symlink; a stale socket is replaced, a live one is an error. */
static int bind_socket(const char *path, unsigned mode, int64_t group, char *err, size_t errlen)
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
	/* Created with no access at all, then opened up: no window where the umask's mode applies. */
	mode_t old = umask(0777);
	int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (b < 0 || (group >= 0 && chown(path, (uid_t)-1, (gid_t)group) < 0) || chmod(path, mode) < 0 ||
	    listen(fd, 128) < 0) {
		int e = -errno;
		snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(-e));
		if (b == 0)
			unlink(path);
		return e;
	}
	return TAKE_FD(fd);
}

static int copy_ids(struct conf_ids *dst, const struct conf_ids *src)
{
	uint32_t *u = src->n_uids ? malloc(src->n_uids * sizeof(*u)) : NULL;
	uint32_t *g = src->n_gids ? malloc(src->n_gids * sizeof(*g)) : NULL;
	if ((src->n_uids && !u) || (src->n_gids && !g)) {
		free(u);
		free(g);
		return -ENOMEM;
	}
	if (u)
		memcpy(u, src->uids, src->n_uids * sizeof(*u));
	if (g)
		memcpy(g, src->gids, src->n_gids * sizeof(*g));
	free(dst->uids);
	free(dst->gids);
	*dst = (struct conf_ids){ .uids = u, .n_uids = src->n_uids, .gids = g, .n_gids = src->n_gids };
	return 0;
}

int server_configure(struct server *s, const struct conf *conf)
{
	if (copy_ids(&s->allow, &conf->allow) < 0 || copy_ids(&s->admin, &conf->admin) < 0)
		return -ENOMEM;
	s->ring_slots = conf->ring_slots;
	s->max_connections = conf->max_connections;
	s->max_connections_per_uid = conf->max_connections_per_uid;
	s->client_memory_max = conf->client_memory_max;
	s->uid_memory_max = conf->uid_memory_max;
	s->memory_max = conf->memory_max;
	s->stuck_client_s = conf->stuck_client_s;
	telemetry_configure(&conf->diagnosis);
	return 0;
}

int server_new(struct event_base *base, const struct server_config *cfg, const struct conf *conf,
	       struct producer *producer, struct feed **feeds, size_t n_feeds, struct server **ret, char *err,
	       size_t errlen)
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
	if (!s->path || !s->feeds || server_configure(s, conf) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n_feeds; i++)
		s->feeds[s->n_feeds++] = (struct served){ .feed = feed_ref(feeds[i]) };

	if (cfg->listen_fd >= 0) {
		s->listen_fd = cfg->listen_fd;
		struct sockaddr_un sa;
		socklen_t l = sizeof(sa);
		if (getsockname(s->listen_fd, (struct sockaddr *)&sa, &l) == 0 && l > offsetof(struct sockaddr_un, sun_path) &&
		    sa.sun_path[0]) {
			free(s->path);
			s->path = strndup(sa.sun_path, l - offsetof(struct sockaddr_un, sun_path));
		}
	} else {
		int r = bind_socket(s->path, conf->socket_mode, conf->socket_group, err, errlen);
		if (r < 0) {
			server_free(s);
			return r;
		}
		s->listen_fd = r;
		s->own_path = true;
	}
	s->listen_ev = event_new(base, s->listen_fd, EV_READ | EV_PERSIST, on_accept, s);
	s->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, s);
	struct timeval second = { .tv_sec = 1 };
	if (!s->path || !s->listen_ev || !s->tick_ev || event_add(s->listen_ev, NULL) < 0 ||
	    event_add(s->tick_ev, &second) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	log_info("listening on %s%s", s->path, s->own_path ? "" : " (socket passed by the service manager)");
	*ret = s;
	return 0;
}

void server_set_feeds(struct server *s, struct feed **feeds, size_t n_feeds, char *msg, size_t msglen)
{
	struct served *next = calloc(n_feeds + s->n_feeds + 1, sizeof(*next));
	if (!next) {
		snprintf(msg, msglen, "out of memory; the feeds are unchanged");
		return;
	}
	size_t n = 0, kept = 0, added = 0, replaced = 0, draining = 0;
	bool *taken = calloc(s->n_feeds + 1, sizeof(*taken));
	if (!taken) {
		free(next);
		snprintf(msg, msglen, "out of memory; the feeds are unchanged");
		return;
	}
	for (size_t i = 0; i < n_feeds; i++) {
		struct feed *f = feeds[i];
		size_t j = 0;
		for (; j < s->n_feeds; j++) {
			struct feed *o = s->feeds[j].feed;
			if (!taken[j] && !o->draining && strcmp(o->name, f->name) == 0)
				break;
		}
		if (j < s->n_feeds && s->feeds[j].feed->state == FEED_READY && f->state == FEED_READY &&
		    s->feeds[j].feed->fingerprint == f->fingerprint) {
			/* The same data under the same order: nothing for its clients to notice. */
			taken[j] = true;
			next[n++] = (struct served){ .feed = s->feeds[j].feed };
			kept++;
			continue;
		}
		if (j < s->n_feeds)
			replaced++;
		else
			added++;
		next[n++] = (struct served){ .feed = feed_ref(f) };
		log_info("feed %s: %s", f->name, j < s->n_feeds ? "replaced by its new definition" : "added");
	}
	for (size_t j = 0; j < s->n_feeds; j++) {
		struct served *o = &s->feeds[j];
		if (taken[j])
			continue;
		if (o->feed->clients == 0) {
			log_info("feed %s: no longer served", o->feed->name);
			feed_unref(o->feed);
			continue;
		}
		if (!o->feed->draining)
			log_notice("feed %s: draining; its %u attached clients keep their streams, new attaches go to "
				   "the new configuration", o->feed->name, o->feed->clients);
		o->feed->draining = true;
		o->removed = true;
		next[n++] = *o;
		draining++;
	}
	free(taken);
	free(s->feeds);
	s->feeds = next;
	s->n_feeds = n;
	snprintf(msg, msglen, "%zu feeds: %zu unchanged, %zu added, %zu replaced; %zu draining", n_feeds, kept, added,
		 replaced, draining);
}

int server_drain(struct server *s, const char *name, char *msg, size_t msglen)
{
	bool draining;
	struct feed *f = find_feed(s, name, &draining);
	if (!f) {
		if (draining)
			snprintf(msg, msglen, "feed %s is draining already", name);
		else
			snprintf(msg, msglen, "no feed named '%s'", name);
		return draining ? -EALREADY : -ENOENT;
	}
	f->draining = true;
	snprintf(msg, msglen, "feed %s drained: it takes no new attaches; its %u attached clients stream on", name,
		 f->clients);
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
		if (s->own_path)
			unlink(s->path);
	}
	for (size_t i = 0; i < s->n_linger; i++)
		linger_close(s->linger[i]);
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
		feed_unref(s->feeds[i].feed);
	free(s->feeds);
	free(s->allow.uids);
	free(s->allow.gids);
	free(s->admin.uids);
	free(s->admin.gids);
	free(s->path);
	free(s);
	return NULL;
}

static struct conn *find_conn(struct server *s, uint64_t id)
{
	for (struct conn *c = s->conns; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

/*
 * Adds what the server alone knows to the document status.c built: the
 * refusal counters under "daemon", and per client whether it is reported as
 * stuck. (Fields are only added, never renamed: docs/protocol.md, section 10.)
 */
static char *status_extend(struct server *s, char *text)
{
	json_t *root = json_loads(text, 0, NULL);
	if (!root)
		return text;
	free(text);
	json_t *d = json_object_get(root, "daemon");
	const struct server_counters *n = &s->n;
	json_object_set_new(d, "connections", json_integer((json_int_t)s->n_conns));
	json_object_set_new(d, "ring_memory_bytes", json_integer((json_int_t)s->memory));
	json_object_set_new(d, "refused", json_pack("{s:I, s:I, s:I, s:I}", "credentials", (json_int_t)n->refused_credentials,
						    "limit", (json_int_t)n->refused_limit, "memory",
						    (json_int_t)n->refused_memory, "admin", (json_int_t)n->refused_admin));
	json_object_set_new(d, "dropped",
			    json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "bad_magic", (json_int_t)n->bad_magic,
				      "bad_version", (json_int_t)n->bad_version, "unknown_type", (json_int_t)n->unknown_type,
				      "oversized", (json_int_t)n->oversized, "bad_message", (json_int_t)n->bad_message,
				      "passed_fds", (json_int_t)n->passed_fds, "unread_output", (json_int_t)n->unread_output,
				      "ring_protocol", (json_int_t)n->ring_protocol));
	json_object_set_new(d, "clients_reaped", json_integer((json_int_t)n->clients_reaped));
	json_object_set_new(d, "stuck_clients", json_integer((json_int_t)n->stuck_clients));
	size_t i;
	json_t *cl;
	json_array_foreach(json_object_get(root, "clients"), i, cl) {
		struct conn *c = find_conn(s, (uint64_t)json_integer_value(json_object_get(cl, "id")));
		if (!c || !c->session)
			continue;
		json_object_set_new(cl, "stuck", json_boolean(c->stuck));
		json_object_set_new(cl, "idle_s", json_real((double)(now_ns() - c->idle_since_ns) / 1e9));
		json_object_set_new(cl, "memory_bytes", json_integer((json_int_t)c->memory));
	}
	char *out = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	return out;
}

char *server_status_json(struct server *s)
{
	_cleanup_free_ struct feed **feeds = calloc(MAX(s->n_feeds, 1u), sizeof(*feeds));
	if (!feeds)
		return NULL;
	for (size_t i = 0; i < s->n_feeds; i++)
		feeds[i] = s->feeds[i].feed;
	struct status_input in = {
		.socket_path = s->path,
		.uptime_ns = now_ns() - s->start_ns,
		.pool = producer_pool(s->producer),
		.gpu_status = s->cfg.gpu_status,
		.feeds = feeds,
		.n_feeds = s->n_feeds,
		.accepted = s->n.accepted,
		.protocol_errors = s->n.protocol_errors,
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
	char *text = status_json(&in);
	return text ? status_extend(s, text) : NULL;
}

void server_status_line(struct server *s, char *buf, size_t len)
{
	size_t failed = 0, draining = 0, clients = 0;
	double tps = 0;
	const struct conn *worst = NULL;
	for (size_t i = 0; i < s->n_feeds; i++) {
		failed += s->feeds[i].feed->state != FEED_READY;
		draining += s->feeds[i].feed->draining;
	}
	for (const struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		clients++;
		tps += c->tokens_per_s;
		if (!worst || c->stall_pct > worst->stall_pct)
			worst = c;
	}
	char rate[32];
	if (tps >= 1e6)
		snprintf(rate, sizeof(rate), "%.1fM", tps / 1e6);
	else if (tps >= 1e3)
		snprintf(rate, sizeof(rate), "%.1fk", tps / 1e3);
	else
		snprintf(rate, sizeof(rate), "%.0f", tps);
	int k = snprintf(buf, len, "%zu feeds (%zu failed, %zu draining), %zu clients, %s tokens/s", s->n_feeds, failed,
			 draining, clients, rate);
	if (worst && k >= 0 && (size_t)k < len)
		k += snprintf(buf + k, len - (size_t)k, ", worst stall %.1f%% (%s rank %u/%u)", worst->stall_pct,
			      worst->session->feed->name, worst->session->rank, worst->session->world);
	/* The worst diagnosis says why, when anything is worth saying. */
	char diag[256];
	if (clients && telemetry_worst(diag, sizeof(diag)) > 0 && k >= 0 && (size_t)k < len)
		snprintf(buf + k, len - (size_t)k, "; %s", diag);
}

int server_stuck(struct server *s, uint64_t stuck_ns, char *buf, size_t len)
{
	uint64_t now = now_ns();
	for (struct conn *c = s->conns; c; c = c->next) {
		struct session *ss = c->session;
		if (!ss)
			continue;
		if (ss->published != c->prog_published || ss->planned <= ss->published || ss->failed) {
			c->prog_published = ss->published;
			c->prog_since_ns = now;
			continue;
		}
		if (now - c->prog_since_ns < stuck_ns)
			continue;
		struct pool *p = producer_pool(s->producer);
		snprintf(buf, len, "worker pool: batch %" PRIu64 " of feed %s rank %u/%u was handed to the workers %.1f s ago "
			 "and is not done (%u of %u workers busy, %u jobs queued): a read or a job hangs",
			 ss->first_batch + ss->published, ss->feed->name, ss->rank, ss->world,
			 (double)(now - c->prog_since_ns) / 1e9, pool_busy(p), pool_threads(p), pool_queued(p));
		return 1;
	}
	return 0;
}

void server_counters(const struct server *s, struct server_counters *ret)
{
	*ret = s->n;
}
