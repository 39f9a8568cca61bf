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
 *
 * On a node many users share (operations.md, "A shared node"): the socket is
 * bound only in a directory no other user can write, and nothing after
 * bind() acts on its name; past max_connections / max_connections_per_uid,
 * admin_connections slots are kept for operators; out of fds, a spare fd
 * lets feedd accept and refuse rather than spin on a readable socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
void listen_refusal_log(struct server *s, unsigned kind, const char *fmt, ...)
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
static void send_error(int fd, int code, const char *fmt, ...) _printf_(3, 4);
static void send_error(int fd, int code, const char *fmt, ...)
{
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_ERROR_SIZE];
	va_list ap;
	va_start(ap, fmt);
	int n = conn_encode_error(buf, sizeof(buf), code, fmt, ap);
	va_end(ap);
	if (n > 0)
		(void)send(fd, buf, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	shutdown(fd, SHUT_WR);
}

static void refuse(struct server *s, int fd, int code, const char *fmt, ...) _printf_(4, 5);
static void refuse(struct server *s, int fd, int code, const char *fmt, ...)
{
	char msg[WIRE_MESSAGE_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_error(fd, code, "%s", msg);
	if (s->n_linger < MAX_LINGER)
		s->linger[s->n_linger++] = fd;
	else
		listen_linger_close(fd);
}

static unsigned uid_connections(struct server *s, uid_t uid)
{
	unsigned *n = listen_uid_count(s, uid);
	if (n)
		return *n;
	unsigned k = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		k += c->uid == uid;
	return k;
}

static size_t uid_hash(uid_t uid, size_t cap)
{
	return (size_t)(((uint64_t)uid * UINT64_C(0x9e3779b97f4a7c15)) >> 32) & (cap - 1);
}

unsigned *listen_uid_count(struct server *s, uid_t uid)
{
	struct uid_slot *u = listen_uid_slot(s, uid);
	return u ? &u->n : NULL;
}

struct uid_slot *listen_uid_slot(struct server *s, uid_t uid)
{
	/* Slots are never emptied (a uid seen once keeps its slot at 0): the uids of a node are few. */
	for (size_t j = s->uid_cap ? uid_hash(uid, s->uid_cap) : 0; s->uid_cap && s->uid_slots[j].used;
	     j = (j + 1) & (s->uid_cap - 1))
		if (s->uid_slots[j].uid == uid)
			return &s->uid_slots[j];
	if (2 * (s->uid_used + 1) > s->uid_cap) {
		size_t cap = s->uid_cap ? 2 * s->uid_cap : 64;
		struct uid_slot *t = calloc(cap, sizeof(*t));
		if (!t)
			return NULL;
		for (size_t i = 0; i < s->uid_cap; i++) {
			if (!s->uid_slots[i].used)
				continue;
			size_t j = uid_hash(s->uid_slots[i].uid, cap);
			while (t[j].used)
				j = (j + 1) & (cap - 1);
			t[j] = s->uid_slots[i];
		}
		free(s->uid_slots);
		s->uid_slots = t;
		s->uid_cap = cap;
	}
	size_t j = uid_hash(uid, s->uid_cap);
	while (s->uid_slots[j].used && s->uid_slots[j].uid != uid)
		j = (j + 1) & (s->uid_cap - 1);
	if (!s->uid_slots[j].used) {
		s->uid_slots[j] = (struct uid_slot){ .uid = uid, .used = true };
		s->uid_used++;
	}
	return &s->uid_slots[j];
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

/* Reads the peer's supplementary groups into c (once). */
static void with_groups(struct conn *c)
{
	int r = peer_groups(c->fd, &c->groups, &c->n_groups);
	if (r < 0)
		log_debug("client %" PRIu64 " (pid %d): no supplementary groups (%s); allow_groups and admin_groups "
			  "see its primary group only", c->id, (int)c->pid, strerror(-r));
}

/* Whether the peer may use the connection slots kept for operators: root, feedd's user, admin_users/_groups. */
static bool peer_admin(struct server *s, const struct conn *c)
{
	return listen_peer_trusted(c) || listen_peer_listed(c, &s->admin);
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
	c->log = (struct log_context){ .client_id = c->id, .client_pid = c->pid, .client_uid = c->uid };

	/* Its groups only when a list names groups: a flood past its limit is refused at the least cost. */
	bool restricted = s->allow.n_uids || s->allow.n_gids;
	if (s->allow.n_gids || s->admin.n_gids)
		with_groups(c);
	if (restricted && !listen_peer_trusted(c) && !listen_peer_listed(c, &s->allow)) {
		s->n.refused_credentials++;
		listen_refusal_log(s, REFUSE_CREDENTIALS, "connection from pid %d (uid %u, gid %u) refused: not in allow_users or allow_groups",
			    (int)c->pid, (unsigned)c->uid, (unsigned)c->gid);
		refuse(s, cfd, -EACCES, "uid %u is not allowed to use this feedd (allow_users / allow_groups)",
		       (unsigned)c->uid);
		free(c->groups);
		free(c);
		return;
	}
	/*
	 * The ordinary slots are max_connections, at most max_connections_per_uid
	 * of them per uid. Past either, an operator (root, feedd's user,
	 * admin_users / admin_groups) still gets one of admin_connections slots
	 * kept for them, so that feedctl status and reload always get in.
	 */
	unsigned mine = uid_connections(s, c->uid);
	size_t ordinary = s->n_conns - s->n_reserved;
	if (ordinary >= s->max_connections || mine >= s->max_connections_per_uid) {
		if (s->n_reserved < s->admin_connections && peer_admin(s, c)) {
			c->reserved = true;
		} else {
			bool global = ordinary >= s->max_connections;
			s->n.refused_limit++;
			listen_refusal_log(s, REFUSE_LIMIT, "connection from pid %d (uid %u) refused: %s (%u) reached", (int)c->pid,
				    (unsigned)c->uid, global ? "max_connections" : "max_connections_per_uid",
				    global ? s->max_connections : s->max_connections_per_uid);
			refuse(s, cfd, -EUSERS, "feedd has reached %s (%u connections%s); try again later, or raise %s "
			       "in the [feedd] section of feedd.conf", global ? "max_connections" : "max_connections_per_uid",
			       global ? s->max_connections : s->max_connections_per_uid, global ? "" : " for this uid",
			       global ? "max_connections" : "max_connections_per_uid");
			free(c->groups);
			free(c);
			return;
		}
	}

	c->pidfd = peer_pidfd(cfd, c->pid);
	if (c->pidfd < 0)
		log_debug("client %" PRIu64 " (pid %d): no pidfd (%s); noticing its exit by EOF only", c->id,
			  (int)c->pid, strerror(-c->pidfd));
	c->rev = event_new(s->base, cfd, EV_READ | EV_PERSIST, conn_on_read, c);
	c->wev = event_new(s->base, cfd, EV_WRITE, conn_on_write, c);
	if (c->rev && c->wev && peer_admin(s, c)) { /* its requests before the clients' (server.h) */
		event_priority_set(c->rev, SERVER_PRIORITY_ADMIN);
		event_priority_set(c->wev, SERVER_PRIORITY_ADMIN);
	}
	if (c->pidfd >= 0)
		c->pidev = event_new(s->base, c->pidfd, EV_READ, conn_on_peer_exit, c);
	c->next = s->conns;
	if (s->conns)
		s->conns->prev = c;
	s->conns = c;
	s->n_conns++;
	s->n_reserved += c->reserved;
	unsigned *mine_now = listen_uid_count(s, c->uid);
	c->uid_counted = mine_now != NULL;
	if (mine_now)
		(*mine_now)++;
	if (!c->rev || !c->wev || event_add(c->rev, NULL) < 0 || (c->pidfd >= 0 && (!c->pidev || event_add(c->pidev, NULL) < 0)))
		conn_free(c);
}

/*
 * Out of file descriptors (EMFILE, ENFILE): the pending connection stays in
 * the backlog and the listening socket stays readable, so retrying at once
 * is a busy loop. The spare fd kept for this moment is closed, the
 * connection accepted on it, told why, and closed; then the spare is taken
 * again. When even that fails, accepting pauses until the next tick.
 * Returns true when accepting may go on.
 */
static bool accept_without_fds(struct server *s, int lfd, int err)
{
	/* Idle rings kept for reuse (ring.h) hold an fd each: let go of them first. */
	if (ring_pool_trim(s->rings, UINT64_MAX) > 0)
		return true;
	s->n.refused_limit++;
	listen_refusal_log(s, REFUSE_FDS, "connections refused: feedd is out of file descriptors (%s); raise LimitNOFILE= "
		    "(RLIMIT_NOFILE) or lower max_connections", strerror(err));
	if (s->spare_fd >= 0) {
		close(s->spare_fd);
		s->spare_fd = -1;
		int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (cfd >= 0) {
			send_error(cfd, -EMFILE, "feedd is out of file descriptors; try again later (its operator can "
				   "raise LimitNOFILE= or lower max_connections)");
			close(cfd);
		}
		int e = cfd < 0 ? errno : 0;
		s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (s->spare_fd >= 0) {
			if (cfd >= 0 || e == ECONNABORTED)
				return true; /* refused one; the next may be pending */
			if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
				return false; /* none pending: nothing to pause */
		}
	}
	/* No spare to spend: stop watching the socket until the tick, when fds may have been freed. */
	event_del(s->listen_ev);
	s->accept_paused = true;
	return false;
}

/*
 * Accepts what is pending, ACCEPT_BATCH at most: the event is level-triggered
 * and fires again. While the backlog drains in one batch, the listener runs
 * before the clients' events (an operator's connection is then accepted at
 * once, and served first: server.h); when a batch does not drain it (a
 * flood), it takes turns with the requests of the connections already in
 * until it does, so that a flood cannot starve them.
 */
#define ACCEPT_BATCH 64

void listen_on_accept(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	for (unsigned n = 0; n < ACCEPT_BATCH; n++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (cfd < 0) {
			if (errno == EMFILE || errno == ENFILE) {
				if (accept_without_fds(s, fd, errno))
					continue;
				return;
			}
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warning_errno(-errno, "accept on %s failed", s->path);
			/* Drained: the next connection (an operator's among them) is accepted first again. */
			(void)event_priority_set(s->listen_ev, SERVER_PRIORITY_ADMIN);
			return;
		}
		accept_one(s, cfd);
	}
	/* More pending than a batch (a flood): accepting takes turns with the clients until it drains. */
	(void)event_priority_set(s->listen_ev, SERVER_PRIORITY_ADMIN + 1);
}

/*
 * Raises the soft RLIMIT_NOFILE to the hard one (systemd's default is
 * 1024:524288): every connection costs 2 fds and every attached one 4 more.
 * Returns the soft limit now in force.
 */
unsigned long listen_raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	if (rl.rlim_cur < rl.rlim_max) {
		struct rlimit want = { .rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max };
		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl.rlim_cur = rl.rlim_max;
	}
	return rl.rlim_cur == RLIM_INFINITY ? ULONG_MAX : (unsigned long)rl.rlim_cur;
}

/* Resumes accepting after accept_without_fds paused it, once a spare fd can be had again. */
void listen_resume(struct server *s)
{
	if (s->spare_fd < 0)
		s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (s->accept_paused && s->spare_fd >= 0 && event_add(s->listen_ev, NULL) == 0)
		s->accept_paused = false;
}

/*
 * Whether the directory the socket is bound in is safe: nobody but root
 * and feedd's user can create, remove or rename anything in it or in the
 * directories above it (a sticky directory, like /tmp, is safe to pass
 * through, not to bind in). Otherwise another user could put a socket of
 * their own where clients look for feedd's, or swap what bind() created.
 */
static int check_dir(const char *dir, int dfd, char *err, size_t errlen)
{
	struct stat st;
	if (fstat(dfd, &st) < 0)
		return -errno;
	uid_t me = geteuid();
	if (st.st_uid != 0 && st.st_uid != me) {
		snprintf(err, errlen, "socket directory %s is owned by uid %u, not root or feedd's user (uid %u): its "
			 "owner could put a socket of their own there; use a directory only root can write, such as the "
			 "packaged unit's RuntimeDirectory (/run/feedd)", dir, (unsigned)st.st_uid, (unsigned)me);
		return -EPERM;
	}
	if (st.st_mode & 0022) {
		snprintf(err, errlen, "socket directory %s is writable by %s (mode %04o): another user could replace "
			 "the socket; use a directory only root can write, such as the packaged unit's RuntimeDirectory "
			 "(/run/feedd)", dir, st.st_mode & 0002 ? "others" : "its group", (unsigned)(st.st_mode & 07777));
		return -EPERM;
	}
	char real[PATH_MAX];
	if (!realpath(dir, real))
		return 0; /* checked the directory itself; its path vanished under us: bind will say */
	for (char *slash = strrchr(real, '/'); slash; slash = strrchr(real, '/')) {
		*(slash == real ? slash + 1 : slash) = 0;
		if (stat(real, &st) == 0 && (st.st_uid != 0 && st.st_uid != me)) {
			snprintf(err, errlen, "socket directory %s is inside %s, owned by uid %u: its owner could rename "
				 "the socket directory away; use a directory only root can write, such as /run/feedd",
				 dir, real, (unsigned)st.st_uid);
			return -EPERM;
		}
		if (stat(real, &st) == 0 && (st.st_mode & 0022) && !(st.st_mode & S_ISVTX)) {
			snprintf(err, errlen, "socket directory %s is inside %s, which others can write (mode %04o): they "
				 "could rename the socket directory away; use a directory only root can write, such as "
				 "/run/feedd", dir, real, (unsigned)(st.st_mode & 07777));
			return -EPERM;
		}
		if (slash == real)
			break;
	}
	return 0;
}

/*
 * Binds path: never through a symlink, only in a directory no other user
 * can write (check_dir); a stale socket is replaced, a live one is an error.
 * The socket is created with its final mode (through the umask), and its
 * group is set relative to the directory's fd without following a symlink:
 * nothing after bind() acts on a name someone else could have swapped.
 */
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
	const char *base = path;
	if (!slash) {
		free(dir);
		dir = strdup(".");
		if (!dir)
			return -ENOMEM;
	} else {
		base = path + (slash - dir) + 1;
		slash[slash == dir ? 1 : 0] = 0;
		if (slash != dir && mkdir(dir, 0755) < 0 && errno != EEXIST) {
			int e = -errno;
			snprintf(err, errlen, "cannot create %s: %s", dir, strerror(-e));
			return e;
		}
	}
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		int e = -errno;
		snprintf(err, errlen, "cannot open socket directory %s: %s", dir, strerror(-e));
		return e;
	}
	int r = check_dir(dir, dfd, err, errlen);
	if (r < 0)
		return r;

	struct stat st;
	if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0) {
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
		unlinkat(dfd, base, 0);
	}

	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	/* Created with its final mode: no chmod by name after bind, no window with the umask's mode. */
	mode_t old = umask(~mode & 0777);
	int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (b < 0 || (group >= 0 && fchownat(dfd, base, (uid_t)-1, (gid_t)group, AT_SYMLINK_NOFOLLOW) < 0) ||
	    listen(fd, SOMAXCONN) < 0) {
		int e = -errno;
		snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(-e));
		if (b == 0)
			unlinkat(dfd, base, 0);
		return e;
	}
	return TAKE_FD(fd);
}

