/* SPDX-License-Identifier: MIT */
/*
 * The work ahead of a feed, for status and metrics (docs/telemetry.md,
 * feeds[].work_ahead): its shuffled windows (feed-windows.c), its shards
 * whose index is still being validated (feed-scan.c), and its text shards
 * counted, indexed and cached (issue #22); a mixture's sums. Reads only
 * what those files publish; owns nothing.
 */
#include <jansson.h>
#include <stdint.h>

#include "daemon/cache/cache.h"
#include "daemon/feed/feed.h"
#include "proto/macro.h"

/* Sums a feed's windows, and its mixture's sources'. */
static void work_ahead(const struct feed *f, struct feed_windows_stats *w, uint32_t *pending)
{
	struct feed_windows_stats one;
	feed_windows_stats(f, &one);
	w->bytes += one.bytes;
	w->builds += one.builds;
	w->built_on_demand += one.built_on_demand;
	w->ready_ahead += one.ready_ahead;
	w->last_build_ns = MAX(w->last_build_ns, one.last_build_ns);
	w->docs_built += one.docs_built;
	w->held += one.held;
	w->ahead += one.ahead;
	w->building += one.building;
	w->evicted += one.evicted;
	w->not_ready += one.not_ready;
	*pending += feed_scan_shards_left(f);
	for (uint32_t i = 0; i < f->n_sources; i++)
		work_ahead(f->sources[i], w, pending);
}

void feed_work_ahead(const struct feed *f, struct feed_windows_stats *ret, uint32_t *ret_index_pending)
{
	*ret = (struct feed_windows_stats){ 0 };
	*ret_index_pending = 0;
	work_ahead(f, ret, ret_index_pending);
}

/* Text shards counted (indexed at least once) and waiting for their window, indexes read from cache_dir; a mixture's sums. */
struct text_work {
	uint64_t indexed, pending, cached, counts, in_memory;
	uint64_t counted_ahead; /* by the background count pass (feed-counts.c) */
	bool pass_running;
};

static void text_work(const struct feed *f, struct text_work *w)
{
	if (f->kind == FEED_TEXT && !f->n_sources) {
		uint32_t n = __atomic_load_n(&f->n_indexed, __ATOMIC_ACQUIRE);
		uint64_t mem = 0;
		bool running;
		w->indexed += n;
		w->pending += f->n_shards - n;
		w->cached += f->n_cached + feed_text_cached(f, &mem);
		w->counts += f->counts_loaded;
		w->in_memory += mem;
		w->counted_ahead += feed_count_pass_stats(f, &running);
		w->pass_running |= running;
	}
	for (uint32_t i = 0; i < f->n_sources; i++)
		text_work(f->sources[i], w);
}

void feed_text_shards(const struct feed *f, uint64_t *ret_indexed, uint64_t *ret_pending)
{
	struct text_work w = { 0 };
	text_work(f, &w);
	*ret_indexed = w.indexed;
	*ret_pending = w.pending;
}

json_t *feed_work_ahead_json(const struct feed *f)
{
	struct feed_windows_stats w;
	uint32_t pending;
	uint64_t copies_open, copies_made, decompressions;
	struct text_work tw = { 0 };
	feed_work_ahead(f, &w, &pending);
	feed_text_copies(f, &copies_open, &copies_made, &decompressions);
	text_work(f, &tw);
	json_t *o = json_pack("{s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I, s:f, s:i, s:I, s:I}", "windows_held", (int)w.held, "windows_ahead",
			 (int)w.ahead, "windows_building", (int)w.building, "window_bytes", (json_int_t)w.bytes,
			 "windows_built", (json_int_t)w.builds, "windows_built_on_demand", (json_int_t)w.built_on_demand,
			 "windows_found_ready", (json_int_t)w.ready_ahead, "windows_evicted", (json_int_t)w.evicted, "last_window_build_seconds",
			 (double)w.last_build_ns / 1e9, "index_shards_pending", (int)pending, "text_copies_open",
			 (json_int_t)copies_open, "text_copies_made", (json_int_t)copies_made);
	if (o) {
		/* Issue #22: text shards are indexed when their window comes up (feed_count_shard). */
		/* Issue #22: walks on the main loop that found their window not built, and waited for the pool. */
		json_object_set_new(o, "windows_not_ready", json_integer((json_int_t)w.not_ready));
		/* Passes that decompressed a compressed shard, for an index or a copy (not the count pass's): one per shard read, cold. */
		json_object_set_new(o, "text_decompressions", json_integer((json_int_t)decompressions));
		json_object_set_new(o, "text_shards_indexed", json_integer((json_int_t)tw.indexed));
		json_object_set_new(o, "text_shards_pending", json_integer((json_int_t)tw.pending));
		json_object_set_new(o, "text_indexes_from_cache", json_integer((json_int_t)tw.cached));
		json_object_set_new(o, "text_counts_from_cache", json_integer((json_int_t)tw.counts));
		json_object_set_new(o, "text_indexes_in_memory", json_integer((json_int_t)tw.in_memory));
		/* The background count pass (feed-counts.c): shards it counted, and whether it still runs. */
		json_object_set_new(o, "text_shards_counted_ahead", json_integer((json_int_t)tw.counted_ahead));
		json_object_set_new(o, "text_count_pass_running", json_boolean(tw.pass_running));
		/* What cache_dir holds now, every feed's and process's: copies, indexes, counts (a scan of the folder). */
		int64_t bytes = f->conf.cache_dir && (tw.indexed || tw.pending) ? cache_usage(f->conf.cache_dir) : 0;
		json_object_set_new(o, "cache_bytes", json_integer((json_int_t)MAX(bytes, INT64_C(0))));
	}
	return o;
}
