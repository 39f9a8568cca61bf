/* SPDX-License-Identifier: MIT */
/*
 * Who is at the other end of the control socket. Before a client sends
 * anything (HELLO carries its pid and name; ATTACH its feed and cursor), it
 * checks the daemon's credentials (SO_PEERCRED: the uid that called
 * listen()). The daemon is trusted when it runs as:
 *   - root;
 *   - the client's own uid (a daemon of one's own: nothing to steal);
 *   - the uid in $FEED_DAEMON_UID (a number or a user name), for a service
 *     user the operator names explicitly;
 *   - the owner of the socket's directory, when that directory can only have
 *     been made by root: its parent is owned by root and writable by no one
 *     else (systemd's RuntimeDirectory=feedd with User=feedd gives
 *     /run/feedd owned by feedd, in root's /run).
 * Anything else is another user's process where feedd should be: a hijack.
 */
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/libfeed-internal.h"

/* The uid named by $FEED_DAEMON_UID, or (uid_t)-1. */
static uid_t env_daemon_uid(void)
{
	const char *e = secure_getenv("FEED_DAEMON_UID");
	if (!e || !*e)
		return (uid_t)-1;
	char *end;
	errno = 0;
	unsigned long v = strtoul(e, &end, 10);
	if (!*end && !errno && v < (uid_t)-1)
		return (uid_t)v;
	struct passwd pw, *res = NULL;
	char buf[1024];
	if (getpwnam_r(e, &pw, buf, sizeof(buf), &res) == 0 && res)
		return res->pw_uid;
	return (uid_t)-1;
}

/* The owner of path's directory when only root could have made it there, or (uid_t)-1. */
static uid_t service_dir_owner(const char *path)
{
	char dir[sizeof(((struct feed_client *)0)->socket_path)];
	snprintf(dir, sizeof(dir), "%s", path);
	char *slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return (uid_t)-1;
	*slash = 0;
	struct stat st, parent;
	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || (st.st_mode & 0022))
		return (uid_t)-1;
	slash = strrchr(dir, '/');
	if (!slash)
		return (uid_t)-1;
	slash[slash == dir ? 1 : 0] = 0;
	if (stat(dir, &parent) < 0 || parent.st_uid != 0 || (parent.st_mode & 0022))
		return (uid_t)-1;
	return st.st_uid;
}

int client_check_daemon(int fd, const char *path, char *err, size_t errlen)
{
	struct ucred cred;
	socklen_t l = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &l) < 0) {
		int r = -errno;
		snprintf(err, errlen, "cannot tell who listens on %s (SO_PEERCRED: %s); not talking to it", path,
			 feed_strerror(r));
		return r;
	}
	if (cred.uid == 0 || cred.uid == geteuid() || cred.uid == env_daemon_uid() || cred.uid == service_dir_owner(path))
		return 0;
	struct passwd pw, *res = NULL;
	char buf[1024];
	const char *name = getpwuid_r(cred.uid, &pw, buf, sizeof(buf), &res) == 0 && res ? res->pw_name : "?";
	snprintf(err, errlen, "refusing to talk to the daemon at %s: it runs as uid %u (%s, pid %d), not root, this user, "
		 "or the owner of a socket directory only root could make; it may be another user's impostor. If it is "
		 "your feedd's service user, set FEED_DAEMON_UID=%u", path, (unsigned)cred.uid, name, (int)cred.pid,
		 (unsigned)cred.uid);
	return -EPERM;
}
