/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: cursors (fc1, fc2) and elastic states (fv1) as feedd and
 * libfeed parse them from a client: any text, k_w fields included (issue
 * #22), since a checkpoint file is the trainer's to damage.
 *
 * Input: the text (NUL-terminated here; parsing stops at a NUL). Promises
 * checked: nothing is read past the text (ASan); an accepted cursor or
 * state is written back and parses to the same value (the writer keeps
 * what the parser took, k_w and the data identity included); a state's
 * <kw> list is all or nothing; a global state merges to itself.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/order/cursor.h"
#include "proto/vstate.h"
#include "tests/fuzz/fuzz.h"

unsigned long fuzz_accepted;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	return 0;
}

static void same_pos(const struct stream_pos *a, const struct stream_pos *b)
{
	assert(a->epoch == b->epoch && a->window == b->window && a->index == b->index && a->offset == b->offset);
	assert(a->has_k == b->has_k && (!a->has_k || a->k == b->k));
}

static void check_cursor(const char *text)
{
	struct cursor c, d;
	if (cursor_parse(text, &c) < 0)
		return;
	fuzz_accepted++;
	char buf[1024];
	int n = cursor_format(&c, buf, sizeof(buf));
	assert(n > 0 && (size_t)n == strlen(buf));
	assert(cursor_parse(buf, &d) == 0);
	assert(c.fingerprint == d.fingerprint && c.has_data == d.has_data && c.data == d.data && c.world == d.world &&
	       c.rank == d.rank && c.batch == d.batch && c.n_sources == d.n_sources);
	if (!c.n_sources) {
		same_pos(&c.pos, &d.pos);
		return;
	}
	assert(c.k == d.k && c.offset == d.offset && c.row == d.row);
	for (uint32_t i = 0; i < c.n_sources; i++) {
		same_pos(&c.src[i], &d.src[i]);
		assert(c.src[i].has_k == c.src[0].has_k); /* fc2: every source's k_w or none */
	}
}

static void check_state(const char *text)
{
	struct vstate st, back, merged;
	if (vstate_parse(text, &st) < 0)
		return;
	fuzz_accepted++;
	for (size_t i = 0; i < st.n; i++)
		assert(st.s[i].has_kw == st.s[0].has_kw);
	char *again = NULL;
	assert(vstate_format(&st, &again) > 0);
	assert(vstate_parse(again, &back) == 0);
	assert(back.fingerprint == st.fingerprint && back.vranks == st.vranks && back.world == st.world &&
	       back.rank == st.rank && back.batch == st.batch && back.n == st.n);
	for (size_t i = 0; i < st.n; i++) {
		const struct vstate_stream *a = &st.s[i], *b = &back.s[i];
		assert(a->v == b->v && a->n_sources == b->n_sources && a->has_kw == b->has_kw);
		assert(memcmp(a->f, b->f, vstate_fields(a->n_sources) * sizeof(uint64_t)) == 0);
		assert(!a->has_kw || memcmp(a->kw, b->kw, vstate_kws(a->n_sources) * sizeof(uint64_t)) == 0);
	}
	char err[256];
	if (st.world == 0 && vstate_merge(&st, 1, &merged, err, sizeof(err)) == 0) {
		char *m = NULL;
		assert(vstate_format(&merged, &m) > 0 && strcmp(m, again) == 0);
		free(m);
		vstate_clear(&merged);
	}
	free(again);
	vstate_clear(&back);
	vstate_clear(&st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > (1u << 16))
		return 0;
	char *text = malloc(size + 1);
	assert(text);
	memcpy(text, data, size);
	text[size] = 0;
	check_cursor(text);
	check_state(text);
	free(text);
	return 0;
}
