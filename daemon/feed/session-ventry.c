/* SPDX-License-Identifier: MIT */
/*
 * A virtual stream's entry in an elastic state (docs/sample-order.md,
 * section 17.5) and its cursor, one from the other: what a state resumes
 * each stream from, and what a stream's cursor writes into the next state.
 */
#include <errno.h>
#include <stdint.h>

#include "daemon/feed/session-internal.h"
#include "proto/macro.h"
#include "proto/vstate.h"

/* A virtual stream's cursor from its entry in a state; what session_open_streams() resumes from. */
void session_cursor_of_entry(const struct feed *f, uint32_t v, const struct vstate_stream *e, struct cursor *c)
{
	*c = (struct cursor){ .fingerprint = f->fingerprint, .world = f->vranks, .rank = v, .batch = e->f[0] };
	/* Its k_w (issue #22): the walk is seeded with it, nothing before its window counted (section 7.3). */
	if (e->n_sources == 0) {
		c->pos = (struct stream_pos){ .epoch = e->f[1], .window = (uint32_t)e->f[2], .index = e->f[3],
					      .offset = e->f[4], .k = e->kw[0], .has_k = e->has_kw };
		return;
	}
	c->n_sources = e->n_sources;
	c->k = e->f[1];
	c->offset = e->f[2];
	c->row = e->f[3];
	for (uint32_t i = 0; i < e->n_sources && i < MIX_MAX_SOURCES; i++)
		c->src[i] = (struct stream_pos){ .epoch = e->f[4 + 3 * i], .window = (uint32_t)e->f[5 + 3 * i],
						 .index = e->f[6 + 3 * i], .k = e->kw[i], .has_k = e->has_kw };
}

void session_entry_of_cursor(uint32_t v, const struct cursor *c, struct vstate_stream *e)
{
	*e = (struct vstate_stream){ .v = v, .n_sources = c->n_sources };
	e->f[0] = c->batch;
	/* k_w where counts may be unknown (text, issue #22), as fc1/fc2 carry it: every position's, or none. */
	if (c->n_sources == 0) {
		e->f[1] = c->pos.epoch;
		e->f[2] = c->pos.window;
		e->f[3] = c->pos.index;
		e->f[4] = c->pos.offset;
		e->kw[0] = c->pos.k;
		e->has_kw = c->pos.has_k;
		return;
	}
	e->f[1] = c->k;
	e->f[2] = c->offset;
	e->f[3] = c->row;
	for (uint32_t i = 0; i < c->n_sources; i++) {
		e->f[4 + 3 * i] = c->src[i].epoch;
		e->f[5 + 3 * i] = c->src[i].window;
		e->f[6 + 3 * i] = c->src[i].index;
		e->kw[i] = c->src[i].k;
		e->has_kw |= c->src[i].has_k;
	}
}

int session_virtual_from_cursor(const struct feed *f, const struct cursor *c, uint32_t rank, uint32_t world,
				struct vstate *st, struct vstate_stream *e)
{
	if (world != f->vranks || c->fingerprint != f->fingerprint_plain || c->world != world || c->rank != rank)
		return -EINVAL;
	/* With V' = R a rank's one stream is its stream without virtual ranks, row for row (section 17.7). */
	struct cursor one = *c;
	one.batch = c->batch * f->conf.batch_size; /* rows delivered */
	session_entry_of_cursor(rank, &one, e);
	*st = (struct vstate){ .fingerprint = f->fingerprint, .vranks = f->vranks, .world = world, .rank = rank,
			       .batch = c->batch, .n = 1, .s = e };
	return 0;
}
