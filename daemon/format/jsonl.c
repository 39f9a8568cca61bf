/* SPDX-License-Identifier: MIT */
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

int jsonl_extract(struct jsonl_record *r, const uint8_t *line, size_t len, const char *key, char *err, size_t errlen)
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
	*r = (struct jsonl_record){ 0 };
}
