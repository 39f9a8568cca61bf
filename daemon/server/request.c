/* SPDX-License-Identifier: MIT */
/*
 * The requests a connection may send, after HELLO: ATTACH (a session and its
 * ring, within the memory limits), STATUS, DETACH, EPOCH_INFO (attached:
 * measured on the pool, answered when done), and the operator commands
 * RELOAD and DRAIN (root, feedd's own user, or admin_users / admin_groups).
 * A request that cannot be served is answered with ERROR and the connection
 * stays; one that breaks the protocol drops it (conn.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "daemon/feed/session-epoch.h"
#include "daemon/server/server-internal.h"
#include "proto/vstate.h"

static void on_session_fail(struct session *sess, int code, const char *msg, void *userdata)
{
	struct conn *c = userdata;
	conn_send_error(c, code, "%s", msg);
	/* A client that broke the ring protocol is dropped; freeing happens from the write event, not here. */
	if (code == -EPROTO) {
		c->srv->n.protocol_errors++;
		c->srv->n.ring_protocol++;
		c->closing = true;
	}
	event_active(c->wev, EV_WRITE, 0);
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
		conn_send_error(c, -EPROTONOSUPPORT, "protocol versions %u..%u are not supported (this daemon speaks %u)",
			   h.min_version, h.max_version, WIRE_VERSION);
		c->closing = true;
		return 0;
	}
	snprintf(c->name, sizeof(c->name), "%s", h.name);
	c->hello = true;
	struct wire_hello_reply r = { .version = WIRE_VERSION, .daemon_pid = (uint32_t)getpid(),
				      .flags = (gpu_available(c->srv->cfg.gpu) ? WIRE_DAEMON_GPU : 0) |
					       WIRE_DAEMON_EPOCH_INFO | WIRE_DAEMON_EXPLAIN | WIRE_DAEMON_LONG_STATE };
	snprintf(r.daemon_version, sizeof(r.daemon_version), "%s", FEEDD_VERSION);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_HELLO_REPLY_SIZE];
	int n = wire_encode_hello_reply(buf, sizeof(buf), &r);
	return n < 0 ? n : conn_queue(c, buf, (size_t)n, NULL, 0);
}

static uint64_t uid_memory(struct server *s, const struct conn *from)
{
	const struct uid_slot *u = from->uid_counted ? listen_uid_slot(s, from->uid) : NULL;
	if (u)
		return u->memory;
	uid_t uid = from->uid;
	uint64_t m = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		if (c->uid == uid)
			m += c->memory;
	return m;
}

/*
 * Room kept beyond the ring itself: the session's own allocations and the
 * daemon's working memory must fit too, or the group's OOM killer picks feedd.
 */
#define HEADROOM_SLACK (UINT64_C(32) << 20)

/*
 * Refuses an attach whose ring would not fit in what the node and feedd's
 * memory cgroup have left: the ring is allocated at once (fallocate), and a
 * charge past a cgroup's limit gets the whole daemon OOM-killed, not this
 * attach refused. Returns 0, or -ENOMEM with the ERROR queued.
 */
static int check_headroom(struct conn *c, const struct feed *f, uint64_t need)
{
	struct server *s = c->srv;
	uint64_t room, now = now_ns();
	char what[512];
	/* Attaches that come fast: the last reading, less what was attached since, while it lets them in. */
	if (s->room_ns && now - s->room_ns < HEADROOM_FRESH_NS) {
		uint64_t since = s->memory > s->room_memory ? s->memory - s->room_memory : 0;
		if (s->room == UINT64_MAX || (s->room > since && need + HEADROOM_SLACK <= s->room - since))
			return 0;
	}
	s->room_ns = 0;
	if (headroom_read(&room, what, sizeof(what)) < 0)
		return 0;
	if (room == UINT64_MAX || need + HEADROOM_SLACK <= room) {
		s->room = room;
		s->room_ns = now;
		s->room_memory = s->memory;
		return 0;
	}
	/* Idle rings kept for reuse (ring.h) are feedd's to give back: let go of them and look again. */
	if (ring_pool_trim(s->rings, UINT64_MAX) > 0 &&
	    (headroom_read(&room, what, sizeof(what)) < 0 || room == UINT64_MAX || need + HEADROOM_SLACK <= room))
		return 0;
	s->n.refused_memory++;
	log_warning("client %" PRIu64 " (pid %d, uid %u): attach to feed %s refused: a ring of %" PRIu64 " MiB (+%" PRIu64
		    " MiB slack) does not fit in %" PRIu64 " MiB left by %s",
		    c->id, (int)c->pid, (unsigned)c->uid, f->name, need >> 20, HEADROOM_SLACK >> 20, room >> 20, what);
	conn_send_error(c, -ENOMEM, "attach to feed %s refused: its ring needs %" PRIu64 " MiB and only %" PRIu64
			" MiB are left by %s; out of memory (ask the operator for more memory for feedd, or use a smaller "
			"batch_size x seq_len)", f->name, need >> 20, room >> 20, what);
	return -ENOMEM;
}

