/* SPDX-License-Identifier: MIT */
/*
 * Small helpers shared by the daemon, libfeed and the tests: scope-bound
 * cleanup (fds, heap pointers), ownership transfer, and a few arithmetic
 * macros. Header-only; nothing here allocates or logs.
 */
#pragma once

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

/* Closing an fd keeps errno: cleanup handlers must never clobber a caller's error. */
static inline void closep(int *fd)
{
	if (*fd >= 0) {
		int saved = errno;
		close(*fd);
		errno = saved;
	}
}

static inline void freep(void *p)
{
	free(*(void **)p);
}

#define _cleanup_close_ _cleanup_(closep)
#define _cleanup_free_ _cleanup_(freep)

/* Hand ownership out of a cleanup-scoped variable. */
#define TAKE_FD(fd)                 \
	__extension__({             \
		int _fd_ = (fd);    \
		(fd) = -1;          \
		_fd_;               \
	})
#define TAKE_PTR(p)                      \
	__extension__({                  \
		__typeof__(p) _p_ = (p); \
		(p) = NULL;              \
		_p_;                     \
	})

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define ALIGN_UP(x, a) (((x) + ((a) - 1)) & ~((__typeof__(x))(a) - 1))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#define NSEC_PER_SEC UINT64_C(1000000000)
#define NSEC_PER_MSEC UINT64_C(1000000)
#define NSEC_PER_USEC UINT64_C(1000)

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}
