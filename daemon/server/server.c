/* SPDX-License-Identifier: MIT */
/*
 * The server object (server.h): starting it on a listening socket, the
 * policy a config sets, the feeds it serves and how a reload changes them,
 * draining, the once-a-second tick (shards unchanged? delivery rates, stuck
 * clients, telemetry, the STATUS= line), the watchdog's progress check, the
 * status snapshot (status.h renders it), and the orderly stop that tells
 * every attached client why its stream ends. The other files of this folder
 * are listed in server-internal.h.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/feed/checker.h"
#include "daemon/feed/integrity.h"
#include "daemon/sd/service.h"
#include "daemon/server/server-internal.h"
#include "daemon/source/remote.h"
#include "daemon/tokenize/tokenize.h"

/* The feed that takes attaches under `name`; NULL, with *ret_draining set when only a draining one exists. */
struct feed *server_find_feed(struct server *s, const char *name, bool *ret_draining)
{
	*ret_draining = false;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i].feed;
		if (strcmp(f->name, name) != 0)
			continue;
		if (!s->feeds[i].draining)
			return f;
		*ret_draining = true;
	}
	return NULL;
}

static struct served *served_of(struct server *s, const struct feed *f)
{
	for (size_t i = 0; i < s->n_feeds; i++)
		if (s->feeds[i].feed == f)
			return &s->feeds[i];
	return NULL;
}

void server_attached(struct server *s, const struct feed *f)
{
	struct served *sf = served_of(s, f);
	assert(sf); /* a feed is let go only once its last client detached */
	sf->clients++;
}

void server_detached(struct server *s, const struct feed *f)
{
	struct served *sf = served_of(s, f);
	assert(sf && sf->clients > 0); /* pairs with server_attached */
	sf->clients--;
}

/*
 * Reports a client that has had batches published and released none for
 * stuck_client_s; once per episode. (`released` is the client's tail, clamped.)
 */
static void watch_consumption(struct server *s, struct conn *c, const struct telemetry_reading *r, uint64_t now)
{
	uint64_t released = r->cons.tail;
	if (released != c->idle_released || released >= r->published || r->failed) {
		if (c->stuck)
			log_info("client %" PRIu64 " (pid %d) on feed %s rank %u/%u consumes again", c->id, (int)c->pid,
				 c->feed->name, c->rank, c->world);
		c->idle_released = released;
		c->idle_since_ns = now;
		c->stuck = false;
		return;
	}
	if (c->stuck || !s->stuck_client_s || now - c->idle_since_ns < (uint64_t)s->stuck_client_s * NSEC_PER_SEC)
		return;
	c->stuck = true;
	s->n.stuck_clients++;
	log_warning("client %" PRIu64 " (pid %d, uid %u) on feed %s rank %u/%u has released no batch for %.0f s with %" PRIu64
		    " published (stuck_client_s = %u); it holds only its own ring, nobody else waits for it",
		    c->id, (int)c->pid, (unsigned)c->uid, c->feed->name, c->rank, c->world,
		    (double)(now - c->idle_since_ns) / 1e9, r->published - released, s->stuck_client_s);
}

/* Lets go of feeds that left the config once their last client is gone. */
static void drop_removed_feeds(struct server *s)
{
	size_t k = 0;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct served *sf = &s->feeds[i];
		if (sf->removed && sf->clients == 0) {
			log_info("feed %s: last client gone; unloaded", sf->feed->name);
			feed_unwatch(sf->feed);
			telemetry_feed_forget(s->tm, sf->feed);
			feed_unref(sf->feed);
			continue;
		}
		s->feeds[k++] = *sf;
	}
	s->n_feeds = k;
}

/* Feed f failed: so does every session on it (a change, -ESTALE, withdraws their unread batches). */
static void fail_sessions(struct server *s, struct feed *f)
{
	for (struct conn *c = s->conns, *next; c; c = next) {
		next = c->next;
		if (c->session && c->feed == f)
			session_fail(c->session, f->error_code, f->error);
	}
}

/* The change watch saw one of f's files written or opened for writing (feed/integrity.h). */
static void on_feed_changed(struct feed *f, void *userdata)
{
	fail_sessions(userdata, f);
}

/*
 * Closes connections that sent no HELLO within handshake_timeout_s: an idle
 * connection must not hold a slot that a trainer or an operator needs.
 */
