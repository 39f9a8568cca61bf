/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/feed.h"
#include "daemon/log/log.h"
#include "proto/macro.h"

static int cmp_path(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void hash_bytes(uint64_t *h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		*h = (*h ^ b[i]) * UINT64_C(0x100000001b3);
}

static void hash_u64(uint64_t *h, uint64_t v)
{
	hash_bytes(h, &v, sizeof(v));
}

/* The feed's identity: its shards (paths, sizes, mtimes) and every order parameter. */
static uint64_t fingerprint_of(const struct feed *f)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	hash_bytes(&h, "feedd-megatron-v1", 17);
	hash_u64(&h, f->n_shards);
	for (uint32_t i = 0; i < f->n_shards; i++) {
		const struct megatron_shard *s = f->shards[i];
		hash_bytes(&h, s->idx_path, strlen(s->idx_path) + 1);
		const struct file_id *ids[2] = { &s->idx_id, &s->bin_id };
		for (size_t k = 0; k < 2; k++) {
			hash_u64(&h, (uint64_t)ids[k]->size);
			hash_u64(&h, (uint64_t)ids[k]->mtime.tv_sec);
			hash_u64(&h, (uint64_t)ids[k]->mtime.tv_nsec);
		}
	}
	const struct conf_feed *c = &f->conf;
	uint64_t params[] = { c->seed, c->shuffle, c->shuffle_window, c->seq_len, c->batch_size,
			      (uint64_t)c->bos, (uint64_t)c->eos };
	for (size_t i = 0; i < ARRAY_SIZE(params); i++)
		hash_u64(&h, params[i]);
	return order_mix(h);
}

static int set_failed(struct feed *f, int code, const char *msg)
{
	f->state = FEED_FAILED;
	f->error_code = code;
	snprintf(f->error, sizeof(f->error), "%s", msg);
	log_error("feed %s: %s", f->name, msg);
	return 0;
}

/*
 * Expands the globs: each in config order, its matches sorted by path bytes,
 * then made canonical (realpath) so that the fingerprint and the duplicate
 * check do not depend on how the config spells a path.
 */
