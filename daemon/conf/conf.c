/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <ini.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
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
	FILE *file;
	unsigned line;      /* of the line inih handles now */
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

/* "K", "M", "G", "T" suffixes are powers of 1024; a bare number is bytes. */
static int parse_size(const char *v, uint64_t *ret)
{
	if (!*v || !isdigit((unsigned char)*v))
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno)
		return -EINVAL;
	unsigned shift = 0;
	if (*end) {
		const char *units = "KMGT", *u = strchr(units, *end);
		if (!u || end[1])
			return -EINVAL;
		shift = 10 * (unsigned)(u - units + 1);
	}
	if (x > (UINT64_MAX >> shift))
		return -EINVAL;
	*ret = (uint64_t)x << shift;
	return 0;
}

/* A user or group: a name known to the system, or a decimal id. */
static int parse_id(const char *v, bool group, uint32_t *ret)
{
	uint64_t x;
	if (parse_u64(v, 0, UINT32_MAX - 1, &x) == 0) {
		*ret = (uint32_t)x;
		return 0;
	}
	if (group) {
		struct group *g = getgrnam(v);
		if (!g)
			return -ENOENT;
		*ret = (uint32_t)g->gr_gid;
	} else {
		struct passwd *pw = getpwnam(v);
		if (!pw)
			return -ENOENT;
		*ret = (uint32_t)pw->pw_uid;
	}
	return 0;
}

