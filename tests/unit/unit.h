/* SPDX-License-Identifier: MIT */
/*
 * Assertions shared by the unit tests. A failed check prints where it failed
 * and what differed, and the test goes on so one run shows every failure;
 * unit_exit() turns the count into the exit status (0 pass, 1 fail).
 * Checks that may crash or hang the code under test run in a child
 * (unit_in_child) so the rest of the test still reports.
 */
#pragma once

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef NDEBUG
#error "unit tests must not be built with NDEBUG"
#endif

#define UNIT_SKIP 77

static unsigned unit_failures;

__attribute__((format(printf, 3, 4))) static inline void unit_fail(const char *file, int line, const char *fmt, ...)
{
	unit_failures++;
	if (unit_failures > 200)
		return; /* one broken loop must not bury the rest */
	va_list ap;
	fprintf(stderr, "FAIL %s:%d: ", file, line);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

#define CHECK(cond, ...)                                       \
	do {                                                   \
		if (!(cond))                                   \
			unit_fail(__FILE__, __LINE__, __VA_ARGS__); \
	} while (0)

/* Signed integers and negative errno codes. */
#define CHECK_INT(actual, expected)                                                                           \
	do {                                                                                                  \
		long long a_ = (long long)(actual), e_ = (long long)(expected);                               \
		if (a_ != e_)                                                                                 \
			unit_fail(__FILE__, __LINE__, "%s = %lld (%s), expected %s = %lld (%s)", #actual, a_, \
				  a_ < 0 ? strerror((int)-a_) : "-", #expected, e_,                            \
				  e_ < 0 ? strerror((int)-e_) : "-");                                          \
	} while (0)

#define CHECK_U64(actual, expected)                                                                      \
	do {                                                                                             \
		uint64_t a_ = (uint64_t)(actual), e_ = (uint64_t)(expected);                             \
		if (a_ != e_)                                                                            \
			unit_fail(__FILE__, __LINE__, "%s = %" PRIu64 " (0x%" PRIx64 "), expected %s = %" PRIu64 \
				  " (0x%" PRIx64 ")",                                                    \
				  #actual, a_, a_, #expected, e_, e_);                                   \
	} while (0)

#define CHECK_STR(actual, expected)                                                                          \
	do {                                                                                                 \
		const char *a_ = (actual), *e_ = (expected);                                                 \
		if (!a_ || strcmp(a_, e_) != 0)                                                              \
			unit_fail(__FILE__, __LINE__, "%s = \"%s\", expected \"%s\"", #actual, a_ ? a_ : "(null)", \
				  e_);                                                                       \
	} while (0)

#define CHECK_CONTAINS(haystack, needle)                                                                     \
	do {                                                                                                 \
		const char *h_ = (haystack), *n_ = (needle);                                                 \
		if (!h_ || !strstr(h_, n_))                                                                  \
			unit_fail(__FILE__, __LINE__, "%s = \"%s\" does not contain \"%s\"", #haystack,     \
				  h_ ? h_ : "(null)", n_);                                                   \
	} while (0)

/* Aborts the test: a setup step (tmpdir, write) failed, so nothing after it means anything. */
#define REQUIRE(cond, ...)                                                      \
	do {                                                                    \
		if (!(cond)) {                                                  \
			unit_fail(__FILE__, __LINE__, __VA_ARGS__);             \
			fprintf(stderr, "aborting: a setup step failed\n");     \
			exit(1);                                                \
		}                                                               \
	} while (0)

/*
 * Runs fn(ctx) in a child with a time limit. The child's failures count here:
 * it exits with its failure count (capped), or dies, or times out, and each of
 * those is one failure reported under `what`.
 */
static inline void unit_in_child(const char *what, void (*fn)(void *ctx), void *ctx, unsigned timeout_s)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		unit_fail(__FILE__, __LINE__, "%s: fork: %s", what, strerror(errno));
		return;
	}
	if (pid == 0) {
		alarm(timeout_s);
		unit_failures = 0;
		fn(ctx);
		fflush(NULL);
		_exit(unit_failures > 100 ? 100 : (int)unit_failures);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(st)) {
		if (WTERMSIG(st) == SIGALRM)
			unit_fail(__FILE__, __LINE__, "%s: did not return within %u s (hangs)", what, timeout_s);
		else
			unit_fail(__FILE__, __LINE__, "%s: crashed with signal %d (%s)", what, WTERMSIG(st),
				  strsignal(WTERMSIG(st)));
	} else if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
		unit_failures += (unsigned)WEXITSTATUS(st);
		fprintf(stderr, "(%s: %d failure(s) in the child, above)\n", what, WEXITSTATUS(st));
	}
}

static inline int unit_exit(const char *name)
{
	if (unit_failures) {
		fprintf(stderr, "%s: %u check(s) failed\n", name, unit_failures);
		return 1;
	}
	printf("%s: all checks passed\n", name);
	return 0;
}
