/* SPDX-License-Identifier: MIT */
/*
 * Unigram and WordPiece tokenizer.json files made by hand: ids worked out by
 * hand (and checked once against HF tokenizers 0.23.2), and every field the
 * loader refuses, named in the message.  Needs no fetched data; the peer
 * tests (test-tok-peers model NAME) compare real vocabularies with HF.
 */
#include <unistd.h>

#include "tok-test.h"

static int n_fail;
static char dir[] = "/tmp/tok-models-XXXXXX";

#define EXPECT(cond, ...)                                           \
	do {                                                        \
		if (!(cond)) {                                      \
			printf("FAIL %s:%d: ", __FILE__, __LINE__); \
			printf(__VA_ARGS__);                        \
			printf("\n");                               \
			n_fail++;                                   \
		}                                                   \
	} while (0)

static char *write_file(const char *name, const char *content) {
	char *path = NULL;
	FILE *f;

	if (asprintf(&path, "%s/%s", dir, name) < 0)
		abort();
	f = fopen(path, "we");
	if (!f || fputs(content, f) < 0)
		abort();
	fclose(f);
	return path;
}

static struct tok *load(const char *name, const char *json) {
	_tok_cleanup_free_ char *path = write_file(name, json);
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	int r = tok_load_hf(path, &t, &error);

	EXPECT(r == 0, "%s: %s", name, error ? error : strerror(-r));
	return t;
}

static void expect_ids(const struct tok *t, const char *text, unsigned flags, const int32_t *want, size_t n_want) {
	struct tok_state *st = NULL;
	struct tok_ids ids = { 0 };
	int r = tok_state_new(t, &st);

	if (r == 0)
		r = tok_encode(t, st, text, strlen(text), flags, &ids, NULL);
	EXPECT(r == 0, "\"%s\": encode: %s", text, strerror(-r));
	if (r == 0 && !test_ids_equal(t, text, want, n_want, ids.ids, ids.n))
		n_fail++;
	tok_ids_done(&ids);
	tok_state_free(st);
}

#define IDS(...) (const int32_t[]) { __VA_ARGS__ }, sizeof((const int32_t[]) { __VA_ARGS__ }) / sizeof(int32_t)

static void expect_refused(const char *name, const char *json, int want_r, const char *want_msg) {
	_tok_cleanup_free_ char *path = write_file(name, json);
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	int r = tok_load_hf(path, &t, &error);

	EXPECT(r == want_r, "%s: got %d (%s), want %d", name, r, error ? error : "-", want_r);
	EXPECT(error && strstr(error, want_msg), "%s: message \"%s\" lacks \"%s\"", name, error ? error : "(none)",
	       want_msg);
	EXPECT(!t, "%s: tok returned on error", name);
	tok_free(t);
	if (error)
		printf("ok: %s\n", error);
}

#define SPECIAL(id, s) "{\"id\":" #id ",\"content\":\"" s "\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false," \
		       "\"normalized\":false,\"special\":true}"
#define META(scheme, split) "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"" scheme "\"," \
			    "\"split\":" split "}"

static char *unigram_json(const char *normalizer, const char *pre, const char *model_extra, const char *added) {
	char *s = NULL;
	if (asprintf(&s,
		     "{\"version\":\"1.0\",\"added_tokens\":[%s],\"normalizer\":%s,\"pre_tokenizer\":%s,"
		     "\"model\":{\"type\":\"Unigram\",%s\"vocab\":["
		     "[\"<unk>\",0.0],[\"\\u2581\",-2.0],[\"\\u2581a\",-1.0],[\"b\",-2.0],[\"\\u2581ab\",-2.5],"
		     "[\"c\",-3.0],[\"bc\",-2.0],[\"<0x41>\",-1.0],[\"<0x42>\",-1.0],[\"<s>\",0.0],[\"d\",-1.5],"
		     "[\"dd\",-3.0]]}}",
		     added, normalizer, pre, model_extra) < 0)
		abort();
	return s;
}

