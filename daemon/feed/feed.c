/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "daemon/cache/cache.h"
#include "daemon/feed/feed.h"
#include "daemon/feed/integrity.h"
#include "daemon/format/text.h"
#include "daemon/log/log.h"
#include "daemon/tok/tok.h"
#include "daemon/tokenize/tokenize.h"
#include "proto/macro.h"

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

static void hash_file(uint64_t *h, const char *path, const struct source_id *id)
{
	hash_bytes(h, path, strlen(path) + 1);
	hash_u64(h, (uint64_t)id->size);
	hash_u64(h, (uint64_t)id->mtime.tv_sec);
	hash_u64(h, (uint64_t)id->mtime.tv_nsec);
}

/*
 * Section 8: a feed one of whose windows can exceed shuffle_list_max is
 * ordered by the bijection there (section 3.1), so its identity names the
 * bijection and M; every other feed's fingerprint stays what it was.
 */
static void hash_permutation(uint64_t *h, const struct feed *f)
{
	if (!order_may_permute(&f->params))
		return;
	hash_bytes(h, "feistel8-v1", 11);
	hash_u64(h, f->params.list_max);
}

/*
 * A text feed's identity: its shards, how text becomes tokens (format, key,
 * the tokenizer file and its settings, the document size limit) and every
 * order parameter.
 */
static uint64_t fingerprint_text(const struct feed *f, const struct source_id *tok_id, uint64_t *ret_alt)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	const struct conf_feed *c = &f->conf;
	hash_bytes(&h, "feedd-text-v1", 13);
	hash_bytes(&h, c->format, strlen(c->format) + 1);
	hash_bytes(&h, c->text_key, strlen(c->text_key) + 1);
	hash_file(&h, c->tokenizer, tok_id);
	hash_bytes(&h, c->tokenizer_preset ? c->tokenizer_preset : "", c->tokenizer_preset ? strlen(c->tokenizer_preset) + 1 : 1);
	hash_u64(&h, f->n_shards);
	for (uint32_t i = 0; i < f->n_shards; i++)
		hash_file(&h, f->shards[i]->name, f->shards[i]->ids[0]);
	uint64_t params[] = { c->seed, c->shuffle, c->shuffle_window, c->seq_len, c->batch_size, (uint64_t)f->bos_id,
			      (uint64_t)f->eos_id, c->encode_special_tokens, c->max_document_bytes };
	for (size_t i = 0; i < ARRAY_SIZE(params); i++)
		hash_u64(&h, params[i]);
	/*
	 * Section 8: whether a window can exceed shuffle_list_max needs every
	 * shard's count, which a text feed knows only once each is indexed
	 * (issue #22), and the fingerprint is of metadata only. So it never
	 * names the bijection; what the old rule added is kept as the
	 * alternative cursors made by it are accepted under.
	 */
	if (f->conf.shuffle && f->conf.shuffle_list_max) {
		uint64_t alt = h;
		hash_bytes(&alt, "feistel8-v1", 11);
		hash_u64(&alt, f->params.list_max);
		*ret_alt = order_mix(alt);
	}
	return order_mix(h);
}

/* The feed's identity: its shards (paths, sizes, mtimes) and every order parameter. */
static uint64_t fingerprint_of(const struct feed *f)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	hash_bytes(&h, "feedd-megatron-v1", 17);
	hash_u64(&h, f->n_shards);
	for (uint32_t i = 0; i < f->n_shards; i++) {
		const struct shard *s = f->shards[i];
		hash_bytes(&h, s->name, strlen(s->name) + 1);
		for (size_t k = 0; k < s->n_ids; k++) {
			hash_u64(&h, (uint64_t)s->ids[k]->size);
			hash_u64(&h, (uint64_t)s->ids[k]->mtime.tv_sec);
			hash_u64(&h, (uint64_t)s->ids[k]->mtime.tv_nsec);
		}
	}
	const struct conf_feed *c = &f->conf;
	uint64_t params[] = { c->seed, c->shuffle, c->shuffle_window, c->seq_len, c->batch_size,
			      (uint64_t)(int64_t)f->bos_id, (uint64_t)(int64_t)f->eos_id };
	for (size_t i = 0; i < ARRAY_SIZE(params); i++)
		hash_u64(&h, params[i]);
	hash_permutation(&h, f);
	return order_mix(h);
}

