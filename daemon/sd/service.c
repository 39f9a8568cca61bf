/* SPDX-License-Identifier: MIT */
/*
 * sd_notify, the watchdog and socket activation (service.h). The last
 * STATUS= line is remembered so the once-a-second tick only talks to the
 * service manager when something changed.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "daemon/sd/service.h"

#if HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static char last_status[256];

int service_notify(const char *state)
{
#if HAVE_SYSTEMD
	return sd_notify(0, state);
#else
	return 0;
#endif
}

int service_notifyf(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		return -EINVAL;
	return service_notify(buf);
}

int service_ready(const char *status)
{
	snprintf(last_status, sizeof(last_status), "%s", status);
	return service_notifyf("READY=1\nSTATUS=%s", status);
}

int service_reloading(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t usec = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	return service_notifyf("RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=%llu",
			       (unsigned long long)usec);
}

int service_stopping(void)
{
	return service_notify("STOPPING=1\nSTATUS=stopping");
}

int service_status(const char *line)
{
	if (strncmp(line, last_status, sizeof(last_status) - 1) == 0)
		return 0;
	snprintf(last_status, sizeof(last_status), "%s", line);
	return service_notifyf("STATUS=%s", line);
}

uint64_t service_watchdog_usec(void)
{
#if HAVE_SYSTEMD
	uint64_t usec = 0;
	return sd_watchdog_enabled(0, &usec) > 0 ? usec : 0;
#else
	return 0;
#endif
}

int service_watchdog_ping(void)
{
	return service_notify("WATCHDOG=1");
}

/* The number of fds passed to this process, from the environment, which is then cleared. */
static int listen_fds(void)
{
#if HAVE_SYSTEMD
	return sd_listen_fds(1);
#else
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	int n = 0;
	if (pid && fds && strtol(pid, NULL, 10) == (long)getpid())
		n = (int)strtol(fds, NULL, 10);
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return n < 0 ? -EINVAL : n;
#endif
}

int service_listen_fd(char *err, size_t errlen)
{
	int n = listen_fds();
	if (n < 0) {
		snprintf(err, errlen, "socket activation: cannot read the passed sockets: %s", strerror(-n));
		return n;
	}
	if (n == 0)
		return 0;
	if (n != 1) {
		snprintf(err, errlen, "socket activation: %d sockets passed; feedd listens on exactly one", n);
		return -EINVAL;
	}
	int fd = 3, domain = 0, type = 0, listening = 0;
	socklen_t l = sizeof(int);
	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &(socklen_t){ sizeof(int) }) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &(socklen_t){ sizeof(int) }) < 0 ||
	    domain != AF_UNIX || type != SOCK_STREAM || !listening) {
		snprintf(err, errlen, "socket activation: fd 3 is not a listening AF_UNIX stream socket "
			 "(use ListenStream= with a path)");
		return -EINVAL;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		int e = -errno;
		snprintf(err, errlen, "socket activation: fd 3: %s", strerror(-e));
		return e;
	}
	return fd;
}
