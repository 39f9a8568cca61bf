/* SPDX-License-Identifier: MIT */
/*
 * The daemon's log. Only the policy layer (feeds, server, main) logs; helpers
 * return error codes. Lines go to stderr as "feedd[pid]: <level>: text"; a
 * later journal sink adds structured fields. Thread-safe: one write(2) per line.
 */
#pragma once

#include <stdarg.h>

#include "proto/macro.h"

enum log_level {
	LOG_LEVEL_ERROR = 3,
	LOG_LEVEL_WARNING = 4,
	LOG_LEVEL_NOTICE = 5,
	LOG_LEVEL_INFO = 6,
	LOG_LEVEL_DEBUG = 7,
};

void log_set_level(int level);
int log_get_level(void);
/* Parses "error", "warning", "notice", "info", "debug". Returns the level or -EINVAL. */
int log_level_from_string(const char *s);

/* Logs at `level`; when err < 0 appends ": strerror(-err)". Returns err. */
int log_full(int level, int err, const char *fmt, ...) _printf_(3, 4);

#define log_error(...) log_full(LOG_LEVEL_ERROR, 0, __VA_ARGS__)
#define log_warning(...) log_full(LOG_LEVEL_WARNING, 0, __VA_ARGS__)
#define log_notice(...) log_full(LOG_LEVEL_NOTICE, 0, __VA_ARGS__)
#define log_info(...) log_full(LOG_LEVEL_INFO, 0, __VA_ARGS__)
#define log_debug(...) log_full(LOG_LEVEL_DEBUG, 0, __VA_ARGS__)
#define log_error_errno(r, ...) log_full(LOG_LEVEL_ERROR, (r), __VA_ARGS__)
#define log_warning_errno(r, ...) log_full(LOG_LEVEL_WARNING, (r), __VA_ARGS__)
