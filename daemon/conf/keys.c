/* SPDX-License-Identifier: MIT */
/*
 * The keys of feedd.conf (docs/configuration.md): one table per section
 * ([feedd], [diagnosis], [feed.NAME]) saying each key's type, range, field
 * and error text, the value parsers behind them, and the few keys whose
 * values need code of their own. The file as a whole (sections, repeats,
 * line numbers, checks across keys) is conf.c's.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/conf/conf-internal.h"
#include "daemon/format/format.h"
#include "daemon/log/log.h"
#include "proto/macro.h"
#include "proto/wire.h"

int conf_bad(struct parse *p, const char *fmt, ...)
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
		return conf_bad(p, "out of memory");
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
			return conf_bad(p, "%s: '%s' is neither a %s name on this system nor a numeric id", key, tok,
				   group ? "group" : "user");
		uint32_t *m = realloc(*ids, (*n + 1) * sizeof(*m));
		if (!m)
			return conf_bad(p, "out of memory");
		*ids = m;
		(*ids)[(*n)++] = id;
	}
	return 1;
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
static char *resolve(const char *dir, const char *path)
{
	char *out;
	/* A URL (s3://bucket/key, https://...) is not relative to anything. */
	if (path[0] == '/' || !dir || strstr(path, "://"))
		return strdup(path);
	return asprintf(&out, "%s/%s", dir, path) < 0 ? NULL : out;
}

static int set_shards(struct parse *p, struct conf_feed *f, const char *value)
{
	_cleanup_free_ char *copy = strdup(value);
	if (!copy)
		return conf_bad(p, "out of memory");
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
			return conf_bad(p, "shards: empty entry in '%s'", value);
		char **n = realloc(f->shards, (f->n_shards + 1) * sizeof(*n));
		if (!n)
			return conf_bad(p, "out of memory");
		f->shards = n;
		f->shards[f->n_shards] = resolve(p->dir, tok);
		if (!f->shards[f->n_shards])
			return conf_bad(p, "out of memory");
		f->n_shards++;
	}
	if (f->n_shards == 0)
		return conf_bad(p, "shards: no globs given");
	return 1;
}

static int set_string(struct parse *p, char **field, const char *value)
{
	char *v = strdup(value);
	if (!v)
		return conf_bad(p, "out of memory");
	free(*field);
	*field = v;
	return 1;
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
		return conf_bad(p, "metrics_listen: '%s' is not ADDRESS:PORT (e.g. 127.0.0.1:9464 or [::1]:9464; port 0..65535)",
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
			return conf_bad(p, "metrics_listen: '%s' is not a numeric IPv6 address", host + 1);
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		len = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
			return conf_bad(p, "metrics_listen: '%s' is not a numeric IPv4 address (write an IPv6 one as [ADDRESS]:PORT)",
				   host);
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		len = sizeof(*a);
	}
	free(c->metrics_listen);
	c->metrics_listen = strdup(value);
	if (!c->metrics_listen)
		return conf_bad(p, "out of memory");
	c->metrics_addr = ss;
	c->metrics_addrlen = len;
	return 1;
}


/* ---- what a key is ---- */

enum key_type {
	KEY_U32,    /* an integer in min..max, into a uint32_t (or unsigned) */
	KEY_U64,    /* an integer in min..max, into a uint64_t */
	KEY_I64,    /* an integer in min..max, into an int64_t (token ids) */
	KEY_SIZE,   /* a size with an optional K/M/G/T suffix in min..max, into a uint64_t */
	KEY_BOOL,   /* true/yes/on/1 or false/no/off/0 */
	KEY_NUMBER, /* a plain decimal number in 0..dmax, into a double */
	KEY_ENUM,   /* one of names[] (indexed by the enum's value), into an int-sized enum */
	KEY_PATH,   /* resolved against the config's directory, into a malloc'd char * */
	KEY_USERS,  /* a list of users, into a struct conf_ids */
	KEY_GROUPS, /* a list of groups, into a struct conf_ids */
	KEY_CUSTOM, /* set() */
};

