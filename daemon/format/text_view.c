/* SPDX-License-Identifier: MIT */
/*
 * The format layer's view of text shards (format.h: `format_jsonl`,
 * `format_text`; `format_parquet` wraps the same in text_parquet.c): a
 * struct text_shard (text.h) behind struct shard.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "daemon/format/format.h"
#include "daemon/format/jsonl.h"
#include "daemon/format/text.h"
#include "proto/macro.h"

static int fmt_open(struct shard *sh, const char *name, const struct format_opts *o, struct source_reader *r,
		    char *err, size_t errlen)
{
	struct text_open_opts to = {
		.kind = sh->format == &format_jsonl ? TEXT_JSONL : sh->format == &format_parquet ? TEXT_PARQUET : TEXT_PLAIN,
		.cache_dir = o->cache_dir,
		.cache_max_bytes = o->cache_max_bytes,
		.max_doc_bytes = o->max_doc_bytes,
		.text_key = o->text_key,
		.defer_store = o->defer_store,
		.defer_index = o->defer_index,
	};
	struct text_shard *t;
	int e = text_open(name, &to, r, &t, err, errlen);
	if (e < 0)
		return e;
	*sh = (struct shard){
		.format = sh->format,
		.impl = t,
		.name = t->path,
		.n_docs = t->n_docs,
		.ids = { &t->id },
		.n_ids = 1,
		.bytes = t->bytes,
		.cached = t->cached,
		.truncated = t->truncated,
		.cache_note = t->cache_note,
		.lazy = t->lazy,
		.store_pending = t->store_pending,
		.deferred = !text_indexed(t),
	};
	return 0;
}

static int fmt_index(const struct shard *sh, struct source_reader *r, uint32_t *ret_docs, char *err, size_t errlen)
{
	const struct text_shard *t = sh->impl;
	int e = text_index(sh->impl, r, err, errlen);
	if (e < 0)
		return e;
	*ret_docs = t->n_docs;
	return 0;
}

static int fmt_acquire(const struct shard *sh, struct source_reader *r, char *note, size_t notelen, char *err,
		       size_t errlen)
{
	return text_acquire(sh->impl, r, note, notelen, err, errlen);
}

static void fmt_release(const struct shard *sh)
{
	text_release(sh->impl);
}

static void fmt_prepare(const struct shard *sh)
{
	text_prepare(sh->impl);
}

static int fmt_store(const struct shard *sh, char *err, size_t errlen)
{
	return text_store_index(sh->impl, err, errlen);
}

static void fmt_close(struct shard *sh)
{
	text_free(sh->impl);
}

static int fmt_check(const struct shard *sh, char *err, size_t errlen)
{
	return text_check(sh->impl, err, errlen);
}

static uint64_t fmt_doc_bytes(const struct shard *sh, uint32_t doc)
{
	return ((const struct text_shard *)sh->impl)->lengths[doc];
}

static void fmt_doc_read(const struct shard *sh, uint32_t doc, struct source_read *ret)
{
	const struct text_shard *t = sh->impl;
	/* A lazy shard's copy comes and goes (text_acquire): its source is only read between acquire and release. */
	*ret = (struct source_read){ .src = __atomic_load_n(&t->data, __ATOMIC_ACQUIRE), .offset = t->offsets[doc],
				     .len = t->lengths[doc] };
}

static int fmt_jsonl_text(const struct shard *sh, uint32_t doc, const uint8_t *bytes, size_t len,
			  struct format_state *st, struct format_text *ret, char *why, size_t whylen)
{
	const struct text_shard *t = sh->impl;
	int r = jsonl_extract(&st->jsonl, bytes, len, t->text_key, why, whylen);
	if (r < 0)
		return r;
	*ret = (struct format_text){ .text = st->jsonl.text, .len = st->jsonl.len, .replaced = st->jsonl.replaced,
				     .utf8_valid = st->jsonl.utf8_valid };
	return 0;
}

static int fmt_plain_text(const struct shard *sh, uint32_t doc, const uint8_t *bytes, size_t len,
			  struct format_state *st, struct format_text *ret, char *why, size_t whylen)
{
	*ret = (struct format_text){ .text = (const char *)bytes, .len = len };
	return 0;
}

static void fmt_jsonl_where(const struct shard *sh, uint32_t doc, char *buf, size_t n)
{
	snprintf(buf, n, ":%" PRIu64, text_doc_line(sh->impl, doc));
}

static void fmt_plain_where(const struct shard *sh, uint32_t doc, char *buf, size_t n)
{
	if (n)
		buf[0] = 0;
}

const struct format format_jsonl = {
	.name = "jsonl",
	.content = FORMAT_TEXT,
	.open = fmt_open,
	.close = fmt_close,
	.check = fmt_check,
	.doc_bytes = fmt_doc_bytes,
	.doc_read = fmt_doc_read,
	.doc_text = fmt_jsonl_text,
	.doc_where = fmt_jsonl_where,
	.acquire = fmt_acquire,
	.release = fmt_release,
	.prepare = fmt_prepare,
	.store = fmt_store,
	.index = fmt_index,
};

const struct format format_text = {
	.name = "text",
	.content = FORMAT_TEXT,
	.open = fmt_open,
	.close = fmt_close,
	.check = fmt_check,
	.doc_bytes = fmt_doc_bytes,
	.doc_read = fmt_doc_read,
	.doc_text = fmt_plain_text,
	.doc_where = fmt_plain_where,
	.acquire = fmt_acquire,
	.release = fmt_release,
	.prepare = fmt_prepare,
	.store = fmt_store,
	.index = fmt_index,
};
