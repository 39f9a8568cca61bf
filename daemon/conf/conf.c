/* SPDX-License-Identifier: MIT */
/*
 * feedd.conf as a whole: inih's pass over the file (each key handed to
 * keys.c), keys given twice, over-long lines and section names, then the
 * checks across keys and sections (mixtures and their sources, packing,
 * tokenizers). Also the copies and destructors of the config's parts, so
 * that whoever keeps a part past conf_free() copies it with conf/.
 */
#include <errno.h>
#include <fcntl.h>
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
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/conf/conf-internal.h"
#include "daemon/log/log.h"
#include "daemon/ring/ring.h"
#include "proto/macro.h"
#include "proto/wire.h"

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
		return conf_bad(p, "'%s' is given twice in [%s] (only shards and sources may go on over indented lines)", name, section);
	if (e < 0)
		return conf_bad(p, "out of memory");
	return conf_key(p, section, name, value);
}

void conf_feed_done(struct conf_feed *f)
{
	for (size_t j = 0; f->shards && j < f->n_shards; j++)
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
	free(f->tokenizer_at);
	for (size_t j = 0; f->sources && j < f->mix->n; j++)
		conf_feed_done(&f->sources[j]);
	free(f->sources);
	free(f->mix);
	free(f->sources_text);
	*f = (struct conf_feed){ 0 };
}

static int dup_opt(char **dst, const char *src)
{
	*dst = NULL;
	return src && !(*dst = strdup(src)) ? -ENOMEM : 0;
}

int conf_feed_copy(struct conf_feed *dst, const struct conf_feed *src)
{
	*dst = *src;
	dst->name = strdup(src->name);
	dst->format = strdup(src->format);
	dst->shards = calloc(MAX(src->n_shards, 1u), sizeof(char *));
	int r = dup_opt(&dst->bos_name, src->bos_name) | dup_opt(&dst->eos_name, src->eos_name) |
		dup_opt(&dst->text_key, src->text_key) | dup_opt(&dst->tokenizer, src->tokenizer) |
		dup_opt(&dst->tokenizer_preset, src->tokenizer_preset) | dup_opt(&dst->cache_dir, src->cache_dir) |
		dup_opt(&dst->tokenizer_at, src->tokenizer_at);
	dst->mix = NULL;
	dst->sources = NULL;
	dst->sources_text = NULL; /* parsed into mix already */
	if (!dst->name || !dst->format || !dst->shards || r)
		goto fail;
	for (size_t i = 0; i < src->n_shards; i++)
		if (!(dst->shards[i] = strdup(src->shards[i])))
			goto fail;
	if (src->mix) {
		if (!(dst->mix = malloc(sizeof(*dst->mix))) ||
		    !(dst->sources = calloc(src->mix->n, sizeof(*dst->sources))))
			goto fail;
		*dst->mix = *src->mix;
		for (uint32_t i = 0; i < src->mix->n; i++)
			if (conf_feed_copy(&dst->sources[i], &src->sources[i]) < 0)
				goto fail;
	}
	return 0;
fail:
	conf_feed_done(dst);
	return -ENOMEM;
}

int conf_ids_copy(struct conf_ids *dst, const struct conf_ids *src)
{
	uint32_t *u = src->n_uids ? malloc(src->n_uids * sizeof(*u)) : NULL;
	uint32_t *g = src->n_gids ? malloc(src->n_gids * sizeof(*g)) : NULL;
	if ((src->n_uids && !u) || (src->n_gids && !g)) {
		free(u);
		free(g);
		return -ENOMEM;
	}
	if (u)
		memcpy(u, src->uids, src->n_uids * sizeof(*u));
	if (g)
		memcpy(g, src->gids, src->n_gids * sizeof(*g));
	conf_ids_done(dst);
	*dst = (struct conf_ids){ .uids = u, .n_uids = src->n_uids, .gids = g, .n_gids = src->n_gids };
	return 0;
}

void conf_ids_done(struct conf_ids *ids)
{
	free(ids->uids);
	free(ids->gids);
	*ids = (struct conf_ids){ 0 };
}