enum {
	KEY_ORDER = 1u << 0,  /* a feed key the sources of a mixture take from it (checked by resolve_sources) */
	KEY_SOURCE = 1u << 1, /* a feed key only a source may have */
};

struct conf_key {
	const char *name;
	enum key_type type;
	size_t off;                 /* the field in the section's struct */
	uint64_t min, max;          /* KEY_U32, KEY_U64, KEY_I64, KEY_SIZE */
	double dmax;                /* KEY_NUMBER */
	const char *what;           /* the error says "NAME: 'VALUE' is not WHAT" */
	const char *const *names;   /* KEY_ENUM: n_names names, by value */
	size_t n_names;
	size_t line_off;            /* where the key's line is recorded (an unsigned), 0: nowhere */
	unsigned flags;             /* KEY_ORDER, KEY_SOURCE */
	int (*set)(struct parse *p, void *obj, const struct conf_key *k, const char *value); /* KEY_CUSTOM */
};

/* ---- keys whose values need code of their own ---- */

static int set_format(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	if (!format_find(value)) {
		char names[128];
		format_names(names, sizeof(names));
		return conf_bad(p, "format: '%s' is not supported (supported: %s)", value, names);
	}
	return set_string(p, &f->format, value);
}

static int set_text_key(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	if (!*value)
		return conf_bad(p, "text_key: empty");
	return set_string(p, &f->text_key, value);
}

static int set_tokenizer_preset(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	static const char *const presets[] = { "gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base", "llama3" };
	for (size_t i = 0; i < ARRAY_SIZE(presets); i++)
		if (strcmp(value, presets[i]) == 0)
			return set_string(p, &f->tokenizer_preset, value);
	return conf_bad(p, "tokenizer_preset: '%s' is not one of gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, llama3",
			value);
}

static int set_on_bad_record(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	if (strcmp(value, "skip") != 0 && strcmp(value, "fail") != 0)
		return conf_bad(p, "on_bad_record: '%s' is not skip or fail", value);
	f->skip_bad_records = value[0] == 's';
	return 1;
}

/* strtod, not parse_number: a fraction may be written 1e-3. */
static int set_max_bad_fraction(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	char *end;
	errno = 0;
	double frac = strtod(value, &end);
	if (errno || end == value || *end || !(frac >= 0 && frac <= 1))
		return conf_bad(p, "max_bad_fraction: '%s' is not a number in 0..1", value);
	f->max_bad_fraction = frac;
	return 1;
}

static int set_shards_key(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	return set_shards(p, obj, value);
}

/* bos and eos: 'none', a token id, or a special token's name (e.g. <|endoftext|>) resolved with the tokenizer. */
static int set_bos_eos(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	bool bos = k->name[0] == 'b';
	int64_t *t = bos ? &f->bos : &f->eos;
	char **tname = bos ? &f->bos_name : &f->eos_name;
	free(*tname);
	*tname = NULL;
	if (parse_token(value, t) == 0)
		return 1;
	if (isdigit((unsigned char)value[0]) || value[0] == '-' || value[0] == '+')
		return conf_bad(p, "%s: '%s' is not 'none', a token id in 0..2147483647 or a special token's name", k->name,
				value);
	*t = CONF_TOKEN_NONE;
	*(bos ? &f->bos_name_line : &f->eos_name_line) = p->line;
	return set_string(p, tname, value);
}

/* sources may go on over indented lines, like shards; parsed whole in resolve_sources(). */
static int set_sources(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf_feed *f = obj;
	const char *sep = "";
	size_t have = f->sources_text ? strlen(f->sources_text) : 0;
	if (have && f->sources_text[have - 1] != ',' && value[0] != ',')
		sep = ", ";
	char *joined;
	if (asprintf(&joined, "%s%s%s", have ? f->sources_text : "", sep, value) < 0)
		return conf_bad(p, "out of memory");
	free(f->sources_text);
	f->sources_text = joined;
	if (!f->sources_line)
		f->sources_line = p->line;
	return 1;
}

static int set_log_level(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf *c = obj;
	int l = log_level_from_string(value);
	if (l < 0)
		return conf_bad(p, "log_level: '%s' is not one of error, warning, notice, info, debug", value);
	c->log_level = l;
	return 1;
}

