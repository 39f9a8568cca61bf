/* SPDX-License-Identifier: MIT */
/* The table of formats, and the shard wrapper every format fills in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/format/format.h"
#include "proto/macro.h"

static const struct format *const formats[] = {
	&format_megatron,
	&format_jsonl,
	&format_text,
	&format_parquet,
};

void format_names(char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = 0;
	for (size_t i = 0; i < ARRAY_SIZE(formats) && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", formats[i]->name);
}

const struct format *format_find(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(formats); i++)
		if (strcmp(formats[i]->name, name) == 0)
			return formats[i];
	return NULL;
}

int format_open(const struct format *fmt, const char *name, const struct format_opts *o, struct source_reader *r,
		struct shard **ret, char *err, size_t errlen)
{
	struct shard *s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -ENOMEM;
	}
	s->format = fmt;
	s->truncated = "";
	int e = fmt->open(s, name, o, r, err, errlen);
	if (e < 0) {
		free(s);
		return e;
	}
	*ret = s;
	return 0;
}

struct shard *format_close(struct shard *s)
{
	if (!s)
		return NULL;
	s->format->close(s);
	free(s);
	return NULL;
}

void format_state_done(struct format_state *st)
{
	jsonl_record_done(&st->jsonl);
}