/*
 * The operator socket's read event. Only root and feedd's user can connect
 * (mode 0600), so nothing here is a flood to take turns with: every pending
 * connection is accepted at once, through the same checks and limits as
 * the control socket's (admin_connections keeps their slots).
 */
static void on_accept_operator(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	for (unsigned n = 0; n < ACCEPT_BATCH; n++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (cfd < 0) {
			if ((errno == EMFILE || errno == ENFILE) && accept_without_fds(s, fd, errno))
				continue;
			return;
		}
		accept_one(s, cfd);
	}
}

void listen_operator(struct server *s)
{
	char path[sizeof(((struct sockaddr_un *)NULL)->sun_path)], err[512] = "";
	if (wire_operator_socket_path(s->path, path, sizeof(path)) < 0) {
		log_info("no operator socket: the path beside %s is too long; operators use the control socket", s->path);
		return;
	}
	int fd = listen_bind(path, 0600, -1, err, sizeof(err));
	if (fd < 0) {
		log_info("no operator socket: %s; operators use the control socket", err);
		return;
	}
	s->op_fd = fd;
	s->op_path = strdup(path);
	s->op_ev = event_new(s->base, fd, EV_READ | EV_PERSIST, on_accept_operator, s);
	if (!s->op_path || !s->op_ev || event_priority_set(s->op_ev, SERVER_PRIORITY_ADMIN) < 0 ||
	    event_add(s->op_ev, NULL) < 0) {
		log_warning("no operator socket: out of memory; operators use the control socket");
		listen_operator_close(s);
		return;
	}
	log_info("operators (root, feedd's user) have %s, served before every client", path);
}

void listen_operator_close(struct server *s)
{
	if (s->op_ev)
		event_free(s->op_ev);
	s->op_ev = NULL;
	if (s->op_fd >= 0) {
		close(s->op_fd);
		if (s->op_path)
			unlink(s->op_path);
	}
	s->op_fd = -1;
	free(s->op_path);
	s->op_path = NULL;
}