/* Refuses an attach whose ring would pass a memory limit. Returns 0, or -EDQUOT or -ENOMEM with the ERROR queued. */
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
	} else if (s->uid_memory_max && (have = uid_memory(s, c)) + need > s->uid_memory_max) {
		key = "uid_memory_max";
		limit = s->uid_memory_max;
	} else if (s->memory_max && (have = s->memory) + need > s->memory_max) {
		key = "memory_max";
		limit = s->memory_max;
	}
	if (!key)
		return check_headroom(c, f, need);
	s->n.refused_memory++;
	log_warning("client %" PRIu64 " (pid %d, uid %u): attach to feed %s refused: a ring of %" PRIu64
		    " bytes with %" PRIu64 " in use passes %s = %" PRIu64,
		    c->id, (int)c->pid, (unsigned)c->uid, f->name, need, have, key, limit);
	conn_send_error(c, -EDQUOT, "attach to feed %s refused: its ring needs %" PRIu64 " bytes, and with %" PRIu64
		   " bytes already in use that passes feedd's %s (%" PRIu64 " bytes); raise it in the [feedd] section "
		   "of feedd.conf, or use a smaller batch_size x seq_len", f->name, need, have, key, limit);
	return -EDQUOT;
}

/* STATE: a part of a long cursor, kept for the next ATTACH or EXPLAIN. */
static int handle_state(struct conn *c, const uint8_t *p, size_t len)
{
	if (len == 0 || memchr(p, 0, len))
		return -EBADMSG;
	if (c->state_len + len >= WIRE_STATE_MAX) {
		conn_send_error(c, -EMSGSIZE, "a cursor of more than %u bytes", WIRE_STATE_MAX);
		c->closing = true;
		return 0;
	}
	char *n = realloc(c->state, c->state_len + len + 1);
	if (!n)
		return -ENOMEM;
	memcpy(n + c->state_len, p, len);
	c->state_len += len;
	n[c->state_len] = 0;
	c->state = n;
	return 0;
}

/*
 * The cursor of an ATTACH or EXPLAIN: the field itself, or the STATE parts
 * sent before it when the field says FEED_CURSOR_IN_STATE_AREA (taken: the
 * caller frees *ret_owned). NULL when that says so but none came.
 */
static const char *request_cursor(struct conn *c, const char *field, char **ret_owned)
{
	*ret_owned = NULL;
	if (strcmp(field, FEED_CURSOR_IN_STATE_AREA) != 0) {
		free(c->state);
		c->state = NULL;
		c->state_len = 0;
		return field;
	}
	*ret_owned = TAKE_PTR(c->state);
	c->state_len = 0;
	return *ret_owned;
}