/* A comma-separated list of users or groups, replacing the list in ids, n. */
static int set_ids(struct parse *p, const char *key, const char *value, bool group, uint32_t **ids, size_t *n)
{
	_cleanup_free_ char *copy = strdup(value);
	if (!copy)
		return bad(p, "out of memory");
	free(*ids);
	*ids = NULL;
	*n = 0;
	char *rest = copy;
	for (char *tok; (tok = strsep(&rest, ","));) {
		while (isspace((unsigned char)*tok))
			tok++;
		char *end = tok + strlen(tok);
		while (end > tok && isspace((unsigned char)end[-1]))
			*--end = 0;
		if (!*tok)
			continue;
		uint32_t id;
		if (parse_id(tok, group, &id) < 0)
			return bad(p, "%s: '%s' is neither a %s name on this system nor a numeric id", key, tok,
				   group ? "group" : "user");
		uint32_t *m = realloc(*ids, (*n + 1) * sizeof(*m));
		if (!m)
			return bad(p, "out of memory");
		*ids = m;
		(*ids)[(*n)++] = id;
	}
	return 1;
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
		.pad_id = CONF_TOKEN_NONE,
		.text_key = strdup("text"),
		.skip_bad_records = true,
		.max_bad_fraction = 0.001,
		.max_document_bytes = UINT64_C(256) << 20,
	};
	if (!f->name || !f->format || !f->text_key) {
		free(f->name);
		free(f->format);
		free(f->text_key);
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
	/* Each line of the list adds its globs. */
	char *rest = copy;
	for (char *tok; (tok = strsep(&rest, ","));) {
		while (isspace((unsigned char)*tok))
			tok++;
		char *end = tok + strlen(tok);
		while (end > tok && isspace((unsigned char)end[-1]))
			*--end = 0;
		if (!*tok && !rest)
			break; /* a trailing comma before the next line */
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

static int set_string(struct parse *p, char **field, const char *value)
{
	char *v = strdup(value);
	if (!v)
		return bad(p, "out of memory");
	free(*field);
	*field = v;
	return 1;
}

/*
 * Packing and mixture keys (docs/sample-order.md, section 15). Returns 1 or
 * bad()'s 0 when the key is one of them, -1 when it is not.
 */
static int packing_key(struct parse *p, struct conf_feed *f, const char *name, const char *value)
{
	uint64_t x;
	if (strcmp(name, "packing") == 0) {
		static const char *const modes[] = { [CONF_PACKING_CONCAT] = "concat", [CONF_PACKING_BESTFIT] = "bestfit",
						     [CONF_PACKING_PAD] = "pad" };
		for (size_t i = 0; i < ARRAY_SIZE(modes); i++) {
			if (strcmp(value, modes[i]) == 0) {
				f->packing = (enum conf_packing)i;
				return 1;
			}
		}
		return bad(p, "packing: '%s' is not one of concat, bestfit, pad", value);
	}
	if (strcmp(name, "pack_buffer") == 0) {
		if (parse_u64(value, 1, UINT64_C(1) << 32, &x) < 0)
			return bad(p, "pack_buffer: '%s' is not an integer in 1..4294967296 (positions)", value);
		f->pack_buffer = x;
		f->pack_buffer_line = p->line;
		return 1;
	}
	if (strcmp(name, "pad_id") == 0) {
		if (parse_u64(value, 0, INT32_MAX, &x) < 0)
			return bad(p, "pad_id: '%s' is not a token id in 0..2147483647", value);
		f->pad_id = (int64_t)x;
		f->pad_id_line = p->line;
		return 1;
	}
	if (strcmp(name, "sources") == 0) {
		/* It may go on over indented lines, like shards; parsed whole in resolve_sources(). */
		const char *sep = "";
		size_t have = f->sources_text ? strlen(f->sources_text) : 0;
		if (have && f->sources_text[have - 1] != ',' && value[0] != ',')
			sep = ", ";
		char *joined;
		if (asprintf(&joined, "%s%s%s", have ? f->sources_text : "", sep, value) < 0)
			return bad(p, "out of memory");
		free(f->sources_text);
		f->sources_text = joined;
		if (!f->sources_line)
			f->sources_line = p->line;
		return 1;
	}
	return -1;
}

static int feed_key(struct parse *p, struct conf_feed *f, const char *name, const char *value)
{
	/* Which keys a mixture feed and its source sections may have is checked once every section is known. */
	static const char *const order_keys[] = { "seq_len", "batch_size", "seed", "shuffle", "shuffle_window", "bos",
						  "eos", "packing", "pack_buffer", "pad_id", "sources" };
	bool order = false;
	for (size_t i = 0; i < ARRAY_SIZE(order_keys); i++)
		order |= strcmp(name, order_keys[i]) == 0;
	if (!f->line)
		f->line = p->line;
	if (order && !f->order_key_line) {
		f->order_key_line = p->line;
		f->order_key = order_keys[0];
		for (size_t i = 0; i < ARRAY_SIZE(order_keys); i++)
			if (strcmp(name, order_keys[i]) == 0)
				f->order_key = order_keys[i];
	} else if (!order && !f->source_key_line) {
		static const char *const source_keys[] = { "format", "shards", "text_key", "tokenizer", "tokenizer_preset",
							   "encode_special_tokens", "on_bad_record", "max_bad_fraction",
							   "max_document_bytes" };
		for (size_t i = 0; i < ARRAY_SIZE(source_keys); i++) {
			if (strcmp(name, source_keys[i]) == 0) {
				f->source_key_line = p->line;
				f->source_key = source_keys[i];
			}
		}
	}
	int k = packing_key(p, f, name, value);
	if (k >= 0)
		return k;

	uint64_t x;
	if (strcmp(name, "format") == 0) {
		if (strcmp(value, "megatron") != 0 && strcmp(value, "jsonl") != 0 && strcmp(value, "text") != 0 &&
		    strcmp(value, "parquet") != 0)
			return bad(p, "format: '%s' is not supported (supported: megatron, jsonl, text, parquet)", value);
		return set_string(p, &f->format, value);
	}
	if (strcmp(name, "text_key") == 0) {
		if (!*value)
			return bad(p, "text_key: empty");
		return set_string(p, &f->text_key, value);
	}
	if (strcmp(name, "tokenizer") == 0) {
		free(f->tokenizer);
		f->tokenizer = resolve(p->dir, value);
		return f->tokenizer ? 1 : bad(p, "out of memory");
	}
	if (strcmp(name, "tokenizer_preset") == 0) {
		static const char *const presets[] = { "gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base", "llama3" };
		for (size_t i = 0; i < ARRAY_SIZE(presets); i++)
			if (strcmp(value, presets[i]) == 0)
				return set_string(p, &f->tokenizer_preset, value);
		return bad(p, "tokenizer_preset: '%s' is not one of gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, llama3",
			   value);
	}
	if (strcmp(name, "encode_special_tokens") == 0) {
		if (parse_bool(value, &f->encode_special_tokens) < 0)
			return bad(p, "encode_special_tokens: '%s' is not true or false", value);
		return 1;
	}
	if (strcmp(name, "on_bad_record") == 0) {
		if (strcmp(value, "skip") != 0 && strcmp(value, "fail") != 0)
			return bad(p, "on_bad_record: '%s' is not skip or fail", value);
		f->skip_bad_records = value[0] == 's';
		return 1;
	}
	if (strcmp(name, "max_bad_fraction") == 0) {
		char *end;
		errno = 0;
		double frac = strtod(value, &end);
		if (errno || end == value || *end || !(frac >= 0 && frac <= 1))
			return bad(p, "max_bad_fraction: '%s' is not a number in 0..1", value);
		f->max_bad_fraction = frac;
		return 1;
	}
	if (strcmp(name, "max_document_bytes") == 0) {
		if (parse_size(value, &x) < 0 || x == 0 || x > UINT32_MAX - 1)
			return bad(p, "max_document_bytes: '%s' is not a size in 1..4294967294 (suffixes K, M, G)", value);
		f->max_document_bytes = x;
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
		char **tname = name[0] == 'b' ? &f->bos_name : &f->eos_name;
		free(*tname);
		*tname = NULL;
		if (parse_token(value, t) == 0)
			return 1;
		/* Anything else names a special token, e.g. <|endoftext|>, resolved with the tokenizer. */
		if (isdigit((unsigned char)value[0]) || value[0] == '-' || value[0] == '+')
			return bad(p, "%s: '%s' is not 'none', a token id in 0..2147483647 or a special token's name", name,
				   value);
		*t = CONF_TOKEN_NONE;
		*(name[0] == 'b' ? &f->bos_name_line : &f->eos_name_line) = p->line;
		return set_string(p, tname, value);
	}
	return bad(p, "unknown key '%s' in [feed.%s]", name, f->name);
}

/* A plain decimal number (no exponent, inf or nan) in min..max. */
static int parse_number(const char *v, double min, double max, double *ret)
{
	if (!*v || strspn(v, "0123456789.") != strlen(v))
		return -EINVAL;
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	if (errno || *end || x < min || x > max)
		return -EINVAL;
	*ret = x;
	return 0;
}

/* [diagnosis]: telemetry window and rule thresholds (docs/telemetry.md). */
static int diagnosis_key(struct parse *p, const char *name, const char *value)
{
	struct conf_diagnosis *d = &p->conf->diagnosis;
	static const struct {
		const char *name;
		size_t off;
		double max;
	} pcts[] = {
		{ "starved_pct", offsetof(struct conf_diagnosis, starved_pct), 100 },
		{ "busy_pct", offsetof(struct conf_diagnosis, busy_pct), 100 },
		{ "storage_pct", offsetof(struct conf_diagnosis, storage_pct), 100 },
		{ "host_pct", offsetof(struct conf_diagnosis, host_pct), 100 },
		{ "full_pct", offsetof(struct conf_diagnosis, full_pct), 100 },
		{ "held_pct", offsetof(struct conf_diagnosis, held_pct), 100 },
		{ "h2d_pct", offsetof(struct conf_diagnosis, h2d_pct), 100 },
		{ "straggler_pct", offsetof(struct conf_diagnosis, straggler_pct), 10000 },
		{ "straggler_min_ms", offsetof(struct conf_diagnosis, straggler_min_ms), 3600000 },
	};
	uint64_t x;
	if (strcmp(name, "window_s") == 0) {
		if (parse_u64(value, 2, 3600, &x) < 0)
			return bad(p, "window_s: '%s' is not an integer in 2..3600", value);
		d->window_s = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "history_s") == 0) {
		if (parse_u64(value, 0, 86400, &x) < 0)
			return bad(p, "history_s: '%s' is not an integer in 0..86400", value);
		d->history_s = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "min_batches") == 0) {
		if (parse_u64(value, 1, 1000000, &x) < 0)
			return bad(p, "min_batches: '%s' is not an integer in 1..1000000", value);
		d->min_batches = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "stage_counters") == 0) {
		if (parse_bool(value, &d->stage_counters) < 0)
			return bad(p, "stage_counters: '%s' is not true or false", value);
		return 1;
	}
	for (size_t i = 0; i < ARRAY_SIZE(pcts); i++) {
		if (strcmp(name, pcts[i].name) != 0)
			continue;
		if (parse_number(value, 0, pcts[i].max, (double *)((char *)d + pcts[i].off)) < 0)
			return bad(p, "%s: '%s' is not a number in 0..%g", name, value, pcts[i].max);
		return 1;
	}
	return bad(p, "unknown key '%s' in [diagnosis]", name);
}

