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
#include "daemon/feed/integrity.h"
#include "daemon/feed/loader.h"
#include "daemon/feed/session.h"
#include "daemon/gpu/gpu.h"
#include "daemon/log/log.h"
#include "daemon/metrics/metrics.h"
#include "daemon/sd/service.h"
#include "daemon/server/server.h"
#include "daemon/slab/slab.h"
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

	/* The load on its thread (daemon/feed/loader.h): at start, or a reload. */
	struct loader *loader;
	struct load_job *job;
	uint64_t reload_client; /* the connection whose RELOAD this is, 0: SIGHUP */
	bool reload_again;      /* SIGHUP while reloading: once more afterwards */
	bool watching;          /* the server watches files for changes (watch_changes at start, not --check) */
	bool stop_asked;        /* SIGTERM/SIGINT, at start too (before the server exists) */
	int start_r;            /* the start's load: its result and message */
	char start_err[1024];
};

/* What a load reads and makes; the loader's thread fills it. */
struct load_job {
	char *path;        /* a reload: the config file to read */
	struct conf *conf; /* what it read (owned), or at start the config given (borrowed) */
	bool own_conf;
	struct feed **feeds;
	size_t n, failed;
	bool watch;        /* ready the feeds' files for the change watch (feed_watch_prepare) */
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

/* On the loader's thread: the config (for a reload), then every feed. */
static int load_run(void *arg, char *err, size_t errlen)
{
	struct load_job *j = arg;
	if (j->path) {
		int r = conf_load(j->path, &j->conf, err, errlen);
		if (r < 0)
			return r;
		j->own_conf = true;
	}
	int r = load_feeds(j->conf, &j->feeds, &j->n, &j->failed);
	if (r < 0) {
		snprintf(err, errlen, "cannot load feeds: %s", strerror(-r));
		return r;
	}
	/*
	 * A reload is all or nothing: the index validation a first start leaves
	 * to the scanner thread (READY at once) is waited for here, off the main
	 * loop, so that a damaged index refuses the reload while the old feed
	 * keeps serving (each shard scanned is progress for load_timeout_s).
	 */
	for (size_t i = 0; j->path && i < j->n; i++)
		if (j->feeds[i]->state == FEED_READY && feed_scan_wait(j->feeds[i]) < 0)
			j->failed++;
	/* The change watch's lookups and opens, here too: the main loop then only takes leases on descriptors. */
	for (size_t i = 0; j->watch && i < j->n; i++)
		if (feed_watch_prepare(j->feeds[i]) < 0)
			log_warning("feed %s: out of memory while readying its files for the change watch; they are checked "
				    "once a second only", j->feeds[i]->name);
	return 0;
}

static void load_job_free(void *arg)
{
	struct load_job *j = arg;
	if (!j)
		return;
	free_feeds(j->feeds, j->n);
	if (j->own_conf)
		conf_free(j->conf);
	free(j->path);
	free(j);
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
 * Why a loaded config is refused whole: a feed that failed to load (the old
 * config keeps serving, docs/operations.md), or no feeds at all where some
 * are served (an empty or cut-short file would drain every feed). Returns
 * 0, or a negative errno with the reasons in msg.
 */
static int reload_refusal(const struct daemon *d, const struct load_job *j, char *msg, size_t msglen)
{
	if (j->conf->n_feeds == 0 && d->conf->n_feeds > 0) {
		snprintf(msg, msglen, "%s holds no feeds (empty or cut short?); to stop serving every feed, drain them "
			 "(feedctl drain FEED)", d->config_path);
		return -ENODATA;
	}
	if (!j->failed)
		return 0;
	size_t at = (size_t)snprintf(msg, msglen, "%zu of %zu feeds failed to load:", j->failed, j->conf->n_feeds);
	int code = -EIO;
	for (size_t i = 0; i < j->n && at < msglen; i++) {
		const struct feed *f = j->feeds[i];
		if (f->state == FEED_READY)
			continue;
		code = f->error_code < 0 ? f->error_code : code;
		at += (size_t)snprintf(msg + at, msglen - at, " feed %s: %s;", f->name, f->error);
	}
	if (j->n < j->conf->n_feeds && at < msglen)
		snprintf(msg + at, msglen - at, " (and feeds that could not be loaded at all, see the log)");
	return code;
}

static void reload_start(struct daemon *d);

/* The reload's load finished (or was given up on): apply it all, or nothing. */
static void on_reloaded(void *userdata, int r, const char *err)
{
	struct daemon *d = userdata;
	struct load_job *j = r == -ETIMEDOUT ? NULL : d->job; /* after a timeout the stuck thread owns it */
	d->loader = NULL;
	d->job = NULL;
	char msg[WIRE_MESSAGE_MAX], why[WIRE_MESSAGE_MAX], line[256];
	if (r == 0)
		r = reload_refusal(d, j, why, sizeof(why));
	else
		snprintf(why, sizeof(why), "%s", err);
	if (r == 0)
		r = server_configure(d->server, j->conf);
	if (r < 0) {
		snprintf(msg, sizeof(msg), "reload rejected, the running configuration stays: %.460s",
			 r == -ENOMEM ? "out of memory" : why);
		log_error("%s", msg);
	} else {
		char summary[256];
		server_set_feeds(d->server, j->feeds, j->n, summary, sizeof(summary));
		note_restart_keys(d, j->conf);
		metrics_apply(d, j->conf);
		if (d->threads_override)
			j->conf->threads = d->conf->threads;
		if (!d->level_override)
			log_set_level(j->conf->log_level);
		conf_free(d->conf);
		d->conf = j->conf;
		j->own_conf = false;
		snprintf(msg, sizeof(msg), "reloaded %s: %s", d->config_path, summary);
		log_notice("%s", msg);
	}
	load_job_free(j);
	server_status_line(d->server, line, sizeof(line));
	service_ready(line);
	if (d->reload_client)
		server_reload_done(d->server, d->reload_client, r, msg);
	d->reload_client = 0;
	if (d->reload_again) {
		d->reload_again = false;
		reload_start(d);
	}
}

/* Starts re-reading the config on the loader's thread. Returns 0, or a negative errno with msg. */
static int reload_begin(struct daemon *d, char *msg, size_t msglen)
{
	service_reloading();
	log_notice("reloading %s", d->config_path);
	struct load_job *j = calloc(1, sizeof(*j));
	int r = j && (j->path = strdup(d->config_path)) ? 0 : -ENOMEM;
	if (j)
		j->watch = d->watching;
	if (r == 0)
		r = loader_start(d->base, d->conf->load_timeout_s, load_run, j, load_job_free, on_reloaded, d, &d->loader);
	if (r < 0) {
		load_job_free(j);
		snprintf(msg, msglen, "reload failed, the running configuration stays: cannot start loading: %s",
			 strerror(-r));
		log_error("%s", msg);
		char line[256];
		server_status_line(d->server, line, sizeof(line));
		service_ready(line);
		return r;
	}
	d->job = j;
	return 0;
}

static void reload_start(struct daemon *d)
{
	char msg[WIRE_MESSAGE_MAX];
	reload_begin(d, msg, sizeof(msg));
}

/*
 * An operator's RELOAD: re-reads the config off the main loop and applies it
 * all or nothing (on_reloaded answers the client). Returns 0 once started,
 * or a negative errno with the reason.
 */
static int reload(void *userdata, uint64_t client, char *msg, size_t msglen)
{
	struct daemon *d = userdata;
	if (d->loader) {
		snprintf(msg, msglen, "a reload is under way already; try again when it is done");
		return -EBUSY;
	}
	int r = reload_begin(d, msg, msglen);
	if (r == 0)
		d->reload_client = client;
	return r;
}

/* The start's load finished or was given up on: back to main(). */
static void on_started(void *userdata, int r, const char *err)
{
	struct daemon *d = userdata;
	d->loader = NULL;
	d->start_r = r;
	snprintf(d->start_err, sizeof(d->start_err), "%s", err);
	event_base_loopbreak(d->base);
}

static void on_signal(evutil_socket_t sig, short what, void *userdata)
{
	struct daemon *d = userdata;
	if (sig == SIGHUP) {
		if (d->loader)
			d->reload_again = true; /* the file may have changed after that load read it */
		else
			reload_start(d);
		return;
	}
	log_notice("received %s, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	d->stop_asked = true;
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
	/*
	 * libevent's objects from slabs of their own (daemon/slab/slab.h), set
	 * before libevent allocates anything: its per-fd records, one per fd
	 * number ever added to the loop and kept for good, were otherwise made
	 * in malloc's heap between the connections of a wave of clients, and
	 * after they left pinned a page each that malloc_trim could not give
	 * back (docs/benchmarks.md, "RSS after clients left"). Not under ASan
	 * or valgrind (whose preload is in LD_PRELOAD), which should see
	 * libevent's objects as they see ours.
	 */
#ifndef __SANITIZE_ADDRESS__
	const char *preload = getenv("LD_PRELOAD");
	if (!preload || !strstr(preload, "vgpreload"))
		event_set_mem_functions(slab_malloc, slab_realloc, slab_free);
#endif
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
		/* The config's own socket key is checked, with its line, by conf_load. */
		log_error("%s: the socket path is too long (a unix socket path holds at most %zu bytes)",
			  socket_arg ? "--socket" : d.config_path, sizeof(socket_path) - 1);
		conf_free(d.conf);
		return 1;
	}

	signal(SIGPIPE, SIG_IGN);
	/*
	 * Past 64 ordinary callbacks or 2 ms in one loop turn, the loop polls
	 * again, so that an operator's request or connection (served first:
	 * server.h) that arrived meanwhile waits for no more than that, not for
	 * every client's turn.
	 */
	struct event_config *ecfg = event_config_new();
	if (ecfg)
		(void)event_config_set_max_dispatch_interval(ecfg, &(struct timeval){ .tv_usec = 2000 }, 64, 1);
	d.base = ecfg ? event_base_new_with_config(ecfg) : event_base_new();
	if (ecfg)
		event_config_free(ecfg);
	if (!d.base) {
		log_error("cannot create the event loop");
		conf_free(d.conf);
		return 1;
	}
	/* Before any event exists, so that every event gets the ordinary priority (server.h, SERVER_PRIORITIES). */
	if (event_base_priority_init(d.base, SERVER_PRIORITIES) < 0)
		log_warning("cannot set event priorities: an operator's requests wait their turn with the clients'");

	struct feed **feeds = NULL;
	size_t n_feeds = 0, failed = 0;
	int ret = 0;
	struct producer *producer = NULL;
	struct gpu *gpu = NULL;
	struct event *sigs[3] = { NULL }, *watchdog = NULL;
	/*
	 * Before anything is loaded or listens: a SIGTERM while the feeds load,
	 * or between the socket's listen() and the loop (a client may connect
	 * then), stops feedd cleanly instead of killing it by the signal's
	 * default action (exit status 143, no "stopped", no socket removed).
	 * SIGHUP before the server exists reloads once it does.
	 */
	static const int signals[] = { SIGTERM, SIGINT, SIGHUP };
	for (size_t i = 0; i < ARRAY_SIZE(signals); i++) {
		sigs[i] = evsignal_new(d.base, signals[i], on_signal, &d);
		if (!sigs[i] || event_add(sigs[i], NULL) < 0) {
			log_error("cannot install signal handlers");
			ret = 1;
			goto out;
		}
	}
	/* Loaded on the loader's thread too, so that --check gives up on a FIFO or a hung mount. */
	struct load_job *job = calloc(1, sizeof(*job));
	/* The server's watch is made once, as the start's config says (--check serves nothing). */
	d.watching = !check && d.conf->watch_changes != CONF_WATCH_OFF;
	if (job)
		job->watch = d.watching;
	if (!job || !(job->conf = d.conf) ||
	    loader_start(d.base, d.conf->load_timeout_s, load_run, job, load_job_free, on_started, &d, &d.loader) < 0) {
		free(job);
		log_error("cannot start loading the feeds");
		ret = 1;
		goto out;
	}
	d.job = job;
	event_base_dispatch(d.base); /* until on_started, or a SIGTERM */
	if (d.stop_asked) {
		ret = check ? 1 : 0; /* a check stopped before it finished checked nothing */
		goto out;            /* the load, if still under way, is abandoned to its thread */
	}
	if (d.start_r < 0) {
		log_error("%s", d.start_err);
		if (d.start_r == -ETIMEDOUT)
			d.conf = NULL; /* the stuck thread still reads it: never freed */
		ret = 1;
		goto out;
	}
	feeds = d.job->feeds;
	n_feeds = d.job->n;
	failed = d.job->failed;
	d.job->feeds = NULL;
	d.job->n = 0;
	d.job = (load_job_free(d.job), NULL);
	if (check) {
		/* A check validates every index whole, also those that serving would validate after load. */
		for (size_t i = 0; i < n_feeds; i++)
			if (feeds[i]->state == FEED_READY && feed_scan_wait(feeds[i]) < 0)
				failed++;
		printf("%s: %zu feeds, %zu failed\n", d.config_path, d.conf->n_feeds, failed);
		for (size_t i = 0; i < n_feeds; i++)
			if (feeds[i]->state != FEED_READY)
				printf("  feed %s: %s\n", feeds[i]->name, feeds[i]->error);
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
	if (d.reload_again) { /* a SIGHUP while the feeds loaded: the config may have changed since it was read */
		d.reload_again = false;
		reload_start(&d);
	}
	event_base_dispatch(d.base);

out:
	if (d.loader) { /* a reload under way when stopping: its job goes with the loader */
		d.loader = loader_abandon(d.loader);
		d.job = NULL;
	}
	if (d.job && d.start_r != -ETIMEDOUT) /* the start's, unless a stuck thread still holds it */
		load_job_free(d.job);
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
