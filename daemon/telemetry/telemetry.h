/* SPDX-License-Identifier: MIT */
/*
 * Telemetry that explains itself (docs/telemetry.md). Once a second the main
 * thread feeds the telemetry object every attached client's reading (its
 * consumer page, read by ring_read_consumer(), and its ring's state) and
 * every feed's stage counters (feed/stage.h), and it keeps, by differencing:
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
 * Ownership: the server creates one struct telemetry (server_new) and frees
 * it after its connections. Per-client state is a struct telemetry_client
 * embedded in its owner (the server's struct conn, as dbus-broker embeds a
 * peer's state in struct Peer): telemetry_client_attach() links it into the
 * object's list, telemetry_client_detach() unlinks it, and both are asserted
 * to pair. Telemetry never sees a session: the owner hands it readings.
 * Feeds are named to it at every tick; one not named is forgotten at once.
 * Everything here runs on the main thread.
 */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/conf/conf.h"
#include "daemon/feed/feed.h"
#include "daemon/pool/pool.h"
#include "daemon/ring/ring.h"
#include "proto/ring_abi.h"

#define WINDOW_SLOTS 60

struct telemetry;

/* Severity of a diagnosis, for the worst line: higher is worse. */
enum diag_severity {
	DIAG_OK = 0,      /* compute-bound, idle, warming up, keeping up */
	DIAG_NOTICE = 1,  /* transfer-bound, straggler */
	DIAG_WARNING = 2, /* starved, slow to release */
	DIAG_ERROR = 3,   /* failed */
};

struct diag {
	enum diag_severity severity;
	const char *kind;   /* "compute-bound", "starved", ... (docs/telemetry.md); NULL before the first */
	char cause[24];     /* the stage or reason a starved client or a feed is bound by, or "" */
	double stall_pct;   /* the client's (or the feed's worst client's) data wait share */
	double needed_x;    /* throughput factor that would end the wait, 0 if none */
	char text[384];
};

/* The scalar sums of a client's window or sub-window (same order as client_sums). */
#define CLIENT_SCALARS 8
/*
 * wait, step, h2d, reports and batches come from the consumer page (written by
 * the client, clamped); span, full and published are the daemon's own.
 */
#define CLIENT_SCALAR_FIELDS uint64_t span_ns, wait_ns, step_ns, h2d_ns, reports, batches, full_ns, published

/* One sub-window of a client; histograms in u32 to halve the memory. */
struct client_slot {
	union {
		struct {
			CLIENT_SCALAR_FIELDS;
		};
		uint64_t v[CLIENT_SCALARS];
	};
	uint32_t wait[FEED_HIST_BUCKETS], step[FEED_HIST_BUCKETS], h2d[FEED_HIST_BUCKETS];
};

/* The running sums over a client's window. */
struct client_sums {
	union {
		struct {
			CLIENT_SCALAR_FIELDS;
		};
		uint64_t v[CLIENT_SCALARS];
	};
	uint64_t wait[FEED_HIST_BUCKETS], step[FEED_HIST_BUCKETS], h2d[FEED_HIST_BUCKETS];
};

/* One second of a client's history: totals within that second. 24 bytes. */
struct sample {
	float wait_ms, step_ms, h2d_ms, full_pct;
	uint32_t batches;
	uint16_t fill, held;
};

/* A client's windows and histogram readings: about 190 KiB, allocated while it is attached. */
struct client_data {
	uint64_t p_hw[FEED_HIST_BUCKETS], p_hs[FEED_HIST_BUCKETS]; /* the previous histogram readings */
	uint64_t h2d_attach[FEED_HIST_BUCKETS]; /* per-second mean H2D times since attach */
	/*
	 * Since attach, summed from the clamped per-second deltas rather than
	 * read off the page: a client that writes 2^64 - 1 into its page gets
	 * no count that overflows a JSON integer, or any other absurd figure.
	 */
	uint64_t attach_wait[FEED_HIST_BUCKETS], attach_step[FEED_HIST_BUCKETS];
	uint64_t attach_wait_ns, attach_step_ns, attach_h2d_ns, attach_reports;
	struct client_sums win;                 /* the window's running sums */
	struct client_slot slots[WINDOW_SLOTS];
};

