/* SPDX-License-Identifier: MIT */
/*
 * The Prometheus endpoint (docs/configuration.md, metrics_listen): libevent's
 * HTTP server on the daemon's own event base, answering GET /metrics with
 * the text exposition format 0.0.4 and 404 for every other path. A scrape
 * takes the server's status snapshot (daemon/server/status.h), the same one
 * the status document is made of, and only formats it: no number is
 * computed twice.
 *
 * The endpoint is a side channel: it holds no reference on anything between
 * scrapes, and a client of it has bounded headers, no body and a 5 s
 * timeout. Main thread only.
 */
#pragma once

#include <stdint.h>
#include <sys/socket.h>

#include "daemon/server/status.h"

struct event_base;
struct evbuffer;
struct metrics;
struct server;

/*
 * Listens on addr (IPv4 or IPv6; port 0 picks a free one) and serves srv's
 * metrics from base. Returns 0, or a negative errno with a message naming
 * the address in err.
 */
int metrics_new(struct event_base *base, const struct sockaddr *addr, socklen_t addrlen, struct server *srv,
		struct metrics **ret, char *err, size_t errlen);
struct metrics *metrics_free(struct metrics *m);

/* The address it listens on, with the port it got: "127.0.0.1:9464", "[::1]:9464". Owned by m. */
const char *metrics_address(const struct metrics *m);

/* What the endpoint reports about itself. */
struct metrics_self {
	uint64_t scrapes;   /* scrapes answered before this one */
	uint64_t scrape_ns; /* the previous scrape's snapshot and render time */
};

/* Appends the exposition text of a snapshot to out. Returns 0 or -ENOMEM. */
int metrics_render(const struct status_input *in, const struct metrics_self *self, struct evbuffer *out);
