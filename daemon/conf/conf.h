/* SPDX-License-Identifier: MIT */
/*
 * feedd.conf (docs/configuration.md): INI, parsed with inih. Every key is
 * checked; an unknown key (or any key under an unknown section), a key given
 * twice, or a bad value fails the whole
 * file with "path:line: ..." so a broken config never half-applies.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/io/reader.h"

#define CONF_TOKEN_NONE INT64_C(-1)

struct conf_feed {
	char *name;
	char *format;        /* "megatron" */
	char **shards;       /* globs, in config order; relative ones resolved against the config's directory */
	size_t n_shards;
	uint32_t seq_len;
	uint32_t batch_size;
	uint64_t seed;
	bool shuffle;
	uint32_t shuffle_window;
	int64_t bos, eos;    /* token id or CONF_TOKEN_NONE */
};

struct conf {
	char *path;
	char *socket;        /* NULL: the default (wire_socket_path) */
	unsigned threads;    /* 0: one per CPU */
	unsigned ring_slots;
	int log_level;
	enum io_engine io_engine;
	unsigned io_depth;
	struct conf_feed *feeds;
	size_t n_feeds;
};

/*
 * Parses the file at path. Returns 0; or a negative errno with a message
 * naming the file and line in err.
 */
int conf_load(const char *path, struct conf **ret, char *err, size_t errlen);
struct conf *conf_free(struct conf *c);
const struct conf_feed *conf_find_feed(const struct conf *c, const char *name);
