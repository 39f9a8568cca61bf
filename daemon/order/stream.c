/* SPDX-License-Identifier: MIT */
/*
 * Walking a rank's stream. Moving forward builds each window's document list
 * once (O(documents in the window)); nothing ever walks backwards.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/order/stream.h"
#include "proto/macro.h"

static uint64_t doc_length(const struct stream *s, uint64_t doc)
{
	return stream_doc_length(s, s->doc_tokens[ORDER_DOC_SHARD(doc)][ORDER_DOC_INDEX(doc)]);
}

static int load_window(struct stream *s, uint32_t w)
{
	uint64_t *docs, first, total;
	size_t n;
	int r = order_window_rank_docs(s->params, &s->ep, w, s->rank, s->world, &docs, &n, &first, &total);
	if (r < 0)
		return r;
	free(s->docs);
	s->docs = docs;
	s->n_docs = n;
	s->first_index = first;
	s->window = w;
	s->at = 0;
	return 0;
}

/*
 * How many epochs in a row may give a rank no token before it is told it
 * never will. Without shuffling every epoch deals the same documents, so one
 * is proof; with shuffling a rank of a feed with few non-empty documents may
 * wait several epochs for one (tests/ref/feed_ref.py uses the same bound).
 */
#define MAX_EMPTY_EPOCHS_SHUFFLED 1000

/* Moves to the next document of this rank, crossing windows and epochs. */
static int next_document(struct stream *s)
{
	int r;
	s->at++;
	while (s->at >= s->n_docs) {
		uint32_t w = s->window + 1;
		if (w >= s->ep.n_windows) {
			s->empty_epochs = s->epoch_had_tokens ? 0 : s->empty_epochs + 1;
			s->epoch_had_tokens = false;
			if (s->empty_epochs >= (s->params->shuffle ? MAX_EMPTY_EPOCHS_SHUFFLED : 1))
				return -ENODATA;
			r = order_epoch_build(s->params, s->ep.epoch + 1, &s->ep);
			if (r < 0)
				return r;
			w = 0;
		}
		r = load_window(s, w);
		if (r < 0)
			return r;
	}
	s->offset = 0;
	s->length = doc_length(s, s->docs[s->at]);
	s->epoch_had_tokens |= s->length > 0;
	return 0;
}

/* Skips empty documents (they still count in k mod R); next_document() bounds the search. */
static int skip_empty(struct stream *s)
{
	while (s->length == 0) {
		int r = next_document(s);
		if (r < 0)
			return r;
	}
	return 0;
}

void stream_clear(struct stream *s)
{
	order_epoch_clear(&s->ep);
	free(s->docs);
	*s = (struct stream){ 0 };
}

int stream_init(struct stream *s, const struct order_params *params, const uint32_t *const *doc_tokens,
		uint32_t rank, uint32_t world, bool bos, bool eos, const struct stream_pos *pos)
{
	int r;
	*s = (struct stream){
		.params = params,
		.doc_tokens = doc_tokens,
		.rank = rank,
		.world = world,
		.bos = bos,
		.eos = eos,
	};
	for (uint32_t i = 0; i < params->n_shards; i++)
		s->epoch_docs += params->shard_docs[i];
	if (world == 0 || rank >= world || s->epoch_docs == 0)
		return -EINVAL;

	struct stream_pos start = pos ? *pos : (struct stream_pos){ 0 };
	r = order_epoch_build(params, start.epoch, &s->ep);
	if (r < 0)
		goto fail;
	r = -EINVAL;
	if (start.window >= s->ep.n_windows)
		goto fail;
	r = load_window(s, start.window);
	if (r < 0)
		goto fail;

	if (!pos) {
		/* The rank's first document may lie in a later window. */
		s->at = (size_t)-1;
		r = next_document(s);
		if (r < 0)
			goto fail;
		r = skip_empty(s);
		if (r < 0)
			goto fail;
		return 0;
	}

	/* A cursor must name one of this rank's non-empty documents, inside it. */
	r = -EINVAL;
	if (start.index < s->first_index || (start.index - s->first_index) % world != 0)
		goto fail;
	uint64_t m = (start.index - s->first_index) / world;
	if (m >= s->n_docs)
		goto fail;
	s->at = (size_t)m;
	s->length = doc_length(s, s->docs[s->at]);
	if (start.offset >= s->length)
		goto fail;
	s->offset = start.offset;
	s->epoch_had_tokens = true;
	return 0;

fail:
	stream_clear(s);
	return r;
}

struct stream_pos stream_tell(const struct stream *s)
{
	return (struct stream_pos){
		.epoch = s->ep.epoch,
		.window = s->window,
		.index = s->first_index + (uint64_t)s->at * s->world,
		.offset = s->offset,
	};
}

struct stream_piece stream_peek(const struct stream *s)
{
	return (struct stream_piece){
		.doc = s->docs[s->at],
		.offset = s->offset,
		.count = 1,
		.length = s->length,
	};
}

int stream_take(struct stream *s, uint64_t max, struct stream_piece *ret)
{
	uint64_t n = MIN(max, s->length - s->offset);
	*ret = (struct stream_piece){
		.doc = s->docs[s->at],
		.offset = s->offset,
		.count = n,
		.length = s->length,
	};
	s->offset += n;
	if (s->offset < s->length)
		return 0;
	int r = next_document(s);
	if (r < 0)
		return r;
	return skip_empty(s);
}
