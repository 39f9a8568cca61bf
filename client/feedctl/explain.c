/* SPDX-License-Identifier: MIT */
/*
 * feedctl explain: which documents a rank's next batches hold (provenance:
 * "which data was in step N?"), and feedctl merge: the global state of a
 * job's ranks (elastic resume). docs/sample-order.md, section 17.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/feedctl/feedctl.h"

static int parse_u32_arg(const char *what, const char *s, uint32_t *ret)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	if (!*s || *end || v > UINT32_MAX || s[0] == '-') {
		fprintf(stderr, "feedctl: %s '%s' is not an unsigned integer\n", what, s);
		return -1;
	}
	*ret = (uint32_t)v;
	return 0;
}

int cmd_explain(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "rank", required_argument, NULL, 'r' },   { "world", required_argument, NULL, 'w' },
		{ "cursor", required_argument, NULL, 'c' }, { "state", required_argument, NULL, 'c' },
		{ "batches", required_argument, NULL, 'n' }, { 0 },
	};
	uint32_t rank = 0, world = 1, batches = 1;
	const char *cursor = NULL;
	int opt;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if ((opt == 'r' && parse_u32_arg("--rank", optarg, &rank) < 0) ||
		    (opt == 'w' && parse_u32_arg("--world", optarg, &world) < 0) ||
		    (opt == 'n' && parse_u32_arg("--batches", optarg, &batches) < 0) || opt == '?')
			return 2;
		if (opt == 'c')
			cursor = optarg;
	}
	if (optind + 1 != argc) {
		fprintf(stderr, "Usage: feedctl explain FEED [--rank R --world W] [--cursor C | --state S] [--batches N]\n");
		return 2;
	}
	feed_client *c;
	if (connect_or_say(&c) < 0)
		return 1;
	char *text = NULL;
	int r = feed_client_explain(c, argv[optind], rank, world, cursor, batches, &text);
	if (r < 0)
		fprintf(stderr, "feedctl explain: %s\n", feed_client_error(c));
	else
		fputs(text, stdout);
	free(text);
	feed_client_close(c);
	return r < 0 ? 1 : 0;
}

int cmd_merge(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "Usage: feedctl merge STATE_OF_RANK_0 STATE_OF_RANK_1 ...\n");
		return 2;
	}
	size_t cap = 64;
	for (int i = 1; i < argc; i++)
		cap += strlen(argv[i]);
	char *buf = malloc(cap), err[512];
	if (!buf) {
		fprintf(stderr, "feedctl merge: out of memory\n");
		return 1;
	}
	int r = feed_merge_states((const char *const *)argv + 1, (size_t)argc - 1, buf, cap, err, sizeof(err));
	if (r < 0)
		fprintf(stderr, "feedctl merge: %s\n", err[0] ? err : feed_strerror(r));
	else
		printf("%s\n", buf);
	free(buf);
	return r < 0 ? 1 : 0;
}