static int handle_attach(struct conn *c, const uint8_t *p, size_t len)
{
	struct server *s = c->srv;
	struct wire_attach a;
	if (wire_decode_attach(p, len, &a) < 0)
		return -EBADMSG;
	/* Taken first: the STATE parts belong to this request, whatever it answers. */
	_cleanup_free_ char *owned = NULL;
	const char *text = request_cursor(c, a.cursor, &owned);
	if (c->session) {
		conn_send_error(c, -EALREADY, "this connection is already attached to feed %s", c->feed->name);
		return 0;
	}
	if (c->reserved) {
		s->n.refused_limit++;
		conn_send_error(c, -EUSERS, "feedd has reached max_connections or max_connections_per_uid; this connection got "
				"one of the admin_connections slots, kept for operator commands (status, reload, drain), not "
				"for attaching; raise the limits in the [feedd] section of feedd.conf");
		return 0;
	}
	bool draining;
	struct feed *f = server_find_feed(s, a.feed, &draining);
	if (!f) {
		if (draining)
			conn_send_error(c, -ENOENT, "feed '%s' is draining (drained by an operator or removed from the config): "
				   "it takes no new attaches", a.feed);
		else
			conn_send_error(c, -ENOENT, "no feed named '%s'", a.feed);
		return 0;
	}
	struct cursor cur;
	_cleanup_(vstate_clear) struct vstate state = { 0 };
	if (!text) {
		conn_send_error(c, -EINVAL, "the attach names a long state that was not sent (STATE) before it");
		return 0;
	}
	const bool elastic = vstate_is(text);
	if (elastic ? vstate_parse(text, &state) < 0 : text[0] && cursor_parse(text, &cur) < 0) {
		conn_send_error(c, -EINVAL, "%s '%.64s' is malformed or damaged (bad check digits)", elastic ? "state" : "cursor",
				text);
		return 0;
	}
	if (check_memory(c, f) < 0)
		return 0;
	char err[512];
	struct session *sess;
	/* Its ring's memory from this uid's idle rings, and back to them when it leaves (ring.h). */
	ring_pool_lend(s->rings, (uint32_t)c->uid);
	int r = session_new(s->producer, f, a.rank, a.world, text[0] && !elastic ? &cur : NULL,
			    elastic ? &state : NULL, s->ring_slots, on_session_fail, c, &sess, err, sizeof(err));
	ring_pool_lend(NULL, 0);
	if (r < 0) {
		log_warning("client %" PRIu64 " (pid %d): attach to feed %s rank %u/%u refused: %s", c->id, (int)c->pid,
			    a.feed, a.rank, a.world, err);
		conn_send_error(c, r, "%s", err);
		return 0;
	}
	/* GPU: the device half (daemon/gpu), or the reason there is none; refused before anything is sent. */
	_cleanup_free_ uint8_t *dev_msg = NULL;
	size_t dev_len = 0;
	int dev_fd = -1;
	struct staging *staging = NULL;
	if ((a.flags & WIRE_ATTACH_DEVICE) && (r = gpu_attach_reply(s->cfg.gpu, session_ring(sess), &a, &staging, &dev_msg,
								      &dev_len, &dev_fd, err, sizeof(err))) < 0) {
		s->n.refused_memory += r == -EDQUOT; /* gpu_memory_max, counted with the ring limits */
		log_warning("client %" PRIu64 " (pid %d): attach to feed %s on cuda:%u refused: %s", c->id, (int)c->pid,
			    a.feed, a.device, err);
		session_close(sess);
		conn_send_error(c, r, "%s", err);
		return 0;
	}
	session_attach_staging(sess, staging);
	c->session = sess;
	c->feed = f;
	c->rank = a.rank;
	c->world = a.world;
	server_attached(s, f);
	telemetry_client_attach(s->tm, &c->tm, f, a.rank, a.world, session_ring(sess)->slot_count,
				session_attach_ns(sess));
	conn_set_memory(c, session_ring(sess)->size + FEED_CONSUMER_PAGE_SIZE);
	c->log.feed = f->name;
	c->log.rank = a.rank;
	c->log.world = a.world;
	c->idle_released = 0;
	c->idle_since_ns = now_ns();

	struct ring *ring = session_ring(sess);
	int fds[WIRE_ATTACH_FDS] = { -1, -1, -1, -1 };
	int src[WIRE_ATTACH_FDS] = { ring->ring_fd, ring->consumer_fd, ring->data_efd, ring->space_efd };
	for (unsigned i = 0; i < WIRE_ATTACH_FDS; i++) {
		fds[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
		if (fds[i] < 0) {
			r = -errno;
			for (unsigned k = 0; k < i; k++)
				close(fds[k]);
			telemetry_client_detach(&c->tm);
			server_detached(s, f);
			c->session = session_close(c->session);
			c->feed = NULL;
			conn_set_memory(c, 0);
			conn_send_error(c, r, "cannot pass the ring: %s", strerror(-r));
			return 0;
		}
	}
	struct wire_attach_reply rep = {
		.ring_size = ring->size,
		.consumer_size = FEED_CONSUMER_PAGE_SIZE,
		.fingerprint = f->fingerprint,
		.first_batch = session_first_batch(sess),
		.slot_count = ring->slot_count,
		.batch_size = f->conf.batch_size,
		.seq_len = f->conf.seq_len,
		.n_fds = WIRE_ATTACH_FDS,
	};
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ATTACH_REPLY_SIZE];
	int n = wire_encode_attach_reply(buf, sizeof(buf), &rep);
	log_info("client %" PRIu64 " (pid %d, %s) attached to feed %s rank %u/%u%s%s", c->id, (int)c->pid, c->name,
		 f->name, a.rank, a.world, a.cursor[0] ? " at cursor " : "", a.cursor);
	r = n < 0 ? n : conn_queue(c, buf, (size_t)n, fds, WIRE_ATTACH_FDS);
	if (r == 0 && dev_msg) {
		log_info("client %" PRIu64 " (pid %d): %s", c->id, (int)c->pid,
			 staging ? "batches staged on its GPU" : "asked for a GPU, gets host batches (no GPU staging)");
		r = conn_queue(c, dev_msg, dev_len, &dev_fd, dev_fd >= 0);
	} else if (dev_fd >= 0) {
		close(dev_fd);
	}
	/*
	 * Wired and answered: only now may it produce, so a failure it finds at
	 * once reaches this connection's session, after ATTACH_REPLY.
	 */
	if (r == 0)
		session_start(sess);
	return r;
}