/*
 * metrics_listen: "ADDRESS:PORT" with a numeric IPv4 address, or
 * "[ADDRESS]:PORT" with a numeric IPv6 one. Host names are refused: what
 * the endpoint binds must not depend on the resolver at start.
 */
static int set_metrics_listen(struct parse *p, const char *value)
{
	struct conf *c = p->conf;
	const char *colon = strrchr(value, ':');
	char host[INET6_ADDRSTRLEN + 2];
	uint64_t port;
	if (!colon || (size_t)(colon - value) >= sizeof(host) || parse_u64(colon + 1, 0, 65535, &port) < 0)
		return bad(p, "metrics_listen: '%s' is not ADDRESS:PORT (e.g. 127.0.0.1:9464 or [::1]:9464; port 0..65535)",
			   value);
	memcpy(host, value, (size_t)(colon - value));
	host[colon - value] = 0;
	struct sockaddr_storage ss = { 0 };
	socklen_t len;
	size_t hl = strlen(host);
	if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		host[hl - 1] = 0;
		if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
			return bad(p, "metrics_listen: '%s' is not a numeric IPv6 address", host + 1);
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		len = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
			return bad(p, "metrics_listen: '%s' is not a numeric IPv4 address (write an IPv6 one as [ADDRESS]:PORT)",
				   host);
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		len = sizeof(*a);
	}
	free(c->metrics_listen);
	c->metrics_listen = strdup(value);
	if (!c->metrics_listen)
		return bad(p, "out of memory");
	c->metrics_addr = ss;
	c->metrics_addrlen = len;
	return 1;
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
	if (strcmp(name, "cache_dir") == 0) {
		free(c->cache_dir);
		c->cache_dir = resolve(p->dir, value);
		return c->cache_dir ? 1 : bad(p, "out of memory");
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
	if (strcmp(name, "socket_mode") == 0) {
		char *end;
		errno = 0;
		unsigned long m = strtoul(value, &end, 8);
		if (!*value || *end || errno || m > 0777 || strspn(value, "01234567") != strlen(value))
			return bad(p, "socket_mode: '%s' is not an octal mode in 0..0777", value);
		c->socket_mode = (unsigned)m;
		return 1;
	}
	if (strcmp(name, "socket_group") == 0) {
		uint32_t gid;
		if (parse_id(value, true, &gid) < 0)
			return bad(p, "socket_group: '%s' is neither a group name on this system nor a numeric gid", value);
		c->socket_group = gid;
		return 1;
	}
	if (strcmp(name, "allow_users") == 0)
		return set_ids(p, name, value, false, &c->allow.uids, &c->allow.n_uids);
	if (strcmp(name, "allow_groups") == 0)
		return set_ids(p, name, value, true, &c->allow.gids, &c->allow.n_gids);
	if (strcmp(name, "admin_users") == 0)
		return set_ids(p, name, value, false, &c->admin.uids, &c->admin.n_uids);
	if (strcmp(name, "admin_groups") == 0)
		return set_ids(p, name, value, true, &c->admin.gids, &c->admin.n_gids);
	if (strcmp(name, "max_connections") == 0 || strcmp(name, "max_connections_per_uid") == 0) {
		if (parse_u64(value, 1, 65536, &x) < 0)
			return bad(p, "%s: '%s' is not an integer in 1..65536", name, value);
		*(strcmp(name, "max_connections") == 0 ? &c->max_connections : &c->max_connections_per_uid) = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "client_memory_max") == 0 || strcmp(name, "uid_memory_max") == 0 ||
	    strcmp(name, "memory_max") == 0) {
		if (parse_size(value, &x) < 0)
			return bad(p, "%s: '%s' is not a size in bytes (suffix K, M, G or T; 0 = no limit)", name, value);
		*(name[0] == 'c' ? &c->client_memory_max : name[0] == 'u' ? &c->uid_memory_max : &c->memory_max) = x;
		return 1;
	}
	if (strcmp(name, "gpu_memory_max") == 0) {
		if (parse_size(value, &x) < 0)
			return bad(p, "gpu_memory_max: '%s' is not a size in bytes (suffix K, M, G or T; 0 = no limit)", value);
		c->gpu_memory_max = x;
		return 1;
	}
	if (strcmp(name, "stuck_client_s") == 0) {
		if (parse_u64(value, 0, 86400, &x) < 0)
			return bad(p, "stuck_client_s: '%s' is not an integer in 0..86400 (0 = never report)", value);
		c->stuck_client_s = (unsigned)x;
		return 1;
	}
	if (strcmp(name, "metrics_listen") == 0)
		return set_metrics_listen(p, value);
	return bad(p, "unknown key '%s' in [feedd]", name);
}

