/* SPDX-License-Identifier: MIT */
/*
 * JSONL records (jsonl.h). Two readers give the same answer:
 *
 *  - a scanner for the common record, {"text": "...", "id": 7, ...}: it
 *    validates the whole line as JSON and decodes only the text member,
 *    with no allocation when the record needs no other work. It accepts a
 *    line only where jansson surely would, with the same text; for anything
 *    it is not sure of (escapes in keys, exponents or long numbers, lone
 *    surrogates, control characters, deep nesting, a missing or non-string
 *    member, any syntax error) it gives up and the line goes to
 *  - jansson, which decides every other case and writes the error messages.
 *
 * Measured (bench/textpath.py, perf): jansson's full parse was 29 % of the
 * daemon's CPU time on the Debian docs corpus, more than the PCRE2 split.
 * The scanner reads strings 16 bytes at a time and decodes the text member
 * on the same pass that checks it (6.7 % -> 3.8 % of the daemon's CPU on
 * the text path); its text is valid UTF-8 by construction, which the record
 * says (utf8_valid) so that the tokenizer need not check it again.
 * tests/unit/test-jsonl.c checks the scanner against jansson on crafted
 * and on randomly mutated records; tests/fuzz/fuzz-jsonl.c fuzzes both.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/format/jsonl.h"
#include "daemon/tok/tok.h"

static const char *type_name(const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "?";
}

/* ---- the scanner ----------------------------------------------------------- */

#define SCAN_MAX_DEPTH 64
#define SCAN_MAX_NUMBER 18 /* digits and signs: fits json_int_t, and a real cannot overflow */

