/* SPDX-License-Identifier: MIT */
/*
 * EPOCH_INFO: how many batches the attached rank's current epoch has
 * (docs/sample-order.md, section 16). Asked only of a daemon that says it
 * answers (WIRE_DAEMON_EPOCH_INFO): an older one would drop the connection
 * for a message type it does not know.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/libfeed-internal.h"

FEED_EXPORT int feed_client_epoch_info(feed_client *c, const char *cursor, struct feed_epoch_info *ret)
{
	assert_return(c && ret, -EINVAL);
	int saved = errno;
	int r = 0;
	struct wire_epoch_info m = { 0 };
	if (!c->attached)
		r = client_fail(c, -ENOTCONN, "not attached to a feed");
	else if (c->stopped)
		r = c->stopped;
	else if (!(c->daemon_flags & WIRE_DAEMON_EPOCH_INFO))
		r = client_fail(c, -EOPNOTSUPP, "this feedd is too old to tell an epoch's length; set the training "
				"length in steps (max_steps) instead");
	else
		r = client_put_cursor(c, cursor ? cursor : "", m.cursor); /* a long elastic state goes ahead (STATE) */
	if (r < 0) {
		errno = saved;
		return r;
	}
	uint8_t buf[WIRE_HEADER_SIZE + WIRE_EPOCH_INFO_SIZE];
	int n = wire_encode_epoch_info(buf, sizeof(buf), &m);
	r = n < 0 ? n : client_send(c, buf, (size_t)n);
	if (r < 0) {
		errno = saved;
		return client_fail(c, r, "sending to feedd: %s", feed_strerror(r));
	}
	void *p;
	size_t len;
	int type = client_recv_msg(c, REPLY_TIMEOUT_MS, &p, &len, NULL, 0, NULL);
	errno = saved;
	if (type < 0) {
		/* The ERROR that stops the stream may come first: then it is the stream's, for next() too. */
		if (__atomic_load_n(&c->hdr->state, __ATOMIC_ACQUIRE) != FEED_RING_RUNNING)
			c->stopped = type;
		return type;
	}
	struct wire_epoch_info_reply rep;
	r = type == WIRE_EPOCH_INFO_REPLY ? wire_decode_epoch_info_reply(p, len, &rep) : -EPROTO;
	free(p);
	if (r < 0)
		return client_fail(c, -EPROTO, "feedd sent an unexpected reply to EPOCH_INFO");
	*ret = (struct feed_epoch_info){ .epoch = rep.epoch, .batches = rep.batches, .first_batch = rep.first_batch,
					 .units = rep.units };
	return 0;
}