static void test_unigram(void) {
	_tok_cleanup_free_ char *j = unigram_json("null", META("always", "true"), "\"unk_id\":0,", SPECIAL(9, "<s>"));
	struct tok *t = load("unigram.json", j);

	if (t) {
		EXPECT(tok_vocab_size(t) == 12, "vocab size %zu", tok_vocab_size(t));
		EXPECT(tok_special_id(t, "<s>") == 9, "<s> keeps its vocabulary id");
		/* "▁ab": ▁ab (-2.5) beats ▁a + b (-3); "▁abc": ▁a + bc
		 * (-3) beats ▁ab + c (-5.5). */
		expect_ids(t, "ab", 0, IDS(4));
		expect_ids(t, "abc", 0, IDS(2, 6));
		/* "dd": dd (-3) ties d + d (-3); dd reaches the end first
		 * and a tie does not replace it. */
		expect_ids(t, "dd", 0, IDS(1, 11));
		/* "xy" unknown: fused into one <unk>; "AB" too (no byte
		 * fallback). */
		expect_ids(t, "a xyb", 0, IDS(2, 1, 0, 3));
		/* Specials: <s> split out when recognised, else pieces; the
		 * run after a special gets its own ▁ (prepend "always"). */
		expect_ids(t, "a<s>a", TOK_ENCODE_SPECIALS, IDS(2, 9, 2));
		expect_ids(t, "  a", 0, IDS(1, 2));
		tok_free(t);
	}
	_tok_cleanup_free_ char *k = unigram_json("null", META("first", "false"), "\"unk_id\":0,\"byte_fallback\":true,",
						  SPECIAL(9, "<s>"));
	t = load("unigram-fallback.json", k);
	if (t) {
		/* Unknown "AB" fused, then spelled <0x41> <0x42>; "ABa" and
		 * "AC" lack a byte piece: <unk>.  split false: one piece, ▁
		 * in the middle.  "first": only the run at the start gets ▁. */
		expect_ids(t, "AB a", 0, IDS(1, 7, 8, 2));
		expect_ids(t, "ABa AC", 0, IDS(1, 0, 1, 0));
		expect_ids(t, "<s>a", TOK_ENCODE_SPECIALS, IDS(9, 0));
		tok_free(t);
	}
}

static const char wordpiece_vocab[] =
	"{\"[UNK]\":0,\"un\":1,\"##aff\":2,\"##able\":3,\"a\":4,\"##a\":5,\"!\":6,\"[CLS]\":7,\"hello\":8,\"中\":9,"
	"\"e\":10,\"##e\":11,\"##llo\":12,\"h\":13}";

static char *wordpiece_json(const char *normalizer, const char *model_extra) {
	char *s = NULL;
	if (asprintf(&s,
		     "{\"version\":\"1.0\",\"added_tokens\":[" SPECIAL(7, "[CLS]") "],\"normalizer\":%s,"
		     "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"model\":{\"type\":\"WordPiece\",%s\"vocab\":%s}}",
		     normalizer, model_extra, wordpiece_vocab) < 0)
		abort();
	return s;
}