const char *feed_packing_name(enum conf_packing p)
{
	return p == CONF_PACKING_BESTFIT ? "bestfit" : p == CONF_PACKING_PAD ? "pad" : "concat";
}

/* What packing adds to a stream's identity (section 8): the mode, pack_buffer and pad_id. */
static void hash_packing(uint64_t *h, const struct feed *f)
{
	const char *name = feed_packing_name(f->conf.packing);
	hash_bytes(h, name, strlen(name) + 1);
	hash_u64(h, f->conf.packing == CONF_PACKING_BESTFIT ? f->conf.pack_buffer : 0);
	hash_u64(h, f->conf.packing == CONF_PACKING_CONCAT ? UINT64_MAX : (uint64_t)f->pad_id);
}

/*
 * A feed of one stream packed other than "concat": its stream's fingerprint
 * and the packing. "concat" keeps the stream's own, so its cursors stay valid.
 */
static uint64_t fingerprint_packed(const struct feed *f, uint64_t stream)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	hash_bytes(&h, "feedd-packing-v1", 16);
	hash_u64(&h, stream);
	hash_packing(&h, f);
	return order_mix(h);
}

/*
 * Virtual ranks (section 17): V' = min(virtual_ranks, the documents of an
 * epoch of the smallest source), so every virtual stream is dealt at least
 * one document per epoch; the fingerprint then names V' too, so a cursor
 * without virtual ranks is never resumed as one with them, or the other way.
 */
static int virtualize(struct feed *f)
{
	uint64_t v = f->conf.virtual_ranks;
	if (!v)
		return 0;
	for (uint32_t i = 0; i < MAX(f->n_sources, 1u); i++) {
		struct feed *sf = f->n_sources ? f->sources[i] : f;
		/* Text: counted only until V documents are known (section 17.1: "at least V" is all V' needs). */
		int r = feed_count_until(sf, v);
		if (r < 0)
			return r;
		v = MIN(v, sf->n_docs);
	}
	f->vranks = (uint32_t)MAX(v, UINT64_C(1));
	f->fingerprint_plain = f->fingerprint;
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	hash_bytes(&h, "feedd-virtual-v1", 16);
	hash_u64(&h, f->fingerprint);
	hash_u64(&h, f->vranks);
	f->fingerprint = order_mix(h);
	if (f->fingerprint_alt) {
		h = UINT64_C(0xcbf29ce484222325);
		hash_bytes(&h, "feedd-virtual-v1", 16);
		hash_u64(&h, f->fingerprint_alt);
		hash_u64(&h, f->vranks);
		f->fingerprint_alt = order_mix(h);
	}
	return 0;
}

/* A mixture: the packing, then each source's name, weight and own fingerprint, in `sources` order. */
static uint64_t fingerprint_mixture(const struct feed *f)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	hash_bytes(&h, "feedd-mixture-v1", 16);
	hash_packing(&h, f);
	hash_u64(&h, f->n_sources);
	for (uint32_t i = 0; i < f->n_sources; i++) {
		hash_bytes(&h, f->conf.mix->names[i], strlen(f->conf.mix->names[i]) + 1);
		hash_u64(&h, f->conf.mix->units[i]);
		hash_u64(&h, f->sources[i]->fingerprint);
	}
	return order_mix(h);
}

void feed_fail(struct feed *f, int code, const char *msg)
{
	if (f->state == FEED_FAILED)
		return;
	f->state = FEED_FAILED;
	f->error_code = code;
	snprintf(f->error, sizeof(f->error), "%.*s", (int)sizeof(f->error) - 1, msg);
	log_error("feed %s: %s", f->name, msg);
}

/*
 * A mixture (docs/sample-order.md, section 14): each source loaded as a feed
 * of its own; the first that fails fails the mixture.
 */
