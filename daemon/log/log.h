/* SPDX-License-Identifier: MIT */
/*
 * The daemon's log. Only the policy layer (feeds, server, main) logs; helpers
 * return error codes. Lines go to stderr as "feedd[pid]: <level>: text", or,
 * when stderr is connected to the journal ($JOURNAL_STREAM names it) and
 * feedd was built with libsystemd, to the journal with structured fields:
 * PRIORITY, ERRNO, and FEEDD_FEED / FEEDD_RANK / FEEDD_WORLD /
 * FEEDD_CLIENT_ID / FEEDD_CLIENT_PID / FEEDD_CLIENT_UID from the calling
 * thread's log context. Thread-safe: one write(2) or one journal datagram per line.
 */
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/macro.h"

enum log_level {
	LOG_LEVEL_ERROR = 3,
	LOG_LEVEL_WARNING = 4,
	LOG_LEVEL_NOTICE = 5,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

/* What a line is about; fields left 0/NULL are not sent. */
struct log_context {
	const char *feed;
	uint32_t rank, world; /* world 0: no rank */
	uint64_t client_id;
	pid_t client_pid;
	uid_t client_uid;
};

void log_set_level(int level);
int log_get_level(void);
/* Parses "error", "warning", "notice", "info", "debug". Returns the level or -EINVAL. */
int log_level_from_string(const char *s);

/*
 * Picks the sink: the journal when $JOURNAL_STREAM matches stderr's device
 * and inode and libsystemd is built in, else stderr. Returns 1 for the
 * journal, 0 for stderr.
 */
int log_open(void);

/*
 * Makes ctx (NULL: none) the calling thread's context until the next call.
 * The caller keeps ctx alive meanwhile. Returns the previous one.
 */
const struct log_context *log_context_swap(const struct log_context *ctx);

/* Logs at `level`; when err < 0 appends ": strerror(-err)". Returns err. */
int log_full(int level, int err, const char *fmt, ...) _printf_(3, 4);

#define log_error(...) log_full(LOG_LEVEL_ERROR, 0, __VA_ARGS__)
#define log_warning(...) log_full(LOG_LEVEL_WARNING, 0, __VA_ARGS__)
#define log_notice(...) log_full(LOG_LEVEL_NOTICE, 0, __VA_ARGS__)
#define log_info(...) log_full(LOG_LEVEL_INFO, 0, __VA_ARGS__)
#define log_debug(...) log_full(LOG_LEVEL_DEBUG, 0, __VA_ARGS__)
#define log_error_errno(r, ...) log_full(LOG_LEVEL_ERROR, (r), __VA_ARGS__)
#define log_warning_errno(r, ...) log_full(LOG_LEVEL_WARNING, (r), __VA_ARGS__)