struct conf *conf_free(struct conf *c)
{
	if (!c)
		return NULL;
	for (size_t i = 0; i < c->n_feeds; i++)
		conf_feed_done(&c->feeds[i]);
	free(c->feeds);
	free(c->cache_dir);
	conf_ids_done(&c->allow);
	conf_ids_done(&c->admin);
	free(c->socket);
	free(c->metrics_listen);
	free(c->s3_endpoint);
	free(c->s3_region);
	free(c->s3_credentials_file);
	free(c->s3_profile);
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
			sf->virtual_ranks = 0; /* the mixture's key: a source is never virtual on its own (section 17.1) */
			sf->shuffle_list_max = f->shuffle_list_max;
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

/*
 * A batch must fit one ring slot: cu_seqlens are int32 over the flattened
 * batch, and a slot (four arrays of B*L int32 and a header) is at most 4 GiB.
 * Checked here so that --check and a reload refuse it, instead of a feed that
 * loads as ready and whose every attach fails.
 */
static int check_batch(const struct conf_feed *feed, const char *path, char *err, size_t errlen)
{
	unsigned line = MAX(feed->batch_size_line, feed->seq_len_line);
	uint64_t n = (uint64_t)feed->batch_size * feed->seq_len;
	if (!line)
		line = feed->line;
	if (n + 1 > INT32_MAX) {
		snprintf(err, errlen, "%s:%u: [feed.%s]: batch_size x seq_len = %u x %u = %llu positions; at most %d fit a batch",
			 path, line, feed->name, feed->batch_size, feed->seq_len, (unsigned long long)n, INT32_MAX - 1);
		return -EINVAL;
	}
	if (ring_slot_bytes(feed->batch_size, feed->seq_len) == 0) {
		snprintf(err, errlen, "%s:%u: [feed.%s]: batch_size x seq_len = %u x %u = %llu positions need a ring slot of "
			 "about %llu bytes; a ring slot holds at most %u bytes (about %u positions)",
			 path, line, feed->name, feed->batch_size, feed->seq_len, (unsigned long long)n,
			 (unsigned long long)(16 * n), UINT32_MAX, UINT32_MAX / 16);
		return -EINVAL;
	}
	return 0;
}

/* Records where the feed's tokenizer key is, so that a load error can name the line. */
static int tokenizer_at(struct conf_feed *f, const char *path)
{
	if (!f->tokenizer || f->tokenizer_at)
		return 0;
	return asprintf(&f->tokenizer_at, "%s:%u", path, f->tokenizer_line) < 0 ? -ENOMEM : 0;
}

/*
 * Opens the config for reading: O_NONBLOCK, so that a FIFO in its place is
 * refused rather than waited on. Returns the stream, or NULL with errno set
 * and a message in err.
 */
static FILE *open_regular(const char *path, char *err, size_t errlen)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0 && errno == EWOULDBLOCK) /* a lease: only regular files have one */
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	int e = fd < 0 || fstat(fd, &st) < 0 ? errno : S_ISREG(st.st_mode) ? 0 : EINVAL;
	int fl = e ? -1 : fcntl(fd, F_GETFL);
	if (!e && (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0))
		e = errno;
	FILE *f = e ? NULL : fdopen(fd, "r");
	if (!e && !f)
		e = errno;
	if (e) {
		if (e == EINVAL)
			snprintf(err, errlen, "%s: not a regular file", path);
		else
			snprintf(err, errlen, "%s: cannot open: %s", path, strerror(e));
		if (fd >= 0)
			close(fd);
		errno = e;
	}
	return f;
}

int conf_load(const char *path, struct conf **ret, char *err, size_t errlen)
{
	struct conf *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	*c = (struct conf){ .ring_slots = 4, .log_level = LOG_LEVEL_INFO, .io_depth = 64, .socket_mode = 0660,
			    .socket_group = -1, .max_connections = 1024, .max_connections_per_uid = 64,
			    .admin_connections = 4, .handshake_timeout_s = 5, .uid_memory_max = 2ull << 30,
			    .stuck_client_s = 60, .diagnosis = CONF_DIAGNOSIS_DEFAULTS,
			    .load_timeout_s = 60 };
	c->path = strdup(path);
	_cleanup_free_ char *copy = strdup(path);
	if (!c->path || !copy) {
		conf_free(c);
		return -ENOMEM;
	}
	char *dir = dirname(copy);
	struct parse p = { .conf = c, .dir = dir };

	FILE *f = open_regular(path, err, errlen);
	if (!f) {
		int e = -errno;
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
			/* inih reads lines as C strings: a NUL would silently cut the value there. */
			if (memchr(buf, 0, (size_t)len))
				snprintf(err, errlen, "%s:%d: the line holds a NUL byte (at column %zu); a value cannot contain one",
					 path, no, strlen(buf) + 1);
			else if ((size_t)len - (len > 0 && buf[len - 1] == '\n') >= INI_MAX_LINE - 1)
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
			feed->sources[j].cache_max_bytes = c->cache_max_bytes;
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
		c->feeds[i].cache_max_bytes = c->cache_max_bytes;
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
		r = check_batch(feed, path, err, errlen);
		if (r == 0)
			r = tokenizer_at(feed, path);
		for (size_t j = 0; r == 0 && feed->mix && j < feed->mix->n; j++)
			r = tokenizer_at(&feed->sources[j], path);
		if (r < 0) {
			conf_free(c);
			return r;
		}
	}
	if (c->socket) {
		char sp[sizeof(((struct sockaddr_un *)0)->sun_path)];
		if (wire_socket_path(c->socket, sp, sizeof(sp)) < 0) {
			snprintf(err, errlen, "%s:%u: socket: '%s' is %zu bytes long; a unix socket path holds at most %zu",
				 path, c->socket_line, c->socket, strlen(c->socket), sizeof(sp) - 1);
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
