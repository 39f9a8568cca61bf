/* SPDX-License-Identifier: MIT */
/*
 * The shard checker (daemon/feed/checker.h) on real files and real feeds:
 * a sweep finds nothing on unchanged shards, fails the feed (and a
 * mixture, through its source) whose shard changed, calls back once per
 * feed, starts no second sweep while one runs, takes only its budget, and
 * drops the result for a feed that only the sweep still holds.
 */
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/conf/conf.h"
#include "daemon/feed/checker.h"
#include "daemon/feed/feed.h"
#include "daemon/log/log.h"
#include "daemon/source/source.h"
#include "unit.h"

static char dir[256];

static void write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "we");
	REQUIRE(f, "cannot create %s: %s", path, strerror(errno));
	REQUIRE(fwrite(p, 1, n, f) == n && fclose(f) == 0, "write %s", path);
}

/* A Megatron shard of 4 documents of 16 u16 tokens each. */
static void write_shard(const char *sub, unsigned k)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, sub);
	REQUIRE(mkdir(path, 0755) == 0 || errno == EEXIST, "mkdir %s", path);
	uint16_t toks[64];
	for (unsigned i = 0; i < 64; i++)
		toks[i] = (uint16_t)(i + 1 + k);
	snprintf(path, sizeof(path), "%s/%s/s%u.bin", dir, sub, k);
	write_file(path, toks, sizeof(toks));
	uint8_t idx[9 + 8 + 1 + 8 + 8 + 4 * 4 + 4 * 8 + 5 * 8], *p = idx;
#define PUT(v) do { __typeof__(v) v_ = (v); memcpy(p, &v_, sizeof(v_)); p += sizeof(v_); } while (0)
	memcpy(p, "MMIDIDX\0\0", 9);
	p += 9;
	PUT((uint64_t)1);
	PUT((uint8_t)8);
	PUT((uint64_t)4);
	PUT((uint64_t)5);
	for (int d = 0; d < 4; d++)
		PUT((int32_t)16);
	for (int d = 0; d < 4; d++)
		PUT((uint64_t)(32 * d));
	for (int d = 0; d < 5; d++)
		PUT((uint64_t)d);
#undef PUT
	snprintf(path, sizeof(path), "%s/%s/s%u.idx", dir, sub, k);
	write_file(path, idx, (size_t)(p - idx));
}

/* A shard rewritten with other content of another size: its identity changes. */
static void change(const char *sub, unsigned k)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s/s%u.bin", dir, sub, k);
	FILE *f = fopen(path, "ae");
	REQUIRE(f && fputc(0, f) == 0 && fclose(f) == 0, "append to %s", path);
}

struct calls {
	unsigned n;
	struct feed *last;
};

static void on_failed(void *userdata, struct feed *f)
{
	struct calls *c = userdata;
	c->n++;
	c->last = f;
}

static void run(struct event_base *base, struct checker *c)
{
	for (int i = 0; i < 10000 && checker_busy(c); i++)
		event_base_loop(base, EVLOOP_ONCE);
	REQUIRE(!checker_busy(c), "the sweep never finished");
}

static struct feed *load(const struct conf *conf, struct source_reader *io, const char *name)
{
	const struct conf_feed *cf = conf_find_feed(conf, name);
	REQUIRE(cf, "no feed %s", name);
	struct feed *f;
	REQUIRE(feed_load(cf, io, &f) == 0 && f->state == FEED_READY, "feed_load %s: %s", name, f ? f->error : "");
	return f;
}