static void expire_handshakes(struct server *s, uint64_t now)
{
	uint64_t limit = (uint64_t)s->handshake_timeout_s * NSEC_PER_SEC;
	for (struct conn *c = s->conns, *next; c; c = next) {
		next = c->next;
		if (c->hello || now - c->connect_ns < limit)
			continue;
		s->n.refused_limit++;
		listen_refusal_log(s, REFUSE_HANDSHAKE, "client %" PRIu64 " (pid %d, uid %u) sent no HELLO within "
				   "handshake_timeout_s (%u s); disconnecting", c->id, (int)c->pid, (unsigned)c->uid,
				   s->handshake_timeout_s);
		conn_send_error(c, -ETIMEDOUT, "no HELLO within %u s (handshake_timeout_s in feedd.conf)",
				s->handshake_timeout_s);
		conn_flush(c);
		shutdown(c->fd, SHUT_WR);
		conn_free(c);
	}
}

/* A sweep of the shard checker failed f (main loop): so does every session on it. */
static void on_check_failed(void *userdata, struct feed *f)
{
	fail_sessions(userdata, f);
}

/*
 * Shards unchanged? Only feeds someone reads, and at most CHECK_PER_TICK
 * shards a tick in all: an idle daemon stats nothing, a busy one with 10,000
 * shards sweeps them in seconds, not every tick. The stat()s run on the
 * checker's thread (feed/checker.h), never here: a hung mount holds up that
 * sweep only, and no second one starts while it hangs; it is logged once it
 * has hung load_timeout_s, and again each time that doubles.
 * (A read that comes up short asks the checker to check its whole feed at
 * once: checker_recheck, through the producer.)
 */
static void check_shards(struct server *s)
{
	/* Index validation that finished on its scan thread (feed/feed-scan.c) is folded in, read or not: no file is touched. */
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i].feed;
		if (f->state == FEED_READY && feed_scan_fold(f) < 0)
			fail_sessions(s, f);
	}
	if (!s->checker)
		return;
	if (checker_busy(s->checker)) {
		char what[512];
		uint64_t ns, limit = (uint64_t)MAX(s->load_timeout_s, 1u) * NSEC_PER_SEC;
		if (checker_stuck(s->checker, limit, what, sizeof(what), &ns) && ns >= s->check_reported_ns) {
			log_warning("shard check stuck on %s for %" PRIu64 " s (a hung mount or a stuck device?); no other "
				    "shard check starts until it answers", what, ns / NSEC_PER_SEC);
			s->check_reported_ns = 2 * ns;
		}
		return;
	}
	if (s->check_reported_ns)
		log_notice("the shard check stuck before has answered; shard checks go on");
	s->check_reported_ns = 0;
	uint32_t budget = CHECK_PER_TICK;
	for (size_t k = 0; k < s->n_feeds && budget > 0; k++) {
		size_t i = (s->check_first + k) % s->n_feeds;
		struct feed *f = s->feeds[i].feed;
		if (f->state != FEED_READY || !s->feeds[i].clients)
			continue;
		if (checker_add(s->checker, f, &budget) < 0)
			break;
	}
	s->check_first++;
	int r = checker_start(s->checker);
	if (r < 0)
		log_warning("cannot start the shard check: %s", strerror(-r));
}

/*
 * A text feed's cursors over huge documents (tokenize.h, tokenize_pool_*)
 * hold 5-8 MB each, up to 4 a feed, until another document needs the slot.
 * One unused for CURSOR_IDLE_S once the feed's clients have gone is freed,
 * so that a document read once does not keep them until the feed goes;
 * while clients are attached, only one unused for CURSOR_IDLE_ATTACHED_S:
 * a cursor freed mid-document makes the document again from its start, and
 * a trainer with long steps asks for its next batch only every few seconds.
 */
#define CURSOR_IDLE_S 5
#define CURSOR_IDLE_ATTACHED_S 60
static unsigned trim_feed_cursors(struct feed *f, uint64_t now, unsigned idle)
{
	unsigned n = f->huge ? tokenize_pool_trim(f->huge, now, (uint64_t)idle * NSEC_PER_SEC) : 0;
	if (n)
		log_debug("feed %s: freed %u tokenize cursor(s) over huge documents unused for %u s", f->name, n, idle);
	for (uint32_t i = 0; i < f->n_sources; i++) /* a mixture's sources have cursors of their own */
		n += trim_feed_cursors(f->sources[i], now, idle);
	return n;
}

