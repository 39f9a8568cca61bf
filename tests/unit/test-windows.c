/* SPDX-License-Identifier: MIT */
/*
 * A feed's shared shuffled windows (daemon/feed/feed-windows.c) as the main
 * loop sees them (issue #22): on a thread that set feed_count_never_block(),
 * a window not built yet is refused (order_window_build -EAGAIN, nothing
 * held, nothing shuffled here) and noted as wanted; feed_window_make()
 * builds it (as the pool's window job does), with its token counts, and
 * pins it; the walk then gets it, the same list its own shuffle makes, and
 * the pin goes once the walk took it (and only then, unless forced). A
 * thread that may wait still builds a window nobody built. Real Megatron
 * shards written here, a real feed.
 */
#include <ftw.h>
#include <sys/stat.h>

#include "daemon/conf/conf.h"
#include "daemon/feed/feed.h"
#include "daemon/log/log.h"
#include "daemon/source/source.h"
#include "unit.h"

#define SHARDS 6
#define DOCS 300

static char dir[64];

static int32_t doc_len(uint32_t s, uint32_t d)
{
	return 1 + (int32_t)((s * 131 + d * 7) % 50);
}

static void put(FILE *f, const void *p, size_t n)
{
	REQUIRE(fwrite(p, 1, n, f) == n, "write failed");
}