static int set_socket_mode(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf *c = obj;
	char *end;
	errno = 0;
	unsigned long m = strtoul(value, &end, 8);
	if (!*value || *end || errno || m > 0777 || strspn(value, "01234567") != strlen(value))
		return conf_bad(p, "socket_mode: '%s' is not an octal mode in 0..0777", value);
	c->socket_mode = (unsigned)m;
	return 1;
}

static int set_socket_group(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	struct conf *c = obj;
	uint32_t gid;
	if (parse_id(value, true, &gid) < 0)
		return conf_bad(p, "socket_group: '%s' is neither a group name on this system nor a numeric gid", value);
	c->socket_group = gid;
	return 1;
}

static int set_metrics_listen_key(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	return set_metrics_listen(p, value);
}

/* A plain string (an endpoint, a region, a profile name), as written. */
static int set_plain_string(struct parse *p, void *obj, const struct conf_key *k, const char *value)
{
	return set_string(p, (char **)((char *)obj + k->off), value);
}

/* ---- the tables ---- */

/* The field's offset, refused at compile time when its size is not the key type's. */
#define FIELD(s, f, size) (offsetof(s, f) + 0 * sizeof(char[sizeof(((s *)0)->f) == (size) ? 1 : -1]))
#define U32(s, f, lo, hi, w, ...) { .name = #f, .type = KEY_U32, .off = FIELD(s, f, 4), .min = lo, .max = hi, .what = w, __VA_ARGS__ }
#define U64(s, f, lo, hi, w, ...) { .name = #f, .type = KEY_U64, .off = FIELD(s, f, 8), .min = lo, .max = hi, .what = w, __VA_ARGS__ }
#define SIZE(s, f, lo, hi, w, ...) { .name = #f, .type = KEY_SIZE, .off = FIELD(s, f, 8), .min = lo, .max = hi, .what = w, __VA_ARGS__ }
#define BOOL(s, f, ...) { .name = #f, .type = KEY_BOOL, .off = FIELD(s, f, sizeof(bool)), .what = "true or false", __VA_ARGS__ }
#define PCT(f, hi) { .name = #f, .type = KEY_NUMBER, .off = FIELD(struct conf_diagnosis, f, sizeof(double)), .dmax = hi }
#define ENUM(s, f, n, w, ...) { .name = #f, .type = KEY_ENUM, .off = FIELD(s, f, sizeof(int)), .names = n, .n_names = ARRAY_SIZE(n), .what = w, __VA_ARGS__ }
#define PATH(s, f, ...) { .name = #f, .type = KEY_PATH, .off = FIELD(s, f, sizeof(char *)), __VA_ARGS__ }
#define IDS(n, t, s, f) { .name = n, .type = t, .off = FIELD(s, f, sizeof(struct conf_ids)) }
#define CUSTOM(n, fn, ...) { .name = n, .type = KEY_CUSTOM, .set = fn, __VA_ARGS__ }

static const char *const packings[] = { [CONF_PACKING_CONCAT] = "concat", [CONF_PACKING_BESTFIT] = "bestfit",
					[CONF_PACKING_PAD] = "pad" };
static const char *const io_engines[] = { [IO_ENGINE_AUTO] = "auto", [IO_ENGINE_URING] = "io_uring",
					  [IO_ENGINE_PREAD] = "pread" };
static const char *const watch_modes[] = { [CONF_WATCH_AUTO] = "auto", [CONF_WATCH_INOTIFY] = "inotify",
					   [CONF_WATCH_OFF] = "off" };