/* What the owner of a client reads for telemetry once a second (and for status). */
struct telemetry_reading {
	struct ring_consumer cons; /* the consumer page, clamped (ring_read_consumer) */
	uint64_t published;        /* batches published into the ring */
	uint64_t tail;             /* the ring's validated tail (ring->tail) */
	uint64_t full_ns;          /* time the ring spent full since attach, up to now */
	bool failed;               /* the stream stopped with an error */
	int pid;                   /* the client's pid (SO_PEERCRED), 0 if unknown: for its /proc state */
};

/*
 * A client's telemetry, embedded in its owner. The fields are telemetry's
 * alone; the owner only calls the functions below on it. Zeroed (or
 * detached), it is not tracked.
 */
struct telemetry_client {
	struct telemetry *tm;                     /* NULL when not attached */
	struct telemetry_client *prev, *next;     /* in tm's list of clients */
	const struct feed *feed;                  /* the feed it reads; its session holds a reference */
	unsigned rank, world, slot_count;
	uint64_t attach_ns, last_ns;
	bool failed;
	/* the previous readings, to difference against */
	uint64_t p_wait, p_step, p_h2d, p_reports, p_delivered, p_full, p_published, p_tail;
	uint64_t progress_ns; /* when the consumer page last moved (any counter, or a release) */
	bool stopped;         /* the page did not move and /proc/PID/stat says 'T' (SIGSTOP, a debugger) */
	struct client_data *d; /* the big part, allocated on attach: an unattached connection does not carry it */
	unsigned cur;          /* the current sub-window in d->slots */
	struct sample *hist;   /* ring of hist_cap seconds */
	unsigned hist_cap, hist_head, hist_n;
	uint64_t fill, held; /* at the last sample */
	bool waiting;        /* blocked in next() on an empty ring at the last sample */
	struct diag diag;
	char straggler[192];
};

/* Creates the telemetry object with the diagnosis config d (copied). Returns 0 or -ENOMEM. */
int telemetry_new(const struct conf_diagnosis *d, struct telemetry **ret);
/* Frees it; every client must be detached first. Takes NULL; returns NULL. */
struct telemetry *telemetry_free(struct telemetry *tm);
/* Sets the window and thresholds (a copy is kept); after a reload. Clients attached later use the new history_s. */
void telemetry_configure(struct telemetry *tm, const struct conf_diagnosis *d);

/*
 * Starts tracking a client just attached to feed f at rank/world, with a ring
 * of slot_count slots. c must not be attached. Returns 0 or -ENOMEM (c then
 * stays untracked and detaching it is a no-op).
 */
int telemetry_client_attach(struct telemetry *tm, struct telemetry_client *c, const struct feed *f, unsigned rank,
			    unsigned world, unsigned slot_count, uint64_t attach_ns);
/* Stops tracking c and frees what it holds. Takes an untracked (zeroed or failed-to-attach) client. */
void telemetry_client_detach(struct telemetry_client *c);
static inline bool telemetry_client_tracked(const struct telemetry_client *c)
{
	return c->tm != NULL;
}

/*
 * Once a second, from the server's tick: telemetry_tick_begin(), then
 * telemetry_tick_feed() for every feed served and telemetry_client_sample()
 * for every tracked client, then telemetry_tick_end() re-runs the diagnoses.
 * Feeds not named in a tick are forgotten (they may be freed after it).
 */
uint64_t telemetry_tick_begin(struct telemetry *tm); /* returns the tick's time (now_ns()) for the readings */
void telemetry_tick_feed(struct telemetry *tm, const struct feed *f);
void telemetry_client_sample(struct telemetry_client *c, const struct telemetry_reading *r);
void telemetry_tick_end(struct telemetry *tm, struct pool *pool);
/*
 * The server lets go of f (a reload removed it, its last client left, or
 * shutdown): its figures are forgotten now, before f can be freed, so that
 * nothing (the status line, a diagnosis) reads its name after, and a new
 * feed allocated at the same address starts from nothing.
 */