static void write_shard(uint32_t s)
{
	char path[128];
	snprintf(path, sizeof(path), "%s/s%u.bin", dir, s);
	FILE *bin = fopen(path, "we");
	REQUIRE(bin, "cannot write %s", path);
	for (uint32_t d = 0; d < DOCS; d++)
		for (int32_t o = 0; o < doc_len(s, d); o++)
			put(bin, &(uint16_t){ (uint16_t)(d + o) }, 2);
	REQUIRE(fclose(bin) == 0, "write %s", path);
	snprintf(path, sizeof(path), "%s/s%u.idx", dir, s);
	FILE *f = fopen(path, "we");
	REQUIRE(f, "cannot write %s", path);
	put(f, "MMIDIDX\0\0", 9);
	put(f, &(uint64_t){ 1 }, 8);
	put(f, "\x08", 1); /* u16 */
	put(f, &(uint64_t){ DOCS }, 8);
	put(f, &(uint64_t){ DOCS + 1 }, 8);
	for (uint32_t d = 0; d < DOCS; d++)
		put(f, &(int32_t){ doc_len(s, d) }, 4);
	int64_t at = 0;
	for (uint32_t d = 0; d < DOCS; d++) {
		put(f, &at, 8);
		at += 2 * doc_len(s, d);
	}
	for (uint64_t d = 0; d <= DOCS; d++)
		put(f, &d, 8);
	REQUIRE(fclose(f) == 0, "write %s", path);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

/* Window w of epoch 0 for rank 0 of world 1, its start known. */
static int window(struct feed *f, struct order_epoch *ep, uint32_t w, struct order_window *ret)
{
	CHECK_INT(order_epoch_window(&f->params, ep, w), 0);
	return order_window_build(&f->params, ep, w, 0, 1, ret);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/test-windows-XXXXXX");
	REQUIRE(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	for (uint32_t s = 0; s < SHARDS; s++)
		write_shard(s);
	char path[128], err[512];
	snprintf(path, sizeof(path), "%s/feedd.conf", dir);
	FILE *c = fopen(path, "we");
	REQUIRE(c, "cannot write %s", path);
	fprintf(c, "[feed.w]\nshards = %s/s*.idx\nseq_len = 32\nbatch_size = 2\nseed = 3\nshuffle = true\n"
		   "shuffle_window = 2\nvirtual_ranks = 0\n", dir);
	REQUIRE(fclose(c) == 0, "write %s", path);
	log_set_level(LOG_LEVEL_WARNING);
	struct conf *conf;
	REQUIRE(conf_load(path, &conf, err, sizeof(err)) == 0, "conf: %s", err);
	struct source_reader *io;
	REQUIRE(source_reader_new(IO_ENGINE_PREAD, 64, &io) == 0, "source_reader_new");
	struct feed *f;
	REQUIRE(feed_load(conf_find_feed(conf, "w"), io, &f) == 0 && f->state == FEED_READY, "feed_load");
	REQUIRE(f->params.windows, "the feed shares no windows");

	struct order_epoch ep = { 0 };
	REQUIRE(order_epoch_build(&f->params, 0, &ep) == 0, "order_epoch_build");
	/* What a walk builds for itself: the reference list. */
	struct order_params own = f->params;
	own.windows = NULL;
	struct order_window ref;
	CHECK_INT(order_epoch_window(&own, &ep, 0), 0);
	CHECK_INT(order_window_build(&own, &ep, 0, 0, 1, &ref), 0);

	/* The main loop: refused, nothing held, the window wanted. */
	bool was = feed_count_never_block(true);
	struct order_window win;
	CHECK_INT(window(f, &ep, 0, &win), -EAGAIN);
	struct feed_window_want want[FEED_WINDOW_WANTS];
	unsigned n = feed_windows_wanted(want, FEED_WINDOW_WANTS);
	CHECK_U64(n, 1);
	CHECK(n == 1 && want[0].feed == f && want[0].epoch == 0 && want[0].w == 0 && want[0].k == 0,
	      "wanted: feed %p epoch %" PRIu64 " window %u k %" PRIu64, (void *)want[0].feed, want[0].epoch, want[0].w,
	      want[0].k);
	struct feed_window_want w0 = want[0];
	CHECK_U64(feed_windows_wanted(want, FEED_WINDOW_WANTS), 0); /* taken */

	/* The pool's job: built (or waited for, the builder thread has it queued) and pinned. */
	struct feed_window_pin pin;
	CHECK_INT(feed_window_make(f, &w0, &pin, err, sizeof(err)), 0);
	/* Not taken yet: the pin stays. */
	bool dropped = feed_window_unpin(f, &pin, false);
	CHECK(!dropped, "a window no walk took since it was wanted was unpinned");

	/* The walk gets it now: the list its own shuffle makes, with every document's token count. */
	CHECK_INT(window(f, &ep, 0, &win), 0);
	CHECK(win.shared != NULL, "the walk built its own list on the main loop");
	CHECK_U64(win.mine, ref.mine);
	for (size_t m = 0; m < win.mine && m < ref.mine; m++) {
		uint64_t doc = order_window_doc(&win, m), t = 0;
		CHECK_U64(doc, order_window_doc(&ref, m));
		CHECK(order_window_count(&win, m, &t), "document %zu: no count built with the window", m);
		CHECK_U64(t, (uint64_t)doc_len(ORDER_DOC_SHARD(doc), ORDER_DOC_INDEX(doc)));
	}
	CHECK_U64(feed_windows_wanted(want, FEED_WINDOW_WANTS), 0);
	/* Taken: the pin goes (the walk holds it). */
	CHECK(dropped || feed_window_unpin(f, &pin, false), "the walk took the window, but its pin stays");
	order_window_clear(&win);

	/* A pin whose walk never came is dropped when forced (the session's end). */
	CHECK_INT(window(f, &ep, 2, &win) == -EAGAIN || win.shared, 1);
	if (win.shared)
		order_window_clear(&win);
	n = feed_windows_wanted(want, FEED_WINDOW_WANTS);
	struct feed_window_want w2 = { .feed = f, .epoch = 0, .w = 2, .k = ep.win_start[2],
				       .gets = n ? want[0].gets : UINT64_MAX };
	CHECK_INT(feed_window_make(f, &w2, &pin, err, sizeof(err)), 0);
	CHECK(feed_window_unpin(f, &pin, true), "a forced unpin kept its window");
	/* A window of no such index is refused, nothing pinned. */
	struct feed_window_want bad = { .feed = f, .epoch = 0, .w = 99 };
	CHECK_INT(feed_window_make(f, &bad, &pin, err, sizeof(err)), -ERANGE);
	feed_count_never_block(was);

	/* Off the main loop a walk builds (or waits for) a window nobody built. */
	CHECK_INT(window(f, &ep, 1, &win), 0);
	CHECK(win.shared != NULL, "a walk that may wait got no shared window");
	order_window_clear(&win);

	struct feed_windows_stats st;
	feed_windows_stats(f, &st);
	CHECK(st.not_ready >= 1, "windows_not_ready %" PRIu64 ", expected at least 1", st.not_ready);

	order_window_clear(&ref);
	order_epoch_clear(&ep);
	feed_unref(f);
	source_reader_free(io);
	conf_free(conf);
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return unit_exit("test-windows");
}
