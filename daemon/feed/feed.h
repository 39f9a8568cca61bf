/* SPDX-License-Identifier: MIT */
/*
 * A feed: a named dataset from the config, its shards opened and validated,
 * and the order parameters that define every rank's stream. A feed that
 * fails to load stays listed, in state FAILED with its reason, so the other
 * feeds keep serving and operators see why. Loaded feeds are immutable and
 * shared read-only by the workers; counters are atomics.
 */
#pragma once

#include <stdint.h>

#include "daemon/conf/conf.h"
#include "daemon/format/megatron.h"
#include "daemon/order/order.h"

enum feed_state {
	FEED_READY,
	FEED_FAILED,
};

struct feed {
	unsigned refs;
	char *name;
	struct conf_feed conf; /* a copy; strings owned by the feed */
	enum feed_state state;
	char error[512];
	int error_code;
	char *io_engine;       /* engine that read the .idx files */

	struct megatron_shard **shards;
	uint32_t n_shards;
	uint32_t *shard_docs;
	const uint32_t **doc_tokens;
	struct order_params params;
	uint64_t fingerprint;
	uint64_t n_docs, n_nonempty, n_tokens, n_bytes;

	/* telemetry, updated by the main thread */
	uint64_t batches;
	uint64_t tokens_served;
	unsigned clients;
	bool draining; /* takes no new attaches (removed from the config) */
};

/*
 * Loads the feed described by cf. Returns 0 with a feed (possibly FAILED, with
 * the reason logged and kept in feed->error); -ENOMEM.
 */
int feed_load(const struct conf_feed *cf, struct io_reader *io, struct feed **ret);
struct feed *feed_ref(struct feed *f);
struct feed *feed_unref(struct feed *f);

/* Re-checks that no shard changed on disk. Returns 0 or -ESTALE (the feed is then FAILED). */
int feed_check(struct feed *f);
