/* SPDX-License-Identifier: MIT */
/*
 * Telemetry that explains itself (docs/telemetry.md). Once a second the main
 * thread samples every attached client's consumer page (the wait/step totals
 * and histograms libfeed records) and every feed's stage counters
 * (stage.h), and keeps, by differencing:
 *  - per client: wait, step and H2D histograms over a sliding window and since
 *    attach, ring occupancy, and per-second samples for the last history_s
 *    seconds (feedctl report plots them);
 *  - per feed: stage rates over the same window;
 *  - a diagnosis per client and per feed (words + a kind), stragglers among
 *    the ranks of a feed and world, and the worst line of all.
 *
 * The window is WINDOW_SLOTS sub-windows of ceil(window_s / WINDOW_SLOTS)
 * seconds, so its memory does not grow with window_s: about 190 KiB per
 * client plus 24 bytes per second of history.
 *
 * Everything here runs on the main thread. The telemetry module owns its
 * per-client records; the server registers a session on attach and
 * unregisters it before closing it, so every pointer held here is live.
 */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/conf/conf.h"
#include "daemon/feed/feed.h"
#include "daemon/feed/session.h"
#include "daemon/pool/pool.h"

/* Severity of a diagnosis, for the worst line: higher is worse. */
enum diag_severity {
	DIAG_OK = 0,      /* compute-bound, idle, warming up, keeping up */
	DIAG_NOTICE = 1,  /* transfer-bound, straggler */
	DIAG_WARNING = 2, /* starved, slow to release */
	DIAG_ERROR = 3,   /* failed */
};

/* Sets the window and thresholds (a copy is kept). Call before serving and after a reload. */
void telemetry_configure(const struct conf_diagnosis *d);

/* Starts tracking a session just attached. Returns 0 or -ENOMEM (the session then goes untracked). */
int telemetry_attach(struct session *s);
/* Stops tracking s; call before the session is closed. Takes NULL or an untracked session. */
void telemetry_detach(struct session *s);

/*
 * Once a second, from the server's tick: telemetry_tick_begin(), then
 * telemetry_tick_feed() for every feed served, then telemetry_tick_end()
 * samples every tracked session and re-runs the diagnoses. Feeds not named
 * in a tick are forgotten (they may be freed after it).
 */
void telemetry_tick_begin(void);
void telemetry_tick_feed(const struct feed *f);
void telemetry_tick_end(struct pool *pool);

/* The "diagnosis" and "telemetry" members of a client's status object (new references, NULL if untracked). */
json_t *telemetry_client_diagnosis_json(const struct session *s);
json_t *telemetry_client_json(const struct session *s);
/* The "diagnosis" and "stages" members of a feed's status object (new references). */
json_t *telemetry_feed_diagnosis_json(const struct feed *f);
json_t *telemetry_feed_stages_json(const struct feed *f);
/* The daemon-wide view: window, thresholds, the worst line (new reference). */
json_t *telemetry_daemon_json(void);

/*
 * The worst diagnosis of all clients and feeds as one line, e.g. "web rank
 * 3/8: starved: waiting 41 % — ...", written to buf (always NUL-terminated;
 * "no clients" when nothing is attached). Returns its enum diag_severity.
 * For the systemd STATUS= line.
 */
int telemetry_worst(char *buf, size_t len);