static int expand(struct feed *f, char ***ret, size_t *ret_n, char *err, size_t errlen)
{
	char **paths = NULL;
	size_t n = 0;
	int r = 0;
	for (size_t g = 0; g < f->conf.n_shards; g++) {
		glob_t gl = { 0 };
		int e = glob(f->conf.shards[g], GLOB_NOSORT, NULL, &gl);
		if (e == GLOB_NOMATCH) {
			snprintf(err, errlen, "shards: '%s' matches no file", f->conf.shards[g]);
			r = -ENOENT;
		} else if (e != 0) {
			snprintf(err, errlen, "shards: cannot expand '%s'", f->conf.shards[g]);
			r = e == GLOB_NOSPACE ? -ENOMEM : -EIO;
		}
		if (r < 0) {
			globfree(&gl);
			goto fail;
		}
		qsort(gl.gl_pathv, gl.gl_pathc, sizeof(char *), cmp_path);
		char **grown = realloc(paths, (n + gl.gl_pathc) * sizeof(*paths));
		if (!grown) {
			globfree(&gl);
			r = -ENOMEM;
			goto fail;
		}
		paths = grown;
		for (size_t i = 0; i < gl.gl_pathc; i++) {
			/* Canonical paths: the fingerprint must not depend on how the config spells them. */
			char *real = realpath(gl.gl_pathv[i], NULL);
			if (!real) {
				r = -errno;
				snprintf(err, errlen, "shards: %s: %s", gl.gl_pathv[i], strerror(-r));
				globfree(&gl);
				goto fail;
			}
			for (size_t j = 0; j < n; j++) {
				if (strcmp(paths[j], real) == 0) {
					snprintf(err, errlen, "shards: %s is listed twice", real);
					free(real);
					globfree(&gl);
					r = -EINVAL;
					goto fail;
				}
			}
			paths[n++] = real;
		}
		globfree(&gl);
	}
	*ret = paths;
	*ret_n = n;
	return 0;
fail:
	for (size_t i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	return r;
}

static int copy_conf(struct conf_feed *dst, const struct conf_feed *src)
{
	*dst = *src;
	dst->name = strdup(src->name);
	dst->format = strdup(src->format);
	dst->shards = calloc(MAX(src->n_shards, 1u), sizeof(char *));
	if (!dst->name || !dst->format || !dst->shards)
		return -ENOMEM;
	for (size_t i = 0; i < src->n_shards; i++)
		if (!(dst->shards[i] = strdup(src->shards[i])))
			return -ENOMEM;
	return 0;
}

int feed_load(const struct conf_feed *cf, struct io_reader *io, struct feed **ret)
{
	struct feed *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->refs = 1;
	f->state = FEED_READY;
	if (copy_conf(&f->conf, cf) < 0 || !(f->name = strdup(cf->name)) ||
	    !(f->io_engine = strdup(io_reader_engine(io)))) {
		feed_unref(f);
		return -ENOMEM;
	}

	char err[512] = "";
	char **paths = NULL;
	size_t n = 0;
	int r = expand(f, &paths, &n, err, sizeof(err));
	if (r == -ENOMEM) {
		feed_unref(f);
		return r;
	}
	if (r < 0) {
		set_failed(f, r, err);
		*ret = f;
		return 0;
	}
	if ((uint64_t)n > UINT32_MAX - 1) {
		snprintf(err, sizeof(err), "shards: %zu shards, at most %u are supported", n, UINT32_MAX - 1);
		r = -E2BIG;
	}

	f->shards = calloc(MAX(n, 1u), sizeof(*f->shards));
	f->shard_docs = calloc(MAX(n, 1u), sizeof(*f->shard_docs));
	f->doc_tokens = calloc(MAX(n, 1u), sizeof(*f->doc_tokens));
	if (!f->shards || !f->shard_docs || !f->doc_tokens)
		r = -ENOMEM;
	for (size_t i = 0; r == 0 && i < n; i++) {
		r = megatron_open(paths[i], io, &f->shards[i], err, sizeof(err));
		if (r < 0)
			break;
		f->n_shards++;
		f->shard_docs[i] = f->shards[i]->n_docs;
		f->doc_tokens[i] = f->shards[i]->doc_tokens;
		f->n_docs += f->shards[i]->n_docs;
		f->n_nonempty += f->shards[i]->n_nonempty;
		f->n_tokens += f->shards[i]->n_tokens;
		f->n_bytes += f->shards[i]->n_tokens * f->shards[i]->itemsize;
	}
	for (size_t i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	if (r == -ENOMEM) {
		feed_unref(f);
		return r;
	}
	if (r == 0 && f->n_nonempty == 0) {
		snprintf(err, sizeof(err), "the shards hold no tokens (%" PRIu64 " documents, all empty)", f->n_docs);
		r = -ENODATA;
	}
	if (r < 0) {
		set_failed(f, r, err);
		*ret = f;
		return 0;
	}

	f->params = (struct order_params){
		.seed = f->conf.seed,
		.shuffle = f->conf.shuffle,
		.window = f->conf.shuffle_window,
		.n_shards = f->n_shards,
		.shard_docs = f->shard_docs,
	};
	f->fingerprint = fingerprint_of(f);
	log_info("feed %s: %u shards, %" PRIu64 " documents, %" PRIu64 " tokens, read with %s", f->name,
		 f->n_shards, f->n_docs, f->n_tokens, f->io_engine);
	*ret = f;
	return 0;
}

struct feed *feed_ref(struct feed *f)
{
	f->refs++;
	return f;
}

struct feed *feed_unref(struct feed *f)
{
	if (!f || --f->refs > 0)
		return NULL;
	for (uint32_t i = 0; i < f->n_shards; i++)
		megatron_free(f->shards[i]);
	free(f->shards);
	free(f->shard_docs);
	free(f->doc_tokens);
	for (size_t i = 0; f->conf.shards && i < f->conf.n_shards; i++)
		free(f->conf.shards[i]);
	free(f->conf.shards);
	free(f->conf.name);
	free(f->conf.format);
	free(f->io_engine);
	free(f->name);
	free(f);
	return NULL;
}

int feed_check(struct feed *f)
{
	if (f->state != FEED_READY)
		return f->error_code;
	char err[512];
	for (uint32_t i = 0; i < f->n_shards; i++) {
		int r = megatron_check(f->shards[i], err, sizeof(err));
		if (r < 0) {
			set_failed(f, r, err);
			return r;
		}
	}
	return 0;
}