#define F struct conf_feed
static const struct conf_key feed_keys[] = {
	CUSTOM("format", set_format, .flags = KEY_SOURCE),
	CUSTOM("shards", set_shards_key, .flags = KEY_SOURCE),
	CUSTOM("text_key", set_text_key, .flags = KEY_SOURCE),
	PATH(F, tokenizer, .flags = KEY_SOURCE, .line_off = offsetof(F, tokenizer_line)),
	CUSTOM("tokenizer_preset", set_tokenizer_preset, .flags = KEY_SOURCE),
	BOOL(F, encode_special_tokens, .flags = KEY_SOURCE),
	CUSTOM("on_bad_record", set_on_bad_record, .flags = KEY_SOURCE),
	CUSTOM("max_bad_fraction", set_max_bad_fraction, .flags = KEY_SOURCE),
	SIZE(F, max_document_bytes, 1, UINT32_MAX - 1, "a size in 1..4294967294 (suffixes K, M, G)", .flags = KEY_SOURCE),
	BOOL(F, count_ahead, .flags = KEY_SOURCE),
	U32(F, seq_len, 1, 1u << 20, "an integer in 1..1048576", .flags = KEY_ORDER, .line_off = offsetof(F, seq_len_line)),
	U32(F, batch_size, 1, 1u << 16, "an integer in 1..65536", .flags = KEY_ORDER,
	    .line_off = offsetof(F, batch_size_line)),
	U64(F, seed, 0, UINT64_MAX, "an unsigned 64-bit integer", .flags = KEY_ORDER),
	BOOL(F, shuffle, .flags = KEY_ORDER),
	U32(F, shuffle_window, 1, UINT32_MAX, "a positive integer", .flags = KEY_ORDER),
	U64(F, shuffle_list_max, 1, UINT64_MAX, "a positive integer (documents)", .flags = KEY_ORDER),
	CUSTOM("bos", set_bos_eos, .flags = KEY_ORDER),
	CUSTOM("eos", set_bos_eos, .flags = KEY_ORDER),
	ENUM(F, packing, packings, "one of concat, bestfit, pad", .flags = KEY_ORDER),
	U64(F, pack_buffer, 1, UINT64_C(1) << 32, "an integer in 1..4294967296 (positions)", .flags = KEY_ORDER,
	    .line_off = offsetof(F, pack_buffer_line)),
	{ .name = "pad_id", .type = KEY_I64, .off = FIELD(F, pad_id, 8), .min = 0, .max = INT32_MAX,
	  .what = "a token id in 0..2147483647", .flags = KEY_ORDER, .line_off = offsetof(F, pad_id_line) },
	CUSTOM("sources", set_sources, .flags = KEY_ORDER),
	U32(F, virtual_ranks, 0, 1u << 16, "an integer in 0..65536 (0: one stream per rank, no elastic resume)", .flags = KEY_ORDER),
};
#undef F

#define D struct conf_diagnosis
static const struct conf_key diagnosis_keys[] = {
	U32(D, window_s, 2, 3600, "an integer in 2..3600"),
	U32(D, history_s, 0, 86400, "an integer in 0..86400"),
	U32(D, min_batches, 1, 1000000, "an integer in 1..1000000"),
	BOOL(D, stage_counters),
	PCT(starved_pct, 100),
	PCT(busy_pct, 100),
	PCT(storage_pct, 100),
	PCT(host_pct, 100),
	PCT(full_pct, 100),
	PCT(held_pct, 100),
	PCT(h2d_pct, 100),
	PCT(straggler_pct, 10000),
	PCT(straggler_min_ms, 3600000),
};
#undef D