static void test_wordpiece(void) {
	_tok_cleanup_free_ char *j = wordpiece_json(
		"{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,"
		"\"lowercase\":true}",
		"\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":5,");
	struct tok *t = load("wordpiece.json", j);

	if (t) {
		/* Longest match first, ## after the first piece; a word
		 * with a gap is one [UNK]; over 5 characters: [UNK]. */
		expect_ids(t, "unaff", 0, IDS(1, 2));
		expect_ids(t, "UNAFFable", 0, IDS(0));
		expect_ids(t, "Héllo!", 0, IDS(8, 6));
		expect_ids(t, "Hélo!", 0, IDS(0, 6));
		expect_ids(t, "aaz a", 0, IDS(0, 4));
		/* Chinese characters become words of their own; NUL and
		 * U+200B are cleaned away; [CLS] only when recognised. */
		expect_ids(t, "a中a\xe2\x80\x8b\t[CLS]", TOK_ENCODE_SPECIALS, IDS(4, 9, 4, 7));
		expect_ids(t, "[CLS]", 0, IDS(0, 0, 0));
		tok_free(t);
	}
}

static void test_refused(void) {
	_tok_cleanup_free_ char *a = unigram_json("{\"type\":\"BertNormalizer\",\"lowercase\":\"yes\"}", "null",
						  "\"unk_id\":0,", "");
	expect_refused("bert-flag.json", a, -EOPNOTSUPP, "bert-flag.json: normalizer.lowercase: unsupported value \"yes\"");
	_tok_cleanup_free_ char *b = unigram_json("null", META("sometimes", "true"), "\"unk_id\":0,", "");
	expect_refused("scheme.json", b, -EOPNOTSUPP, "pre_tokenizer.prepend_scheme: unsupported value \"sometimes\"");
	/* HF fails on the first character no piece covers without unk_id. */
	_tok_cleanup_free_ char *c = unigram_json("null", "null", "\"unk_id\":null,", "");
	expect_refused("unk-null.json", c, -EOPNOTSUPP, "model.unk_id: unsupported value null");
	_tok_cleanup_free_ char *d = unigram_json("null", "null", "\"unk_id\":12,", "");
	expect_refused("unk-range.json", d, -EINVAL, "model.unk_id: 12 is not in model.vocab");
	_tok_cleanup_free_ char *e = unigram_json("null", "null", "\"unk_id\":0,\"dropout\":0.1,", "");
	expect_refused("unigram-extra.json", e, -EOPNOTSUPP, "model.dropout: unknown field");
	_tok_cleanup_free_ char *f = unigram_json("{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"AQID\"}", "null",
						  "\"unk_id\":0,", "");
	expect_refused("charsmap.json", f, -EINVAL, "normalizer: precompiled_charsmap: 3 bytes, too short");
	_tok_cleanup_free_ char *f2 = unigram_json("{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"/wAAAAEC\"}",
						   "null", "\"unk_id\":0,", "");
	expect_refused("charsmap2.json", f2, -EINVAL, "precompiled_charsmap: trie of 255 bytes past the end");
	_tok_cleanup_free_ char *f3 = unigram_json("{\"type\":\"Precompiled\"}", "null", "\"unk_id\":0,", "");
	expect_refused("charsmap3.json", f3, -EOPNOTSUPP, "normalizer.precompiled_charsmap: unsupported value (missing)");
	_tok_cleanup_free_ char *g = unigram_json("null", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
							  "\"trim_offsets\":true,\"use_regex\":true}", "\"unk_id\":0,", "");
	expect_refused("bytelevel.json", g, -EOPNOTSUPP, "model.type: Unigram after a ByteLevel pre-tokenizer");
	_tok_cleanup_free_ char *h = wordpiece_json("null", "\"unk_token\":\"<nope>\",");
	expect_refused("unk-token.json", h, -EINVAL, "model.unk_token: \"<nope>\" is not in model.vocab");
	_tok_cleanup_free_ char *i = wordpiece_json("null", "\"max_input_chars_per_word\":-1,");
	expect_refused("max-chars.json", i, -EOPNOTSUPP, "model.max_input_chars_per_word: unsupported value -1");
	expect_refused("wordlevel.json", "{\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}", -EOPNOTSUPP,
		       "model.type: unsupported value \"WordLevel\"");
	expect_refused("wordpiece-empty.json", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", -EOPNOTSUPP,
		       "model.vocab: unsupported value {}");
	_tok_cleanup_free_ char *k = unigram_json("null", "{\"type\":\"BertPreTokenizer\",\"x\":1}", "\"unk_id\":0,", "");
	expect_refused("bert-pre.json", k, -EOPNOTSUPP, "pre_tokenizer.x: unknown field");
}

int main(void) {
	if (!mkdtemp(dir))
		abort();
	test_unigram();
	test_wordpiece();
	test_refused();
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (!getenv("TOK_TEST_KEEP") && system(cmd) != 0)
		printf("could not remove %s\n", dir);
	printf("%s\n", n_fail ? "FAIL" : "PASS");
	return n_fail ? 1 : 0;
}