static void trim_idle_cursors(struct server *s, uint64_t now)
{
	unsigned freed = 0;
	for (size_t i = 0; i < s->n_feeds; i++)
		freed += trim_feed_cursors(s->feeds[i].feed, now,
					   s->feeds[i].clients ? CURSOR_IDLE_ATTACHED_S : CURSOR_IDLE_S);
	/* Their buffers were made on the workers' arenas, which keep what is freed (see on_tick). */
	if (freed)
		malloc_trim(0);
}

/* Once a second: shards still unchanged? delivery rates, stuck clients, the service manager's status line. */
static void on_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	check_shards(s);
	/*
	 * Sessions allocate on the workers' malloc arenas, and glibc gives back
	 * little of a freed arena by itself: after many clients came and went
	 * the daemon would keep their peak. Trim once a tick after departures.
	 */
	if (s->departed >= TRIM_AFTER_DEPARTED) {
		malloc_trim(0);
		s->departed = 0;
	}
	gpu_reap(s->cfg.gpu); /* departed clients' stagings whose copies have run since */
	uint64_t now = now_ns();
	ring_pool_trim(s->rings, now - RING_POOL_IDLE_NS);
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		struct telemetry_reading r;
		conn_reading(c, now, &r);
		uint64_t d = r.cons.delivered, wait = r.cons.wait_ns, step = r.cons.step_ns;
		if (c->rate_ns && now > c->rate_ns) {
			uint64_t per = (uint64_t)c->feed->conf.batch_size * c->feed->conf.seq_len;
			c->tokens_per_s = (double)(d - MIN(d, c->rate_delivered)) * (double)per /
					  ((double)(now - c->rate_ns) / 1e9);
			/* Client-written totals: a delta that goes backwards counts as none. */
			uint64_t dw = wait > c->rate_wait ? wait - c->rate_wait : 0;
			uint64_t ds = step > c->rate_step ? step - c->rate_step : 0;
			c->stall_pct = dw + ds ? 100.0 * (double)dw / (double)(dw + ds) : 0.0;
		}
		c->rate_delivered = d;
		c->rate_wait = wait;
		c->rate_step = step;
		c->rate_ns = now;
		const struct log_context *old = log_context_swap(&c->log);
		watch_consumption(s, c, &r, now);
		log_context_swap(old);
	}
	expire_handshakes(s, now);
	listen_resume(s);
	static const char *const kinds[] = { "not allowed", "over a connection limit", "over a memory limit",
					     "out of file descriptors", "no HELLO within handshake_timeout_s" };
	for (unsigned k = 0; k < ARRAY_SIZE(s->refusal_logs); k++) {
		struct refusal_log *rl = &s->refusal_logs[k];
		if (rl->suppressed)
			log_warning("%" PRIu64 " more connections refused in the last second (%s)", rl->suppressed, kinds[k]);
		rl->suppressed = 0;
		rl->logged = false;
	}
	for (size_t i = 0; i < s->n_linger; i++)
		listen_linger_close(s->linger[i]);
	s->n_linger = 0;
	drop_removed_feeds(s);
	trim_idle_cursors(s, now);
	uint64_t tick = telemetry_tick_begin(s->tm);
	for (size_t i = 0; i < s->n_feeds; i++)
		telemetry_tick_feed(s->tm, s->feeds[i].feed);
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		struct telemetry_reading r;
		conn_reading(c, tick, &r);
		telemetry_client_sample(&c->tm, &r);
	}
	telemetry_tick_end(s->tm, producer_pool(s->producer));
	char line[256];
	server_status_line(s, line, sizeof(line));
	service_status(line);
}

int server_configure(struct server *s, const struct conf *conf)
{
	if (conf_ids_copy(&s->allow, &conf->allow) < 0 || conf_ids_copy(&s->admin, &conf->admin) < 0)
		return -ENOMEM;
	s->ring_slots = conf->ring_slots;
	s->max_connections = conf->max_connections;
	s->max_connections_per_uid = conf->max_connections_per_uid;
	s->admin_connections = conf->admin_connections;
	s->handshake_timeout_s = conf->handshake_timeout_s;
	s->load_timeout_s = conf->load_timeout_s;
	s->client_memory_max = conf->client_memory_max;
	s->uid_memory_max = conf->uid_memory_max;
	s->memory_max = conf->memory_max;
	gpu_configure(s->cfg.gpu, conf->gpu_memory_max);
	s->stuck_client_s = conf->stuck_client_s;
	if (s->tm)
		telemetry_configure(s->tm, &conf->diagnosis);
	stage_timing_set(conf->diagnosis.stage_counters);
	return 0;
}