static int load_sources(struct feed *f, struct source_reader *io, char *err, size_t errlen)
{
	uint32_t n = f->conf.mix->n;
	if (!(f->sources = calloc(n, sizeof(*f->sources))))
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		struct feed *s;
		int r = feed_load(&f->conf.sources[i], io, &s);
		if (r < 0)
			return r;
		f->sources[f->n_sources++] = s;
		if (s->state != FEED_READY) {
			snprintf(err, errlen, "source %s: %.400s", f->conf.mix->names[i], s->error);
			return s->error_code < 0 ? s->error_code : -EIO;
		}
		/* The mixture's telemetry shows its sources' work. */
		free(s->stages);
		s->stages = f->stages;
		s->stages_borrowed = true;
		f->n_shards += s->n_shards;
		f->n_docs += s->n_docs;
		f->n_nonempty += s->n_nonempty;
		f->n_tokens += s->n_tokens;
		f->n_bytes += s->n_bytes;
	}
	return mix_init(f->conf.seed, f->conf.mix->units, n, &f->mix);
}

/* Opens every shard through the format layer; text shards also go through the bad-record policy. */
static int load_shards(struct feed *f, char **paths, size_t n, struct source_reader *io, char *err, size_t errlen)
{
	f->shards = calloc(MAX(n, 1u), sizeof(*f->shards));
	f->shard_docs = calloc(MAX(n, 1u), sizeof(*f->shard_docs));
	if (!f->shards || !f->shard_docs)
		return -ENOMEM;
	uint64_t scan_budget = FEED_SCAN_AT_LOAD;
	struct format_opts o = {
		.scan_budget = &scan_budget,
		.cache_dir = f->conf.cache_dir,
		.cache_max_bytes = f->conf.cache_max_bytes,
		.max_doc_bytes = f->conf.max_document_bytes,
		.text_key = f->conf.text_key,
		.defer_store = true,
		.defer_index = true, /* text: a stat per shard; indexed when its window comes up (issue #22) */
	};
	/* Creates cache_dir, and removes what crashed builds left in it (daemon/cache/cache.h). */
	int cleaned = f->kind == FEED_TEXT && o.cache_dir ? cache_clean(o.cache_dir, err, errlen) : 0;
	if (cleaned < 0) {
		log_warning("feed %s: %s; text indexes stay in memory", f->name, err);
		o.cache_dir = NULL;
	} else if (cleaned > 0)
		log_notice("feed %s: cache_dir %s: removed %d temporary files of builds that did not finish", f->name,
			   o.cache_dir, cleaned);
	for (size_t i = 0; i < n; i++) {
		struct shard *t;
		int r = format_open(f->format, paths[i], &o, io, &t, err, errlen);
		if (r < 0)
			return r;
		f->shards[i] = t;
		f->n_shards++;
		if (t->deferred) {
			f->shard_docs[i] = ORDER_DOCS_UNKNOWN; /* feed_count_shard() */
			continue;
		}
		f->n_indexed++;
		f->shard_docs[i] = t->n_docs;
		f->n_docs += t->n_docs;
		f->n_nonempty += t->n_nonempty;
		f->n_tokens += t->n_tokens;
		f->n_bytes += t->bytes;
		f->n_cached += t->cached;
		if (t->cache_note && t->cache_note[0])
			log_warning("feed %s: %s", f->name, t->cache_note);
		if (t->truncated[0]) {
			/* The cut line is a bad record: the policy decides. */
			if (!f->conf.skip_bad_records) {
				snprintf(err, errlen, "%s (on_bad_record = fail)", t->truncated);
				return -EBADMSG;
			}
			f->counters.bad_records++;
			snprintf(f->counters.last_bad, sizeof(f->counters.last_bad), "%s", t->truncated);
			log_warning("feed %s: %s", f->name, t->truncated);
		}
	}
	if (f->kind != FEED_TEXT)
		return 0;
	/* Counts a previous start kept: the windows' starts and the totals known without reading a shard. */
	int known = feed_counts_load(f);
	if (known < 0)
		return known;
	/* Text: every document counts, and the token counts are known only once tokenized. */
	f->n_nonempty = f->n_docs;
	const struct feed_counters *k = &f->counters;
	if ((double)k->bad_records > f->conf.max_bad_fraction * (double)f->n_docs) {
		snprintf(err, errlen, "%" PRIu64 " bad records, more than max_bad_fraction %g of the feed's %" PRIu64
			 " documents; the latest: %.300s", k->bad_records, f->conf.max_bad_fraction, f->n_docs, k->last_bad);
		return -EBADMSG;
	}
	return 0;
}

