/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/feed/feed.h"
#include "daemon/feed/session-epoch.h"
#include "daemon/feed/session-internal.h"
#include "daemon/order/epoch-len.h"
#include "proto/vstate.h"

int feed_epoch_info_supported(const struct feed *f, char *err, size_t errlen)
{
	const char *why = NULL;
	if (f->n_sources)
		why = "is a mixture: each source runs through its epochs at its own pace, so no epoch of the feed has "
		      "a batch count";
	else if (f->kind == FEED_TEXT)
		why = "tokenizes its text on the way: its epoch's token counts are known only once the epoch has been "
		      "tokenized";
	else if (f->conf.packing == CONF_PACKING_BESTFIT)
		why = "packs with bestfit: its rows per epoch are known only by packing the epoch, and its buffers cross "
		      "epochs";
	if (!why)
		return 0;
	snprintf(err, errlen, "feed %s %s; set the training length in steps (max_steps) instead", f->name, why);
	return -EOPNOTSUPP;
}

/* Units per batch: B*L positions (concat) or B rows, one document each (pad). */
static uint64_t unit_per_batch(const struct feed *f)
{
	return f->conf.packing == CONF_PACKING_PAD ? f->conf.batch_size
						   : (uint64_t)f->conf.batch_size * f->conf.seq_len;
}

static const struct feed_epoch_len *cache_find(const struct feed *f, uint32_t rank, uint32_t world,
					       const struct cursor *c, uint64_t state_key)
{
	for (unsigned i = 0; i < FEED_EPOCH_LENS; i++) {
		const struct feed_epoch_len *e = &f->epoch_lens[i];
		if (!e->used || e->rank != rank || e->world != world || e->state_key != state_key)
			continue;
		if (state_key)
			return e; /* virtual ranks: the answer for exactly this state */
		/* The stream's start is the first epoch with batches: the one whose first batch is 0. */
		if (c ? e->epoch == c->pos.epoch : e->first_batch == 0)
			return e;
	}
	return NULL;
}

static void cache_put(struct feed *f, uint32_t rank, uint32_t world, uint64_t state_key,
		      const struct session_epoch_info *info)
{
	struct feed_epoch_len *e = &f->epoch_lens[f->epoch_lens_next++ % FEED_EPOCH_LENS];
	*e = (struct feed_epoch_len){ .used = true, .rank = rank, .world = world, .state_key = state_key,
				      .epoch = info->epoch,
				      .first_batch = info->first_batch, .batches = info->batches, .units = info->units };
}

static void info_of(const struct feed_epoch_len *e, struct session_epoch_info *ret)
{
	*ret = (struct session_epoch_info){ .epoch = e->epoch, .first_batch = e->first_batch, .batches = e->batches,
					    .units = e->units };
}

/* The cache's key of a state (never 0), over what the answer depends on: its streams' rows and positions, its batch. */
static uint64_t state_key_of(const struct vstate *st)
{
	uint64_t h = 1469598103934665603ull;
#define MIXIN(x) (h = (h ^ (uint64_t)(x)) * 1099511628211ull)
	MIXIN(st ? st->batch : UINT64_MAX);
	for (size_t i = 0; st && i < st->n; i++) {
		MIXIN(st->s[i].v);
		for (unsigned k = 0; k < vstate_fields(0); k++)
			MIXIN(st->s[i].f[k]);
	}
#undef MIXIN
	return h | 1;
}

/* The served streams at state st (NULL: the start), for epoch_vranks_measure(); NULL on -ENOMEM. */
static struct epoch_vstream *vstreams_of(const struct session *s, const struct vstate *st)
{
	const uint32_t m = (s->feed->vranks - s->rank + s->world - 1) / s->world;
	struct epoch_vstream *vs = calloc(m, sizeof(*vs));
	if (!vs)
		return NULL;
	size_t e = 0;
	for (uint32_t i = 0; i < m; i++) {
		const uint32_t v = s->rank + i * s->world;
		vs[i].live = session_virtual_live(s, i);
		while (st && e < st->n && st->s[e].v < v)
			e++;
		if (st && e < st->n && st->s[e].v == v && st->s[e].f[0]) {
			const uint64_t *f = st->s[e].f;
			vs[i].rows = f[0];
			vs[i].has_pos = true;
			vs[i].pos = (struct stream_pos){ .epoch = f[1], .window = (uint32_t)f[2], .index = f[3],
							 .offset = f[4] };
		}
	}
	return vs;
}

