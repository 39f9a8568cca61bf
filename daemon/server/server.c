/* SPDX-License-Identifier: MIT */
/*
 * The server object (server.h): starting it on a listening socket, the
 * policy a config sets, the feeds it serves and how a reload changes them,
 * draining, the once-a-second tick (shards unchanged? delivery rates, stuck
 * clients, telemetry, the STATUS= line), the watchdog's progress check, and
 * the orderly stop that tells every attached client why its stream ends.
 * The other files of this folder are listed in server-internal.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/sd/service.h"
#include "daemon/server/server-internal.h"
#include "daemon/telemetry/telemetry.h"

/* The feed that takes attaches under `name`; NULL, with *ret_draining set when only a draining one exists. */
struct feed *server_find_feed(struct server *s, const char *name, bool *ret_draining)
{
	*ret_draining = false;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i].feed;
		if (strcmp(f->name, name) != 0)
			continue;
		if (!f->draining)
			return f;
		*ret_draining = true;
	}
	return NULL;
}

/*
 * Reports a client that has had batches published and released none for
 * stuck_client_s; once per episode. (`released` is the client's tail, clamped.)
 */
static void watch_consumption(struct server *s, struct conn *c, uint64_t released, uint64_t now)
{
	if (released != c->idle_released || released >= c->session->published || c->session->failed) {
		if (c->stuck)
			log_info("client %" PRIu64 " (pid %d) on feed %s rank %u/%u consumes again", c->id, (int)c->pid,
				 c->session->feed->name, c->session->rank, c->session->world);
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
		    c->id, (int)c->pid, (unsigned)c->uid, c->session->feed->name, c->session->rank, c->session->world,
		    (double)(now - c->idle_since_ns) / 1e9, c->session->published - released, s->stuck_client_s);
}

/* Lets go of feeds that left the config once their last client is gone. */
static void drop_removed_feeds(struct server *s)
{
	size_t k = 0;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct served *sf = &s->feeds[i];
		if (sf->removed && sf->feed->clients == 0) {
			log_info("feed %s: last client gone; unloaded", sf->feed->name);
			feed_unref(sf->feed);
			continue;
		}
		s->feeds[k++] = *sf;
	}
	s->n_feeds = k;
}

