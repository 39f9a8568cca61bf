/* SPDX-License-Identifier: MIT */
/*
 * feedd: load the config, open every feed, start the worker pool and the
 * control socket, tell the service manager it is ready, and run the event
 * loop: SIGHUP (or an operator's RELOAD) re-reads the config, SIGTERM/SIGINT
 * stop, and with a watchdog the loop pings it only while the pipeline makes
 * progress.
 *
 * Lifecycle (docs/operations.md): READY=1 once the socket listens and every
 * feed has loaded or failed; STATUS= kept current by the server's tick;
 * RELOADING=1 ... READY=1 around a reload; STOPPING=1 before shutdown.
 *
 * The metrics endpoint (metrics_listen) is a side channel: when it cannot
 * listen, feedd says so in the log and in status and serves its clients
 * anyway; a reload that changes the address, or finds it not listening,
 * tries again.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "daemon/conf/conf.h"
#include "daemon/feed/feed.h"
#include "daemon/feed/session.h"
#include "daemon/gpu/gpu.h"
#include "daemon/log/log.h"
#include "daemon/metrics/metrics.h"
#include "daemon/sd/service.h"
#include "daemon/server/server.h"
#include "daemon/source/remote.h"
#include "proto/macro.h"
#include "proto/wire.h"

#define DEFAULT_CONFIG FEEDD_SYSCONFDIR "/feedd/feedd.conf"

/* What the running daemon is made of; the main thread's only. */
struct daemon {
	const char *config_path;
	bool socket_override, threads_override, level_override;
	struct conf *conf;
	struct event_base *base;
	struct server *server;
	struct metrics *metrics; /* NULL: off, or it could not listen */
	char *metrics_listen;    /* metrics_listen it was started for */
	uint64_t watchdog_usec;
	bool stuck; /* the watchdog is being starved on purpose */
};

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: feedd [OPTIONS]\n"
		"Serve packed training batches to trainer processes over shared memory.\n\n"
		"  -c, --config FILE     configuration file (default %s)\n"
		"  -s, --socket PATH     control socket (overrides the config)\n"
		"  -t, --threads N       worker threads, 0 = one per CPU (overrides the config)\n"
		"  -l, --log-level LVL   error, warning, notice, info, debug\n"
		"      --check           load the config and every feed, report, and exit\n"
		"  -h, --help            show this help\n"
		"      --version         show the version\n",
		DEFAULT_CONFIG);
}

/*
 * Loads every feed of conf (a failed one is kept, FAILED, with its reason).
 * Returns 0 with the list in *ret (caller unrefs each and frees it), or a
 * negative errno.
 */
static int load_feeds(const struct conf *conf, struct feed ***ret, size_t *ret_n, size_t *ret_failed)
{
	/* Objects named by URL are reached as [feedd] s3_* says (docs/storage.md). */
	int r = remote_configure(&(struct remote_conf){
		.endpoint = conf->s3_endpoint, .region = conf->s3_region, .path_style = conf->s3_path_style,
		.credentials_file = conf->s3_credentials_file, .profile = conf->s3_profile,
		.max_requests = conf->s3_max_requests, .memory_bytes = conf->s3_memory_max,
		.cache_dir = conf->cache_dir, .cache_max_bytes = conf->s3_cache_max_bytes });
	if (r < 0)
		return r;
	/* Feeds load on the main thread with a reader of their own; workers get theirs. */
	struct source_reader *io = NULL;
	r = source_reader_new(conf->io_engine, conf->io_depth, &io);
	if (r < 0)
		return log_error_errno(r, "io_engine = io_uring was asked for, but io_uring cannot be set up");
	if (source_reader_fallback(io) < 0)
		log_warning_errno(source_reader_fallback(io), "io_uring is unavailable, reading shards with pread");

	struct feed **feeds = calloc(MAX(conf->n_feeds, 1u), sizeof(*feeds));
	if (!feeds) {
		source_reader_free(io);
		return -ENOMEM;
	}
	size_t n = 0, failed = 0;
	for (size_t i = 0; i < conf->n_feeds; i++) {
		/* A long load must not look like a hang to the watchdog. */
		if (service_watchdog_usec())
			service_watchdog_ping();
		r = feed_load(&conf->feeds[i], io, &feeds[n]);
		if (r < 0) {
			log_error_errno(r, "feed %s: cannot load", conf->feeds[i].name);
			failed++;
			continue;
		}
		failed += feeds[n]->state != FEED_READY;
		n++;
	}
	source_reader_free(io);
	*ret = feeds;
	*ret_n = n;
	*ret_failed = failed;
	return 0;
}

