/* SPDX-License-Identifier: MIT */
/*
 * An LD_PRELOAD shim for test_shared_node.py: plays the attacker who wins
 * the race after bind(). When feedd binds $SWAP_PATH, the socket just made
 * there is replaced at once by a symlink to $SWAP_TARGET, so whatever feedd
 * then does by that name (chown, chmod) lands on the target, every time.
 * (Exported by hand: the project builds with -fvisibility=hidden.)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

__attribute__((visibility("default"))) int bind(int fd, const struct sockaddr *sa, socklen_t len)
{
	int (*real)(int, const struct sockaddr *, socklen_t) = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
	int r = real(fd, sa, len);
	const char *path = getenv("SWAP_PATH"), *target = getenv("SWAP_TARGET");
	const struct sockaddr_un *un = (const struct sockaddr_un *)sa;
	if (r == 0 && path && target && sa->sa_family == AF_UNIX && strcmp(un->sun_path, path) == 0) {
		unlink(path);
		if (symlink(target, path) < 0)
			abort();
	}
	return r;
}