static int rm_tree(const char *d)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d);
	return system(cmd);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/test-checker-XXXXXX");
	REQUIRE(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	log_set_level(LOG_LEVEL_ERROR);
	for (unsigned k = 0; k < 3; k++) {
		write_shard("a", k);
		write_shard("b", k);
	}
	char path[512], text[2048], err[512];
	snprintf(text, sizeof(text),
		 "[feed.m]\nshards = %s/a/s*.idx\nseq_len = 8\nbatch_size = 2\n"
		 "[feed.mix]\nseq_len = 8\nbatch_size = 2\nsources = a:0.5, b:0.5\n"
		 "[feed.mix.a]\nshards = %s/a/s*.idx\n[feed.mix.b]\nshards = %s/b/s*.idx\n", dir, dir, dir);
	snprintf(path, sizeof(path), "%s/feedd.conf", dir);
	write_file(path, text, strlen(text));
	struct conf *conf;
	REQUIRE(conf_load(path, &conf, err, sizeof(err)) == 0, "conf: %s", err);
	struct source_reader *io;
	REQUIRE(source_reader_new(IO_ENGINE_PREAD, 8, &io) == 0, "source_reader_new");
	struct event_base *base = event_base_new();
	REQUIRE(base, "event_base_new");

	struct calls calls = { 0 };
	struct checker *c;
	REQUIRE(checker_new(base, on_failed, &calls, &c) == 0, "checker_new");
	struct feed *m = load(conf, io, "m"), *m2 = load(conf, io, "m"), *mix = load(conf, io, "mix");

	/* Unchanged shards: nothing fails. The budget is taken, no more; a second sweep waits for the first. */
	uint32_t budget = 2;
	CHECK_INT(checker_add(c, m, &budget), 0);
	CHECK_INT(budget, 0);
	CHECK_INT(m->check_next, 2);
	CHECK_INT(checker_start(c), 0);
	CHECK(checker_busy(c), "a sweep is under way");
	budget = 10;
	CHECK_INT(checker_add(c, m, &budget), -EBUSY);
	CHECK_INT(budget, 10);
	run(base, c);
	budget = 10;
	CHECK_INT(checker_add(c, m, &budget), 0);
	CHECK_INT(checker_add(c, mix, &budget), 0);
	CHECK_INT(budget, 1); /* 3 of m, 6 of the mixture's two sources */
	CHECK_INT(checker_start(c), 0);
	run(base, c);
	CHECK_INT(calls.n, 0);
	CHECK(m->state == FEED_READY && mix->state == FEED_READY, "unchanged shards fail nothing");
	/* Nothing added: no sweep. */
	CHECK_INT(checker_start(c), 0);
	CHECK(!checker_busy(c), "an empty sweep does not start");

	/* A changed shard of a feed that a reload let go of meanwhile: the result is dropped. */
	change("a", 1);
	budget = 1024;
	CHECK_INT(checker_add(c, m2, &budget), 0);
	m2 = feed_unref(m2); /* only the sweep holds it now */
	CHECK_INT(checker_start(c), 0);
	run(base, c);
	CHECK_INT(calls.n, 0);

	/* The same change in a served feed: it fails, once, with the file named. */
	budget = 1024;
	CHECK_INT(checker_add(c, m, &budget), 0);
	CHECK_INT(checker_start(c), 0);
	run(base, c);
	CHECK_INT(calls.n, 1);
	CHECK(calls.last == m, "the callback names the feed");
	CHECK(m->state == FEED_FAILED, "a changed shard fails its feed");
	CHECK_INT(m->error_code, -ESTALE);
	CHECK_CONTAINS(m->error, "s1.bin: changed while serving");

	/* A mixture fails through its source (a, whose s1 changed). */
	calls = (struct calls){ 0 };
	budget = 1024;
	CHECK_INT(checker_add(c, mix, &budget), 0);
	CHECK_INT(checker_start(c), 0);
	run(base, c);
	CHECK_INT(calls.n, 1);
	CHECK(mix->state == FEED_FAILED, "a mixture fails with its source");
	CHECK_CONTAINS(mix->error, "source a: ");
	CHECK_CONTAINS(mix->error, "s1.bin: changed while serving");
	/* A failed feed is not swept again. */
	budget = 1024;
	CHECK_INT(checker_add(c, mix, &budget), 0);
	CHECK_INT(budget, 1024);

	c = checker_free(c);
	feed_unref(m);
	feed_unref(mix);
	event_base_free(base);
	source_reader_free(io);
	conf_free(conf);
	rm_tree(dir);
	return unit_exit("test-checker");
}
