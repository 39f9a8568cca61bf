/* SPDX-License-Identifier: MIT */
/* Elastic states (docs/sample-order.md, section 17): merging every rank's into one that any world resumes from. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/libfeed-internal.h"
#include "proto/macro.h"
#include "proto/vstate.h"
#include "proto/wire.h"

FEED_EXPORT int feed_merge_states(const char *const *states, size_t n, char *buf, size_t cap, char *err,
				  size_t errlen)
{
	char dummy[1];
	if (!err || errlen == 0) {
		err = dummy;
		errlen = sizeof(dummy);
	}
	*err = 0;
	if (!states || n == 0 || n > VSTATE_MAX_VRANKS) {
		snprintf(err, errlen, "give the states of every rank of one world (1 to %d)", VSTATE_MAX_VRANKS);
		return -EINVAL;
	}
	struct vstate *parsed = calloc(n, sizeof(*parsed)), merged = { 0 };
	if (!parsed)
		return -ENOMEM;
	int r = 0;
	for (size_t i = 0; i < n && r == 0; i++) {
		r = vstate_parse(states[i], &parsed[i]);
		if (r == -EINVAL)
			snprintf(err, errlen, "state %zu is not an elastic state (fv1-...) or is damaged (bad check digits)", i);
	}
	if (r == 0)
		r = vstate_merge(parsed, n, &merged, err, errlen);
	char *text = NULL;
	if (r == 0) {
		r = vstate_format(&merged, &text);
		if (r >= 0 && (size_t)r >= cap) {
			snprintf(err, errlen, "the merged state takes %d characters, the buffer holds %zu", r, cap ? cap - 1 : 0);
			r = -ENOBUFS;
		} else if (r >= 0) {
			memcpy(buf, text, (size_t)r + 1);
		}
	}
	free(text);
	vstate_clear(&merged);
	for (size_t i = 0; i < n; i++)
		vstate_clear(&parsed[i]);
	free(parsed);
	return r;
}

int client_put_cursor(feed_client *c, const char *cursor, char field[FEED_CURSOR_MAX])
{
	size_t n = cursor ? strlen(cursor) : 0;
	if (n < FEED_CURSOR_MAX) {
		memcpy(field, cursor ? cursor : "", n + 1);
		return 0;
	}
	if (!(c->daemon_flags & WIRE_DAEMON_LONG_STATE))
		return client_fail(c, -EINVAL, "this feedd takes cursors of at most %d bytes; this one has %zu",
				   FEED_CURSOR_MAX - 1, n);
	if (n >= WIRE_STATE_MAX)
		return client_fail(c, -EINVAL, "a cursor is at most %u bytes", WIRE_STATE_MAX - 1);
	uint8_t buf[WIRE_MAX_REQUEST];
	const size_t part = WIRE_MAX_REQUEST - WIRE_HEADER_SIZE;
	for (size_t at = 0; at < n; at += part) {
		size_t k = MIN(part, n - at);
		int h = wire_encode_state_header(buf, WIRE_HEADER_SIZE, k);
		if (h < 0)
			return client_fail(c, h, "cannot encode a STATE message");
		memcpy(buf + WIRE_HEADER_SIZE, cursor + at, k);
		int r = client_send(c, buf, WIRE_HEADER_SIZE + k);
		if (r < 0)
			return client_fail(c, r, "sending to feedd: %s", feed_strerror(r));
	}
	snprintf(field, FEED_CURSOR_MAX, "%s", FEED_CURSOR_IN_STATE_AREA);
	return 0;
}

int client_keep_cursor(const char *text, size_t n, char *fixed, size_t cap, char **buf)
{
	if (n < cap) {
		memcpy(fixed, text, n);
		fixed[n] = 0;
		free(*buf);
		*buf = NULL;
		return 0;
	}
	char *p = realloc(*buf, n + 1);
	if (!p)
		return -ENOMEM;
	memcpy(p, text, n);
	p[n] = 0;
	*buf = p;
	fixed[0] = 0;
	return 0;
}

FEED_EXPORT int feed_client_explain(feed_client *c, const char *feed, uint32_t rank, uint32_t world, const char *cursor,
				    uint32_t batches, char **ret_text)
{
	if (!c || !feed || !ret_text)
		return -EINVAL;
	int saved = errno, r = 0;
	struct wire_explain m = { .rank = rank, .world = world, .batches = batches };
	if (c->attached)
		r = client_fail(c, -EISCONN, "explain is asked on a connection that is not attached");
	else if (!(c->daemon_flags & WIRE_DAEMON_EXPLAIN))
		r = client_fail(c, -EOPNOTSUPP, "this feedd is too old to explain batches");
	else if (strlen(feed) >= sizeof(m.feed))
		r = client_fail(c, -EINVAL, "a feed name is at most %zu bytes", sizeof(m.feed) - 1);
	else if (world == 0 || rank >= world || batches == 0 || batches > WIRE_EXPLAIN_MAX_BATCHES)
		r = client_fail(c, -EINVAL, "explain takes rank < world and 1 to %d batches", WIRE_EXPLAIN_MAX_BATCHES);
	if (r < 0) {
		errno = saved;
		return r;
	}
	snprintf(m.feed, sizeof(m.feed), "%s", feed);
	r = client_put_cursor(c, cursor, m.cursor);
	if (r < 0) {
		errno = saved;
		return r;
	}
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_EXPLAIN_SIZE];
	int n = wire_encode_explain(buf, sizeof(buf), &m);
	errno = saved;
	return client_request_text(c, buf, n, WIRE_EXPLAIN_REPLY, "EXPLAIN", ret_text);
}