static int handle_status(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_status st;
	if (wire_decode_status(p, len, &st) < 0)
		return -EBADMSG;
	/*
	 * The document is bounded by the reply limit and by what this
	 * connection may still queue; a document that does not fit is the
	 * daemon's problem, answered with an ERROR, never a reason to drop the
	 * client that asked.
	 */
	size_t room = c->out_bytes + WIRE_HEADER_SIZE < MAX_OUT_BYTES ? MAX_OUT_BYTES - c->out_bytes - WIRE_HEADER_SIZE : 0;
	_cleanup_free_ char *json = NULL;
	/* Bits this daemon does not know are ignored (proto/wire.h): a newer client's request is answered. */
	int r = server_status_json(c->srv, st.flags, MIN(room, (size_t)WIRE_MAX_REPLY), &json);
	if (r == -EMSGSIZE) {
		conn_send_error(c, r, "the status document does not fit in one reply (%u MiB), even without the "
			        "clients' history", WIRE_MAX_REPLY >> 20);
		return 0;
	}
	if (r < 0) {
		conn_send_error(c, r, "cannot build the status document");
		return 0;
	}
	size_t jl = strlen(json);
	_cleanup_free_ uint8_t *buf = malloc(WIRE_HEADER_SIZE + jl);
	if (!buf) {
		conn_send_error(c, -ENOMEM, "cannot build the status document");
		return 0;
	}
	int n = wire_encode_status_reply_header(buf, WIRE_HEADER_SIZE, jl);
	if (n < 0) {
		conn_send_error(c, n, "cannot encode the status document");
		return 0;
	}
	memcpy(buf + WIRE_HEADER_SIZE, json, jl);
	return conn_queue(c, buf, WIRE_HEADER_SIZE + jl, NULL, 0);
}

static int epoch_info_reply(struct conn *c, const struct session_epoch_info *info)
{
	struct wire_epoch_info_reply rep = { .epoch = info->epoch, .batches = info->batches,
					     .first_batch = info->first_batch, .units = info->units };
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_EPOCH_INFO_REPLY_SIZE];
	int n = wire_encode_epoch_info_reply(buf, sizeof(buf), &rep);
	return n < 0 ? n : conn_queue(c, buf, (size_t)n, NULL, 0);
}