/*
 * libinih keeps at most this many bytes of a section name (its MAX_SECTION,
 * not exported) and silently cuts the rest: a longer [feed.NAME] or
 * [feed.NAME.SOURCE] is refused before parsing instead.
 */
#define CONF_MAX_SECTION 50

/* inih's reader: fgets that counts lines, so checks after parsing can name them. */
static char *read_line(char *str, int num, void *stream)
{
	struct parse *p = stream;
	char *r = fgets(str, num, p->file);
	p->line += r != NULL;
	return r;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct parse *p = user;
	if (p->failed)
		return 1;
	/* A shards or sources list may go on over indented lines: inih hands each over as the key again. */
	bool list = strncmp(section, "feed.", 5) == 0 && (strcmp(name, "shards") == 0 || strcmp(name, "sources") == 0);
	int e = list ? 0 : check_repeat(p, section, name);
	if (e == -EEXIST)
		return bad(p, "'%s' is given twice in [%s] (only shards and sources may go on over indented lines)", name, section);
	if (e < 0)
		return bad(p, "out of memory");
	if (strcmp(section, "feedd") == 0)
		return daemon_key(p, name, value);
	if (strcmp(section, "diagnosis") == 0)
		return diagnosis_key(p, name, value);
	if (strncmp(section, "feed.", 5) == 0) {
		if (!valid_feed_name(section + 5))
			return bad(p, "[%s]: feed names are 1-63 characters of A-Z a-z 0-9 _ - .", section);
		struct conf_feed *f = feed_for(p, section + 5);
		if (!f)
			return bad(p, "out of memory");
		return feed_key(p, f, name, value);
	}
	return bad(p, "unknown section [%s] (expected [feedd], [diagnosis] or [feed.NAME])", section);
}

