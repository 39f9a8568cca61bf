/* SPDX-License-Identifier: MIT */
/*
 * feedd.conf loading (daemon/conf/conf.h), on real files in a temporary
 * directory: the defaults, every key of [feedd] and [feed.NAME], shard globs
 * resolved against the config's directory, and for each kind of mistake an
 * error naming "path:LINE:" so an operator can go straight to it.
 */
#include <ftw.h>
#include <sys/stat.h>

#include "daemon/conf/conf.h"
#include "daemon/log/log.h"
#include "unit.h"

static char dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void cleanup(void)
{
	if (dir[0])
		nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Writes text to dir/name and returns the path (static buffer of the caller's). */
static void write_conf(const char *name, const char *text, char *path, size_t cap)
{
	snprintf(path, cap, "%s/%s", dir, name);
	FILE *f = fopen(path, "we");
	REQUIRE(f, "cannot create %s: %s", path, strerror(errno));
	fputs(text, f);
	REQUIRE(fclose(f) == 0, "cannot write %s", path);
}

static struct conf *load_ok(const char *what, const char *text)
{
	char path[256], err[512] = "";
	struct conf *c = NULL;
	write_conf("ok.conf", text, path, sizeof(path));
	int r = conf_load(path, &c, err, sizeof(err));
	CHECK(r == 0 && c, "%s: conf_load returned %d: %s", what, r, err);
	return r == 0 ? c : NULL;
}

/*
 * The file must fail to load with an error that starts "path:LINE:" for one
 * of the allowed lines (line2 = 0: only line) and mentions `needle`.
 */
static void load_bad(const char *what, const char *text, int line, int line2, const char *needle)
{
	char path[256], err[512] = "", want[300], want2[300];
	struct conf *c = NULL;
	write_conf("bad.conf", text, path, sizeof(path));
	int r = conf_load(path, &c, err, sizeof(err));
	CHECK(r == -EINVAL, "%s: conf_load returned %d (%s), expected -EINVAL", what, r, err);
	if (r == 0) {
		conf_free(c);
		return;
	}
	snprintf(want, sizeof(want), "%s:%d: ", path, line);
	snprintf(want2, sizeof(want2), "%s:%d: ", path, line2 ? line2 : line);
	CHECK(strncmp(err, want, strlen(want)) == 0 || strncmp(err, want2, strlen(want2)) == 0,
	      "%s: error \"%s\" does not start with \"%s\"%s%s", what, err, want, line2 ? " or " : "",
	      line2 ? want2 : "");
	CHECK(strstr(err, needle), "%s: error \"%s\" does not mention \"%s\"", what, err, needle);
}

static void test_defaults(void)
{
	struct conf *c = load_ok("defaults", "[feed.main]\nshards = /data/*.idx\n");
	if (!c)
		return;
	CHECK(c->socket == NULL, "socket defaults to \"%s\", expected NULL (the built-in path)", c->socket);
	CHECK_U64(c->threads, 0);
	CHECK_U64(c->ring_slots, 4);
	CHECK_INT(c->log_level, LOG_LEVEL_INFO);
	CHECK_INT(c->io_engine, IO_ENGINE_AUTO);
	CHECK_U64(c->io_depth, 64);
	CHECK_U64(c->n_feeds, 1);
	const struct conf_feed *f = conf_find_feed(c, "main");
	CHECK(f, "feed main not found");
	if (f) {
		CHECK_STR(f->format, "megatron");
		CHECK_U64(f->n_shards, 1);
		CHECK_STR(f->shards[0], "/data/*.idx");
		CHECK_U64(f->seq_len, 4096);
		CHECK_U64(f->batch_size, 8);
		CHECK_U64(f->seed, 0);
		CHECK(f->shuffle, "shuffle defaults to off");
		CHECK_U64(f->shuffle_window, 4);
		CHECK_U64(f->shuffle_list_max, UINT64_C(1) << 21);
		CHECK_INT(f->bos, CONF_TOKEN_NONE);
		CHECK_INT(f->eos, CONF_TOKEN_NONE);
	}
	conf_free(c);

	/* No feeds at all is a valid (if idle) daemon. */
	c = load_ok("empty file", "");
	if (c) {
		CHECK_U64(c->n_feeds, 0);
		CHECK(conf_find_feed(c, "main") == NULL, "a feed was found in an empty file");
		conf_free(c);
	}
}

static void test_all_keys(void)
{
	struct conf *c = load_ok("all keys",
				 "# feedd test configuration\n"
				 "[feedd]\n"
				 "socket = /tmp/feedd-unit.sock\n"
				 "threads = 3\n"
				 "ring_slots = 16\n"
				 "log_level = debug\n"
				 "io_engine = pread\n"
				 "io_depth = 128\n"
				 "\n"
				 "[feed.pretrain]\n"
				 "format = megatron\n"
				 "shards = data/a_*.idx, /abs/b.idx ,sub/c.idx\n"
				 "seq_len = 2048\n"
				 "batch_size = 4\n"
				 "seed = 18446744073709551615\n"
				 "shuffle = false\n"
				 "shuffle_window = 9\n"
				 "shuffle_list_max = 1000\n"
				 "bos = 1\n"
				 "eos = 2147483647\n"
				 "\n"
				 "[feed.other-1.x_Y]\n"
				 "shards = x.idx\n"
				 "shuffle = yes\n"
				 "bos = none\n"
				 "eos = 0\n"
				 "seq_len = 1048576\n"
				 "batch_size = 255\n"
				 "shuffle_window = 1\n");
	if (!c)
		return;
	CHECK_STR(c->socket, "/tmp/feedd-unit.sock");
	CHECK_U64(c->threads, 3);
	CHECK_U64(c->ring_slots, 16);
	CHECK_INT(c->log_level, LOG_LEVEL_DEBUG);
	CHECK_INT(c->io_engine, IO_ENGINE_PREAD);
	CHECK_U64(c->io_depth, 128);
	CHECK_U64(c->n_feeds, 2);

	char want[256];
	const struct conf_feed *f = conf_find_feed(c, "pretrain");
	CHECK(f, "feed pretrain not found");
	if (f) {
		CHECK_STR(f->name, "pretrain");
		CHECK_STR(f->format, "megatron");
		CHECK_U64(f->n_shards, 3);
		if (f->n_shards == 3) {
			/* Relative globs are relative to the config file, not to the daemon's cwd. */
			snprintf(want, sizeof(want), "%s/data/a_*.idx", dir);
			CHECK_STR(f->shards[0], want);
			CHECK_STR(f->shards[1], "/abs/b.idx");
			snprintf(want, sizeof(want), "%s/sub/c.idx", dir);
			CHECK_STR(f->shards[2], want);
		}
		CHECK_U64(f->seq_len, 2048);
		CHECK_U64(f->batch_size, 4);
		CHECK_U64(f->seed, UINT64_MAX);
		CHECK(!f->shuffle, "shuffle = false read as true");
		CHECK_U64(f->shuffle_window, 9);
		CHECK_U64(f->shuffle_list_max, 1000);
		CHECK_INT(f->bos, 1);
		CHECK_INT(f->eos, INT32_MAX);
	}
	f = conf_find_feed(c, "other-1.x_Y");
	CHECK(f, "feed other-1.x_Y not found");
	if (f) {
		CHECK_U64(f->n_shards, 1);
		snprintf(want, sizeof(want), "%s/x.idx", dir);
		if (f->n_shards == 1)
			CHECK_STR(f->shards[0], want);
		CHECK(f->shuffle, "shuffle = yes read as false");
		CHECK_INT(f->bos, CONF_TOKEN_NONE);
		CHECK_INT(f->eos, 0);
		CHECK_U64(f->seq_len, 1048576);
		CHECK_U64(f->batch_size, 255);
		CHECK_U64(f->shuffle_window, 1);
		CHECK_U64(f->seed, 0);
	}
	CHECK(conf_find_feed(c, "nope") == NULL, "conf_find_feed found a feed that is not configured");
	conf_free(c);

	/* The other spellings of engines, levels and booleans. */
	static const struct {
		const char *text;
		enum io_engine engine;
		int level;
		bool shuffle;
	} spell[] = {
		{ "[feedd]\nio_engine = auto\nlog_level = error\n[feed.a]\nshards = a\nshuffle = off\n", IO_ENGINE_AUTO,
		  LOG_LEVEL_ERROR, false },
		{ "[feedd]\nio_engine = io_uring\nlog_level = warning\n[feed.a]\nshards = a\nshuffle = on\n",
		  IO_ENGINE_URING, LOG_LEVEL_WARNING, true },
		{ "[feedd]\nio_engine = pread\nlog_level = notice\n[feed.a]\nshards = a\nshuffle = 0\n", IO_ENGINE_PREAD,
		  LOG_LEVEL_NOTICE, false },
		{ "[feedd]\nlog_level = info\n[feed.a]\nshards = a\nshuffle = 1\n", IO_ENGINE_AUTO, LOG_LEVEL_INFO, true },
		{ "[feedd]\n[feed.a]\nshards = a\nshuffle = no\n", IO_ENGINE_AUTO, LOG_LEVEL_INFO, false },
	};
	for (size_t i = 0; i < sizeof(spell) / sizeof(spell[0]); i++) {
		c = load_ok(spell[i].text, spell[i].text);
		if (!c)
			continue;
		CHECK(c->io_engine == spell[i].engine, "case %zu: io_engine %d", i, c->io_engine);
		CHECK(c->log_level == spell[i].level, "case %zu: log_level %d", i, c->log_level);
		CHECK(c->n_feeds == 1 && c->feeds[0].shuffle == spell[i].shuffle, "case %zu: shuffle", i);
		conf_free(c);
	}
}

static void test_errors(void)
{
	load_bad("unknown key in [feedd]", "[feedd]\nthreads = 2\nbogus = 1\n", 3, 0, "bogus");
	load_bad("unknown key in a feed", "[feed.a]\nshards = a\n\nseqlen = 10\n", 4, 0, "seqlen");
	/* A section error is reported at its header or at the key right under it. */
	load_bad("unknown section", "[feedd]\nthreads = 1\n[daemon]\nthreads = 2\n", 3, 4, "daemon");
	load_bad("unknown section [feed]", "[feed]\nshards = a\n", 1, 2, "feed");
	load_bad("bad feed name (space)", "[feedd]\n[feed.my feed]\nshards = a\n", 2, 3, "my feed");
	load_bad("bad feed name (slash)", "[feed.a/b]\nshards = a\n", 1, 2, "a/b");
	load_bad("bad feed name (empty)", "\n[feed.]\nshards = a\n", 2, 3, "feed");

	load_bad("bad number (letters)", "[feedd]\nthreads = many\n", 2, 0, "threads");
	load_bad("bad number (suffix)", "[feed.a]\nshards = a\nseq_len = 12x\n", 3, 0, "seq_len");
	load_bad("bad number (negative)", "[feed.a]\nshards = a\nseed = -1\n", 3, 0, "seed");
	load_bad("bad number (overflow)", "[feed.a]\nshards = a\nseed = 18446744073709551616\n", 3, 0, "seed");
	load_bad("bad number (empty)", "[feed.a]\nshards = a\nbatch_size =\n", 3, 0, "batch_size");

	load_bad("ring_slots 1", "[feedd]\nring_slots = 1\n", 2, 0, "ring_slots");
	load_bad("ring_slots 1025", "[feedd]\n\nring_slots = 1025\n", 3, 0, "ring_slots");
	load_bad("threads 1025", "[feedd]\nthreads = 1025\n", 2, 0, "threads");
	load_bad("io_depth 0", "[feedd]\nio_depth = 0\n", 2, 0, "io_depth");
	load_bad("io_depth 4097", "[feedd]\nio_depth = 4097\n", 2, 0, "io_depth");
	load_bad("seq_len 0", "[feed.a]\nshards = a\nseq_len = 0\n", 3, 0, "seq_len");
	load_bad("seq_len 2^20+1", "[feed.a]\nshards = a\nseq_len = 1048577\n", 3, 0, "seq_len");
	load_bad("batch_size 0", "[feed.a]\nshards = a\nbatch_size = 0\n", 3, 0, "batch_size");
	load_bad("batch_size 65537", "[feed.a]\nshards = a\nbatch_size = 65537\n", 3, 0, "batch_size");
	load_bad("shuffle_window 0", "[feed.a]\nshards = a\nshuffle_window = 0\n", 3, 0, "shuffle_window");
	load_bad("shuffle_list_max 0", "[feed.a]\nshards = a\nshuffle_list_max = 0\n", 3, 0, "shuffle_list_max");

	load_bad("bad bool", "[feed.a]\nshards = a\nshuffle = maybe\n", 3, 0, "shuffle");
	load_bad("bad bool (case)", "[feed.a]\nshards = a\nshuffle = TRUE\n", 3, 0, "shuffle");
	load_bad("bad token (negative)", "[feed.a]\nshards = a\nbos = -1\n", 3, 0, "bos");
	load_bad("bad token (too big)", "[feed.a]\nshards = a\neos = 2147483648\n", 3, 0, "eos");
	load_bad("bad token (sign)", "[feed.a]\nshards = a\neos = +3\n", 3, 0, "eos");
	load_bad("bad io_engine", "[feedd]\nio_depth = 8\nio_engine = aio\n", 3, 0, "io_engine");
	load_bad("bad log_level", "[feedd]\nlog_level = loud\n", 2, 0, "log_level");
	load_bad("bad format", "[feed.a]\nformat = arrow\nshards = a\n", 2, 0, "arrow");
	load_bad("blank shard entry", "[feed.a]\nshards = a.idx, ,b.idx\n", 2, 0, "shards");
	load_bad("syntax error", "[feedd]\nthreads 2\n", 2, 0, "");
	/* The first mistake is the one reported. */
	load_bad("two mistakes", "[feedd]\nthreads = x\nio_engine = y\n", 2, 0, "threads");

	/* A feed without shards cannot serve anything: the error names the feed. */
	char path[256], err[512] = "";
	struct conf *c = NULL;
	write_conf("noshards.conf", "[feed.lonely]\nseq_len = 8\n", path, sizeof(path));
	int r = conf_load(path, &c, err, sizeof(err));
	CHECK(r == -EINVAL, "feed without shards: conf_load returned %d", r);
	CHECK_CONTAINS(err, "lonely");
	CHECK_CONTAINS(err, "shards");
	CHECK_CONTAINS(err, path);
	if (r == 0)
		conf_free(c);

	/* A missing file is reported as such, naming it. */
	char missing[300];
	snprintf(missing, sizeof(missing), "%s/does-not-exist.conf", dir);
	c = NULL;
	err[0] = 0;
	r = conf_load(missing, &c, err, sizeof(err));
	CHECK(r == -ENOENT, "missing file: conf_load returned %d", r);
	CHECK_CONTAINS(err, missing);
	if (r == 0)
		conf_free(c);
}

/*
 * A section with a wrong name changes nothing until a key sits under it; with
 * a key, the whole file fails at that key (inih reports key lines only).
 * B x L must fit the int32 cu_seqlens and a 4 GiB ring slot even when each is
 * within its own range (with the line of the later key).
 */
static void test_empty_unknown_section(void)
{
	struct conf *c = load_ok("unknown section without keys", "[feedd]\nthreads = 1\n[fed.main]\n[feed.a]\nshards = a\n");
	if (c)
		CHECK_U64(c->n_feeds, 1);
	conf_free(c);
	load_bad("unknown section with a key", "[feedd]\nthreads = 1\n[fed.main]\nx = 1\n[feed.a]\nshards = a\n", 4, 0,
		 "fed.main");
	load_bad("key given twice", "[feed.a]\nshards = a\nseq_len = 8\nseq_len = 9\n", 4, 0, "given twice");
	load_bad("line too long for inih", "[feed.a]\nshards = a,b\n# 123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890\n",
		 3, 0, "indented lines");
	load_bad("batch too large", "[feed.a]\nshards = a\nseq_len = 1048576\nbatch_size = 2048\n", 4, 0, "batch_size x seq_len");
	/* 16384 x 16385 fits an int32 cu_seqlens but not a 4 GiB ring slot. */
	load_bad("batch over the ring limit", "[feed.a]\nshards = a\nbatch_size = 16384\nseq_len = 16385\n", 4, 0,
		 "a ring slot holds at most 4294967295 bytes");
	load_bad("socket path too long", "[feedd]\nthreads = 1\nsocket = /run/feedd/"
		 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx.sock\n",
		 3, 0, "a unix socket path holds at most 107");
}

/*
 * conf.c refuses an empty entry in a shard list ("a, ,b") as a likely typo;
 * two commas in a row are the same typo and must not slip through.
 */
static void test_empty_shard_entry(void)
{
	load_bad("empty shard entry", "[feed.a]\nshards = a.idx,,b.idx\n", 2, 0, "shards");
}

/* A config error found after parsing: names the file and the feed, and mentions needle. */
static void load_bad_feed(const char *what, const char *text, const char *needle)
{
	char path[256], err[512] = "";
	struct conf *c = NULL;
	write_conf("bad.conf", text, path, sizeof(path));
	int r = conf_load(path, &c, err, sizeof(err));
	CHECK(r == -EINVAL, "%s: conf_load returned %d (%s), expected -EINVAL", what, r, err);
	if (r == 0) {
		conf_free(c);
		return;
	}
	CHECK(strncmp(err, path, strlen(path)) == 0 && strstr(err, "[feed.t]"), "%s: error \"%s\" does not name the file and feed",
	      what, err);
	CHECK(strstr(err, needle), "%s: error \"%s\" does not mention \"%s\"", what, err, needle);
}

static void test_shards_over_lines(void)
{
	struct conf *c = load_ok("shards over indented lines", "[feed.a]\nshards = /d/a.idx,\n  /d/b*.idx, /d/c.idx\n  /d/e.idx\nseq_len = 8\n");
	if (!c)
		return;
	CHECK(c->feeds[0].n_shards == 4, "%zu shard globs, expected 4", c->feeds[0].n_shards);
	if (c->feeds[0].n_shards == 4)
		CHECK(strcmp(c->feeds[0].shards[1], "/d/b*.idx") == 0 && strcmp(c->feeds[0].shards[3], "/d/e.idx") == 0,
		      "globs %s, %s", c->feeds[0].shards[1], c->feeds[0].shards[3]);
	conf_free(c);
}

static void test_text_sources(void)
{
	struct conf *c = load_ok("jsonl feed",
				 "[feedd]\ncache_dir = cache\n"
				 "[feed.t]\nformat = jsonl\nshards = a.jsonl\ntokenizer = cl100k_base.tiktoken\n"
				 "tokenizer_preset = cl100k_base\neos = <|endoftext|>\ntext_key = content\n"
				 "on_bad_record = fail\nmax_bad_fraction = 0.01\nmax_document_bytes = 1M\n"
				 "encode_special_tokens = yes\n");
	if (c) {
		const struct conf_feed *f = &c->feeds[0];
		CHECK(strcmp(f->format, "jsonl") == 0, "format %s", f->format);
		CHECK(f->eos == CONF_TOKEN_NONE && f->eos_name && strcmp(f->eos_name, "<|endoftext|>") == 0,
		      "eos name not kept");
		CHECK(strcmp(f->text_key, "content") == 0, "text_key %s", f->text_key);
		CHECK(!f->skip_bad_records && f->max_bad_fraction == 0.01, "bad-record policy not kept");
		CHECK_U64(f->max_document_bytes, 1u << 20);
		CHECK(f->encode_special_tokens, "encode_special_tokens not kept");
		CHECK(f->tokenizer[0] == '/' && strstr(f->tokenizer, "cl100k_base.tiktoken"), "tokenizer %s not resolved",
		      f->tokenizer);
		CHECK(f->cache_dir && f->cache_dir[0] == '/' && strcmp(f->cache_dir, c->cache_dir) == 0,
		      "the feed does not carry cache_dir");
		conf_free(c);
	}
	c = load_ok("defaults of a text feed", "[feed.t]\nformat = text\nshards = a.txt\ntokenizer = q/tokenizer.json\n");
	if (c) {
		const struct conf_feed *f = &c->feeds[0];
		CHECK(strcmp(f->text_key, "text") == 0 && f->skip_bad_records && f->max_bad_fraction == 0.001 &&
			      !f->encode_special_tokens && f->max_document_bytes == (UINT64_C(256) << 20),
		      "text defaults differ from docs/configuration.md");
		conf_free(c);
	}
	load_bad("unknown format", "[feed.t]\nformat = orc\nshards = a\n", 2, 0, "orc");
	load_bad("unknown preset", "[feed.t]\ntokenizer_preset = gpt5\n", 2, 0, "gpt5");
	load_bad("bad policy", "[feed.t]\non_bad_record = ignore\n", 2, 0, "on_bad_record");
	load_bad("bad fraction", "[feed.t]\nmax_bad_fraction = 2\n", 2, 0, "max_bad_fraction");
	load_bad("bad fraction (word)", "[feed.t]\nmax_bad_fraction = some\n", 2, 0, "max_bad_fraction");
	load_bad("zero document size", "[feed.t]\nmax_document_bytes = 0\n", 2, 0, "max_document_bytes");
	load_bad("empty text_key", "[feed.t]\ntext_key =\n", 2, 0, "text_key");
	load_bad_feed("jsonl without tokenizer", "[feed.t]\nformat = jsonl\nshards = a\n", "tokenizer");
	load_bad_feed("rank file without preset", "[feed.t]\nformat = jsonl\nshards = a\ntokenizer = x.tiktoken\n",
		      "tokenizer_preset");
	load_bad_feed("preset with tokenizer.json",
		      "[feed.t]\nformat = jsonl\nshards = a\ntokenizer = tokenizer.json\ntokenizer_preset = gpt2\n",
		      "tokenizer_preset");
	load_bad_feed("special name without tokenizer", "[feed.t]\nshards = a\neos = eos\n", "eos");
}

int main(void)
{
	char tmpl[] = "/tmp/feedd-conf-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp: %s", strerror(errno));
	snprintf(dir, sizeof(dir), "%s", tmpl);
	atexit(cleanup);

	test_defaults();
	test_all_keys();
	test_errors();
	test_empty_unknown_section();
	test_empty_shard_entry();
	test_text_sources();
	test_shards_over_lines();
	return unit_exit("test-conf");
}
