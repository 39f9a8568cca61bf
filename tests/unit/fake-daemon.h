/* SPDX-License-Identifier: MIT */
/*
 * The wire-level half of a fake feedd for libfeed's unit tests
 * (test-libfeed.c, test-libfeed-device.c): a forked child that talks the
 * real protocol over a real socket with real memfds. Any failure ends the
 * child with a distinct status (_exit), which the parent checks.
 */
#pragma once

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/wire.h"

/* Exactly len bytes, or the child exits 3. */
static inline void read_exact(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = read(fd, p, len);
		if (n <= 0)
			_exit(3);
		p += n;
		len -= (size_t)n;
	}
}

/* One message with up to 4 fds (SCM_RIGHTS), or the child exits 4. */
static inline void send_msg(int fd, const void *buf, size_t len, const int *fds, unsigned n_fds)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 4)];
	} cm;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (n_fds) {
		memset(&cm, 0, sizeof(cm));
		mh.msg_control = cm.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
		struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
		h->cmsg_level = SOL_SOCKET;
		h->cmsg_type = SCM_RIGHTS;
		h->cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
		memcpy(CMSG_DATA(h), fds, sizeof(int) * n_fds);
	}
	if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)len)
		_exit(4);
}

/* A memfd of `size` bytes sealed against resizing, as feedd's rings are, or the child exits 5. */
static inline int sealed_memfd(const char *name, size_t size)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		_exit(5);
	return fd;
}

/* Accepts one client on lfd and answers its HELLO (daemon version "fake"). Returns the connection. */
static inline int fake_hello(int lfd)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		_exit(2);
	uint8_t in[WIRE_HEADER_SIZE + WIRE_HELLO_SIZE];
	read_exact(fd, in, sizeof(in));
	struct wire_hello_reply hr = { .version = WIRE_VERSION, .daemon_pid = (uint32_t)getpid() };
	snprintf(hr.daemon_version, sizeof(hr.daemon_version), "fake");
	uint8_t out[WIRE_HEADER_SIZE + WIRE_HELLO_REPLY_SIZE];
	int n = wire_encode_hello_reply(out, sizeof(out), &hr);
	send_msg(fd, out, (size_t)n, NULL, 0);
	return fd;
}