static void conf_feed_done(struct conf_feed *f)
{
	for (size_t j = 0; j < f->n_shards; j++)
		free(f->shards[j]);
	free(f->shards);
	free(f->name);
	free(f->format);
	free(f->bos_name);
	free(f->eos_name);
	free(f->text_key);
	free(f->tokenizer);
	free(f->tokenizer_preset);
	free(f->cache_dir);
	for (size_t j = 0; f->sources && j < f->mix->n; j++)
		conf_feed_done(&f->sources[j]);
	free(f->sources);
	free(f->mix);
	free(f->sources_text);
}

struct conf *conf_free(struct conf *c)
{
	if (!c)
		return NULL;
	for (size_t i = 0; i < c->n_feeds; i++)
		conf_feed_done(&c->feeds[i]);
	free(c->feeds);
	free(c->cache_dir);
	free(c->allow.uids);
	free(c->allow.gids);
	free(c->admin.uids);
	free(c->admin.gids);
	free(c->socket);
	free(c->metrics_listen);
	free(c->path);
	free(c);
	return NULL;
}

bool conf_tokenizer_is_hf(const char *path)
{
	size_t n = strlen(path);
	return n >= 5 && strcmp(path + n - 5, ".json") == 0;
}

/* What is wrong with a feed's tokenizer settings, or NULL. */
static const char *conf_feed_tokenizer_problem(const struct conf_feed *f)
{
	bool text = strcmp(f->format, "megatron") != 0;
	if (text && !f->tokenizer)
		return "a text format (jsonl, text, parquet) needs 'tokenizer'";
	if (!f->tokenizer && f->bos_name)
		return "bos names a special token, which needs 'tokenizer' to resolve";
	if (!f->tokenizer && f->eos_name)
		return "eos names a special token, which needs 'tokenizer' to resolve";
	if (!f->tokenizer && f->tokenizer_preset)
		return "'tokenizer_preset' without 'tokenizer'";
	if (f->tokenizer && conf_tokenizer_is_hf(f->tokenizer) && f->tokenizer_preset)
		return "'tokenizer_preset' applies to tiktoken rank files, not to a tokenizer.json";
	if (f->tokenizer && !conf_tokenizer_is_hf(f->tokenizer) && !f->tokenizer_preset)
		return "a tiktoken rank file needs 'tokenizer_preset' (its pattern and special tokens)";
	return NULL;
}

