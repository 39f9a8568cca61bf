/* SPDX-License-Identifier: MIT */
/*
 * The log sinks: stderr lines, or journal entries with structured fields.
 * The level and the sink are read with relaxed atomics so workers may log
 * while the main thread reconfigures them; the context is per thread.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "config.h"
#include "daemon/log/log.h"

#if HAVE_SYSTEMD
#include <systemd/sd-journal.h>
#endif

static int max_level = LOG_LEVEL_INFO;
static int to_journal;
static _Thread_local const struct log_context *context;

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

int log_open(void)
{
	int j = 0;
#if HAVE_SYSTEMD
	/* systemd's rule: stderr goes to the journal only while it is the stream systemd set up. */
	const char *e = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;
	if (e && sscanf(e, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
	    (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino)
		j = 1;
#endif
	__atomic_store_n(&to_journal, j, __ATOMIC_RELAXED);
	return j;
}

const struct log_context *log_context_swap(const struct log_context *ctx)
{
	const struct log_context *old = context;
	context = ctx;
	return old;
}

#if HAVE_SYSTEMD
/* One journal entry; returns 0 or a negative errno (the caller falls back to stderr). */
static int journal_send(int level, int err, const char *msg)
{
	char f[10][160];
	struct iovec iov[12];
	size_t n = 0;
#define FIELD(...)                                                                          \
	do {                                                                                \
		int k_ = snprintf(f[n], sizeof(f[n]), __VA_ARGS__);                         \
		iov[n] = (struct iovec){ .iov_base = f[n], .iov_len = MIN((size_t)MAX(k_, 0), sizeof(f[n]) - 1) }; \
		n++;                                                                        \
	} while (0)
	FIELD("PRIORITY=%d", level);
	FIELD("SYSLOG_IDENTIFIER=feedd");
	if (err < 0)
		FIELD("ERRNO=%d", -err);
	const struct log_context *c = context;
	if (c && c->feed)
		FIELD("FEEDD_FEED=%s", c->feed);
	if (c && c->world) {
		FIELD("FEEDD_RANK=%" PRIu32, c->rank);
		FIELD("FEEDD_WORLD=%" PRIu32, c->world);
	}
	if (c && c->client_id) {
		FIELD("FEEDD_CLIENT_ID=%" PRIu64, c->client_id);
		FIELD("FEEDD_CLIENT_PID=%d", (int)c->client_pid);
		FIELD("FEEDD_CLIENT_UID=%u", (unsigned)c->client_uid);
	}
#undef FIELD
	/* MESSAGE may be long: its own iovec, not a fixed buffer. */
	char *m = NULL;
	if (asprintf(&m, "MESSAGE=%s", msg) < 0)
		return -ENOMEM;
	iov[n++] = (struct iovec){ .iov_base = m, .iov_len = strlen(m) };
	int r = sd_journal_sendv(iov, (int)n);
	free(m);
	return r;
}
#endif

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
#if HAVE_SYSTEMD
	if (__atomic_load_n(&to_journal, __ATOMIC_RELAXED)) {
		line[len] = 0;
		if (journal_send(level, err, line + n) >= 0)
			return err;
	}
#endif
	line[len++] = '\n';
	ssize_t _unused_ w = write(STDERR_FILENO, line, len);
	return err;
}