static inline const uint8_t *skip_ws(const uint8_t *p, const uint8_t *end)
{
	while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

static inline int hex4(const uint8_t *p)
{
	int v = 0;
	for (int i = 0; i < 4; i++) {
		uint8_t c = p[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
		if (d < 0)
			return -1;
		v = v << 4 | d;
	}
	return v;
}

/*
 * Sixteen bytes at a time: the mask of the bytes that end a plain run in a
 * JSON string (a quote, a backslash, a control character), as two words, 0
 * where all sixteen are plain. GCC's vector extension, so SSE2 on x86-64
 * and NEON on arm64 from the same code.
 */
typedef uint8_t jsonl_v16 __attribute__((vector_size(16), aligned(1)));

static inline uint64_t special16(const uint8_t *p, uint64_t *ret_hi)
{
	jsonl_v16 x;
	memcpy(&x, p, 16);
	jsonl_v16 m = (jsonl_v16)((x == '"') | (x == '\\') | (x < 0x20));
	uint64_t w[2];
	memcpy(w, &m, 16);
	*ret_hi = w[1];
	return w[0];
}

/* Offset of the first special byte of a 16-byte block given special16()'s mask (which is not 0). */
static inline unsigned special_at(uint64_t lo, uint64_t hi)
{
	/* Little-endian: the lowest set byte of the mask is the first special byte. */
	return lo ? (unsigned)__builtin_ctzll(lo) / 8 : 8 + (unsigned)__builtin_ctzll(hi) / 8;
}

/*
 * The escape at p (a backslash): returns what follows it, with the code
 * point it stands for in *ret_c, or NULL where jansson might refuse it or
 * the scanner does not know (bad escapes, surrogates that are not a pair).
 */
static const uint8_t *scan_escape(const uint8_t *p, const uint8_t *end, uint32_t *ret_c)
{
	if (end - p < 2)
		return NULL;
	switch (p[1]) {
	case '"': case '\\': case '/':
		*ret_c = p[1];
		return p + 2;
	case 'b': *ret_c = '\b'; return p + 2;
	case 'f': *ret_c = '\f'; return p + 2;
	case 'n': *ret_c = '\n'; return p + 2;
	case 'r': *ret_c = '\r'; return p + 2;
	case 't': *ret_c = '\t'; return p + 2;
	case 'u':
		break;
	default:
		return NULL;
	}
	if (end - p < 6)
		return NULL;
	int u = hex4(p + 2);
	if (u < 0 || (u >= 0xdc00 && u <= 0xdfff))
		return NULL;
	p += 6;
	if (u >= 0xd800 && u <= 0xdbff) {
		if (end - p < 6 || p[0] != '\\' || p[1] != 'u')
			return NULL;
		int lo = hex4(p + 2);
		if (lo < 0xdc00 || lo > 0xdfff)
			return NULL;
		u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
		p += 6;
	}
	*ret_c = (uint32_t)u;
	return p;
}

/* The first quote, backslash or control character in p[0..end), or end. */
static inline const uint8_t *plain_run(const uint8_t *p, const uint8_t *end)
{
	while (end - p >= 16) {
		uint64_t hi, lo = special16(p, &hi);
		if (lo | hi)
			return p + special_at(lo, hi);
		p += 16;
	}
	while (p < end && *p != '"' && *p != '\\' && *p >= 0x20)
		p++;
	return p;
}

/*
 * A string starting after its opening quote at p: returns the closing quote,
 * or NULL where jansson might refuse it or the scanner does not know (raw
 * control characters, escapes scan_escape() refuses). Escapes are counted
 * in *ret_escapes.
 */
static const uint8_t *scan_string(const uint8_t *p, const uint8_t *end, size_t *ret_escapes)
{
	size_t escapes = 0;
	uint32_t c;
	for (;;) {
		p = plain_run(p, end);
		if (p >= end || *p < 0x20)
			return NULL;
		if (*p == '"')
			break;
		escapes++;
		if (!(p = scan_escape(p, end, &c)))
			return NULL;
	}
	*ret_escapes = escapes;
	return p;
}

static const uint8_t *scan_number(const uint8_t *p, const uint8_t *end)
{
	const uint8_t *start = p;
	if (p < end && *p == '-')
		p++;
	if (p < end && *p == '0')
		p++;
	else if (p < end && *p >= '1' && *p <= '9')
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	else
		return NULL;
	if (p < end && *p == '.') {
		p++;
		if (p >= end || *p < '0' || *p > '9')
			return NULL;
		while (p < end && *p >= '0' && *p <= '9')
			p++;
	}
	/* Exponents and long numbers: jansson may call them overflows. */
	if ((p < end && (*p == 'e' || *p == 'E')) || p - start > SCAN_MAX_NUMBER)
		return NULL;
	return p;
}

static const uint8_t *scan_value(const uint8_t *p, const uint8_t *end, unsigned depth);

/* An object or array after its opening bracket; returns the byte after its end. */
static const uint8_t *scan_container(const uint8_t *p, const uint8_t *end, unsigned depth, bool object)
{
	size_t esc;
	if (depth >= SCAN_MAX_DEPTH)
		return NULL;
	p = skip_ws(p, end);
	if (p < end && *p == (object ? '}' : ']'))
		return p + 1;
	for (;;) {
		if (object) {
			if (p >= end || *p != '"' || !(p = scan_string(p + 1, end, &esc)) || esc)
				return NULL;
			p = skip_ws(p + 1, end);
			if (p >= end || *p != ':')
				return NULL;
			p = skip_ws(p + 1, end);
		}
		if (!(p = scan_value(p, end, depth + 1)))
			return NULL;
		p = skip_ws(p, end);
		if (p < end && *p == ',') {
			p = skip_ws(p + 1, end);
			continue;
		}
		if (p < end && *p == (object ? '}' : ']'))
			return p + 1;
		return NULL;
	}
}

static const uint8_t *scan_value(const uint8_t *p, const uint8_t *end, unsigned depth)
{
	size_t esc;
	if (p >= end)
		return NULL;
	switch (*p) {
	case '"':
		p = scan_string(p + 1, end, &esc);
		return p ? p + 1 : NULL;
	case '{':
		return scan_container(p + 1, end, depth, true);
	case '[':
		return scan_container(p + 1, end, depth, false);
	case 't':
		return end - p >= 4 && memcmp(p, "true", 4) == 0 ? p + 4 : NULL;
	case 'f':
		return end - p >= 5 && memcmp(p, "false", 5) == 0 ? p + 5 : NULL;
	case 'n':
		return end - p >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : NULL;
	default:
		return scan_number(p, end);
	}
}

static uint8_t *put_utf8(uint8_t *o, uint32_t c)
{
	if (c < 0x80) {
		*o++ = (uint8_t)c;
	} else if (c < 0x800) {
		*o++ = (uint8_t)(0xc0 | c >> 6);
		*o++ = (uint8_t)(0x80 | (c & 0x3f));
	} else if (c < 0x10000) {
		*o++ = (uint8_t)(0xe0 | c >> 12);
		*o++ = (uint8_t)(0x80 | (c >> 6 & 0x3f));
		*o++ = (uint8_t)(0x80 | (c & 0x3f));
	} else {
		*o++ = (uint8_t)(0xf0 | c >> 18);
		*o++ = (uint8_t)(0x80 | (c >> 12 & 0x3f));
		*o++ = (uint8_t)(0x80 | (c >> 6 & 0x3f));
		*o++ = (uint8_t)(0x80 | (c & 0x3f));
	}
	return o;
}

/*
 * The text member's string, starting after its opening quote at p: checked
 * as scan_string() checks, and decoded on the same pass. Returns the closing
 * quote with r->text/r->len set (pointing into the line when the string has
 * no escapes, else into r->text_buf), NULL as scan_string() does; *ret_oom
 * is set when the buffer cannot grow.
 */
static const uint8_t *scan_text(struct jsonl_record *r, const uint8_t *p, const uint8_t *end, bool *ret_oom)
{
	const uint8_t *start = p;
	p = plain_run(p, end);
	if (p >= end || *p < 0x20)
		return NULL;
	if (*p == '"') {
		r->text = (const char *)start;
		r->len = (size_t)(p - start);
		return p;
	}
	/*
	 * Every escape is at least as long as what it stands for, so the text
	 * fits in the rest of the line, and so does each 16-byte store below:
	 * it starts no further from text_buf than p from start.
	 */
	size_t cap = (size_t)(end - start);
	if (r->text_cap < cap) {
		uint8_t *n = realloc(r->text_buf, cap);
		if (!n) {
			*ret_oom = true;
			return NULL;
		}
		r->text_buf = n;
		r->text_cap = cap;
	}
	uint8_t *o = r->text_buf;
	memcpy(o, start, (size_t)(p - start));
	o += p - start;
	for (;;) {
		/* p is at a special byte: the end, a control character, a quote or an escape. */
		if (p >= end || *p < 0x20)
			return NULL;
		if (*p == '"')
			break;
		uint32_t c;
		if (!(p = scan_escape(p, end, &c)))
			return NULL;
		o = put_utf8(o, c);
		/* The plain run after it, copied sixteen bytes at a time. */
		for (;;) {
			if (end - p < 16) {
				while (p < end && *p != '"' && *p != '\\' && *p >= 0x20)
					*o++ = *p++;
				break;
			}
			uint64_t hi, lo = special16(p, &hi);
			memcpy(o, p, 16);
			if (lo | hi) {
				unsigned k = special_at(lo, hi);
				o += k;
				p += k;
				break;
			}
			o += 16;
			p += 16;
		}
	}
	r->text = (const char *)r->text_buf;
	r->len = (size_t)(o - r->text_buf);
	return p;
}

/*
 * A member's name at p (a string without escapes), its colon: the value's
 * start, *ret_match saying whether the name is key; NULL where jansson must
 * decide.
 */
static const uint8_t *member_value(const uint8_t *p, const uint8_t *end, const char *key, size_t key_len,
				   bool *ret_match)
{
	size_t esc;
	if (p >= end || *p != '"')
		return NULL;
	const uint8_t *k = p + 1, *ke = scan_string(k, end, &esc);
	if (!ke || esc)
		return NULL;
	p = skip_ws(ke + 1, end);
	if (p >= end || *p != ':')
		return NULL;
	*ret_match = (size_t)(ke - k) == key_len && memcmp(k, key, key_len) == 0;
	return skip_ws(p + 1, end);
}

/*
 * The scanner: 1 with r->text set when line is a JSON object whose last
 * `key` member is a string, 0 where jansson must decide, -ENOMEM.
 */
static int scan_record(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key)
{
	const uint8_t *end = line + len, *p = skip_ws(line, end);
	size_t key_len = strlen(key);
	bool text = false, oom = false;

	if (p >= end || *p != '{')
		return 0;
	p = skip_ws(p + 1, end);
	if (p < end && *p == '}')
		return 0; /* no member: jansson says so */
	for (;;) {
		bool match;
		if (!(p = member_value(p, end, key, key_len, &match)))
			return 0;
		if (match) {
			/* A repeated key: jansson keeps the last value. */
			if (p >= end || *p != '"')
				return 0;
			const uint8_t *se = scan_text(r, p + 1, end, &oom);
			if (!se)
				return oom ? -ENOMEM : 0;
			text = true;
			p = se + 1;
		} else if (!(p = scan_value(p, end, 1))) {
			return 0;
		}
		p = skip_ws(p, end);
		if (p < end && *p == ',') {
			p = skip_ws(p + 1, end);
			continue;
		}
		if (p < end && *p == '}')
			break;
		return 0;
	}
	if (skip_ws(p + 1, end) != end || !text)
		return 0;
	/* The line was valid UTF-8 (repaired first), and escapes decode to whole characters. */
	r->utf8_valid = true;
	return 1;
}

/* ---- the record ------------------------------------------------------------ */

int jsonl_extract(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key, char *err, size_t errlen)
{
	return jsonl_extract_with(r, line, len, key, true, err, errlen);
}

int jsonl_extract_with(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key, bool scan,
		       char *err, size_t errlen)
{
	if (r->root) {
		json_decref(r->root);
		r->root = NULL;
	}
	r->text = NULL;
	r->len = 0;
	r->replaced = 0;
	r->utf8_valid = false;
	if (tok_utf8_valid_prefix(line, len) != len) {
		if (len > (SIZE_MAX - 1) / 3)
			return -ENOMEM;
		if (r->scratch_cap < 3 * len) {
			uint8_t *n = realloc(r->scratch, 3 * len);
			if (!n)
				return -ENOMEM;
			r->scratch = n;
			r->scratch_cap = 3 * len;
		}
		len = tok_utf8_replace(line, len, r->scratch, &r->replaced);
		line = r->scratch;
	}
	if (scan) {
		int k = scan_record(r, line, len, key);
		if (k != 0)
			return k < 0 ? k : 0;
	}
	json_error_t je;
	r->root = json_loadb((const char *)line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
	if (!r->root) {
		snprintf(err, errlen, "column %d: not valid JSON: %s", je.column, je.text);
		return -EBADMSG;
	}
	if (!json_is_object(r->root)) {
		snprintf(err, errlen, "the record is %s, not a JSON object", type_name(r->root));
		return -EINVAL;
	}
	json_t *v = json_object_get(r->root, key);
	if (!v) {
		snprintf(err, errlen, "the record has no \"%s\" member", key);
		return -EINVAL;
	}
	if (!json_is_string(v)) {
		snprintf(err, errlen, "\"%s\" is %s, not a string", key, type_name(v));
		return -EINVAL;
	}
	r->text = json_string_value(v);
	r->len = json_string_length(v);
	return 0;
}

void jsonl_record_done(struct jsonl_record *r)
{
	if (r->root)
		json_decref(r->root);
	free(r->scratch);
	free(r->text_buf);
	*r = (struct jsonl_record){ 0 };
}

/* ---- one record's text member decoded a segment at a time ----------------- */

/*
 * A huge record (tokenize.c streams documents over a few MiB) is decoded
 * with the scanner's own rules, one segment at a time: the members before
 * the text must fit in the first segment, those after it in the last
 * (jsonl_stream_end()); anything the scanner would hand to jansson makes the
 * caller fall back to reading the record whole, so the text is the same.
 */
int jsonl_stream_begin(const uint8_t *line, size_t len, const char *key, size_t *ret_used)
{
	const uint8_t *end = line + len, *p = skip_ws(line, end);
	size_t key_len = strlen(key);
	if (p >= end || *p != '{')
		return 0;
	p = skip_ws(p + 1, end);
	for (;;) {
		bool match;
		if (!(p = member_value(p, end, key, key_len, &match)))
			return 0;
		if (match) {
			if (p >= end || *p != '"')
				return 0;
			*ret_used = (size_t)(p + 1 - line);
			return tok_utf8_valid_prefix(line, *ret_used) == *ret_used;
		}
		if (!(p = scan_value(p, end, 1)))
			return 0;
		p = skip_ws(p, end);
		if (p >= end || *p != ',')
			return 0;
		p = skip_ws(p + 1, end);
	}
}

int jsonl_stream_text(const uint8_t *in, size_t n, bool last, uint8_t *out, size_t *ret_out, size_t *ret_used,
		      bool *ret_closed)
{
	const uint8_t *p = in, *end = in + n;
	uint8_t *o = out;
	*ret_closed = false;
	while (p < end) {
		const uint8_t *q = plain_run(p, end);
		memcpy(o, p, (size_t)(q - p));
		o += q - p;
		p = q;
		if (p >= end)
			break;
		if (*p == '"') {
			*ret_closed = true;
			p++;
			break;
		}
		if (*p < 0x20)
			return -EINVAL;
		/* An escape cut by the segment's end waits for the next one. */
		size_t need = end - p >= 2 && p[1] == 'u' ? 6 : 2;
		if (need == 6 && end - p >= 6) {
			int u = hex4(p + 2);
			if (u >= 0xd800 && u <= 0xdbff)
				need = 12;
		}
		if ((size_t)(end - p) < need) {
			if (last)
				return -EINVAL;
			break;
		}
		uint32_t c;
		if (!(q = scan_escape(p, end, &c)))
			return -EINVAL;
		o = put_utf8(o, c);
		p = q;
	}
	if (last && !*ret_closed)
		return -EINVAL;
	*ret_out = (size_t)(o - out);
	*ret_used = (size_t)(p - in);
	return 0;
}

int jsonl_stream_end(const uint8_t *rest, size_t len, const char *key)
{
	const uint8_t *end = rest + len, *p = skip_ws(rest, end);
	size_t key_len = strlen(key), esc;
	if (tok_utf8_valid_prefix(rest, len) != len)
		return 0;
	while (p < end && *p == ',') {
		p = skip_ws(p + 1, end);
		if (p >= end || *p != '"')
			return 0;
		const uint8_t *k = p + 1, *ke = scan_string(k, end, &esc);
		if (!ke || esc || ((size_t)(ke - k) == key_len && memcmp(k, key, key_len) == 0))
			return 0; /* a repeated key: jansson keeps the last value */
		p = skip_ws(ke + 1, end);
		if (p >= end || *p != ':')
			return 0;
		if (!(p = scan_value(skip_ws(p + 1, end), end, 1)))
			return 0;
		p = skip_ws(p, end);
	}
	return p < end && *p == '}' && skip_ws(p + 1, end) == end;
}
