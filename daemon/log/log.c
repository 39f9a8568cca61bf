/* SPDX-License-Identifier: MIT */
/*
 * stderr log sink. The level is read with relaxed atomics so workers may log
 * while the main thread reconfigures it.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "daemon/log/log.h"

static int max_level = LOG_LEVEL_INFO;

static const char *const level_names[] = {
	[LOG_LEVEL_ERROR] = "error",   [LOG_LEVEL_WARNING] = "warning",
	[LOG_LEVEL_NOTICE] = "notice", [LOG_LEVEL_INFO] = "info",
	[LOG_LEVEL_DEBUG] = "debug",
};

void log_set_level(int level)
{
	__atomic_store_n(&max_level, level, __ATOMIC_RELAXED);
}

int log_get_level(void)
{
	return __atomic_load_n(&max_level, __ATOMIC_RELAXED);
}

int log_level_from_string(const char *s)
{
	for (size_t i = 0; i < ARRAY_SIZE(level_names); i++)
		if (level_names[i] && strcasecmp(s, level_names[i]) == 0)
			return (int)i;
	return -EINVAL;
}

int log_full(int level, int err, const char *fmt, ...)
{
	if (level > log_get_level())
		return err;

	char line[2048];
	int n = snprintf(line, sizeof(line), "feedd[%d]: %s: ", (int)getpid(), level_names[level]);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	size_t len = MIN((size_t)n + (size_t)MAX(m, 0), sizeof(line) - 2);
	if (err < 0) {
		char buf[128];
		int k = snprintf(line + len, sizeof(line) - len - 1, ": %s", strerror_r(-err, buf, sizeof(buf)));
		len = MIN(len + (size_t)MAX(k, 0), sizeof(line) - 2);
	}
	line[len++] = '\n';
	ssize_t _unused_ w = write(STDERR_FILENO, line, len);
	return err;
}
