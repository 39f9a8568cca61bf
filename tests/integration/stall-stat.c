/* SPDX-License-Identifier: MIT */
/*
 * An LD_PRELOAD shim for test_reload_conf.py: a hung network mount, for one
 * file. While the file $STALL_TRIGGER exists, every stat() of $STALL_PATH
 * (stat, stat64, fstatat, statx and glibc's old __xstat), and every open()
 * of it (open, openat, their 64 and fortified forms), first sleeps $STALL_S
 * seconds, as a call on an NFS mount whose server went away would, and
 * appends a line to $STALL_LOG for each stall that begins: "stall main" on
 * the process's main thread, else "stall thread". With $STALL_ONLY=main only
 * the main thread's calls stall (the mount hangs just as the loader thread
 * is done with the file: what the main loop does with it afterwards is
 * caught). Other paths, and all paths without the trigger, go at once.
 * (Exported by hand: the project builds with -fvisibility=hidden.)
 */
#undef _FILE_OFFSET_BITS /* stat and stat64 are two symbols here, both wrapped */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static void maybe_stall(const char *path)
{
	const char *want = getenv("STALL_PATH"), *trigger = getenv("STALL_TRIGGER"), *log = getenv("STALL_LOG");
	if (!path || !want || !trigger || strcmp(path, want) != 0 || access(trigger, F_OK) != 0)
		return;
	const char *only = getenv("STALL_ONLY");
	if (only && strcmp(only, "main") == 0 && gettid() != getpid())
		return;
	if (log) {
		int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0) {
			char line[64];
			int n = snprintf(line, sizeof(line), "stall %s\n", gettid() == getpid() ? "main" : "thread");
			ssize_t _unused = write(fd, line, (size_t)n);
			(void)_unused;
			close(fd);
		}
	}
	const char *s = getenv("STALL_S");
	sleep(s ? (unsigned)atoi(s) : 10u);
}

/* fn = the next definition of name (dlsym's object pointer, converted by memcpy as ISO C allows). */
#define REAL(fn, name) do { void *p_ = dlsym(RTLD_NEXT, name); memcpy(&fn, &p_, sizeof(fn)); } while (0)

/* glibc's old entry points, still called by objects built against glibc < 2.33. */
EXPORT int __xstat(int ver, const char *path, struct stat *st);
EXPORT int __xstat64(int ver, const char *path, struct stat64 *st);

EXPORT int stat(const char *path, struct stat *st)
{
	maybe_stall(path);
	int (*real)(const char *, struct stat *);
	REAL(real, "stat");
	return real(path, st);
}

EXPORT int stat64(const char *path, struct stat64 *st)
{
	maybe_stall(path);
	int (*real)(const char *, struct stat64 *);
	REAL(real, "stat64");
	return real(path, st);
}

EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	maybe_stall(path);
	int (*real)(int, const char *, struct stat *, int);
	REAL(real, "fstatat");
	return real(dirfd, path, st, flags);
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
	maybe_stall(path);
	int (*real)(int, const char *, struct stat64 *, int);
	REAL(real, "fstatat64");
	return real(dirfd, path, st, flags);
}

EXPORT int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *st)
{
	maybe_stall(path);
	int (*real)(int, const char *, int, unsigned, struct statx *);
	REAL(real, "statx");
	return real(dirfd, path, flags, mask, st);
}

EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
	maybe_stall(path);
	int (*real)(int, const char *, struct stat *);
	REAL(real, "__xstat");
	return real(ver, path, st);
}

EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
	maybe_stall(path);
	int (*real)(int, const char *, struct stat64 *);
	REAL(real, "__xstat64");
	return real(ver, path, st);
}

/* open(2)'s mode is there only with O_CREAT or O_TMPFILE. */
#define MODE(flags, mode)                                                        \
	do {                                                                     \
		if ((flags) & (O_CREAT | __O_TMPFILE)) {                         \
			va_list ap_;                                             \
			va_start(ap_, flags);                                    \
			mode = (mode_t)va_arg(ap_, int);                         \
			va_end(ap_);                                             \
		}                                                                \
	} while (0)

EXPORT int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	MODE(flags, mode);
	maybe_stall(path);
	int (*real)(const char *, int, ...);
	REAL(real, "open");
	return real(path, flags, mode);
}

EXPORT int open64(const char *path, int flags, ...)
{
	mode_t mode = 0;
	MODE(flags, mode);
	maybe_stall(path);
	int (*real)(const char *, int, ...);
	REAL(real, "open64");
	return real(path, flags, mode);
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	MODE(flags, mode);
	maybe_stall(path);
	int (*real)(int, const char *, int, ...);
	REAL(real, "openat");
	return real(dirfd, path, flags, mode);
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	mode_t mode = 0;
	MODE(flags, mode);
	maybe_stall(path);
	int (*real)(int, const char *, int, ...);
	REAL(real, "openat64");
	return real(dirfd, path, flags, mode);
}

/* What _FORTIFY_SOURCE turns a two-argument open() into. */
EXPORT int __open_2(const char *path, int flags);
EXPORT int __open64_2(const char *path, int flags);

EXPORT int __open_2(const char *path, int flags)
{
	maybe_stall(path);
	int (*real)(const char *, int);
	REAL(real, "__open_2");
	return real(path, flags);
}

EXPORT int __open64_2(const char *path, int flags)
{
	maybe_stall(path);
	int (*real)(const char *, int);
	REAL(real, "__open64_2");
	return real(path, flags);
}
