/* SPDX-License-Identifier: MIT */
/*
 * One JSONL record's text, with jansson: the line must be a JSON object and
 * `key` a string member of it. Invalid UTF-8 is replaced by U+FFFD first, the
 * way Python's bytes.decode("utf-8", errors="replace") would before
 * json.loads(), so a record that a Python pipeline reads is read the same.
 * Common records are read by a validating scanner that decodes only the text
 * (jsonl.c says why); jansson decides the rest and words the errors.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct jsonl_record {
	json_t *root;
	const char *text;  /* points into root, text_buf or the line */
	size_t len;
	size_t replaced;   /* invalid UTF-8 sequences replaced */
	bool utf8_valid;   /* text is known to be valid UTF-8 (the scanner read it) */
	uint8_t *scratch;  /* the line with invalid UTF-8 replaced, reused */
	size_t scratch_cap;
	uint8_t *text_buf; /* the text with its escapes decoded, reused */
	size_t text_cap;
};

/*
 * Parses line[0..len) and finds its text. Returns 0 with r->text/r->len set;
 * -EBADMSG (not JSON, err names the column), -EINVAL (not an object, no such
 * key, or not a string; err says which), -ENOMEM. r->root is released by
 * the next call or jsonl_record_done(). r->text may point into line: it
 * is valid while line and r are.
 */
int jsonl_extract(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key, char *err, size_t errlen);
/* As jsonl_extract(); scan = false sends every line to jansson (for tests
 * that compare the two readers). */
int jsonl_extract_with(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key, bool scan,
		       char *err, size_t errlen);
void jsonl_record_done(struct jsonl_record *r);

/*
 * A record's `key` member decoded a segment at a time (huge documents,
 * tokenize.c), by the scanner's rules; 0 or -EINVAL wherever the scanner
 * would leave the record to jansson: the caller then reads it whole.
 * jsonl_stream_begin(): 1 and the offset just after the opening quote of the
 * member's string when the members before it are in line[0..len).
 * jsonl_stream_text(): decodes the string from in[0..n) into out (room for
 * n bytes): *ret_out bytes written, *ret_used bytes taken (an escape cut by
 * the end is left for the next call, unless last), *ret_closed after the
 * closing quote (taken). Invalid UTF-8 is passed through (the tokenizer
 * repairs it as the whole-line repair would).
 * jsonl_stream_end(): 1 when rest (all after the closing quote) ends the
 * object validly with no second `key` member.
 */
int jsonl_stream_begin(const uint8_t *line, size_t len, const char *key, size_t *ret_used);
int jsonl_stream_text(const uint8_t *in, size_t n, bool last, uint8_t *out, size_t *ret_out, size_t *ret_used,
		      bool *ret_closed);
int jsonl_stream_end(const uint8_t *rest, size_t len, const char *key);
