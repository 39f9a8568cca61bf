/* SPDX-License-Identifier: MIT */
/*
 * Loading: small hand-made rank files and tokenizer.json files, written to
 * a temporary directory.  Good files load and encode to ids worked out by
 * hand; bad ones fail with the right errno and a message that names the
 * file and the line or field; nothing crashes.  Needs no fetched data.
 */
#include <unistd.h>

#include "tok-test.h"

static int n_fail;
static char dir[] = "/tmp/tok-load-XXXXXX";

#define EXPECT(cond, ...)                                  \
	do {                                               \
		if (!(cond)) {                             \
			printf("FAIL %s:%d: ", __FILE__, __LINE__); \
			printf(__VA_ARGS__);               \
			printf("\n");                      \
			n_fail++;                          \
		}                                          \
	} while (0)

static char *write_file(const char *name, const char *content, size_t len) {
	char *path = NULL;
	FILE *f;

	if (asprintf(&path, "%s/%s", dir, name) < 0)
		abort();
	f = fopen(path, "we");
	if (!f || fwrite(content, 1, len, f) != len)
		abort();
	fclose(f);
	return path;
}

static void b64(const uint8_t *s, size_t n, char *out) {
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t w = (uint32_t) s[i] << 16 | (i + 1 < n ? (uint32_t) s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
		out[o++] = tab[w >> 18 & 63];
		out[o++] = tab[w >> 12 & 63];
		out[o++] = i + 1 < n ? tab[w >> 6 & 63] : '=';
		out[o++] = i + 2 < n ? tab[w & 63] : '=';
	}
	out[o] = 0;
}

/* A rank file: the 256 bytes (rank = byte), then "ab" 256, "cd" 257,
 * "abcd" 258, " a" 259, then extra lines. */
static char *rank_text(const char *extra) {
	char *s = NULL, line[64], enc[16];
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);
	static const char *const merges[] = { "ab", "cd", "abcd", " a" };

	for (int b = 0; b < 256; b++) {
		uint8_t c = (uint8_t) b;
		b64(&c, 1, enc);
		fprintf(f, "%s %d\n", enc, b);
	}
	for (int i = 0; i < 4; i++) {
		b64((const uint8_t *) merges[i], strlen(merges[i]), enc);
		snprintf(line, sizeof(line), "%s %d\n", enc, 256 + i);
		fputs(line, f);
	}
	fputs(extra, f);
	fclose(f);
	return s;
}

static void expect_ids(const struct tok *t, const char *text, size_t len, unsigned flags, const int32_t *want,
		       size_t n_want, const char *what) {
	struct tok_state *st = NULL;
	struct tok_ids ids = { 0 };
	int r = tok_state_new(t, &st);

	if (r == 0)
		r = tok_encode(t, st, text, len, flags, &ids, NULL);
	EXPECT(r == 0, "%s: encode: %s", what, strerror(-r));
	if (r == 0 && !test_ids_equal(t, what, want, n_want, ids.ids, ids.n))
		n_fail++;
	tok_ids_done(&ids);
	tok_state_free(st);
}

static void expect_load_error(const char *name, const char *content, int want_r, const char *want_msg) {
	_tok_cleanup_free_ char *path = write_file(name, content, strlen(content));
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	int r;

	if (strstr(name, ".json"))
		r = tok_load_hf(path, &t, &error);
	else
		r = tok_load_rankfile(path, "gpt2", &t, &error);
	EXPECT(r == want_r, "%s: got %d (%s), want %d", name, r, error ? error : "-", want_r);
	EXPECT(error && strstr(error, want_msg), "%s: message \"%s\" lacks \"%s\"", name, error ? error : "(none)",
	       want_msg);
	EXPECT(!t, "%s: tok returned on error", name);
	tok_free(t);
	if (error)
		printf("ok: %s\n", error);
}

/* A file the general pipeline loads, and the ids it gives for text. */
static void expect_loads(const char *name, const char *content, const char *text, unsigned flags,
			 const int32_t *want, size_t n_want) {
	_tok_cleanup_free_ char *path = write_file(name, content, strlen(content));
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	int r = tok_load_hf(path, &t, &error);

	EXPECT(r == 0 && !error, "%s: %s", name, error ? error : strerror(-r));
	if (r == 0)
		expect_ids(t, text, strlen(text), flags, want, n_want, name);
	tok_free(t);
}