#define C struct conf
#define NO_LIMIT "a size in bytes (suffix K, M, G or T; 0 = no limit)"
static const struct conf_key daemon_keys[] = {
	PATH(C, socket, .line_off = offsetof(C, socket_line)),
	PATH(C, cache_dir),
	SIZE(C, cache_max_bytes, 0, UINT64_MAX, NO_LIMIT),
	U32(C, threads, 0, 1024, "an integer in 0..1024 (0 = all CPUs)"),
	U32(C, ring_slots, 2, 1024, "an integer in 2..1024"),
	CUSTOM("log_level", set_log_level),
	ENUM(C, io_engine, io_engines, "one of auto, io_uring, pread"),
	U32(C, io_depth, 1, 4096, "an integer in 1..4096"),
	CUSTOM("socket_mode", set_socket_mode),
	CUSTOM("socket_group", set_socket_group),
	IDS("allow_users", KEY_USERS, C, allow),
	IDS("allow_groups", KEY_GROUPS, C, allow),
	IDS("admin_users", KEY_USERS, C, admin),
	IDS("admin_groups", KEY_GROUPS, C, admin),
	U32(C, max_connections, 1, 65536, "an integer in 1..65536"),
	U32(C, max_connections_per_uid, 1, 65536, "an integer in 1..65536"),
	SIZE(C, client_memory_max, 0, UINT64_MAX, NO_LIMIT),
	SIZE(C, uid_memory_max, 0, UINT64_MAX, NO_LIMIT),
	SIZE(C, memory_max, 0, UINT64_MAX, NO_LIMIT),
	SIZE(C, gpu_memory_max, 0, UINT64_MAX, NO_LIMIT),
	U32(C, stuck_client_s, 0, 86400, "an integer in 0..86400 (0 = never report)"),
	CUSTOM("metrics_listen", set_metrics_listen_key),
	ENUM(C, watch_changes, watch_modes, "one of auto, inotify, off"),
	U32(C, admin_connections, 0, 1024, "an integer in 0..1024"),
	U32(C, handshake_timeout_s, 1, 3600, "an integer in 1..3600"),
	U32(C, load_timeout_s, 1, 86400, "an integer in 1..86400 (seconds)"),
	{ .name = "s3_endpoint", .type = KEY_CUSTOM, .set = set_plain_string, .off = FIELD(C, s3_endpoint, sizeof(char *)) },
	{ .name = "s3_region", .type = KEY_CUSTOM, .set = set_plain_string, .off = FIELD(C, s3_region, sizeof(char *)) },
	BOOL(C, s3_path_style),
	PATH(C, s3_credentials_file),
	{ .name = "s3_profile", .type = KEY_CUSTOM, .set = set_plain_string, .off = FIELD(C, s3_profile, sizeof(char *)) },
	U32(C, s3_max_requests, 1, 4096, "an integer in 1..4096"),
	SIZE(C, s3_memory_max, UINT64_C(8) << 20, UINT64_MAX, "a size of at least 8M (suffix K, M, G or T)"),
	SIZE(C, s3_cache_max_bytes, 0, UINT64_MAX, "a size in bytes (suffix K, M, G or T; 0 = 4G)"),
};
#undef C
#undef NO_LIMIT

_Static_assert(sizeof(enum conf_packing) == sizeof(int) && sizeof(enum io_engine) == sizeof(int) &&
		       sizeof(enum conf_watch) == sizeof(int),
	       "KEY_ENUM fields are int-sized");

static const struct conf_key *find_key(const struct conf_key *keys, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(keys[i].name, name) == 0)
			return &keys[i];
	return NULL;
}

/* Parses value as key k says and stores it in obj (the section's struct). Returns 1, or conf_bad()'s 0. */
static int apply(struct parse *p, const struct conf_key *k, void *obj, const char *value)
{
	void *field = (char *)obj + k->off;
	uint64_t x = 0;
	int r = -EINVAL;
	switch (k->type) {
	case KEY_U32:
	case KEY_U64:
	case KEY_I64:
		r = parse_u64(value, k->min, k->max, &x);
		if (r == 0 && k->type == KEY_U32)
			*(uint32_t *)field = (uint32_t)x;
		else if (r == 0 && k->type == KEY_U64)
			*(uint64_t *)field = x;
		else if (r == 0)
			*(int64_t *)field = (int64_t)x;
		break;
	case KEY_SIZE:
		r = parse_size(value, &x);
		if (r == 0 && (x < k->min || x > k->max))
			r = -EINVAL;
		if (r == 0)
			*(uint64_t *)field = x;
		break;
	case KEY_BOOL:
		r = parse_bool(value, field);
		break;
	case KEY_NUMBER:
		if (parse_number(value, 0, k->dmax, field) < 0)
			return conf_bad(p, "%s: '%s' is not a number in 0..%g", k->name, value, k->dmax);
		return 1;
	case KEY_ENUM:
		for (size_t i = 0; i < k->n_names && r < 0; i++) {
			if (k->names[i] && strcmp(value, k->names[i]) == 0) {
				*(int *)field = (int)i;
				r = 0;
			}
		}
		break;
	case KEY_PATH: {
		char *v = resolve(p->dir, value);
		if (!v)
			return conf_bad(p, "out of memory");
		free(*(char **)field);
		*(char **)field = v;
		if (k->line_off)
			*(unsigned *)((char *)obj + k->line_off) = p->line;
		return 1;
	}
	case KEY_USERS:
	case KEY_GROUPS: {
		struct conf_ids *ids = field;
		return k->type == KEY_USERS ? set_ids(p, k->name, value, false, &ids->uids, &ids->n_uids)
					    : set_ids(p, k->name, value, true, &ids->gids, &ids->n_gids);
	}
	case KEY_CUSTOM:
		return k->set(p, obj, k, value);
	}
	if (r < 0)
		return conf_bad(p, "%s: '%s' is not %s", k->name, value, k->what);
	if (k->line_off)
		*(unsigned *)((char *)obj + k->line_off) = p->line;
	return 1;
}

