/* SPDX-License-Identifier: MIT */
/*
 * An LD_PRELOAD shim for test_shared_node.py: plays the attacker who wins
 * the race after bind(). When feedd binds $SWAP_PATH, the socket just made
 * there is replaced at once by a symlink to $SWAP_TARGET, so whatever feedd
 * then does by that name (chown, chmod) lands on the target, every time.
 * (Exported by hand: the project builds with -fvisibility=hidden.)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* bind() as <sys/socket.h> declares it (__CONST_SOCKADDR_ARG: a transparent union under _GNU_SOURCE). */
__attribute__((visibility("default"))) int bind(int fd, __CONST_SOCKADDR_ARG arg, socklen_t len)
{
#if defined __USE_GNU && __GNUC_PREREQ(2, 7) /* the header's own test for the union */
	const struct sockaddr *sa = arg.__sockaddr__;
#else
	const struct sockaddr *sa = arg;
#endif
	int (*real)(int, __CONST_SOCKADDR_ARG, socklen_t);
	void *p = dlsym(RTLD_NEXT, "bind"); /* an object pointer, converted by memcpy as ISO C allows */
	memcpy(&real, &p, sizeof(real));
	int r = real(fd, arg, len);
	const char *path = getenv("SWAP_PATH"), *target = getenv("SWAP_TARGET");
	const struct sockaddr_un *un = (const struct sockaddr_un *)sa;
	if (r == 0 && path && target && sa->sa_family == AF_UNIX && strcmp(un->sun_path, path) == 0) {
		unlink(path);
		if (symlink(target, path) < 0)
			abort();
	}
	return r;
}