int server_new(struct event_base *base, const struct server_config *cfg, const struct conf *conf,
	       struct producer *producer, struct feed **feeds, size_t n_feeds, struct server **ret, char *err,
	       size_t errlen)
{
	struct server *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->base = base;
	s->cfg = *cfg;
	s->producer = producer;
	s->start_ns = now_ns();
	s->listen_fd = -1;
	s->op_fd = -1;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->path = strdup(cfg->socket_path);
	s->feeds = calloc(MAX(n_feeds, 1u), sizeof(*s->feeds));
	if (ring_pool_new(RING_POOL_MAX, &s->rings) < 0)
		s->rings = NULL; /* every ring made and freed whole */
	if (!s->path || !s->feeds || telemetry_new(&conf->diagnosis, &s->tm) < 0 || server_configure(s, conf) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	int wr = conf->watch_changes == CONF_WATCH_OFF
			 ? 0 : feed_watch_new(base, conf->watch_changes == CONF_WATCH_AUTO, on_feed_changed, s, &s->watch);
	if (wr < 0)
		log_warning("cannot watch shards for changes as they happen: %s; they are checked once a second only",
			    strerror(-wr));
	producer_set_watch(producer, s->watch);
	int cr = checker_new(base, on_check_failed, s, &s->checker);
	if (cr < 0)
		log_warning("cannot start the shard checker: %s; shards are checked only when a read comes up short",
			    strerror(-cr));
	producer_set_checker(producer, s->checker); /* a short read's full check goes to its thread */
	for (size_t i = 0; i < n_feeds; i++) {
		s->feeds[s->n_feeds++] = (struct served){ .feed = feed_ref(feeds[i]) };
		feed_watch_add(s->watch, feeds[i]);
	}

	if (cfg->listen_fd >= 0) {
		s->listen_fd = cfg->listen_fd;
		struct sockaddr_un sa;
		socklen_t l = sizeof(sa);
		if (getsockname(s->listen_fd, (struct sockaddr *)&sa, &l) == 0 && l > offsetof(struct sockaddr_un, sun_path) &&
		    sa.sun_path[0]) {
			free(s->path);
			s->path = strndup(sa.sun_path, l - offsetof(struct sockaddr_un, sun_path));
		}
	} else {
		int r = listen_bind(s->path, conf->socket_mode, conf->socket_group, err, errlen);
		if (r < 0) {
			server_free(s);
			return r;
		}
		s->listen_fd = r;
		s->own_path = true;
	}
	s->listen_ev = event_new(base, s->listen_fd, EV_READ | EV_PERSIST, listen_on_accept, s);
	s->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, s);
	if (s->listen_ev) /* accepted first while no flood (listen_on_accept) */
		(void)event_priority_set(s->listen_ev, SERVER_PRIORITY_ADMIN);
	struct timeval second = { .tv_sec = 1 };
	if (!s->path || !s->listen_ev || !s->tick_ev || event_add(s->listen_ev, NULL) < 0 ||
	    event_add(s->tick_ev, &second) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	log_info("listening on %s%s", s->path, s->own_path ? "" : " (socket passed by the service manager)");
	listen_operator(s);
	unsigned long nofile = listen_raise_nofile();
	unsigned long need = 6ul * (s->max_connections + s->admin_connections) + 64;
	if (nofile < need)
		log_warning("RLIMIT_NOFILE is %lu: max_connections %u needs about %lu (6 per attached client); past it, "
			    "connections are refused as out of file descriptors. Raise LimitNOFILE= or lower max_connections",
			    nofile, s->max_connections, need);
	*ret = s;
	return 0;
}

void server_set_feeds(struct server *s, struct feed **feeds, size_t n_feeds, char *msg, size_t msglen)
{
	struct served *next = calloc(n_feeds + s->n_feeds + 1, sizeof(*next));
	if (!next) {
		snprintf(msg, msglen, "out of memory; the feeds are unchanged");
		return;
	}
	size_t n = 0, kept = 0, added = 0, replaced = 0, draining = 0;
	bool *taken = calloc(s->n_feeds + 1, sizeof(*taken));
	if (!taken) {
		free(next);
		snprintf(msg, msglen, "out of memory; the feeds are unchanged");
		return;
	}
	for (size_t i = 0; i < n_feeds; i++) {
		struct feed *f = feeds[i];
		size_t j = 0;
		for (; j < s->n_feeds; j++) {
			struct feed *o = s->feeds[j].feed;
			if (!taken[j] && !s->feeds[j].draining && strcmp(o->name, f->name) == 0)
				break;
		}
		if (j < s->n_feeds && s->feeds[j].feed->state == FEED_READY && f->state == FEED_READY &&
		    s->feeds[j].feed->fingerprint == f->fingerprint && s->feeds[j].feed->data_id == f->data_id) {
			/* The same data under the same order: nothing for its clients to notice. */
			taken[j] = true;
			next[n++] = s->feeds[j];
			kept++;
			continue;
		}
		if (j < s->n_feeds)
			replaced++;
		else
			added++;
		next[n++] = (struct served){ .feed = feed_ref(f) };
		feed_watch_add(s->watch, f);
		log_info("feed %s: %s", f->name, j < s->n_feeds ? "replaced by its new definition" : "added");
	}
	for (size_t j = 0; j < s->n_feeds; j++) {
		struct served *o = &s->feeds[j];
		if (taken[j])
			continue;
		if (o->clients == 0) {
			log_info("feed %s: no longer served", o->feed->name);
			feed_unwatch(o->feed);
			telemetry_feed_forget(s->tm, o->feed);
			feed_unref(o->feed);
			continue;
		}
		if (!o->draining)
			log_notice("feed %s: draining; its %u attached clients keep their streams, new attaches go to "
				   "the new configuration", o->feed->name, o->clients);
		o->draining = true;
		o->removed = true;
		next[n++] = *o;
		draining++;
	}
	free(taken);
	free(s->feeds);
	s->feeds = next;
	s->n_feeds = n;
	snprintf(msg, msglen, "%zu feeds: %zu unchanged, %zu added, %zu replaced; %zu draining", n_feeds, kept, added,
		 replaced, draining);
}

int server_drain(struct server *s, const char *name, char *msg, size_t msglen)
{
	bool draining;
	struct feed *f = server_find_feed(s, name, &draining);
	if (!f) {
		if (draining)
			snprintf(msg, msglen, "feed %s is draining already", name);
		else
			snprintf(msg, msglen, "no feed named '%s'", name);
		return draining ? -EALREADY : -ENOENT;
	}
	struct served *sf = served_of(s, f);
	sf->draining = true;
	snprintf(msg, msglen, "feed %s drained: it takes no new attaches; its %u attached clients stream on", name,
		 sf->clients);
	return 0;
}

struct server *server_free(struct server *s)
{
	if (!s)
		return NULL;
	if (s->listen_ev)
		event_free(s->listen_ev);
	listen_operator_close(s);
	if (s->tick_ev)
		event_free(s->tick_ev);
	if (s->producer)
		producer_set_checker(s->producer, NULL);
	s->checker = checker_free(s->checker); /* a sweep stuck meanwhile is left to its thread */
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		if (s->own_path)
			unlink(s->path);
	}
	for (size_t i = 0; i < s->n_linger; i++)
		listen_linger_close(s->linger[i]);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	/* Tell every attached client why its stream ends, then let go. */
	while (s->conns) {
		struct conn *c = s->conns;
		if (c->session) {
			session_stop(c->session);
			conn_send_error(c, -ESHUTDOWN, "feedd is stopping");
			conn_flush(c);
		}
		conn_free(c);
	}
	for (size_t i = 0; i < s->n_feeds; i++) {
		assert(s->feeds[i].clients == 0); /* every connection detached above */
		feed_unwatch(s->feeds[i].feed);
		telemetry_feed_forget(s->tm, s->feeds[i].feed);
		feed_unref(s->feeds[i].feed);
	}
	free(s->feeds);
	if (s->producer)
		producer_set_watch(s->producer, NULL);
	s->watch = feed_watch_free(s->watch);
	s->tm = telemetry_free(s->tm);
	s->rings = ring_pool_free(s->rings); /* rings of sessions still out free themselves */
	conf_ids_done(&s->allow);
	conf_ids_done(&s->admin);
	free(s->uid_slots);
	free(s->path);
	free(s);
	return NULL;
}

