/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/conf/conf.h"
#include "daemon/log/log.h"
#include "proto/macro.h"
#include "proto/wire.h"

struct parse {
	struct conf *conf;
	char *dir;          /* the config file's directory */
	char msg[512];      /* the first error, without the line */
	bool failed;
	char **seen;        /* "section\nkey" of every key so far */
	size_t n_seen;
};

/*
 * A key given twice is an error rather than "last one wins": inih hands an
 * indented continuation line over as a repeat of its key, and silently
 * keeping only the second line of a shards list would serve the wrong data.
 */
static int check_repeat(struct parse *p, const char *section, const char *name)
{
	char *id;
	if (asprintf(&id, "%s\n%s", section, name) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < p->n_seen; i++) {
		if (strcmp(p->seen[i], id) == 0) {
			free(id);
			return -EEXIST;
		}
	}
	char **n = realloc(p->seen, (p->n_seen + 1) * sizeof(*n));
	if (!n) {
		free(id);
		return -ENOMEM;
	}
	p->seen = n;
	p->seen[p->n_seen++] = id;
	return 0;
}

static int bad(struct parse *p, const char *fmt, ...) _printf_(2, 3);
static int bad(struct parse *p, const char *fmt, ...)
{
	if (!p->failed) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(p->msg, sizeof(p->msg), fmt, ap);
		va_end(ap);
		p->failed = true;
	}
	return 0; /* inih: stop here and report this line */
}

static int parse_u64(const char *v, uint64_t min, uint64_t max, uint64_t *ret)
{
	if (!*v || !isdigit((unsigned char)*v))
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end || x < min || x > max)
		return -EINVAL;
	*ret = x;
	return 0;
}