static int resolve_special(struct feed *f, const char *what, const char *name, int64_t id, int32_t *ret, char *err,
			   size_t errlen)
{
	if (!name) {
		*ret = id == CONF_TOKEN_NONE ? -1 : (int32_t)id;
		return 0;
	}
	int r = tok_special_id(f->tok, name);
	if (r < 0) {
		snprintf(err, errlen, "%s: the tokenizer %s has no special token '%s'", what, f->conf.tokenizer, name);
		return -EINVAL;
	}
	*ret = r;
	return 0;
}

static uint64_t tok_generations;

/* Loads the feed's tokenizer, if it names one, and resolves bos/eos given by name. */
static int load_tokenizer(struct feed *f, char *err, size_t errlen)
{
	f->bos_id = f->eos_id = -1;
	if (f->conf.tokenizer) {
		_cleanup_free_ char *msg = NULL;
		int r = tokenize_tok_load(f->conf.tokenizer, f->conf.tokenizer_preset, &f->tok, &msg);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			snprintf(err, errlen, "%s: tokenizer: %s", f->conf.tokenizer_at ? f->conf.tokenizer_at : "",
				 msg ? msg : strerror(-r));
			return r;
		}
		f->tok_generation = __atomic_add_fetch(&tok_generations, 1, __ATOMIC_RELAXED);
	}
	int r = resolve_special(f, "bos", f->conf.bos_name, f->conf.bos, &f->bos_id, err, errlen);
	if (r == 0)
		r = resolve_special(f, "eos", f->conf.eos_name, f->conf.eos, &f->eos_id, err, errlen);
	return r;
}