void conf_feed_defaults(struct conf_feed *f)
{
	*f = (struct conf_feed){
		.seq_len = 4096,
		.batch_size = 8,
		.seed = 0,
		.shuffle = true,
		.shuffle_window = 4,
		.shuffle_list_max = CONF_SHUFFLE_LIST_MAX,
		.bos = CONF_TOKEN_NONE,
		.eos = CONF_TOKEN_NONE,
		.pad_id = CONF_TOKEN_NONE,
		.skip_bad_records = true,
		.max_bad_fraction = 0.001,
		.max_document_bytes = UINT64_C(256) << 20,
		.count_ahead = true,
		.virtual_ranks = CONF_VIRTUAL_RANKS_DEFAULT,
	};
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
	conf_feed_defaults(f);
	f->name = strdup(name);
	f->format = strdup(CONF_FEED_FORMAT);
	f->text_key = strdup(CONF_FEED_TEXT_KEY);
	if (!f->name || !f->format || !f->text_key) {
		free(f->name);
		free(f->format);
		free(f->text_key);
		return NULL;
	}
	c->n_feeds++;
	return f;
}

static int feed_key(struct parse *p, struct conf_feed *f, const char *name, const char *value)
{
	const struct conf_key *k = find_key(feed_keys, ARRAY_SIZE(feed_keys), name);
	if (!f->line)
		f->line = p->line;
	/* Which keys a mixture feed and its source sections may have is checked once every section is known. */
	if (k && (k->flags & KEY_ORDER) && !f->order_key_line) {
		f->order_key_line = p->line;
		f->order_key = k->name;
	} else if (k && (k->flags & KEY_SOURCE) && !f->source_key_line) {
		f->source_key_line = p->line;
		f->source_key = k->name;
	}
	if (!k)
		return conf_bad(p, "unknown key '%s' in [feed.%s]", name, f->name);
	return apply(p, k, f, value);
}

int conf_key(struct parse *p, const char *section, const char *name, const char *value)
{
	const struct conf_key *k;
	if (strcmp(section, "feedd") == 0) {
		k = find_key(daemon_keys, ARRAY_SIZE(daemon_keys), name);
		return k ? apply(p, k, p->conf, value) : conf_bad(p, "unknown key '%s' in [feedd]", name);
	}
	if (strcmp(section, "diagnosis") == 0) {
		k = find_key(diagnosis_keys, ARRAY_SIZE(diagnosis_keys), name);
		return k ? apply(p, k, &p->conf->diagnosis, value) : conf_bad(p, "unknown key '%s' in [diagnosis]", name);
	}
	if (strncmp(section, "feed.", 5) == 0) {
		if (!valid_feed_name(section + 5))
			return conf_bad(p, "[%s]: feed names are 1-63 characters of A-Z a-z 0-9 _ - .", section);
		struct conf_feed *f = feed_for(p, section + 5);
		if (!f)
			return conf_bad(p, "out of memory");
		int r = feed_key(p, f, name, value);
		if (r == 1 && strcmp(name, "virtual_ranks") == 0)
			f->virtual_ranks_set = true;
		return r;
	}
	return conf_bad(p, "unknown section [%s] (expected [feedd], [diagnosis] or [feed.NAME])", section);
}