static void test_rankfile(void) {
	_tok_cleanup_free_ char *text = rank_text("");
	_tok_cleanup_free_ char *path = write_file("good.tiktoken", text, strlen(text));
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	int r = tok_load_rankfile(path, "gpt2", &t, &error);

	EXPECT(r == 0, "good rank file: %s", error ? error : strerror(-r));
	if (r < 0)
		return;
	EXPECT(tok_vocab_size(t) == 50257, "vocab size %zu", tok_vocab_size(t));
	EXPECT(tok_special_id(t, "<|endoftext|>") == 50256, "special id");
	EXPECT(tok_special_id(t, "<|nope|>") == -ENOENT, "missing special");
	/* "abcd": ab(256) + cd(257) -> abcd(258); " abx": "ab" (rank 256)
	 * merges before " a" (rank 259), leaving " " ab x.
	 * NUL is ordinary text: a, NUL, b. */
	expect_ids(t, "abcd abx", 8, 0, (const int32_t[]) { 258, ' ', 256, 'x' }, 4, "merges");
	expect_ids(t, " a", 2, 0, (const int32_t[]) { 259 }, 1, "merge \" a\"");
	expect_ids(t, "a\0b", 3, 0, (const int32_t[]) { 'a', 0, 'b' }, 3, "NUL");
	/* Specials are text unless asked for. */
	expect_ids(t, "<|endoftext|>", 13, TOK_ENCODE_SPECIALS, (const int32_t[]) { 50256 }, 1, "special on");
	expect_ids(t, "x<|endoftext|>", 14, 0,
		   (const int32_t[]) { 'x', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>' }, 14,
		   "special off");
	/* Invalid UTF-8 becomes U+FFFD (EF BF BD), one per maximal subpart. */
	{
		struct tok_state *st = NULL;
		struct tok_ids ids = { 0 };
		size_t rep = 0;
		tok_state_new(t, &st);
		r = tok_encode(t, st, "a\xff\xe2\x82", 4, 0, &ids, &rep);
		EXPECT(r == 0 && rep == 2, "replacements %zu", rep);
		EXPECT(ids.n == 7 && ids.ids[1] == 0xef && ids.ids[4] == 0xef, "replaced ids (%zu)", ids.n);
		tok_ids_done(&ids);
		tok_state_free(st);
	}
	{
		const uint8_t *b;
		size_t n;
		EXPECT(tok_token_bytes(t, 258, &b, &n) == 0 && n == 4 && memcmp(b, "abcd", 4) == 0, "token bytes");
		EXPECT(tok_token_bytes(t, 50256, &b, &n) == 0 && n == 13, "special bytes");
		EXPECT(tok_token_bytes(t, 40000, &b, &n) == -ENOENT, "unused id");
	}
	t = tok_free(t);
	EXPECT(tok_free(NULL) == NULL, "tok_free(NULL)");
	EXPECT(tok_state_free(NULL) == NULL, "tok_state_free(NULL)");

	r = tok_load_rankfile(path, "nope", &t, &error);
	EXPECT(r == -EINVAL && error && strstr(error, "unknown tokenizer preset"), "unknown preset");
	r = tok_load_rankfile("/nonexistent/x.tiktoken", "gpt2", &t, &error);
	EXPECT(r == -ENOENT && error && strstr(error, "/nonexistent/x.tiktoken"), "missing file: %d", r);
	{
		/* A custom pattern and special tokens. */
		const struct tok_special sp[] = { { "<eos>", 300 } };
		r = tok_load_rankfile_custom(path, "\\S+|\\s+", sp, 1, &t, &error);
		EXPECT(r == 0, "custom: %s", error);
		if (r == 0) {
			expect_ids(t, "ab<eos>", 7, TOK_ENCODE_SPECIALS, (const int32_t[]) { 256, 300 }, 2, "custom");
			t = tok_free(t);
		}
		r = tok_load_rankfile_custom(path, "(unclosed", NULL, 0, &t, &error);
		EXPECT(r == -EINVAL && error && strstr(error, "pattern"), "bad pattern: %s", error);
	}

	/* Bad lines: line 261 is the first after the good ones. */
	_tok_cleanup_free_ char *a = rank_text("!!!! 260\n");
	expect_load_error("bad-b64.tiktoken", a, -EINVAL, "bad-b64.tiktoken:261: bad base64");
	_tok_cleanup_free_ char *b = rank_text("eHl6 12x\n");
	expect_load_error("bad-rank.tiktoken", b, -EINVAL, "bad-rank.tiktoken:261: bad rank");
	_tok_cleanup_free_ char *c = rank_text("eHl6\n");
	expect_load_error("no-rank.tiktoken", c, -EINVAL, "no-rank.tiktoken:261: expected");
	_tok_cleanup_free_ char *d = rank_text("eHl6 5\n");
	expect_load_error("dup-rank.tiktoken", d, -EINVAL, "dup-rank.tiktoken:261: id 5 given twice");
	_tok_cleanup_free_ char *e = rank_text("YWI= 300\n");
	expect_load_error("dup-bytes.tiktoken", e, -EINVAL, "same bytes");
	_tok_cleanup_free_ char *g = rank_text("eHl6 99999999999\n");
	expect_load_error("huge-rank.tiktoken", g, -EINVAL, "huge-rank.tiktoken:261:");
	expect_load_error("empty.tiktoken", "\n\n", -EINVAL, "empty.tiktoken: no tokens");
	expect_load_error("bytes-missing.tiktoken", "YQ== 0\nYg== 1\n", -EINVAL, "byte 0x00 has no token");
	expect_load_error("binary.tiktoken", "\x01\x02\x03\xff\n", -EINVAL, "binary.tiktoken:1:");
}

/* GPT-2's byte-level alphabet, for writing vocab keys. */
static void bl_char(uint8_t b, char *out) {
	int n = 0, cp = -1;
	for (int x = 0; x < 256; x++) {
		bool printable = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
		int c = printable ? x : 0x100 + n++;
		if (x == b)
			cp = c;
	}
	if (cp < 0x80)
		out[0] = (char) cp, out[1] = 0;
	else
		out[0] = (char) (0xc0 | cp >> 6), out[1] = (char) (0x80 | (cp & 0x3f)), out[2] = 0;
}

static char *hf_json(const char *model_extra, const char *pre, const char *normalizer, const char *added) {
	char *s = NULL, ch[4];
	size_t n = 0;
	FILE *f = open_memstream(&s, &n);

	fprintf(f, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":%s,\"normalizer\":%s,"
		   "\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":null,\"model\":{\"type\":\"BPE\",%s\"vocab\":{",
		added, normalizer, pre, model_extra);
	for (int b = 0; b < 256; b++) {
		bl_char((uint8_t) b, ch);
		fprintf(f, "\"%s%s\":%d,", ch[0] == '"' || ch[0] == '\\' ? "\\" : "", ch, b);
	}
	/* 256 "ab", 257 " a" (Ġa), 258 "abc" */
	fprintf(f, "\"ab\":256,\"\\u0120a\":257,\"abc\":258},\"merges\":[\"a b\",[\"\\u0120\",\"a\"],\"ab c\"]}}");
	fclose(f);
	return s;
}

#define BL "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true}"
#define ADDED "[{\"id\":300,\"content\":\"<eos>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}]"

static void test_hf(void) {
	_tok_cleanup_free_ char *good = hf_json("\"ignore_merges\":false,", BL, "null", ADDED);
	_tok_cleanup_free_ char *path = write_file("good.json", good, strlen(good));
	_tok_cleanup_free_ char *error = NULL;
	struct tok *t = NULL;
	int r = tok_load_hf(path, &t, &error);

	EXPECT(r == 0, "good tokenizer.json: %s", error ? error : strerror(-r));
	if (r == 0) {
		/* HF ignores added_tokens[].id: <eos> (300 in the file) gets
		 * the next id after the 259 vocabulary entries. */
		EXPECT(tok_vocab_size(t) == 260, "vocab size %zu", tok_vocab_size(t));
		EXPECT(tok_special_id(t, "<eos>") == 259, "special");
		/* " ab": a+b (merge 0) wins over Ġ+a (merge 1). */
		expect_ids(t, "abc ab<eos>", 11, TOK_ENCODE_SPECIALS, (const int32_t[]) { 258, ' ', 256, 259 }, 4,
			   "hf merges");
		expect_ids(t, " a", 2, 0, (const int32_t[]) { 257 }, 1, "hf merge 1");
		t = tok_free(t);
	}
	{
		/* Split + ByteLevel in a Sequence, NFC: "e" + U+0301 is
		 * composed to U+00E9 (C3 A9) before splitting. */
		_tok_cleanup_free_ char *j = hf_json(
			"", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\S+|\\\\s+\"},"
			    "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
			    "\"trim_offsets\":true,\"use_regex\":false}]}",
			"{\"type\":\"NFC\"}", "[]");
		_tok_cleanup_free_ char *p = write_file("seq.json", j, strlen(j));
		r = tok_load_hf(p, &t, &error);
		EXPECT(r == 0, "sequence: %s", error);
		if (r == 0) {
			expect_ids(t, "e\xcc\x81 abc", 7, 0, (const int32_t[]) { 0xc3, 0xa9, ' ', 258 }, 4, "nfc");
			t = tok_free(t);
		}
	}

	expect_load_error("wordlevel.json", "{\"model\":{\"type\":\"WordLevel\",\"vocab\":{}}}", -EOPNOTSUPP,
			  "wordlevel.json: model.type: unsupported value \"WordLevel\"");
	/* Settings the general pipeline (tok-pipe.h) reads.  NFKC: U+FB01
	 * is "fi"; byte_fallback is moot with a byte-level vocabulary. */
	_tok_cleanup_free_ char *a = hf_json("", BL, "{\"type\":\"NFKC\"}", "[]");
	expect_loads("nfkc.json", a, "\xef\xac\x81", 0, (const int32_t[]) { 'f', 'i' }, 2);
	_tok_cleanup_free_ char *b = hf_json("\"byte_fallback\":true,", BL, "null", "[]");
	expect_loads("fallback.json", b, "ab", 0, (const int32_t[]) { 256 }, 1);
	_tok_cleanup_free_ char *c = hf_json("\"dropout\":0.1,", BL, "null", "[]");
	expect_load_error("dropout.json", c, -EOPNOTSUPP, "model.dropout");
	/* Split Removed drops the matches. */
	_tok_cleanup_free_ char *d = hf_json(
		"", "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"x\"},"
		    "\"behavior\":\"Removed\",\"invert\":false},{\"type\":\"ByteLevel\",\"use_regex\":false}]}",
		"null", "[]");
	expect_loads("removed.json", d, "axb", 0, (const int32_t[]) { 'a', 'b' }, 2);
	/* Metaspace without ByteLevel: a vocabulary of UTF-8 strings, where
	 * "_" is 95; prefix added (add_prefix_space defaults to true), split
	 * before each "_". */
	_tok_cleanup_free_ char *e = hf_json("", "{\"type\":\"Metaspace\",\"replacement\":\"_\"}", "null", "[]");
	expect_loads("metaspace.json", e, "a b", 0, (const int32_t[]) { '_', 'a', '_', 'b' }, 4);
	/* lstrip: the space before <eos> goes with it. */
	_tok_cleanup_free_ char *g = hf_json(
		"", BL, "null",
		"[{\"id\":300,\"content\":\"<eos>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":false,"
		"\"normalized\":false,\"special\":true}]");
	expect_loads("lstrip.json", g, "x <eos>", TOK_ENCODE_SPECIALS, (const int32_t[]) { 'x', 259 }, 2);
	_tok_cleanup_free_ char *h = hf_json("\"continuing_subword_prefix\":\"##\",", BL, "null", "[]");
	expect_load_error("prefix.json", h, -EOPNOTSUPP, "model.continuing_subword_prefix");
	_tok_cleanup_free_ char *i = hf_json("\"whatever\":1,", BL, "null", "[]");
	expect_load_error("unknown.json", i, -EOPNOTSUPP, "model.whatever: unknown field");
	/* ByteLevel's add_prefix_space: "a" is read as " a". */
	_tok_cleanup_free_ char *k = hf_json("", "{\"type\":\"ByteLevel\",\"add_prefix_space\":true}", "null", "[]");
	expect_loads("prefix-space.json", k, "a", 0, (const int32_t[]) { 257 }, 1);
	_tok_cleanup_free_ char *l = hf_json("", BL, "{\"type\":\"BertNormalizer\"}", "[]");
	/* BertNormalizer (tok-hf-model.c) in front of byte-level BPE: "A" is
	 * lowercased, U+00E9 loses its accent. */
	expect_loads("bert.json", l, "A\xc3\xa9", 0, (const int32_t[]) { 'a', 'e' }, 2);
	_tok_cleanup_free_ char *o = hf_json("", "{\"type\":\"UnicodeScripts\"}", "null", "[]");
	expect_load_error("scripts.json", o, -EOPNOTSUPP, "pre_tokenizer.type: unsupported value \"UnicodeScripts\"");
	expect_load_error("broken.json", "{\"model\": {\n  \"type\": \"BPE\",,\n}", -EINVAL, "broken.json:2:");
	expect_load_error("array.json", "[1,2]", -EINVAL, "not a JSON object");
	/* No pre-tokenizer: a UTF-8 vocabulary; with no unk_token, "b" is
	 * dropped, as HF drops it. */
	expect_loads("null-pre.json", "{\"pre_tokenizer\":null,\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
		     "ab", 0, (const int32_t[]) { 0 }, 1);
	/* A merge whose result is not in the vocabulary. */
	_tok_cleanup_free_ char *m = hf_json("", BL, "null", "[]");
	char *at = strstr(m, "\"ab c\"");
	memcpy(at, "\"c d\" ", 6);
	expect_load_error("bad-merge.json", m, -EINVAL, "model.merges[2]: \"c\" + \"d\": merged token not in vocab");
}

int main(void) {
	if (!mkdtemp(dir))
		abort();
	test_rankfile();
	test_hf();
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		printf("could not remove %s\n", dir);
	printf("%s\n", n_fail ? "FAIL" : "PASS");
	return n_fail ? 1 : 0;
}