static int load(const struct conf_feed *cf, struct source_reader *io, struct feed **ret)
{
	struct feed *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->refs = 1;
	f->state = FEED_READY;
	f->format = format_find(cf->format);
	f->kind = f->format && f->format->content == FORMAT_TOKENS ? FEED_MEGATRON : FEED_TEXT;
	if (conf_feed_copy(&f->conf, cf) < 0 || !(f->name = strdup(cf->name)) ||
	    !(f->io_engine = strdup(source_reader_engine(io))) || !(f->stages = calloc(1, sizeof(*f->stages)))) {
		feed_unref(f);
		return -ENOMEM;
	}

	char err[512] = "";
	char **paths = NULL;
	size_t n = 0;
	int r = 0;
	if (cf->mix) {
		r = load_tokenizer(f, err, sizeof(err));
		if (r == 0)
			r = load_sources(f, io, err, sizeof(err));
		if (r == -ENOMEM) {
			feed_unref(f);
			return r;
		}
		if (r < 0) {
			feed_fail(f, r, err);
		} else {
			f->pad_id = f->conf.pad_id != CONF_TOKEN_NONE ? (int32_t)f->conf.pad_id : f->eos_id >= 0 ? f->eos_id : 0;
			f->fingerprint = fingerprint_mixture(f);
			f->data_id = feed_data_identity(f);
			if ((r = virtualize(f)) < 0) {
				*ret = f; /* failed with the source that could not be counted */
				return 0;
			}
			log_info("feed %s: a mixture of %u sources, %" PRIu64 " documents, packing %s", f->name,
				 f->n_sources, f->n_docs, feed_packing_name(f->conf.packing));
		}
		*ret = f;
		return 0;
	}
	r = source_glob((const char *const *)f->conf.shards, f->conf.n_shards, &paths, &n, err, sizeof(err));
	if (r == -ENOMEM) {
		feed_unref(f);
		return r;
	}
	if (r < 0) {
		feed_fail(f, r, err);
		*ret = f;
		return 0;
	}
	if (!f->format) {
		snprintf(err, sizeof(err), "format: '%s' is not a format feedd reads", cf->format);
		r = -EINVAL;
	} else if ((uint64_t)n > UINT32_MAX - 1) {
		snprintf(err, sizeof(err), "shards: %zu shards, at most %u are supported", n, UINT32_MAX - 1);
		r = -E2BIG;
	}

	if (r == 0)
		r = load_tokenizer(f, err, sizeof(err));
	if (r == 0)
		r = load_shards(f, paths, n, io, err, sizeof(err));
	for (size_t i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	if (r == -ENOMEM) {
		feed_unref(f);
		return r;
	}
	if (r == 0)
		r = feed_scan_start(f); /* Megatron: validates indexes; text: writes the indexes load built to cache_dir */
	if (r == -ENOMEM) {
		feed_unref(f);
		return r;
	}
	f->params = (struct order_params){
		.seed = f->conf.seed,
		.shuffle = f->conf.shuffle,
		.window = f->conf.shuffle_window,
		.n_shards = f->n_shards,
		.shard_docs = f->shard_docs,
		.list_max = f->conf.shuffle_list_max,
		.count = f->kind == FEED_TEXT ? feed_count_shard : NULL,
		.count_ctx = f,
		.hold = f->kind == FEED_TEXT ? feed_hold_shard : NULL,
	};
	/*
	 * Stored tokens: the first non-empty document answers, wherever the
	 * scan is. Text: shards counted in epoch 0's order until one document
	 * is found (usually the first shard of window 0).
	 */
	int any = r == 0 ? feed_nonempty_at_least(f, 1) : 1;
	if (any < 0) {
		*ret = f;
		return 0;
	}
	if (r == 0 && !any) {
		snprintf(err, sizeof(err), "the shards hold no %s (%" PRIu64 " documents, all empty)",
			 f->kind == FEED_TEXT ? "documents" : "tokens", f->n_docs);
		r = -ENODATA;
	}
	if (r < 0) {
		feed_fail(f, r, err);
		*ret = f;
		return 0;
	}

	if (feed_windows_new(f) < 0) {
		feed_unref(f);
		return -ENOMEM;
	}
	if (f->kind == FEED_TEXT && tokenize_pool_new(&f->huge) < 0) {
		feed_unref(f);
		return -ENOMEM;
	}
	if (f->kind == FEED_TEXT) {
		struct stat st;
		struct source_id tid = { 0 };
		if (stat(f->conf.tokenizer, &st) == 0)
			tid = (struct source_id){ .size = (uint64_t)st.st_size, .mtime = st.st_mtim };
		f->fingerprint = fingerprint_text(f, &tid, &f->fingerprint_alt);
		log_info("feed %s: %u %s shards (%u counted so far, %u of them from cache_dir; the others when their window comes up), read with %s",
			 f->name, f->n_shards, f->conf.format, f->n_indexed, f->counts_loaded, f->io_engine);
	} else {
		f->fingerprint = fingerprint_of(f);
		if (feed_scan_pending(f))
			log_info("feed %s: %u shards, %" PRIu64 " documents (%u indexes being validated), read with %s",
				 f->name, f->n_shards, f->n_docs, feed_scan_shards_left(f), f->io_engine);
		else
			log_info("feed %s: %u shards, %" PRIu64 " documents, %" PRIu64 " tokens, read with %s", f->name,
				 f->n_shards, f->n_docs, f->n_tokens, f->io_engine);
	}
	f->pad_id = f->conf.pad_id != CONF_TOKEN_NONE ? (int32_t)f->conf.pad_id : f->eos_id >= 0 ? f->eos_id : 0;
	if (f->conf.packing != CONF_PACKING_CONCAT) {
		f->fingerprint = fingerprint_packed(f, f->fingerprint);
		if (f->fingerprint_alt)
			f->fingerprint_alt = fingerprint_packed(f, f->fingerprint_alt);
	}
	f->data_id = feed_data_identity(f);
	virtualize(f);
	/* Text: the shards no window reached yet, counted in the background (a thread that fails to start is only slower totals). */
	if (f->state == FEED_READY && feed_count_pass_start(f) < 0)
		log_warning("feed %s: no background count of its shards (no thread): they are counted as their windows come up",
			    f->name);
	*ret = f;
	return 0;
}

int feed_load(const struct conf_feed *cf, struct source_reader *io, struct feed **ret)
{
	/*
	 * The shards load counts (until a document, or virtual_ranks of them)
	 * keep only a copy in memory: a file copy is made when read (text.h,
	 * text_index_keeps_files), so that READY never waits for writing one.
	 */
	const bool keep = text_index_keeps_files(false);
	int r = load(cf, io, ret);
	text_index_keeps_files(keep);
	return r;
}

struct feed *feed_ref(struct feed *f)
{
	f->refs++;
	return f;
}

struct feed *feed_unref(struct feed *f)
{
	if (!f)
		return NULL;
	/* unsigned: one unref too many would wrap to UINT_MAX and leak, or free later under a holder */
	assert(f->refs > 0);
	if (--f->refs > 0)
		return NULL;
	feed_watch_prep_release(f); /* the descriptors the loader readied for a watch it never got */
	feed_scan_free(f); /* it reads the shards */
	feed_count_pass_free(f); /* so does it */
	feed_windows_free(f);
	if (feed_counts_store(f) < 0)
		log_warning("feed %s: cannot keep its shards' counts in cache_dir %s", f->name, f->conf.cache_dir);
	f->counts_pin = cache_unpin(f->counts_pin);
	for (uint32_t i = 0; f->shards && i < f->n_shards; i++)
		format_close(f->shards[i]);
	for (uint32_t i = 0; f->counters.bad_seen && i < f->n_shards; i++)
		free(f->counters.bad_seen[i]);
	free(f->counters.bad_seen);
	for (uint32_t i = 0; f->counters.tok_seen && i < f->n_shards; i++)
		free(f->counters.tok_seen[i]);
	free(f->counters.tok_seen);
	tokenize_pool_free(f->huge);
	tok_free(f->tok);
	free(f->shards);
	free(f->shard_docs);
	for (uint32_t i = 0; f->sources && i < f->n_sources; i++)
		feed_unref(f->sources[i]);
	free(f->sources);
	conf_feed_done(&f->conf);
	free(f->io_engine);
	if (!f->stages_borrowed)
		free(f->stages);
	free(f->name);
	free(f);
	return NULL;
}

int feed_mark_bad(struct feed *f, uint64_t doc, const char *why)
{
	struct feed_counters *k = &f->counters;
	uint32_t s = ORDER_DOC_SHARD(doc), d = ORDER_DOC_INDEX(doc);
	if (!k->bad_seen && !(k->bad_seen = calloc(f->n_shards, sizeof(*k->bad_seen))))
		return -ENOMEM;
	if (!k->bad_seen[s] && !(k->bad_seen[s] = calloc((f->shard_docs[s] + 63) / 64, sizeof(uint64_t))))
		return -ENOMEM;
	uint64_t bit = UINT64_C(1) << (d % 64);
	if (k->bad_seen[s][d / 64] & bit)
		return 0;
	k->bad_seen[s][d / 64] |= bit;
	__atomic_add_fetch(&k->bad_records, 1, __ATOMIC_RELAXED); /* feed_count_shard() adds truncated shards off the main loop */
	snprintf(k->last_bad, sizeof(k->last_bad), "%s", why);
	/* Logged, but not a line per record for a feed full of them. */
	if (k->bad_records <= 10)
		log_warning("feed %s: skipped a bad record: %s%s", f->name, why,
			    k->bad_records == 10 ? " (further ones are only counted)" : "");
	return 1;
}

int feed_check_bad(struct feed *f, char *msg, size_t msglen)
{
	const struct feed_counters *k = &f->counters;
	/* Every document bad fails too (max_bad_fraction = 1): nothing is left to serve, however many epochs are walked. */
	const bool all = k->bad_records >= f->n_docs;
	if (!all && (double)k->bad_records <= f->conf.max_bad_fraction * (double)f->n_docs)
		return 0;
	if (all)
		snprintf(msg, msglen, "feed %s: every one of its %" PRIu64 " documents is a bad record; the latest: %s", f->name,
			 f->n_docs, k->last_bad);
	else
		snprintf(msg, msglen,
			 "%" PRIu64 " bad records skipped, more than max_bad_fraction %g of the feed's %" PRIu64
			 " documents; the latest: %s",
			 k->bad_records, f->conf.max_bad_fraction, f->n_docs, k->last_bad);
	feed_fail(f, -EBADMSG, msg);
	return -EBADMSG;
}

void feed_count_batch(struct feed *f, const struct pack_counters *counts, const uint64_t *src_docs)
{
	struct feed_counters *k = &f->counters;
	k->tokens_served += (uint64_t)f->conf.batch_size * f->conf.seq_len;
	k->batches++;
	pack_counters_add(&k->packed, counts);
	for (uint32_t i = 0; src_docs && i < f->n_sources; i++)
		k->source_docs[i] += src_docs[i];
}

int feed_count_tokens(struct feed *f, uint64_t doc, uint64_t tokens)
{
	struct feed_counters *k = &f->counters;
	if (f->kind != FEED_TEXT || k->tok_done)
		return 0;
	uint32_t s = ORDER_DOC_SHARD(doc), d = ORDER_DOC_INDEX(doc);
	if (s >= f->n_shards || d >= __atomic_load_n(&f->shard_docs[s], __ATOMIC_ACQUIRE))
		return 0;
	if (!k->tok_seen && !(k->tok_seen = calloc(f->n_shards, sizeof(*k->tok_seen))))
		return -ENOMEM;
	if (!k->tok_seen[s] && !(k->tok_seen[s] = calloc((f->shard_docs[s] + 63) / 64, sizeof(uint64_t))))
		return -ENOMEM;
	uint64_t bit = UINT64_C(1) << (d % 64);
	if (!(k->tok_seen[s][d / 64] & bit)) {
		k->tok_seen[s][d / 64] |= bit;
		k->tok_counted += tokens;
		k->tok_counted_docs++;
	}
	/*
	 * Every document of the feed: only once every shard is counted (indexed
	 * when its window came up), read first: n_docs is added to before
	 * n_indexed (release), so it is then final. Asked again for a document
	 * seen already: the last shard counted may have had no document.
	 */
	if (__atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE) == f->n_shards &&
	    k->tok_counted_docs == __atomic_load_n(&f->n_docs, __ATOMIC_RELAXED)) {
		k->tok_done = true;
		f->n_tokens = k->tok_counted;
		for (uint32_t i = 0; i < f->n_shards; i++)
			free(k->tok_seen[i]);
		free(k->tok_seen);
		k->tok_seen = NULL;
	}
	return 0;
}