/* Once a second: shards still unchanged? delivery rates, stuck clients, the service manager's status line. */
static void on_tick(evutil_socket_t fd, short what, void *userdata)
{
	struct server *s = userdata;
	for (size_t i = 0; i < s->n_feeds; i++) {
		struct feed *f = s->feeds[i].feed;
		if (f->state != FEED_READY || feed_check(f) == 0)
			continue;
		for (struct conn *c = s->conns, *next; c; c = next) {
			next = c->next;
			if (c->session && c->session->feed == f)
				session_fail(c->session, f->error_code, f->error);
		}
	}
	uint64_t now = now_ns();
	for (struct conn *c = s->conns; c; c = c->next) {
		if (!c->session)
			continue;
		const struct feed_consumer_page *cp = c->session->ring->cons;
		uint64_t d = MIN(__atomic_load_n(&cp->delivered, __ATOMIC_RELAXED), c->session->published);
		uint64_t wait = __atomic_load_n(&cp->wait_ns_total, __ATOMIC_RELAXED);
		uint64_t step = __atomic_load_n(&cp->step_ns_total, __ATOMIC_RELAXED);
		if (c->rate_ns && now > c->rate_ns) {
			uint64_t per = (uint64_t)c->session->feed->conf.batch_size * c->session->feed->conf.seq_len;
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
		uint64_t released = MIN(__atomic_load_n(&cp->tail, __ATOMIC_RELAXED), c->session->published);
		const struct log_context *old = log_context_swap(&c->log);
		watch_consumption(s, c, released, now);
		log_context_swap(old);
	}
	static const char *const kinds[] = { "not allowed", "over a connection limit", "over a memory limit" };
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
	telemetry_tick_begin();
	for (size_t i = 0; i < s->n_feeds; i++)
		telemetry_tick_feed(s->feeds[i].feed);
	telemetry_tick_end(producer_pool(s->producer));
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
	s->client_memory_max = conf->client_memory_max;
	s->uid_memory_max = conf->uid_memory_max;
	s->memory_max = conf->memory_max;
	gpu_configure(s->cfg.gpu, conf->gpu_memory_max);
	s->stuck_client_s = conf->stuck_client_s;
	telemetry_configure(&conf->diagnosis);
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
	s->path = strdup(cfg->socket_path);
	s->feeds = calloc(MAX(n_feeds, 1u), sizeof(*s->feeds));
	if (!s->path || !s->feeds || server_configure(s, conf) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n_feeds; i++)
		s->feeds[s->n_feeds++] = (struct served){ .feed = feed_ref(feeds[i]) };

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
	struct timeval second = { .tv_sec = 1 };
	if (!s->path || !s->listen_ev || !s->tick_ev || event_add(s->listen_ev, NULL) < 0 ||
	    event_add(s->tick_ev, &second) < 0) {
		server_free(s);
		return -ENOMEM;
	}
	log_info("listening on %s%s", s->path, s->own_path ? "" : " (socket passed by the service manager)");
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
			if (!taken[j] && !o->draining && strcmp(o->name, f->name) == 0)
				break;
		}
		if (j < s->n_feeds && s->feeds[j].feed->state == FEED_READY && f->state == FEED_READY &&
		    s->feeds[j].feed->fingerprint == f->fingerprint) {
			/* The same data under the same order: nothing for its clients to notice. */
			taken[j] = true;
			next[n++] = (struct served){ .feed = s->feeds[j].feed };
			kept++;
			continue;
		}
		if (j < s->n_feeds)
			replaced++;
		else
			added++;
		next[n++] = (struct served){ .feed = feed_ref(f) };
		log_info("feed %s: %s", f->name, j < s->n_feeds ? "replaced by its new definition" : "added");
	}
	for (size_t j = 0; j < s->n_feeds; j++) {
		struct served *o = &s->feeds[j];
		if (taken[j])
			continue;
		if (o->feed->clients == 0) {
			log_info("feed %s: no longer served", o->feed->name);
			feed_unref(o->feed);
			continue;
		}
		if (!o->feed->draining)
			log_notice("feed %s: draining; its %u attached clients keep their streams, new attaches go to "
				   "the new configuration", o->feed->name, o->feed->clients);
		o->feed->draining = true;
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
	f->draining = true;
	snprintf(msg, msglen, "feed %s drained: it takes no new attaches; its %u attached clients stream on", name,
		 f->clients);
	return 0;
}

struct server *server_free(struct server *s)
{
	if (!s)
		return NULL;
	if (s->listen_ev)
		event_free(s->listen_ev);
	if (s->tick_ev)
		event_free(s->tick_ev);
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		if (s->own_path)
			unlink(s->path);
	}
	for (size_t i = 0; i < s->n_linger; i++)
		listen_linger_close(s->linger[i]);
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
	for (size_t i = 0; i < s->n_feeds; i++)
		feed_unref(s->feeds[i].feed);
	free(s->feeds);
	conf_ids_done(&s->allow);
	conf_ids_done(&s->admin);
	free(s->path);
	free(s);
	return NULL;
}

int server_stuck(struct server *s, uint64_t stuck_ns, char *buf, size_t len)
{
	uint64_t now = now_ns();
	for (struct conn *c = s->conns; c; c = c->next) {
		struct session *ss = c->session;
		if (!ss)
			continue;
		if (ss->published != c->prog_published || ss->planned <= ss->published || ss->failed) {
			c->prog_published = ss->published;
			c->prog_since_ns = now;
			continue;
		}
		if (now - c->prog_since_ns < stuck_ns)
			continue;
		struct pool *p = producer_pool(s->producer);
		snprintf(buf, len, "worker pool: batch %" PRIu64 " of feed %s rank %u/%u was handed to the workers %.1f s ago "
			 "and is not done (%u of %u workers busy, %u jobs queued): a read or a job hangs",
			 ss->first_batch + ss->published, ss->feed->name, ss->rank, ss->world,
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