/* The pool measured the epoch: answer (the connection still holds its open session, else this is not called). */
static void on_epoch_info(struct session *sess, int code, const struct session_epoch_info *info, const char *msg,
			  void *userdata)
{
	struct conn *c = userdata;
	if (code < 0)
		conn_send_error(c, code, "%s", msg);
	else if (epoch_info_reply(c, info) < 0)
		conn_send_error(c, -ENOBUFS, "cannot queue the epoch length");
	event_active(c->wev, EV_WRITE, 0);
}

static int handle_epoch_info(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_epoch_info m;
	if (wire_decode_epoch_info(p, len, &m) < 0)
		return -EBADMSG;
	_cleanup_free_ char *owned = NULL;
	const char *text = request_cursor(c, m.cursor, &owned); /* taken first, as ATTACH does */
	if (!c->session) {
		conn_send_error(c, -ENOTCONN, "epoch lengths are per attachment: attach to a feed first");
		return 0;
	}
	if (!text) {
		conn_send_error(c, -EINVAL, "the request names a long state that was not sent (STATE) before it");
		return 0;
	}
	struct cursor cur;
	_cleanup_(vstate_clear) struct vstate state = { 0 };
	const bool elastic = vstate_is(text);
	if (elastic ? vstate_parse(text, &state) < 0 : text[0] && cursor_parse(text, &cur) < 0) {
		conn_send_error(c, -EINVAL, "%s '%.64s' is malformed or damaged (bad check digits)", elastic ? "state" : "cursor",
				text);
		return 0;
	}
	struct session_epoch_info info;
	char err[512];
	int r = session_epoch_info(c->session, text[0] && !elastic ? &cur : NULL, elastic ? &state : NULL, on_epoch_info,
				   c, &info, err, sizeof(err));
	if (r < 0) {
		conn_send_error(c, r, "%s", err);
		return 0;
	}
	return r == 1 ? epoch_info_reply(c, &info) : 0;
}

static int admin_reply(struct conn *c, const char *msg)
{
	struct wire_admin_reply rep;
	snprintf(rep.message, sizeof(rep.message), "%s", msg);
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ADMIN_REPLY_SIZE];
	int n = wire_encode_admin_reply(buf, sizeof(buf), &rep);
	return n < 0 ? n : conn_queue(c, buf, (size_t)n, NULL, 0);
}

/* Operator commands need root, feedd's own user, or admin_users / admin_groups. Returns true when allowed. */
static bool admin_allowed(struct conn *c, const char *what)
{
	struct server *s = c->srv;
	if (listen_peer_trusted(c) || listen_peer_listed(c, &s->admin))
		return true;
	s->n.refused_admin++;
	log_warning("client %" PRIu64 " (pid %d, uid %u, gid %u): %s refused: not root, not feedd's user, "
		    "not in admin_users or admin_groups",
		    c->id, (int)c->pid, (unsigned)c->uid, (unsigned)c->gid, what);
	conn_send_error(c, -EPERM, "%s is not allowed for uid %u: it needs root, feedd's own user, or an entry in "
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
	/* The reload loads off the main loop; server_reload_done answers. */
	int r = s->cfg.reload ? s->cfg.reload(s->cfg.userdata, c->id, msg, sizeof(msg)) : -EOPNOTSUPP;
	if (r < 0) {
		if (!s->cfg.reload)
			snprintf(msg, sizeof(msg), "this feedd cannot reload");
		conn_send_error(c, r, "%s", msg);
	}
	return 0;
}

void server_reload_done(struct server *s, uint64_t client, int r, const char *msg)
{
	for (struct conn *c = s->conns; c; c = c->next) {
		if (c->id != client)
			continue;
		if (r < 0)
			conn_send_error(c, r, "%s", msg);
		else
			admin_reply(c, msg);
		conn_flush(c);
		return;
	}
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
		conn_send_error(c, r, "%s", msg);
		return 0;
	}
	log_notice("client %" PRIu64 " (pid %d, uid %u): %s", c->id, (int)c->pid, (unsigned)c->uid, msg);
	return admin_reply(c, msg);
}