int feed_check(struct feed *f)
{
	if (f->state != FEED_READY)
		return f->error_code;
	char err[512];
	for (uint32_t i = 0; i < f->n_sources; i++) {
		int r = feed_check(f->sources[i]);
		if (r < 0) {
			snprintf(err, sizeof(err), "source %s: %.400s", f->conf.mix->names[i], f->sources[i]->error);
			feed_fail(f, r, err);
			return r;
		}
	}
	if (f->sources)
		return 0;
	feed_scan_poll(f);
	if (f->state != FEED_READY)
		return f->error_code;
	for (uint32_t i = 0; i < f->n_shards; i++) {
		int r = format_check(f->shards[i], err, sizeof(err));
		if (r < 0) {
			feed_fail(f, r, err);
			return r;
		}
	}
	return 0;
}

json_t *feed_packing_json(const struct feed *f)
{
	const struct pack_counters *c = &f->counters.packed;
	json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:I}", "mode", feed_packing_name(f->conf.packing),
			      "positions", (json_int_t)c->positions, "tokens", (json_int_t)c->tokens, "truncated",
			      (json_int_t)c->truncated, "documents", (json_int_t)c->docs, "cut_documents",
			      (json_int_t)c->cut_docs, "efficiency", pack_counters_efficiency(c), "pad_id",
			      (json_int_t)f->pad_id);
	if (!o)
		return NULL;
	json_object_set_new(o, "pack_buffer", f->conf.packing == CONF_PACKING_BESTFIT
						      ? json_integer((json_int_t)f->conf.pack_buffer) : json_null());
	if (f->conf.packing == CONF_PACKING_CONCAT)
		json_object_set_new(o, "pad_id", json_null());
	if (!f->conf.mix)
		return o;
	/* A mixture: each source's documents served, against its weight (realised proportions). */
	json_t *a = json_array();
	uint64_t units = 0, docs = 0;
	for (uint32_t i = 0; i < f->conf.mix->n; i++) {
		units += f->conf.mix->units[i];
		docs += f->counters.source_docs[i];
	}
	for (uint32_t i = 0; a && i < f->conf.mix->n; i++)
		json_array_append_new(a, json_pack("{s:s, s:f, s:I, s:f}", "name", f->conf.mix->names[i], "weight",
						   (double)f->conf.mix->units[i] / (double)units, "documents",
						   (json_int_t)f->counters.source_docs[i], "share",
						   docs ? (double)f->counters.source_docs[i] / (double)docs : 0.0));
	json_object_set_new(o, "sources", a ? a : json_null());
	return o;
}
