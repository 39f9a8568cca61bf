/* SPDX-License-Identifier: MIT */
/*
 * What feedctl's subcommands share: the socket option, fetching and printing
 * the status document (docs/protocol.md, section 10, has its schema), and the table of
 * subcommands. feedctl talks to feedd only through libfeed.
 */
#pragma once

#include <jansson.h>
#include <stdio.h>

#include "feed/feed.h"

struct command {
	const char *name;
	int (*run)(int argc, char **argv); /* argv[0] is the name; returns the exit status */
	const char *synopsis;
	const char *help;
};

extern const char *socket_path; /* --socket, NULL: libfeed's default */

/* Connects, or says why not on stderr. Returns 0 or a negative errno. */
int connect_or_say(feed_client **c);
/*
 * The same through the operator socket beside the control socket when this
 * user can reach it (root, feedd's user: proto/wire.h), else as
 * connect_or_say(): status, top, report, reload and drain are then served
 * ahead of every client and are not queued behind their connections.
 */
int connect_operator_or_say(feed_client **c);
/*
 * What print_status() reads of the document: no client's history or
 * since_attach (1,000 long-lived clients: 25 MB of history), so the reply
 * and its parse stay small. An older feedd sends them anyway.
 */
#define STATUS_PRINTED (FEED_STATUS_NO_HISTORY | FEED_STATUS_NO_SINCE_ATTACH)
/*
 * Fetches and parses the status document, without what `flags`
 * (FEED_STATUS_*) leaves out. Returns 0 with *ret (caller decrefs), or -1
 * after saying why.
 */
int fetch_status(unsigned flags, json_t **ret);
/* The human view of a status document (feedctl status, top). */
void print_status(json_t *root, FILE *out);
/* What the diagnosis's host rule reads (telemetry.host), in one line of words; "-" when absent. */
void host_line(json_t *root, char *buf, size_t n);

/* Small readers of the document: absent fields read as "-" / 0 / NULL. */
const char *str(json_t *o, const char *k);
double num(json_t *o, const char *k);
json_t *path(json_t *o, const char *a, const char *b, const char *c);
void human(double v, char *buf, size_t n);
void ms(json_t *v, char *buf, size_t n);

int cmd_top(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_prep(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_parquet_info(int argc, char **argv);
int cmd_explain(int argc, char **argv);
int cmd_merge(int argc, char **argv);