int server_snapshot(struct server *s, struct status_input *ret)
{
	uint64_t now = now_ns();
	struct pool *pool = producer_pool(s->producer);
	size_t n = 0;
	for (struct conn *c = s->conns; c; c = c->next)
		n += c->session != NULL;
	struct status_input in = {
		.socket_path = s->path,
		.uptime_ns = now - s->start_ns,
		.threads = pool_threads(pool),
		.threads_busy = pool_busy(pool),
		.jobs_queued = pool_queued(pool),
		.io_engine = producer_io_engine(s->producer),
		.io_fallback = producer_io_fallback(s->producer),
		.tm = s->tm,
		.gpu_status = s->cfg.gpu_status,
		.gpu_available = gpu_available(s->cfg.gpu),
		.metrics_listen = s->metrics_listen[0] ? s->metrics_listen : NULL,
		.metrics_error = s->metrics_error[0] ? s->metrics_error : NULL,
		.feeds = calloc(MAX(s->n_feeds, 1u), sizeof(*in.feeds)),
		.n_feeds = s->n_feeds,
		.feed_info = calloc(MAX(s->n_feeds, 1u), sizeof(*in.feed_info)),
		.clients = calloc(MAX(n, 1u), sizeof(*in.clients)),
		.connections = s->n_conns,
		.ring_memory = s->memory,
		.counters = s->n,
	};
	telemetry_daemon_view(s->tm, &in.telemetry);
	remote_stats(&in.fetch);
	if (!in.feeds || !in.feed_info || !in.clients) {
		status_input_clear(&in);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->n_feeds; i++) {
		in.feeds[i] = s->feeds[i].feed;
		struct status_feed *fi = &in.feed_info[i];
		*fi = (struct status_feed){ .clients = s->feeds[i].clients, .draining = s->feeds[i].draining };
		telemetry_stages_view(s->tm, in.feeds[i], &fi->stages);
		telemetry_feed_view(s->tm, in.feeds[i], &fi->verdict);
	}
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		struct status_client *sc = &in.clients[in.n_clients++];
		conn_status(c, now, sc);
		for (size_t i = 0; i < s->n_feeds; i++)
			if (in.feeds[i] == sc->feed)
				in.feed_info[i].memory += c->memory;
	}
	*ret = in;
	return 0;
}

