/* SPDX-License-Identifier: MIT */
/*
 * The listening socket and the door: binding the control socket (never
 * through a symlink, with the configured mode and group), accepting, and
 * deciding who comes in. Each connection records its peer's credentials at
 * accept (SO_PEERCRED, SO_PEERGROUPS) and watches the peer process through a
 * pidfd (SO_PEERPIDFD, else pidfd_open of the peer's pid): a client that
 * dies while a child still holds its socket is reclaimed as soon as it exits.
 * Refusals of whole connections are logged once per reason per tick, with a
 * count of the ones not logged, so a flood cannot flood the log.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/server/server-internal.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; glibc 2.36's headers predate it */
#endif

static bool has_id(const uint32_t *ids, size_t n, uint32_t id)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

/* Whether the peer is listed in ids by uid, primary gid or a supplementary group. */
bool listen_peer_listed(const struct conn *c, const struct conf_ids *ids)
{
	if (has_id(ids->uids, ids->n_uids, c->uid) || has_id(ids->gids, ids->n_gids, c->gid))
		return true;
	for (unsigned i = 0; i < c->n_groups; i++)
		if (has_id(ids->gids, ids->n_gids, c->groups[i]))
			return true;
	return false;
}

/* Root and feedd's own user are always trusted. */
bool listen_peer_trusted(const struct conn *c)
{
	return c->uid == 0 || c->uid == geteuid();
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

/* Unread input would reset the client's reads of the ERROR: read it first. */
void listen_linger_close(int fd)
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
	int n = conn_encode_error(buf, sizeof(buf), code, fmt, ap);
	va_end(ap);
	if (n > 0)
		(void)send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	shutdown(fd, SHUT_WR);
	if (s->n_linger < MAX_LINGER)
		s->linger[s->n_linger++] = fd;
	else
		listen_linger_close(fd);
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

/*
 * The peer's supplementary groups, however many (up to NGROUPS_MAX): the
 * kernel says how long the list is when the buffer is too short (ERANGE),
 * and the list is read again with that length. Returns 0 with a malloc'd
 * array (NULL when there are none), or a negative errno.
 */
static int peer_groups(int fd, gid_t **ret, unsigned *ret_n)
{
	socklen_t len = 64 * sizeof(gid_t);
	for (unsigned attempt = 0; attempt < 4; attempt++) {
		_cleanup_free_ gid_t *g = malloc(MAX(len, (socklen_t)sizeof(gid_t)));
		if (!g)
			return -ENOMEM;
		socklen_t got = len;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &got) == 0) {
			*ret_n = (unsigned)(got / sizeof(gid_t));
			*ret = *ret_n ? TAKE_PTR(g) : NULL;
			return 0;
		}
		if (errno != ERANGE || got <= len)
			return -errno;
		len = got; /* the length the list has now */
	}
	return -ERANGE;
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
	int r = peer_groups(cfd, &c->groups, &c->n_groups);
	if (r < 0)
		log_debug("client %" PRIu64 " (pid %d): no supplementary groups (%s); allow_groups and admin_groups "
			  "see its primary group only", c->id, (int)c->pid, strerror(-r));
	c->log = (struct log_context){ .client_id = c->id, .client_pid = c->pid, .client_uid = c->uid };

	bool restricted = s->allow.n_uids || s->allow.n_gids;
	if (restricted && !listen_peer_trusted(c) && !listen_peer_listed(c, &s->allow)) {
		s->n.refused_credentials++;
		refusal_log(s, REFUSE_CREDENTIALS, "connection from pid %d (uid %u, gid %u) refused: not in allow_users or allow_groups",
			    (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
		refuse(s, cfd, -EACCES, "uid %u is not allowed to use this feedd (allow_users / allow_groups)",
		       (unsigned)c->uid);
		free(c->groups);
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
		free(c->groups);
		free(c);
		return;
	}

	c->pidfd = peer_pidfd(cfd, c->pid);
	if (c->pidfd < 0)
		log_debug("client %" PRIu64 " (pid %d): no pidfd (%s); noticing its exit by EOF only", c->id,
			  (int)c->pid, strerror(-c->pidfd));
	c->rev = event_new(s->base, cfd, EV_READ | EV_PERSIST, conn_on_read, c);
	c->wev = event_new(s->base, cfd, EV_WRITE, conn_on_write, c);
	if (c->pidfd >= 0)
		c->pidev = event_new(s->base, c->pidfd, EV_READ, conn_on_peer_exit, c);
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	if (!c->rev || !c->wev || event_add(c->rev, NULL) < 0 || (c->pidfd >= 0 && (!c->pidev || event_add(c->pidev, NULL) < 0)))
		conn_free(c);
}

void listen_on_accept(evutil_socket_t fd, short what, void *userdata)
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

/* Binds path: never through a symlink; a stale socket is replaced, a live one is an error. */
int listen_bind(const char *path, unsigned mode, int64_t group, char *err, size_t errlen)
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
