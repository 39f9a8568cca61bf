/* SPDX-License-Identifier: MIT */
/*
 * Shared by conf.c (the file: sections, repeats, checks across keys) and
 * keys.c (each key's type, range and error): the state of one parse.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "daemon/conf/conf.h"
#include "proto/macro.h"

struct parse {
	struct conf *conf;
	char *dir;          /* the config file's directory */
	char msg[512];      /* the first error, without the line */
	bool failed;
	char **seen;        /* "section\nkey" of every key so far */
	size_t n_seen;
	FILE *file;
	unsigned line;      /* of the line inih handles now */
};

/* Records the first error of the parse (inih adds the line). Returns 0, inih's "stop at this line". */
int conf_bad(struct parse *p, const char *fmt, ...) _printf_(2, 3);

/*
 * Sets key `name` of `section` from value. Returns 1, or conf_bad()'s 0 for
 * an unknown section or key, or a bad value.
 */
int conf_key(struct parse *p, const char *section, const char *name, const char *value);