static int parse_bool(const char *v, bool *ret)
{
	static const char *const yes[] = { "true", "yes", "on", "1" }, *const no[] = { "false", "no", "off", "0" };
	for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
		if (strcmp(v, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcmp(v, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

static int parse_token(const char *v, int64_t *ret)
{
	uint64_t x;
	if (strcmp(v, "none") == 0) {
		*ret = CONF_TOKEN_NONE;
		return 0;
	}
	if (parse_u64(v, 0, INT32_MAX, &x) < 0)
		return -EINVAL;
	*ret = (int64_t)x;
	return 0;
}

static bool valid_feed_name(const char *n)
{
	size_t len = strlen(n);
	if (len == 0 || len >= WIRE_NAME_MAX)
		return false;
	for (const char *c = n; *c; c++)
		if (!isalnum((unsigned char)*c) && *c != '_' && *c != '-' && *c != '.')
			return false;
	return true;
}

static struct conf_feed *feed_for(struct parse *p, const char *name)
{
	struct conf *c = p->conf;
	for (size_t i = 0; i < c->n_feeds; i++)
		if (strcmp(c->feeds[i].name, name) == 0)
			return &c->feeds[i];
	struct conf_feed *n = realloc(c->feeds, (c->n_feeds + 1) * sizeof(*n));
	if (!n)
		return NULL;
	c->feeds = n;
	struct conf_feed *f = &c->feeds[c->n_feeds];
	*f = (struct conf_feed){
		.name = strdup(name),
		.format = strdup("megatron"),
		.seq_len = 4096,
		.batch_size = 8,
		.seed = 0,
		.shuffle = true,
		.shuffle_window = 4,
		.bos = CONF_TOKEN_NONE,
		.eos = CONF_TOKEN_NONE,
	};
	if (!f->name || !f->format) {
		free(f->name);
		free(f->format);
		return NULL;
	}
	c->n_feeds++;
	return f;
}

static char *resolve(const char *dir, const char *path)
{
	char *out;
	if (path[0] == '/' || !dir)
		return strdup(path);
	return asprintf(&out, "%s/%s", dir, path) < 0 ? NULL : out;
}

static int set_shards(struct parse *p, struct conf_feed *f, const char *value)
{
	_cleanup_free_ char *copy = strdup(value);
	if (!copy)
		return bad(p, "out of memory");
	for (size_t i = 0; i < f->n_shards; i++)
		free(f->shards[i]);
	f->n_shards = 0;
	char *rest = copy;
	for (char *tok; (tok = strsep(&rest, ","));) {
		while (isspace((unsigned char)*tok))
			tok++;
		char *end = tok + strlen(tok);
		while (end > tok && isspace((unsigned char)end[-1]))
			*--end = 0;
		if (!*tok)
			return bad(p, "shards: empty entry in '%s'", value);
		char **n = realloc(f->shards, (f->n_shards + 1) * sizeof(*n));
		if (!n)
			return bad(p, "out of memory");
		f->shards = n;
		f->shards[f->n_shards] = resolve(p->dir, tok);
		if (!f->shards[f->n_shards])
			return bad(p, "out of memory");
		f->n_shards++;
	}
	if (f->n_shards == 0)
		return bad(p, "shards: no globs given");
	return 1;
}

static int feed_key(struct parse *p, struct conf_feed *f, const char *name, const char *value)
{
	uint64_t x;
	if (strcmp(name, "format") == 0) {
		if (strcmp(value, "megatron") != 0)
			return bad(p, "format: '%s' is not supported (supported: megatron)", value);
		return 1;
	}
	if (strcmp(name, "shards") == 0)
		return set_shards(p, f, value);
	if (strcmp(name, "seq_len") == 0) {
		if (parse_u64(value, 1, 1u << 20, &x) < 0)
			return bad(p, "seq_len: '%s' is not an integer in 1..1048576", value);
		f->seq_len = (uint32_t)x;
		return 1;
	}
	if (strcmp(name, "batch_size") == 0) {
		if (parse_u64(value, 1, 1u << 16, &x) < 0)
			return bad(p, "batch_size: '%s' is not an integer in 1..65536", value);
		f->batch_size = (uint32_t)x;
		return 1;
	}
	if (strcmp(name, "seed") == 0) {
		if (parse_u64(value, 0, UINT64_MAX, &x) < 0)
			return bad(p, "seed: '%s' is not an unsigned 64-bit integer", value);
		f->seed = x;
		return 1;
	}
	if (strcmp(name, "shuffle") == 0) {
		if (parse_bool(value, &f->shuffle) < 0)
			return bad(p, "shuffle: '%s' is not true or false", value);
		return 1;
	}
	if (strcmp(name, "shuffle_window") == 0) {
		if (parse_u64(value, 1, UINT32_MAX, &x) < 0)
			return bad(p, "shuffle_window: '%s' is not a positive integer", value);
		f->shuffle_window = (uint32_t)x;
		return 1;
	}
	if (strcmp(name, "bos") == 0 || strcmp(name, "eos") == 0) {
		int64_t *t = name[0] == 'b' ? &f->bos : &f->eos;
		if (parse_token(value, t) < 0)
			return bad(p, "%s: '%s' is not 'none' or a token id in 0..2147483647", name, value);
		return 1;
	}
	return bad(p, "unknown key '%s' in [feed.%s]", name, f->name);
}

static int daemon_key(struct parse *p, const char *name, const char *value)
{
	struct conf *c = p->conf;
	uint64_t x;
	if (strcmp(name, "socket") == 0) {
		free(c->socket);
		c->socket = resolve(p->dir, value);
		return c->socket ? 1 : bad(p, "out of memory");
	}
	if (strcmp(name, "threads") == 0) {
		if (parse_u64(value, 0, 1024, &x) < 0)
			return bad(p, "threads: '%s' is not an integer in 0..1024 (0 = all CPUs)", value);
		c->threads = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "ring_slots") == 0) {
		if (parse_u64(value, 2, 1024, &x) < 0)
			return bad(p, "ring_slots: '%s' is not an integer in 2..1024", value);
		c->ring_slots = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "log_level") == 0) {
		int l = log_level_from_string(value);
		if (l < 0)
			return bad(p, "log_level: '%s' is not one of error, warning, notice, info, debug", value);
		c->log_level = l;
		return 1;
	}
	if (strcmp(name, "io_engine") == 0) {
		if (strcmp(value, "auto") == 0)
			c->io_engine = IO_ENGINE_AUTO;
		else if (strcmp(value, "io_uring") == 0)
			c->io_engine = IO_ENGINE_URING;
		else if (strcmp(value, "pread") == 0)
			c->io_engine = IO_ENGINE_PREAD;
		else
			return bad(p, "io_engine: '%s' is not one of auto, io_uring, pread", value);
		return 1;
	}
	if (strcmp(name, "io_depth") == 0) {
		if (parse_u64(value, 1, 4096, &x) < 0)
			return bad(p, "io_depth: '%s' is not an integer in 1..4096", value);
		c->io_depth = (unsigned)x;
		return 1;
	}
	return bad(p, "unknown key '%s' in [feedd]", name);
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	if (p->failed)
		return 1;
	int e = check_repeat(p, section, name);
	if (e == -EEXIST)
		return bad(p, "'%s' is given twice in [%s] (values continue only on one line)", name, section);
	if (e < 0)
		return bad(p, "out of memory");
	if (strcmp(section, "feedd") == 0)
		return daemon_key(p, name, value);
	if (strncmp(section, "feed.", 5) == 0) {
		if (!valid_feed_name(section + 5))
			return bad(p, "[%s]: feed names are 1-63 characters of A-Z a-z 0-9 _ - .", section);
		struct conf_feed *f = feed_for(p, section + 5);
		if (!f)
			return bad(p, "out of memory");
		return feed_key(p, f, name, value);
	}
	return bad(p, "unknown section [%s] (expected [feedd] or [feed.NAME])", section);
}

struct conf *conf_free(struct conf *c)
{
	if (!c)
		return NULL;
	for (size_t i = 0; i < c->n_feeds; i++) {
		struct conf_feed *f = &c->feeds[i];
		for (size_t j = 0; j < f->n_shards; j++)
			free(f->shards[j]);
		free(f->shards);
		free(f->name);
		free(f->format);
	}
	free(c->feeds);
	free(c->socket);
	free(c->path);
	free(c);
	return NULL;
}

int conf_load(const char *path, struct conf **ret, char *err, size_t errlen)
{
	struct conf *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = (struct conf){ .ring_slots = 4, .log_level = LOG_LEVEL_INFO, .io_depth = 64 };
	c->path = strdup(path);
	_cleanup_free_ char *copy = strdup(path);
	if (!c->path || !copy) {
		conf_free(c);
		return -ENOMEM;
	}
	char *dir = dirname(copy);
	struct parse p = { .conf = c, .dir = dir };

	FILE *f = fopen(path, "re");
	if (!f) {
		int e = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(-e));
		conf_free(c);
		return e;
	}
	int line = ini_parse_file(f, handler, &p);
	fclose(f);
	for (size_t i = 0; i < p.n_seen; i++)
		free(p.seen[i]);
	free(p.seen);
	if (line != 0 || p.failed) {
		if (line > 0)
			snprintf(err, errlen, "%s:%d: %s", path, line, p.failed ? p.msg : "syntax error");
		else
			snprintf(err, errlen, "%s: %s", path, p.failed ? p.msg : "cannot parse");
		conf_free(c);
		return -EINVAL;
	}
	for (size_t i = 0; i < c->n_feeds; i++) {
		const struct conf_feed *feed = &c->feeds[i];
		if (feed->n_shards == 0) {
			snprintf(err, errlen, "%s: [feed.%s]: 'shards' is required", path, feed->name);
			conf_free(c);
			return -EINVAL;
		}
		/* cu_seqlens are int32 over the flattened batch, so B*L + 1 must fit one. */
		if ((uint64_t)feed->batch_size * feed->seq_len + 1 > INT32_MAX) {
			snprintf(err, errlen, "%s: [feed.%s]: batch_size x seq_len = %llu positions; at most %d fit a batch",
				 path, feed->name, (unsigned long long)feed->batch_size * feed->seq_len, INT32_MAX - 1);
			conf_free(c);
			return -EINVAL;
		}
	}
	*ret = c;
	return 0;
}

const struct conf_feed *conf_find_feed(const struct conf *c, const char *name)
{
	for (size_t i = 0; i < c->n_feeds; i++)
		if (strcmp(c->feeds[i].name, name) == 0)
			return &c->feeds[i];
	return NULL;
}
