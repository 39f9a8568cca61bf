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
 * A string starting after its opening quote at p: returns the closing quote,
 * or NULL where jansson might refuse it or the scanner does not know (raw
 * control characters, bad escapes, surrogates that are not a pair). Escapes
 * are counted in *ret_escapes.
 */
static const uint8_t *scan_string(const uint8_t *p, const uint8_t *end, size_t *ret_escapes)
{
	size_t escapes = 0;
	for (;;) {
		/* Eight bytes at a time until one is a quote, a backslash or a control character. */
		while (end - p >= 8) {
			uint64_t w;
			memcpy(&w, p, 8);
			const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
			uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
			uint64_t hit = ((q - ones) & ~q) | ((b - ones) & ~b) | (w - ones * 0x20);
			if (hit & ~w & high)
				break;
			p += 8;
		}
		while (p < end && *p != '"' && *p != '\\' && *p >= 0x20)
			p++;
		if (p >= end || *p < 0x20)
			return NULL;
		if (*p == '"')
			break;
		escapes++;
		if (end - p < 2)
			return NULL;
		switch (p[1]) {
		case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
			p += 2;
			continue;
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
			p += 6;
		}
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

/* Decodes the escapes of a string that scan_string() accepted, s[0..n), into o; returns the bytes written. */
static size_t unescape(const uint8_t *s, size_t n, uint8_t *o)
{
	const uint8_t *end = s + n;
	uint8_t *start = o;
	while (s < end) {
		const uint8_t *b = memchr(s, '\\', (size_t)(end - s));
		size_t run = (size_t)((b ? b : end) - s);
		memcpy(o, s, run);
		o += run;
		s += run;
		if (!b)
			break;
		uint8_t c = s[1];
		if (c == 'u') {
			uint32_t u = (uint32_t)hex4(s + 2);
			s += 6;
			if (u >= 0xd800 && u <= 0xdbff) {
				u = 0x10000 + ((u - 0xd800) << 10) + ((uint32_t)hex4(s + 2) - 0xdc00);
				s += 6;
			}
			o = put_utf8(o, u);
			continue;
		}
		*o++ = c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
		s += 2;
	}
	return (size_t)(o - start);
}

/*
 * The scanner: 1 with r->text set when line is a JSON object whose last
 * `key` member is a string, 0 where jansson must decide, -ENOMEM.
 */
static int scan_record(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key)
{
	const uint8_t *end = line + len, *p = skip_ws(line, end), *text = NULL;
	size_t key_len = strlen(key), text_len = 0, text_escapes = 0, esc;

	if (p >= end || *p != '{')
		return 0;
	p = skip_ws(p + 1, end);
	if (p < end && *p == '}')
		return 0; /* no member: jansson says so */
	for (;;) {
		if (p >= end || *p != '"')
			return 0;
		const uint8_t *k = p + 1, *ke = scan_string(k, end, &esc);
		if (!ke || esc)
			return 0;
		p = skip_ws(ke + 1, end);
		if (p >= end || *p != ':')
			return 0;
		p = skip_ws(p + 1, end);
		bool match = (size_t)(ke - k) == key_len && memcmp(k, key, key_len) == 0;
		if (match) {
			/* A repeated key: jansson keeps the last value. */
			if (p >= end || *p != '"')
				return 0;
			const uint8_t *se = scan_string(p + 1, end, &text_escapes);
			if (!se)
				return 0;
			text = p + 1;
			text_len = (size_t)(se - text);
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
	if (text_escapes == 0) {
		r->text = (const char *)text;
		r->len = text_len;
		return 1;
	}
	/* Every escape is at least as long as what it stands for. */
	if (r->text_cap < text_len) {
		uint8_t *n = realloc(r->text_buf, text_len);
		if (!n)
			return -ENOMEM;
		r->text_buf = n;
		r->text_cap = text_len;
	}
	r->len = unescape(text, text_len, r->text_buf);
	r->text = (const char *)r->text_buf;
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
