/* SPDX-License-Identifier: MIT */
/*
 * UTF-8 repair must equal Python's bytes.decode("utf-8", errors="replace"):
 * the reference encoders tokenize text repaired that way.
 *
 * 1. Fixed vectors (written from Python 3.11's output).
 * 2. Thousands of random byte strings, biased towards lead/continuation
 *    bytes and boundary values, checked against Debian's /usr/bin/python3
 *    (any python3 on PATH if that is missing; this part is skipped, and
 *    said so, if there is none).  The replacement count is compared too,
 *    using an error handler that counts the calls Python makes, one per
 *    maximal subpart.
 */
#include <unistd.h>

#include "tok-test.h"

static int n_fail;

static void check(const char *what, const uint8_t *in, size_t n, const uint8_t *want, size_t n_want, size_t rep_want) {
	uint8_t *out = malloc(3 * n + 1);
	size_t rep = 99, m = tok_utf8_replace(in, n, out, &rep);
	bool valid = tok_utf8_valid_prefix(in, n) == n;

	if (m != n_want || memcmp(out, want, m) != 0 || rep != rep_want || valid != (rep_want == 0)) {
		printf("FAIL %s: got %zu bytes, %zu replacements (want %zu, %zu); valid_prefix says %s\n", what, m,
		       rep, n_want, rep_want, valid ? "valid" : "invalid");
		n_fail++;
	}
	free(out);
}

#define R "\xef\xbf\xbd"
#define V(in, out, rep) check(#in, (const uint8_t *) in, sizeof(in) - 1, (const uint8_t *) out, sizeof(out) - 1, rep)

static void fixed_vectors(void) {
	V("", "", 0);
	V("abc", "abc", 0);
	V("a\0b", "a\0b", 0);
	V("\xc3\xa9", "\xc3\xa9", 0);
	V("\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80", 0);
	V("\xef\xbf\xbd", R, 0);
	V("\xff", R, 1);
	V("\x80", R, 1);
	V("\x80\x80", R R, 2);
	V("\xc0\xaf", R R, 2);                  /* overlong: C0 never leads */
	V("\xc1\xbf", R R, 2);
	V("\xe0\x80\xaf", R R R, 3);            /* E0 needs A0..BF next */
	V("\xe0\xa0", R, 1);                    /* truncated: one maximal subpart */
	V("\xe2\x82", R, 1);
	V("\xe2\x82x", R "x", 1);
	V("\xed\xa0\x80", R R R, 3);            /* surrogate */
	V("\xed\x9f\xbf", "\xed\x9f\xbf", 0);
	V("\xf0\x80\x80\x80", R R R R, 4);
	V("\xf0\x9f\x98", R, 1);
	V("\xf0\x9f\x98x", R "x", 1);
	V("\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf", 0);
	V("\xf4\x90\x80\x80", R R R R, 4);      /* above U+10FFFF */
	V("\xf5\x80", R R, 2);
	V("\xf8\x88\x80\x80\x80", R R R R R, 5);
	V("\xe2\x28\xa1", R "(" R, 2);
	V("\xc3\xc3\xa9", R "\xc3\xa9", 1);
	V("\xe1\x80\xe2\xf0\x91\x92\xf1\xbf\x41", R R R R "A", 4);
}

static uint8_t pick_byte(unsigned *seed) {
	static const uint8_t interesting[] = { 0x00, 0x41, 0x20, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
					       0xc2, 0xdf, 0xe0, 0xe1, 0xec, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf3, 0xf4,
					       0xf5, 0xff };
	unsigned r = (unsigned) rand_r(seed);
	if (r % 3 == 0)
		return interesting[(r >> 8) % sizeof(interesting)];
	if (r % 3 == 1)
		return (uint8_t) (0x80 | ((r >> 8) & 0x3f));
	return (uint8_t) (r >> 8);
}

static int python_cases(void) {
	const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
	char in_path[] = "/tmp/tok-utf8-in-XXXXXX", out_path[] = "/tmp/tok-utf8-out-XXXXXX";
	int fd_in = mkstemp(in_path), fd_out = mkstemp(out_path);
	const int n_cases = 5000;
	uint8_t **cases = calloc(n_cases, sizeof(*cases));
	size_t *lens = calloc(n_cases, sizeof(*lens));
	unsigned seed = 12345;
	char cmd[1024];
	FILE *f;
	int checked = 0;

	if (fd_in < 0 || fd_out < 0 || !cases || !lens)
		abort();
	f = fdopen(fd_in, "w");
	for (int i = 0; i < n_cases; i++) {
		lens[i] = 1 + (size_t) (rand_r(&seed) % 12);
		cases[i] = malloc(lens[i] + 1);
		for (size_t k = 0; k < lens[i]; k++)
			cases[i][k] = pick_byte(&seed);
		for (size_t k = 0; k < lens[i]; k++)
			fprintf(f, "%02x", cases[i][k]);
		fprintf(f, "\n");
	}
	fclose(f);
	close(fd_out);
	snprintf(cmd, sizeof(cmd),
		 "%s -c 'import codecs, sys\n"
		 "n = 0\n"
		 "def count(e):\n"
		 "    global n\n"
		 "    n += 1\n"
		 "    return (\"\\ufffd\", e.end)\n"
		 "codecs.register_error(\"count\", count)\n"
		 "for line in open(sys.argv[1]):\n"
		 "    b = bytes.fromhex(line.strip())\n"
		 "    n = 0\n"
		 "    a = b.decode(\"utf-8\", errors=\"replace\").encode()\n"
		 "    c = b.decode(\"utf-8\", errors=\"count\").encode()\n"
		 "    assert a == c\n"
		 "    print(a.hex(), n)\n' %s > %s 2>/dev/null",
		 py, in_path, out_path);
	if (system(cmd) != 0) {
		printf("no usable python3 (%s) for part 2\n", py);
		unlink(in_path);
		unlink(out_path);
		return -1;
	}
	f = fopen(out_path, "re");
	for (int i = 0; i < n_cases; i++) {
		char hex[128];
		size_t rep;
		uint8_t want[64];
		size_t n_want = 0;
		if (!f || fscanf(f, "%127s %zu", hex, &rep) != 2) {
			printf("FAIL python output ended early at case %d\n", i);
			n_fail++;
			break;
		}
		for (size_t k = 0; hex[2 * k]; k++) {
			unsigned v;
			sscanf(hex + 2 * k, "%2x", &v);
			want[n_want++] = (uint8_t) v;
		}
		char what[64];
		snprintf(what, sizeof(what), "random case %d", i);
		check(what, cases[i], lens[i], want, n_want, rep);
		checked++;
	}
	if (f)
		fclose(f);
	unlink(in_path);
	unlink(out_path);
	for (int i = 0; i < n_cases; i++)
		free(cases[i]);
	free(cases);
	free(lens);
	printf("checked %d random byte strings against %s\n", checked, py);
	return checked;
}

int main(void) {
	int checked;

	fixed_vectors();
	checked = python_cases();
	if (checked < 0) {
		printf("%s\n", n_fail ? "FAIL" : "SKIP (fixed vectors passed; Python comparison not run)");
		return n_fail ? 1 : SKIP;
	}
	if (checked < 4000 && n_fail == 0) {
		printf("FAIL: too few random cases were checked\n");
		n_fail++;
	}
	printf("%s\n", n_fail ? "FAIL" : "PASS");
	return n_fail ? 1 : 0;
}