void telemetry_feed_forget(struct telemetry *tm, const struct feed *f);

/*
 * What status and metrics render (daemon/server/status.c, daemon/metrics):
 * telemetry fills these plain structs and formats nothing. Pointers in them
 * borrow telemetry's own records: render before the next tick.
 */

/* A stretch of a client's consumption: its window, or the time since attach. */
struct telemetry_period {
	double span_s;
	uint64_t batches, wait_ns, step_ns, h2d_ns, reports, full_ns;
	const uint64_t *hist_wait, *hist_step, *hist_h2d; /* FEED_HIST_BUCKETS each (feed_hist_bucket) */
};

struct telemetry_client_view {
	bool tracked;                /* false: telemetry keeps nothing of this client (the rest is zero) */
	struct telemetry_period window, since_attach;
	uint64_t ring_fill, held;    /* at the last sample */
	const struct sample *hist;   /* per-second samples: a ring of hist_cap from hist_head, hist_n of them */
	unsigned hist_cap, hist_head, hist_n;
	const struct diag *diag;
	const char *straggler;       /* "" when none */
};

/* Fills *ret for client c from its reading r at `now`. */
void telemetry_client_view(const struct telemetry_client *c, const struct telemetry_reading *r, uint64_t now,
			   struct telemetry_client_view *ret);

/* A feed's stage counters: over the window, and since load. */
struct telemetry_stages_view {
	double span_s;              /* the window's length, 0 before the first tick */
	unsigned threads;           /* worker threads of the pool */
	uint64_t worker_ns;         /* all the feed's worker time in the window (batch jobs, and a text feed's reading ahead) */
	struct feed_stages win;     /* the window's sums */
	bool has_total;             /* the feed has stage counters */
	struct feed_stages total;   /* since the feed was loaded */
};

void telemetry_stages_view(const struct telemetry *tm, const struct feed *f, struct telemetry_stages_view *ret);

/* A feed's verdict, and its stragglers (the clients of f named one, in the object's order). */
struct telemetry_feed_view {
	struct diag diag;
	bool tracked; /* false: no tick has seen the feed yet (its diag is "warming-up" or "failed") */
};

void telemetry_feed_view(const struct telemetry *tm, const struct feed *f, struct telemetry_feed_view *ret);
/* The next client of f after `prev` (NULL: the first) that is named a straggler, or NULL. */
const struct telemetry_client *telemetry_next_straggler(const struct telemetry *tm, const struct feed *f,
							 const struct telemetry_client *prev);

/* The daemon-wide view: config, pool, host, the worst line. */
struct telemetry_daemon_view {
	const struct conf_diagnosis *conf;
	double pool_busy_pct;
	unsigned cpus, runnable;
	double load_avg;
	bool host_known;             /* schedstat available: the two below mean something */
	double workers_cpu_per_s;    /* NAN when the window is empty */
	double runqueue_pct;
	int worst_severity;          /* enum diag_severity */
	char worst[512];             /* telemetry_worst() */
};

void telemetry_daemon_view(const struct telemetry *tm, struct telemetry_daemon_view *ret);

/* part as a percentage of whole (0 when whole is 0): every share telemetry and status show. */
/* A share in per cent, bounded by construction: part is clamped to whole, so it is always 0..100. */
static inline double telemetry_pct(uint64_t part, uint64_t whole)
{
	return whole ? 100.0 * (double)(part < whole ? part : whole) / (double)whole : 0.0;
}

/* Value (ns) at quantile q of a histogram of FEED_HIST_BUCKETS buckets (bucket midpoint, nearest rank); NAN when empty. */
double telemetry_quantile(const uint64_t *h, double q);

/*
 * The worst diagnosis of all clients and feeds as one line, e.g. "web rank
 * 3/8: starved: waiting 41 % — ...", written to buf (always NUL-terminated;
 * "no clients" when nothing is attached). Returns its enum diag_severity.
 * For the systemd STATUS= line.
 */
int telemetry_worst(const struct telemetry *tm, char *buf, size_t len);