/* The explanation as one reply, or an error when it does not fit. */
static int explain_reply(struct conn *c, const char *text, uint32_t batches)
{
	size_t tl = strlen(text);
	size_t room = c->out_bytes + WIRE_HEADER_SIZE < MAX_OUT_BYTES ? MAX_OUT_BYTES - c->out_bytes - WIRE_HEADER_SIZE : 0;
	if (tl > MIN(room, (size_t)WIRE_MAX_REPLY)) {
		conn_send_error(c, -EMSGSIZE, "the explanation of %u batches does not fit in one reply: ask for fewer", batches);
		return 0;
	}
	_cleanup_free_ uint8_t *buf = malloc(WIRE_HEADER_SIZE + tl);
	if (!buf) {
		conn_send_error(c, -ENOMEM, "out of memory");
		return 0;
	}
	int n = wire_encode_explain_reply_header(buf, WIRE_HEADER_SIZE, tl);
	if (n < 0) {
		conn_send_error(c, n, "cannot encode the explanation");
		return 0;
	}
	memcpy(buf + WIRE_HEADER_SIZE, text, tl);
	return conn_queue(c, buf, WIRE_HEADER_SIZE + tl, NULL, 0);
}

/* A text feed's explanation is done (the connection is still open: conn_free cancels it). */
static void on_explain(int code, char *text, const char *msg, void *userdata)
{
	struct conn *c = userdata;
	c->explain = NULL;
	if (code < 0)
		conn_send_error(c, code, "%s", msg);
	else if (explain_reply(c, text, c->explain_batches) < 0)
		conn_send_error(c, -ENOBUFS, "cannot queue the explanation");
	free(text);
	event_active(c->wev, EV_WRITE, 0);
}

/* EXPLAIN: provenance of a stream's next batches, planned on the side (feedctl explain). */
static int handle_explain(struct conn *c, const uint8_t *p, size_t len)
{
	struct wire_explain m;
	if (wire_decode_explain(p, len, &m) < 0)
		return -EBADMSG;
	_cleanup_free_ char *owned = NULL;
	const char *given = request_cursor(c, m.cursor, &owned); /* taken first, as ATTACH does */
	if (c->explain) {
		conn_send_error(c, -EBUSY, "an explanation is still being made on this connection");
		return 0;
	}
	bool draining;
	struct feed *f = server_find_feed(c->srv, m.feed, &draining);
	if (!f) {
		conn_send_error(c, -ENOENT, "no feed named '%s'", m.feed);
		return 0;
	}
	struct cursor cur;
	_cleanup_(vstate_clear) struct vstate state = { 0 };
	if (!given) {
		conn_send_error(c, -EINVAL, "the request names a long state that was not sent (STATE) before it");
		return 0;
	}
	const bool elastic = vstate_is(given);
	if (elastic ? vstate_parse(given, &state) < 0 : given[0] && cursor_parse(given, &cur) < 0) {
		conn_send_error(c, -EINVAL, "%s '%.64s' is malformed or damaged (bad check digits)", elastic ? "state" : "cursor",
				given);
		return 0;
	}
	char err[512];
	_cleanup_free_ char *text = NULL;
	c->explain_batches = m.batches;
	int r = session_explain(c->srv->producer, f, m.rank, m.world, given[0] && !elastic ? &cur : NULL,
				elastic ? &state : NULL, m.batches, on_explain, c, &c->explain, &text, err, sizeof(err));
	if (r < 0) {
		conn_send_error(c, r, "%s", err);
		return 0;
	}
	return r == 0 ? 0 : explain_reply(c, text, m.batches); /* 0: text to tokenize first, on_explain answers */
}

int request_dispatch(struct conn *c, const struct wire_header *h, const uint8_t *payload)
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
		/* libfeed unmaps the ring before it says DETACH: its memory may serve the uid's next ring (ring.h). */
		if (c->session)
			session_ring(c->session)->released = true;
		c->closing = true;
		return 0;
	case WIRE_EPOCH_INFO:
		return handle_epoch_info(c, payload, h->length);
	case WIRE_RELOAD:
		return handle_reload(c, payload, h->length);
	case WIRE_DRAIN:
		return handle_drain(c, payload, h->length);
	case WIRE_EXPLAIN:
		return handle_explain(c, payload, h->length);
	case WIRE_STATE:
		return handle_state(c, payload, h->length);
	default:
		return -EPROTO; /* a daemon-to-client type, sent by a client */
	}
}
