/* SPDX-License-Identifier: MIT */
/*
 * libfeed's telemetry: what the client measures and reports lives in the
 * consumer page the daemon reads (no message per batch); counters of the
 * rings of daemons that went away are carried over (reconnect.c), so the
 * figures cover the whole run of the client.
 */
#include <errno.h>
#include <string.h>

#include "client/libfeed-internal.h"

FEED_EXPORT int feed_client_report(feed_client *c, uint64_t step_ns, uint64_t h2d_ns)
{
	assert_return(c, -EINVAL);
	if (!c->attached)
		return client_fail(c, -ENOTCONN, "not attached to a feed");
	struct feed_consumer_page *p = c->cons;
	if (step_ns)
		__atomic_store_n(&p->reported_step_ns_total, p->reported_step_ns_total + step_ns, __ATOMIC_RELAXED);
	if (h2d_ns)
		__atomic_store_n(&p->h2d_ns_total, p->h2d_ns_total + h2d_ns, __ATOMIC_RELAXED);
	__atomic_store_n(&p->reports, p->reports + 1, __ATOMIC_RELAXED);
	return 0;
}

_Static_assert(FEED_HIST_BUCKETS == 256, "public histogram size matches the ABI");

FEED_EXPORT int feed_client_stats(const feed_client *c, struct feed_stats *ret)
{
	assert_return(c && ret, -EINVAL);
	if (!c->cons && (c->resuming || c->stopped) && c->seq_base > 0) {
		*ret = c->carry; /* between daemons (reconnect.c): what the earlier rings counted */
		return 0;
	}
	if (!c->attached)
		return -ENOTCONN;
	const struct feed_consumer_page *p = c->cons;
	*ret = (struct feed_stats){
		.delivered = p->delivered,
		.wait_ns_total = p->wait_ns_total,
		.step_ns_total = p->step_ns_total,
		.reported_step_ns_total = p->reported_step_ns_total,
		.h2d_ns_total = p->h2d_ns_total,
		.last_wait_ns = p->last_wait_ns,
		.last_step_ns = p->last_step_ns,
	};
	memcpy(ret->hist_wait, p->hist_wait, sizeof(ret->hist_wait));
	memcpy(ret->hist_step, p->hist_step, sizeof(ret->hist_step));
	client_stats_carry(c, ret);
	return 0;
}

FEED_EXPORT uint64_t feed_stats_bucket_lower(unsigned b)
{
	return b >= FEED_HIST_BUCKETS ? UINT64_MAX : feed_hist_lower(b);
}