static size_t find_feed(const struct conf *c, const char *feed, const char *source)
{
	size_t n = strlen(feed);
	for (size_t i = 0; i < c->n_feeds; i++) {
		const char *name = c->feeds[i].name;
		if (name && strncmp(name, feed, n) == 0 && name[n] == '.' && strcmp(name + n + 1, source) == 0)
			return i;
	}
	return SIZE_MAX;
}

/*
 * Moves each mixture's [feed.NAME.SOURCE] sections into it (docs/sample-order.md,
 * section 14). A source takes the mixture's order keys (seq_len, seed, bos, ...)
 * and may not set them; the mixture may not set a source's keys (shards, ...).
 */
static int resolve_sources(struct conf *c, const char *path, char *err, size_t errlen)
{
	_cleanup_free_ bool *taken = calloc(MAX(c->n_feeds, (size_t)1), sizeof(*taken));
	if (!taken)
		return -ENOMEM;
	for (size_t i = 0; i < c->n_feeds; i++) {
		struct conf_feed *f = &c->feeds[i];
		if (!f->sources_text)
			continue;
		char why[256];
		if (!(f->mix = calloc(1, sizeof(*f->mix))))
			return -ENOMEM;
		if (mix_parse(f->sources_text, f->mix, why, sizeof(why)) < 0) {
			snprintf(err, errlen, "%s:%u: sources: %s", path, f->sources_line, why);
			return -EINVAL;
		}
		/* Each source names its own tokenizer, so a name means nothing for the mixture as a whole. */
		if (f->bos_name || f->eos_name) {
			bool b = f->bos_name != NULL;
			snprintf(err, errlen, "%s:%u: %s: a mixture's %s must be a token id or 'none' (each source would resolve a name in its own vocabulary)",
				 path, b ? f->bos_name_line : f->eos_name_line, b ? "bos" : "eos", b ? "bos" : "eos");
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < c->n_feeds; i++) {
		const struct conf_feed *f = &c->feeds[i];
		if (!f->mix)
			continue;
		if (f->source_key_line) {
			snprintf(err, errlen, "%s:%u: '%s' belongs in the sections of [feed.%s]'s sources ([feed.%s.%s], ...), not in the mixture's own",
				 path, f->source_key_line, f->source_key, f->name, f->name, f->mix->names[0]);
			return -EINVAL;
		}
		for (uint32_t j = 0; j < f->mix->n; j++) {
			size_t k = find_feed(c, f->name, f->mix->names[j]);
			if (k == SIZE_MAX) {
				snprintf(err, errlen, "%s:%u: sources: source '%s' has no section [feed.%s.%s]", path,
					 f->sources_line, f->mix->names[j], f->name, f->mix->names[j]);
				return -EINVAL;
			}
			const struct conf_feed *sf = &c->feeds[k];
			if (sf->order_key_line) {
				snprintf(err, errlen, "%s:%u: '%s' is set for all of [feed.%s]'s sources in [feed.%s], not in the source's [feed.%s]",
					 path, sf->order_key_line, sf->order_key, f->name, f->name, sf->name);
				return -EINVAL;
			}
			taken[k] = true;
		}
	}
	for (size_t i = 0; i < c->n_feeds; i++) {
		struct conf_feed *f = &c->feeds[i];
		if (!f->mix)
			continue;
		if (taken[i]) {
			snprintf(err, errlen, "%s:%u: [feed.%s] is a source and cannot have sources of its own", path,
				 f->sources_line, f->name);
			return -EINVAL;
		}
		if (!(f->sources = calloc(f->mix->n, sizeof(*f->sources))))
			return -ENOMEM;
		for (uint32_t j = 0; j < f->mix->n; j++) {
			struct conf_feed *sf = &f->sources[j];
			size_t k = find_feed(c, f->name, f->mix->names[j]);
			*sf = c->feeds[k];
			c->feeds[k] = (struct conf_feed){ 0 }; /* moved */
			sf->seq_len = f->seq_len;
			sf->batch_size = f->batch_size;
			sf->seed = f->seed;
			sf->shuffle = f->shuffle;
			sf->shuffle_window = f->shuffle_window;
			sf->bos = f->bos;
			sf->eos = f->eos;
		}
	}
	size_t n = 0;
	for (size_t i = 0; i < c->n_feeds; i++)
		if (!taken[i])
			c->feeds[n++] = c->feeds[i];
	c->n_feeds = n;
	return 0;
}

/* What is wrong with a feed's packing settings, or NULL; *ret_line gets the line of the key at fault. */
static const char *conf_feed_packing_problem(const struct conf_feed *f, unsigned *ret_line)
{
	*ret_line = f->pack_buffer_line;
	if (f->packing != CONF_PACKING_BESTFIT && f->pack_buffer)
		return "pack_buffer: applies to packing = bestfit only";
	*ret_line = f->pad_id_line;
	if (f->packing == CONF_PACKING_CONCAT && f->pad_id != CONF_TOKEN_NONE)
		return "pad_id: applies to packing = bestfit or pad, which pad rows; concat never does";
	return NULL;
}

int conf_load(const char *path, struct conf **ret, char *err, size_t errlen)
{
	struct conf *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = (struct conf){ .ring_slots = 4, .log_level = LOG_LEVEL_INFO, .io_depth = 64, .socket_mode = 0660,
			    .socket_group = -1, .max_connections = 256, .max_connections_per_uid = 64,
			    .stuck_client_s = 60, .diagnosis = CONF_DIAGNOSIS_DEFAULTS };
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
	/*
	 * inih reads at most INI_MAX_LINE - 1 bytes of a line and parses the rest
	 * as a line of its own: say so instead of a confusing error further on.
	 */
	{
		char *buf = NULL;
		size_t cap = 0;
		ssize_t len;
		for (int no = 1; (len = getline(&buf, &cap, f)) >= 0; no++) {
			const char *sec = buf + strspn(buf, " \t");
			size_t sec_len = *sec == '[' ? strcspn(sec + 1, "]\n") : 0;
			if ((size_t)len - (len > 0 && buf[len - 1] == '\n') >= INI_MAX_LINE - 1)
				snprintf(err, errlen, "%s:%d: the line is %zd bytes long, more than the %d an INI line may have; "
					 "continue a shards or sources list on indented lines", path, no, len, INI_MAX_LINE - 2);
			else if (sec_len >= CONF_MAX_SECTION)
				snprintf(err, errlen, "%s:%d: the section name '%.*s' is %zu characters long, more than the %d a "
					 "section name may have", path, no, (int)sec_len, sec + 1, sec_len, CONF_MAX_SECTION - 1);
			else
				continue;
			free(buf);
			fclose(f);
			for (size_t i = 0; i < p.n_seen; i++)
				free(p.seen[i]);
			free(p.seen);
			conf_free(c);
			return -EINVAL;
		}
		free(buf);
		rewind(f);
	}
	p.file = f;
	int line = ini_parse_stream(read_line, &p, handler, &p);
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
	/* Under systemd, CacheDirectory= says where the cache goes (the first, if several). */
	const char *cd = getenv("CACHE_DIRECTORY");
	if (!c->cache_dir && cd && *cd) {
		c->cache_dir = strndup(cd, strcspn(cd, ":"));
		if (!c->cache_dir) {
			conf_free(c);
			return -ENOMEM;
		}
	}
	int r = resolve_sources(c, path, err, errlen);
	if (r < 0) {
		conf_free(c);
		return r;
	}
	for (size_t i = 0; i < c->n_feeds; i++) {
		struct conf_feed *feed = &c->feeds[i];
		unsigned at;
		const char *why = conf_feed_packing_problem(feed, &at);
		if (why) {
			snprintf(err, errlen, "%s:%u: %s", path, at, why);
			conf_free(c);
			return -EINVAL;
		}
		if (feed->packing == CONF_PACKING_BESTFIT && !feed->pack_buffer)
			feed->pack_buffer = UINT64_C(64) * feed->seq_len;
		for (size_t j = 0; feed->mix && j < feed->mix->n; j++) {
			/* A source is checked as a feed of its own would be. */
			const struct conf_feed *sf = &feed->sources[j];
			if (sf->n_shards == 0)
				why = "'shards' is required";
			else
				why = conf_feed_tokenizer_problem(sf);
			if (why) {
				snprintf(err, errlen, "%s:%u: [feed.%s]: %s", path, sf->line, sf->name, why);
				conf_free(c);
				return -EINVAL;
			}
			if (c->cache_dir && !(feed->sources[j].cache_dir = strdup(c->cache_dir))) {
				conf_free(c);
				return -ENOMEM;
			}
		}
		if (feed->n_shards == 0 && !feed->mix) {
			snprintf(err, errlen, "%s: [feed.%s]: 'shards' is required", path, feed->name);
			conf_free(c);
			return -EINVAL;
		}
		if (c->cache_dir && !(c->feeds[i].cache_dir = strdup(c->cache_dir))) {
			conf_free(c);
			return -ENOMEM;
		}
		why = conf_feed_tokenizer_problem(feed);
		if (why) {
			snprintf(err, errlen, "%s: [feed.%s]: %s", path, feed->name, why);
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