void status_input_clear(struct status_input *in)
{
	free(in->feeds);
	free(in->feed_info);
	free(in->clients);
	*in = (struct status_input){ 0 };
}

int server_status_json(struct server *s, unsigned flags, size_t max_len, char **ret)
{
	_cleanup_(status_input_clear) struct status_input in = { 0 };
	if (server_snapshot(s, &in) < 0)
		return -ENOMEM;
	return status_json_fit(&in, flags, max_len, ret);
}

void server_status_line(struct server *s, char *buf, size_t len)
{
	struct status_input in;
	if (server_snapshot(s, &in) < 0) {
		snprintf(buf, len, "out of memory");
		return;
	}
	status_line(&in, buf, len);
	status_input_clear(&in);
}

int server_stuck(struct server *s, uint64_t stuck_ns, char *buf, size_t len)
{
	uint64_t now = now_ns();
	for (struct conn *c = s->conns; c; c = c->next) {
		struct session *ss = c->session;
		if (!ss)
			continue;
		const uint64_t published = session_published(ss);
		if (published != c->prog_published || session_in_flight(ss) == 0 || session_failed(ss)) {
			c->prog_published = published;
			c->prog_since_ns = now;
			continue;
		}
		if (now - c->prog_since_ns < stuck_ns)
			continue;
		struct pool *p = producer_pool(s->producer);
		snprintf(buf, len, "worker pool: batch %" PRIu64 " of feed %s rank %u/%u was handed to the workers %.1f s ago "
			 "and is not done (%u of %u workers busy, %u jobs queued): a read or a job hangs",
			 session_first_batch(ss) + published, session_feed(ss)->name, session_rank(ss), session_world(ss),
			 (double)(now - c->prog_since_ns) / 1e9, pool_busy(p), pool_threads(p), pool_queued(p));
		return 1;
	}
	return 0;
}

void server_counters(const struct server *s, struct server_counters *ret)
{
	*ret = s->n;
}
void server_set_metrics(struct server *s, const char *listen, const char *error)
{
	snprintf(s->metrics_listen, sizeof(s->metrics_listen), "%s", listen ? listen : "");
	snprintf(s->metrics_error, sizeof(s->metrics_error), "%s", error ? error : "");
}