int session_epoch_info(struct session *s, const struct cursor *c, const struct vstate *st, session_epoch_fn done,
		       void *userdata, struct session_epoch_info *ret, char *err, size_t errlen)
{
	struct feed *f = s->feed;
	int r = feed_epoch_info_supported(f, err, errlen);
	if (r < 0)
		return r;
	const bool elastic = s->virt != NULL;
	if (elastic ? c != NULL : st != NULL) {
		snprintf(err, errlen, elastic ? "feed %s has virtual ranks: ask with an elastic state (fv1-...), not a cursor"
						 : "feed %s has no virtual ranks (virtual_ranks): an elastic state names no position of it",
			 f->name);
		return -EINVAL;
	}
	if (st && (st->fingerprint != f->fingerprint || st->vranks != f->vranks ||
		   (st->world && (st->world != s->world || st->rank != s->rank)))) {
		snprintf(err, errlen, "state is not one of rank %u of world %u of feed %s (nor a global state of it)", s->rank,
			 s->world, f->name);
		return -EINVAL;
	}
	for (size_t i = 0; st && i < st->n; i++) {
		if (st->s[i].n_sources) {
			snprintf(err, errlen, "state is not one of feed %s", f->name);
			return -EINVAL;
		}
	}
	const uint64_t state_key = elastic ? state_key_of(st) : 0;
	if (c) {
		if (c->fingerprint != session_fingerprint(s) || (c->has_data && c->data != f->data_id) || c->world != s->world ||
		    c->rank != s->rank || c->n_sources ||
		    (f->conf.packing == CONF_PACKING_PAD && c->pos.offset)) {
			snprintf(err, errlen, "cursor is not one of rank %u of world %u's stream of feed %s", s->rank,
				 s->world, f->name);
			return -EINVAL;
		}
	}
	const struct feed_epoch_len *e = cache_find(f, s->rank, s->world, c, state_key);
	if (e) {
		info_of(e, ret);
		return 1;
	}
	struct session_epoch_job *j = calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->pj.kind = PRODUCER_EPOCH;
	j->pj.session = s;
	j->has_pos = c != NULL;
	if (c) {
		j->pos = c->pos;
		j->next_batch = c->batch;
	}
	if (elastic) {
		j->state_key = state_key;
		j->next_batch = st ? st->batch : 0;
		j->vs = vstreams_of(s, st);
		if (!j->vs) {
			free(j);
			return -ENOMEM;
		}
	}
	j->done = done;
	j->userdata = userdata;
	session_ref(s);
	producer_submit(s->producer, &j->pj);
	return 0;
}

/* Counts on the pool: a damaged entry ends the walk (the stream, on the main thread, fails the feed when it meets it). */
static int epoch_doc_tokens(void *ctx, uint64_t doc, uint64_t *ret)
{
	char err[512];
	return feed_doc_tokens(ctx, doc, ret, err, sizeof(err));
}

void session_epoch_run(struct session_epoch_job *j)
{
	struct session *s = j->pj.session;
	const struct feed *f = s->feed;
	if (__atomic_load_n(&s->closed, __ATOMIC_RELAXED)) {
		j->result = -ECANCELED;
		return;
	}
	const struct epoch_counts counts = { .tokens = epoch_doc_tokens, .ctx = s->feed };
	const bool per_doc = f->conf.packing == CONF_PACKING_PAD;
	if (j->vs) {
		j->result = epoch_vranks_measure(&f->params, &counts, f->vranks, s->rank, s->world, f->bos_id >= 0,
						 f->eos_id >= 0, per_doc, per_doc ? 1 : f->conf.seq_len, f->conf.batch_size,
						 j->vs, j->next_batch, &j->vm);
		return;
	}
	j->result = epoch_units_measure_counts(&f->params, &counts, s->rank, s->world, f->bos_id >= 0, f->eos_id >= 0,
					       f->conf.packing == CONF_PACKING_PAD, j->has_pos ? &j->pos : NULL, &j->m);
}

void session_epoch_done(struct session *s, struct session_epoch_job *j)
{
	struct feed *f = s->feed;
	struct session_epoch_info info = { 0 };
	char msg[256] = "";
	int r = j->result;
	if (r == 0 && j->vs) {
		info = (struct session_epoch_info){ .epoch = j->vm.epoch, .first_batch = j->vm.first_batch,
						    .batches = j->vm.batches, .units = j->vm.units };
		cache_put(f, s->rank, s->world, j->state_key, &info);
	} else if (r == 0) {
		uint64_t u = unit_per_batch(f);
		uint64_t before = j->m.before / u; /* the epoch's batches before the cursor's */
		if (before > j->next_batch) {
			r = -EINVAL;
		} else {
			info = (struct session_epoch_info){ .epoch = j->m.epoch, .first_batch = j->next_batch - before,
							    .batches = epoch_units_batches(&j->m, u),
							    .units = j->m.total };
			cache_put(f, s->rank, s->world, 0, &info);
		}
	}
	if (r == -EINVAL)
		snprintf(msg, sizeof(msg), "cursor does not name a position in rank %u's stream of feed %s", s->rank,
			 f->name);
	else if (r == -ENODATA)
		snprintf(msg, sizeof(msg), "rank %u of world %u receives no tokens from feed %s", s->rank, s->world,
			 f->name);
	else if (r < 0)
		snprintf(msg, sizeof(msg), "cannot measure the epoch: %s", strerror(-r));
	if (!s->closed)
		j->done(s, r, r < 0 ? NULL : &info, msg, j->userdata);
	free(j->vs);
	free(j);
}