static void free_feeds(struct feed **feeds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		feed_unref(feeds[i]);
	free(feeds);
}

static bool same_str(const char *a, const char *b)
{
	return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

/* Names the keys of the new config that only a restart applies. */
static void note_restart_keys(const struct daemon *d, const struct conf *n)
{
	const struct conf *o = d->conf;
	const char *keys[8];
	size_t k = 0;
	if (!d->socket_override && !same_str(o->socket, n->socket))
		keys[k++] = "socket";
	if (!d->threads_override && o->threads != n->threads)
		keys[k++] = "threads";
	if (o->io_engine != n->io_engine)
		keys[k++] = "io_engine";
	if (o->io_depth != n->io_depth)
		keys[k++] = "io_depth";
	if (o->socket_mode != n->socket_mode)
		keys[k++] = "socket_mode";
	if (o->socket_group != n->socket_group)
		keys[k++] = "socket_group";
	for (size_t i = 0; i < k; i++)
		log_notice("reload: %s changed; the new value takes effect when feedd restarts", keys[i]);
}

/* Starts, moves or stops the metrics endpoint as conf says. A failure is logged, never fatal. */
static void metrics_apply(struct daemon *d, const struct conf *conf)
{
	const char *want = conf->metrics_listen;
	if (same_str(want, d->metrics_listen) && (d->metrics || !want))
		return;
	if (d->metrics)
		log_info("metrics: no longer serving on %s", metrics_address(d->metrics));
	d->metrics = metrics_free(d->metrics);
	free(d->metrics_listen);
	d->metrics_listen = want ? strdup(want) : NULL;
	server_set_metrics(d->server, NULL, NULL);
	if (!want)
		return;
	char err[256];
	int r = metrics_new(d->base, (const struct sockaddr *)&conf->metrics_addr, conf->metrics_addrlen, d->server,
			    &d->metrics, err, sizeof(err));
	if (r < 0) {
		log_error("%s; serving clients without metrics (a reload tries again)", err);
		server_set_metrics(d->server, want, err);
		return;
	}
	log_info("metrics: serving Prometheus text at http://%s/metrics", metrics_address(d->metrics));
	server_set_metrics(d->server, metrics_address(d->metrics), NULL);
}

/*
 * Re-reads the config and applies it: new feeds appear, removed or changed
 * ones drain, policy keys apply at once. A config that does not parse is
 * rejected whole and the running one stays. Returns 0 with a summary in msg,
 * or a negative errno with the reason.
 */
static int reload(void *userdata, char *msg, size_t msglen)
{
	struct daemon *d = userdata;
	char line[256];
	service_reloading();
	log_notice("reloading %s", d->config_path);

	char err[512];
	struct conf *conf;
	int r = conf_load(d->config_path, &conf, err, sizeof(err));
	if (r < 0) {
		log_error("reload rejected, the running configuration stays: %s", err);
		snprintf(msg, msglen, "reload rejected, the running configuration stays: %s", err);
		server_status_line(d->server, line, sizeof(line));
		service_ready(line);
		return r;
	}
	struct feed **feeds;
	size_t n, failed;
	r = load_feeds(conf, &feeds, &n, &failed);
	if (r < 0) {
		snprintf(msg, msglen, "reload failed, the running configuration stays: cannot load feeds: %s",
			 strerror(-r));
		conf_free(conf);
		server_status_line(d->server, line, sizeof(line));
		service_ready(line);
		return r;
	}
	r = server_configure(d->server, conf);
	if (r < 0) {
		snprintf(msg, msglen, "reload failed, the running configuration stays: out of memory");
		free_feeds(feeds, n);
		conf_free(conf);
		service_ready("reload failed");
		return r;
	}
	char summary[256];
	server_set_feeds(d->server, feeds, n, summary, sizeof(summary));
	free_feeds(feeds, n);

	note_restart_keys(d, conf);
	metrics_apply(d, conf);
	if (d->threads_override)
		conf->threads = d->conf->threads;
	if (!d->level_override)
		log_set_level(conf->log_level);
	conf_free(d->conf);
	d->conf = conf;

	snprintf(msg, msglen, "reloaded %s: %s%s", d->config_path, summary, failed ? " (some feeds failed to load)" : "");
	log_notice("%s", msg);
	server_status_line(d->server, line, sizeof(line));
	service_ready(line);
	return 0;
}

static void on_signal(evutil_socket_t sig, short what, void *userdata)
{
	struct daemon *d = userdata;
	if (sig == SIGHUP) {
		char msg[512];
		reload(d, msg, sizeof(msg));
		return;
	}
	log_notice("received %s, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	service_stopping();
	event_base_loopbreak(d->base);
}

/* Pings the watchdog from the loop, but only while the workers make progress. */
static void on_watchdog(evutil_socket_t fd, short what, void *userdata)
{
	struct daemon *d = userdata;
	char why[512];
	if (server_stuck(d->server, d->watchdog_usec * 1000u, why, sizeof(why))) {
		if (!d->stuck)
			log_error("watchdog: %s; no longer pinging the watchdog, so the service manager restarts feedd",
				  why);
		d->stuck = true;
		return;
	}
	if (d->stuck)
		log_notice("watchdog: the worker pool makes progress again; pinging the watchdog");
	d->stuck = false;
	service_watchdog_ping();
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },   { "socket", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 't' },  { "log-level", required_argument, NULL, 'l' },
		{ "check", no_argument, NULL, 'C' },          { "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },        { 0 },
	};
	struct daemon d = { .config_path = DEFAULT_CONFIG };
	const char *socket_arg = NULL, *level_arg = NULL;
	long threads_arg = -1;
	bool check = false;
	int opt;
	while ((opt = getopt_long(argc, argv, "c:s:t:l:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			d.config_path = optarg;
			break;
		case 's':
			socket_arg = optarg;
			break;
		case 't': {
			char *end;
			threads_arg = strtol(optarg, &end, 10);
			if (*end || threads_arg < 0 || threads_arg > 1024) {
				fprintf(stderr, "feedd: --threads: '%s' is not an integer in 0..1024\n", optarg);
				return 2;
			}
			break;
		}
		case 'l':
			level_arg = optarg;
			break;
		case 'C':
			check = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("feedd %s\n", FEEDD_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "feedd: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	log_open();

	char err[512];
	int r = conf_load(d.config_path, &d.conf, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "feedd: %s\n", err);
		return 1;
	}
	log_set_level(d.conf->log_level);
	if (level_arg) {
		int l = log_level_from_string(level_arg);
		if (l < 0) {
			fprintf(stderr, "feedd: --log-level: '%s' is not one of error, warning, notice, info, debug\n",
				level_arg);
			conf_free(d.conf);
			return 2;
		}
		log_set_level(l);
		d.level_override = true;
	}
	if (threads_arg >= 0) {
		d.conf->threads = (unsigned)threads_arg;
		d.threads_override = true;
	}
	d.socket_override = socket_arg != NULL;

	char socket_path[108];
	if (wire_socket_path(socket_arg ? socket_arg : d.conf->socket, socket_path, sizeof(socket_path)) < 0) {
		log_error("socket path is too long");
		conf_free(d.conf);
		return 1;
	}

	signal(SIGPIPE, SIG_IGN);
	d.base = event_base_new();
	if (!d.base) {
		log_error("cannot create the event loop");
		conf_free(d.conf);
		return 1;
	}

	struct feed **feeds = NULL;
	size_t n_feeds = 0, failed = 0;
	int ret = 0;
	struct producer *producer = NULL;
	struct gpu *gpu = NULL;
	struct event *sigs[3] = { NULL }, *watchdog = NULL;
	r = load_feeds(d.conf, &feeds, &n_feeds, &failed);
	if (r < 0) {
		ret = 1;
		goto out;
	}
	if (check) {
		printf("%s: %zu feeds, %zu failed\n", d.config_path, d.conf->n_feeds, failed);
		ret = failed ? 1 : 0;
		goto out;
	}

	r = producer_new(d.base, d.conf->threads, d.conf->io_engine, d.conf->io_depth, &producer);
	if (r < 0) {
		log_error_errno(r, "cannot start the worker pool");
		ret = 1;
		goto out;
	}
	int listen_fd = service_listen_fd(err, sizeof(err));
	if (listen_fd < 0) {
		log_error("%s", err);
		ret = 1;
		goto out;
	}
	/* GPU staging, or host-only mode with the reason (the CUDA error text) in the log and in status. */
	r = gpu_open(&gpu);
	if (r < 0) {
		log_error_errno(r, "cannot set up GPU staging");
		ret = 1;
		goto out;
	}
	if (gpu_available(gpu))
		log_info("gpu: %s", gpu->status);
	else
		log_notice("gpu: %s; serving host batches only", gpu->status);
	struct server_config scfg = {
		.socket_path = socket_path,
		.listen_fd = listen_fd > 0 ? listen_fd : -1,
		.gpu_status = gpu->status,
		.gpu = gpu,
		.reload = reload,
		.userdata = &d,
	};
	r = server_new(d.base, &scfg, d.conf, producer, feeds, n_feeds, &d.server, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err);
		ret = 1;
		goto out;
	}
	free_feeds(feeds, n_feeds); /* the server holds its own references */
	feeds = NULL;
	n_feeds = 0;
	metrics_apply(&d, d.conf);

	static const int signals[] = { SIGTERM, SIGINT, SIGHUP };
	for (size_t i = 0; i < ARRAY_SIZE(signals); i++) {
		sigs[i] = evsignal_new(d.base, signals[i], on_signal, &d);
		if (!sigs[i] || event_add(sigs[i], NULL) < 0) {
			log_error("cannot install signal handlers");
			ret = 1;
			goto out;
		}
	}
	d.watchdog_usec = service_watchdog_usec();
	if (d.watchdog_usec) {
		/* Ping at half the interval, as sd_watchdog_enabled(3) advises. */
		uint64_t half = d.watchdog_usec / 2;
		struct timeval tv = { .tv_sec = (time_t)(half / 1000000u), .tv_usec = (suseconds_t)(half % 1000000u) };
		watchdog = event_new(d.base, -1, EV_PERSIST, on_watchdog, &d);
		if (!watchdog || event_add(watchdog, &tv) < 0) {
			log_error("cannot start the watchdog timer");
			ret = 1;
			goto out;
		}
	}

	log_notice("feedd %s ready: %zu feeds (%zu failed), %u worker threads, %s%s", FEEDD_VERSION, d.conf->n_feeds,
		   failed, pool_threads(producer_pool(producer)), gpu->status, d.watchdog_usec ? ", watchdog on" : "");
	char line[256];
	server_status_line(d.server, line, sizeof(line));
	service_ready(line);
	if (d.watchdog_usec)
		service_watchdog_ping();
	event_base_dispatch(d.base);

out:
	d.metrics = metrics_free(d.metrics); /* it reads the server's snapshot */
	free(d.metrics_listen);
	d.server = server_free(d.server);
	remote_cancel(); /* workers waiting on object storage stop waiting */
	producer = producer_free(producer);
	gpu = gpu_free(gpu); /* after the sessions' stagings, which the producer's last completions free */
	free_feeds(feeds, n_feeds);
	remote_shutdown(); /* the fetcher's thread, after every source is closed */
	for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
		if (sigs[i])
			event_free(sigs[i]);
	if (watchdog)
		event_free(watchdog);
	event_base_free(d.base);
	conf_free(d.conf);
	if (!check && ret == 0)
		log_notice("stopped");
	return ret;
}
