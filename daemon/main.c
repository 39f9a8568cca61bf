/* SPDX-License-Identifier: MIT */
/*
 * feedd: load the config, open every feed, start the worker pool and the
 * control socket, and run the event loop until SIGTERM/SIGINT.
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
#include "daemon/log/log.h"
#include "daemon/server/server.h"
#include "proto/macro.h"
#include "proto/wire.h"

#define DEFAULT_CONFIG FEEDD_SYSCONFDIR "/feedd/feedd.conf"

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

static void on_signal(evutil_socket_t sig, short what, void *userdata)
{
	struct event_base *base = userdata;
	log_notice("received %s, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
	event_base_loopbreak(base);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "config", required_argument, NULL, 'c' },   { "socket", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 't' },  { "log-level", required_argument, NULL, 'l' },
		{ "check", no_argument, NULL, 'C' },          { "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },        { 0 },
	};
	const char *config = DEFAULT_CONFIG, *socket_arg = NULL, *level_arg = NULL;
	long threads_arg = -1;
	bool check = false;
	int opt;
	while ((opt = getopt_long(argc, argv, "c:s:t:l:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			config = optarg;
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

	char err[512];
	struct conf *conf;
	int r = conf_load(config, &conf, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "feedd: %s\n", err);
		return 1;
	}
	log_set_level(conf->log_level);
	if (level_arg) {
		int l = log_level_from_string(level_arg);
		if (l < 0) {
			fprintf(stderr, "feedd: --log-level: '%s' is not one of error, warning, notice, info, debug\n",
				level_arg);
			conf_free(conf);
			return 2;
		}
		log_set_level(l);
	}
	if (threads_arg >= 0)
		conf->threads = (unsigned)threads_arg;

	char socket_path[108];
	if (wire_socket_path(socket_arg ? socket_arg : conf->socket, socket_path, sizeof(socket_path)) < 0) {
		log_error("socket path is too long");
		conf_free(conf);
		return 1;
	}

	signal(SIGPIPE, SIG_IGN);
	struct event_base *base = event_base_new();
	if (!base) {
		log_error("cannot create the event loop");
		conf_free(conf);
		return 1;
	}

	/* Feeds load on the main thread with a reader of their own; workers get theirs. */
	struct io_reader *io = NULL;
	r = io_reader_new(conf->io_engine, conf->io_depth, &io);
	if (r < 0) {
		log_error_errno(r, "io_engine = io_uring was asked for, but io_uring cannot be set up");
		event_base_free(base);
		conf_free(conf);
		return 1;
	}
	if (io_reader_fallback(io) < 0)
		log_warning_errno(io_reader_fallback(io), "io_uring is unavailable, reading shards with pread");

	struct feed **feeds = calloc(MAX(conf->n_feeds, 1u), sizeof(*feeds));
	size_t n_feeds = 0, failed = 0;
	for (size_t i = 0; feeds && i < conf->n_feeds; i++) {
		r = feed_load(&conf->feeds[i], io, &feeds[n_feeds]);
		if (r < 0) {
			log_error_errno(r, "feed %s: cannot load", conf->feeds[i].name);
			failed++;
			continue;
		}
		failed += feeds[n_feeds]->state != FEED_READY;
		n_feeds++;
	}
	io = io_reader_free(io);

	int ret = 0;
	struct producer *producer = NULL;
	struct server *server = NULL;
	struct event *sigterm = NULL, *sigint = NULL;
	if (check) {
		printf("%s: %zu feeds, %zu failed\n", config, conf->n_feeds, failed);
		ret = failed ? 1 : 0;
		goto out;
	}

	r = producer_new(base, conf->threads, conf->io_engine, conf->io_depth, &producer);
	if (r < 0) {
		log_error_errno(r, "cannot start the worker pool");
		ret = 1;
		goto out;
	}
	const char *gpu = "unavailable: feedd was built without CUDA support";
	struct server_config scfg = { .socket_path = socket_path, .ring_slots = conf->ring_slots, .gpu_status = gpu };
	r = server_new(base, &scfg, producer, feeds, n_feeds, &server, err, sizeof(err));
	if (r < 0) {
		log_error("%s", err);
		ret = 1;
		goto out;
	}
	log_notice("feedd %s ready: %zu feeds (%zu failed), %u worker threads, %s", FEEDD_VERSION, n_feeds, failed,
		   pool_threads(producer_pool(producer)), gpu);

	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	if (!sigterm || !sigint || event_add(sigterm, NULL) < 0 || event_add(sigint, NULL) < 0) {
		log_error("cannot install signal handlers");
		ret = 1;
		goto out;
	}
	event_base_dispatch(base);

out:
	server = server_free(server);
	producer = producer_free(producer);
	for (size_t i = 0; i < n_feeds; i++)
		feed_unref(feeds[i]);
	free(feeds);
	if (sigterm)
		event_free(sigterm);
	if (sigint)
		event_free(sigint);
	event_base_free(base);
	conf_free(conf);
	if (!check && ret == 0)
		log_notice("stopped");
	return ret;
}
