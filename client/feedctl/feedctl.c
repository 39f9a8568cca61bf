/* SPDX-License-Identifier: MIT */
/*
 * feedctl: the operator's view of feedd (status) and a way to see exactly
 * what a rank receives (dump). Talks to the daemon only through libfeed.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/feedctl/feedctl.h"
#include "client/feedctl/npy.h"
#include "config.h"
#include "feed/feed.h"
#include "proto/macro.h"
#include "proto/wire.h"

const char *socket_path;

static const struct command *commands(void);

static void usage(FILE *out)
{
	fprintf(out, "Usage: feedctl [--socket PATH] COMMAND ...\nInspect and use a running feedd.\n\nCommands:\n");
	for (const struct command *c = commands(); c->name; c++)
		fprintf(out, "  %-34s %s\n", c->synopsis, c->help);
	fprintf(out, "\nOptions:\n"
		     "  -s, --socket PATH   control socket (default: $FEEDD_SOCKET, else feedd's default)\n"
		     "  -h, --help          show this help\n"
		     "      --version       show the version\n");
}

int connect_or_say(feed_client **c)
{
	char why[1024];
	int r = feed_client_connect_err(socket_path, why, sizeof(why), c);
	/* The daemon's reason for a refusal, with the code's name unless the line has it already. */
	if (r < 0 && strstr(why, feed_strerror(r)))
		fprintf(stderr, "feedctl: %s\n", why);
	else if (r < 0)
		fprintf(stderr, "feedctl: %s (%s)\n", why, feed_strerror(r));
	return r;
}

int connect_operator_or_say(feed_client **c)
{
	char path[sizeof(((struct sockaddr_un *)NULL)->sun_path)], op[sizeof(path)];
	if (wire_socket_path(socket_path, path, sizeof(path)) == 0 &&
	    wire_operator_socket_path(path, op, sizeof(op)) == 0 && access(op, F_OK) == 0) {
		char why[1024];
		/* Anything but a connection there (another user's EACCES, a feedd gone) falls back to the control socket. */
		if (feed_client_connect_err(op, why, sizeof(why), c) == 0)
			return 0;
	}
	return connect_or_say(c);
}

void human(double v, char *buf, size_t n)
{
	const char *units = " kMGTP";
	int u = 0;
	while (v >= 1000 && u < 5) {
		v /= 1000;
		u++;
	}
	if (u == 0)
		snprintf(buf, n, "%.0f", v);
	else
		snprintf(buf, n, "%.1f%c", v, units[u]);
}

static void duration(double s, char *buf, size_t n)
{
	long t = (long)s;
	if (t >= 86400)
		snprintf(buf, n, "%ldd%ldh", t / 86400, t % 86400 / 3600);
	else if (t >= 3600)
		snprintf(buf, n, "%ldh%ldm", t / 3600, t % 3600 / 60);
	else if (t >= 60)
		snprintf(buf, n, "%ldm%lds", t / 60, t % 60);
	else
		snprintf(buf, n, "%.1fs", s);
}

const char *str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "-";
}

double num(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

json_t *path(json_t *o, const char *a, const char *b, const char *c)
{
	o = json_object_get(o, a);
	if (b)
		o = json_object_get(o, b);
	if (c)
		o = json_object_get(o, c);
	return o;
}

/* A duration in ms as "0.12ms", "45ms", "1.2s"; "-" when absent. */
void ms(json_t *v, char *buf, size_t n)
{
	if (!json_is_number(v)) {
		snprintf(buf, n, "-");
		return;
	}
	double x = json_number_value(v);
	if (x >= 1000)
		snprintf(buf, n, "%.1fs", x / 1000);
	else if (x >= 10)
		snprintf(buf, n, "%.0fms", x);
	else
		snprintf(buf, n, "%.2fms", x);
}

void host_line(json_t *root, char *buf, size_t n)
{
	json_t *tm = json_object_get(root, "telemetry"), *h = json_object_get(tm, "host");
	if (!json_is_object(h)) {
		snprintf(buf, n, "-");
		return;
	}
	char cpu[32] = "-", rq[96] = "an unknown share of their runnable time (no schedstat)";
	if (json_is_number(json_object_get(h, "workers_cpu_per_s")))
		snprintf(cpu, sizeof(cpu), "%.2f", num(h, "workers_cpu_per_s"));
	if (json_is_number(json_object_get(h, "runqueue_pct")))
		snprintf(rq, sizeof(rq), "%.0f %% of their runnable time", num(h, "runqueue_pct"));
	snprintf(buf, n, "%.0f CPUs, load %.2f, %.0f runnable; workers got %s CPU/s and waited for a CPU %s (host-bound from %.0f %%)",
		 num(h, "cpus"), num(h, "load_avg"), num(h, "runnable"), cpu, rq,
		 num(json_object_get(tm, "thresholds"), "host_pct"));
}

void print_status(json_t *root, FILE *out)
{
	json_t *d = json_object_get(root, "daemon");
	char up[32], a[32], b[32], w50[16], w99[16], s50[16];
	duration(num(d, "uptime_s"), up, sizeof(up));
	fprintf(out, "feedd %s  pid %.0f  up %s  socket %s\n", str(d, "version"), num(d, "pid"), up, str(d, "socket"));
	fprintf(out, "threads %.0f (%.0f busy, %.0f %% over the window)  io %s%s%s  gpu %s\n", num(d, "threads"),
		num(d, "threads_busy"), num(json_object_get(root, "telemetry"), "pool_busy_pct"), str(d, "io_engine"),
		json_is_string(json_object_get(d, "io_fallback")) ? ": " : "",
		json_is_string(json_object_get(d, "io_fallback")) ? str(d, "io_fallback") : "", str(d, "gpu"));
	char host[320];
	host_line(root, host, sizeof(host));
	fprintf(out, "host %s\n", host);

	json_t *feeds = json_object_get(root, "feeds"), *f;
	size_t i;
	fprintf(out, "\n%-16s %-7s %7s %10s %9s %6s %4s %8s %9s\n", "FEED", "STATE", "SHARDS", "DOCUMENTS", "TOKENS",
		"SEQLEN", "B", "CLIENTS", "BATCHES");
	json_array_foreach(feeds, i, f) {
		human(num(f, "tokens"), a, sizeof(a));
		fprintf(out, "%-16s %-7s %7.0f %10.0f %9s %6.0f %4.0f %8.0f %9.0f\n", str(f, "name"), str(f, "state"),
			num(f, "shards"), num(f, "documents"), a, num(f, "seq_len"), num(f, "batch_size"),
			num(f, "clients"), num(f, "batches"));
		json_t *pk = json_object_get(f, "packing"), *src;
		size_t k;
		if (json_is_object(pk) && num(pk, "positions") > 0)
			fprintf(out, "  packing %s: efficiency %.1f %%; %.0f/%.0f documents cut across rows, %.0f tokens truncated\n",
				str(pk, "mode"), 100 * num(pk, "efficiency"), num(pk, "cut_documents"), num(pk, "documents"),
				num(pk, "truncated"));
		json_array_foreach(json_object_get(pk, "sources"), k, src)
			fprintf(out, "  source %s: %.1f %% of documents (weight %.1f %%)\n", str(src, "name"),
				100 * num(src, "share"), 100 * num(src, "weight"));
		/* Work done after load and ahead of the readers (issue #22): shown while there is any. */
		json_t *wa = json_object_get(f, "work_ahead");
		if (json_is_object(wa) && (num(wa, "windows_built") > 0 || num(wa, "index_shards_pending") > 0)) {
			human(num(wa, "window_bytes"), b, sizeof(b));
			fprintf(out, "  work ahead: %.0f windows ahead, %.0f walked, %.0f building (%sB); %.0f built, %.0f while a reader waited, last in %.2f s; %.0f shard indexes to validate\n",
				num(wa, "windows_ahead"), num(wa, "windows_held"), num(wa, "windows_building"), b,
				num(wa, "windows_built"), num(wa, "windows_built_on_demand"),
				num(wa, "last_window_build_seconds"), num(wa, "index_shards_pending"));
		}
		if (json_is_string(json_object_get(f, "error")))
			fprintf(out, "  error: %s\n", str(f, "error"));
		else if (json_is_string(path(f, "diagnosis", "text", NULL)))
			fprintf(out, "  %s\n", str(json_object_get(f, "diagnosis"), "text"));
	}

	json_t *clients = json_object_get(root, "clients"), *c;
	if (json_array_size(clients) == 0) {
		fprintf(out, "\nno clients attached\n");
		return;
	}
	fprintf(out, "\n%-6s %-8s %-16s %-9s %10s %6s %9s %7s %9s %9s %9s %-10s\n", "CLIENT", "PID", "FEED", "RANK",
		"DELIVERED", "RING", "TOKENS/S", "STALL%", "WAIT-P50", "WAIT-P99", "STEP-P50", "STATE");
	json_array_foreach(clients, i, c) {
		char rank[24], ring[24];
		snprintf(rank, sizeof(rank), "%.0f/%.0f", num(c, "rank"), num(c, "world"));
		snprintf(ring, sizeof(ring), "%.0f/%.0f", num(c, "ring_fill"), num(c, "ring_slots"));
		human(num(c, "tokens_per_s"), b, sizeof(b));
		json_t *win = path(c, "telemetry", "window", NULL);
		ms(path(win, "wait", "p50_ms", NULL), w50, sizeof(w50));
		ms(path(win, "wait", "p99_ms", NULL), w99, sizeof(w99));
		ms(path(win, "step", "p50_ms", NULL), s50, sizeof(s50));
		/* The window's stall when there is one, else since attach. */
		double stall = win ? num(win, "stall_pct") : num(c, "stall_pct");
		fprintf(out, "%-6.0f %-8.0f %-16s %-9s %10.0f %6s %9s %7.1f %9s %9s %9s %-10s\n", num(c, "id"),
			num(c, "pid"), str(c, "feed"), rank, num(c, "batches_delivered"), ring, b, stall, w50, w99, s50,
			str(c, "state"));
	}
	fprintf(out, "\n");
	json_array_foreach(clients, i, c) {
		json_t *dg = json_object_get(c, "diagnosis");
		if (!json_is_object(dg))
			continue;
		fprintf(out, "client %.0f (%s rank %.0f/%.0f): %s\n", num(c, "id"), str(c, "feed"), num(c, "rank"),
			num(c, "world"), str(dg, "text"));
	}
	/* Trainers that lived through restarts (libfeed's counters, issue 17). */
	json_array_foreach(clients, i, c) {
		if (num(c, "reconnects") > 0)
			fprintf(out, "client %.0f (%s rank %.0f/%.0f): reconnected %.0f times to a restarted feedd, "
				"%.2f s waiting for it\n", num(c, "id"), str(c, "feed"), num(c, "rank"), num(c, "world"),
				num(c, "reconnects"), num(c, "reconnect_s"));
	}
	/* GPU staging per device client (docs/gpu.md, "Counters"). */
	json_array_foreach(clients, i, c) {
		json_t *g = json_object_get(c, "gpu");
		if (!json_is_object(g))
			continue;
		char bytes[32], rate[32] = "-";
		human(num(g, "h2d_bytes"), bytes, sizeof(bytes));
		if (json_is_number(json_object_get(g, "h2d_gb_per_s")))
			snprintf(rate, sizeof(rate), "%.1f GB/s", num(g, "h2d_gb_per_s"));
		fprintf(out, "client %.0f gpu cuda:%.0f (%s): %.0f copies, %sB, H2D %.1f ms (%s), %.0f release waits\n",
			num(c, "id"), num(g, "device"), str(g, "export"), num(g, "copies"), bytes, num(g, "h2d_ms"), rate,
			num(g, "events_waited"));
	}
}

int fetch_status(unsigned flags, json_t **ret)
{
	feed_client *c;
	if (connect_operator_or_say(&c) < 0)
		return -1;
	char *text = NULL;
	int r = feed_client_status_flags(c, flags, &text);
	if (r < 0) {
		fprintf(stderr, "feedctl: status: %s\n", feed_client_error(c));
		feed_client_close(c);
		return -1;
	}
	feed_client_close(c);
	json_error_t e;
	json_t *root = json_loads(text, 0, &e);
	free(text);
	if (!root) {
		fprintf(stderr, "feedctl: feedd sent status that is not JSON: %s\n", e.text);
		return -1;
	}
	*ret = root;
	return 0;
}

static int cmd_status(int argc, char **argv)
{
	bool json = false, brief = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else if (strcmp(argv[i], "--brief") == 0) {
			brief = true;
		} else {
			fprintf(stderr, "feedctl status: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	}
	if (json) {
		/* The daemon's document verbatim: everything it knows, in its own order (--brief: what the table reads). */
		feed_client *c;
		if (connect_operator_or_say(&c) < 0)
			return 1;
		char *text = NULL;
		int r = feed_client_status_flags(c, brief ? STATUS_PRINTED : 0, &text);
		if (r < 0)
			fprintf(stderr, "feedctl: status: %s\n", feed_client_error(c));
		else
			printf("%s\n", text);
		free(text);
		feed_client_close(c);
		return r < 0 ? 1 : 0;
	}
	json_t *root;
	if (fetch_status(STATUS_PRINTED, &root) < 0)
		return 1;
	print_status(root, stdout);
	json_decref(root);
	return 0;
}

static int parse_u32(const char *opt, const char *v, uint32_t *ret)
{
	char *end;
	errno = 0;
	unsigned long x = strtoul(v, &end, 10);
	if (!*v || *end || errno || x > UINT32_MAX) {
		fprintf(stderr, "feedctl dump: %s: '%s' is not a non-negative integer\n", opt, v);
		return -EINVAL;
	}
	*ret = (uint32_t)x;
	return 0;
}

static int cmd_dump(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "rank", required_argument, NULL, 'r' },   { "world", required_argument, NULL, 'w' },
		{ "cursor", required_argument, NULL, 'c' }, { "batches", required_argument, NULL, 'n' },
		{ "out", required_argument, NULL, 'o' },    { "state", required_argument, NULL, 'c' }, { 0 },
	};
	uint32_t rank = 0, world = 1, batches = 0;
	const char *cursor = NULL, *out = NULL;
	bool have_batches = false;
	int opt;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (opt) {
		case 'r':
			if (parse_u32("--rank", optarg, &rank) < 0)
				return 2;
			break;
		case 'w':
			if (parse_u32("--world", optarg, &world) < 0)
				return 2;
			break;
		case 'n':
			if (parse_u32("--batches", optarg, &batches) < 0)
				return 2;
			have_batches = true;
			break;
		case 'c':
			cursor = optarg;
			break;
		case 'o':
			out = optarg;
			break;
		default:
			return 2;
		}
	}
	if (optind + 1 != argc || !out || !have_batches) {
		fprintf(stderr, "Usage: feedctl dump FEED --rank R --world W --batches N --out DIR [--cursor C]\n");
		return 2;
	}
	const char *feed = argv[optind];
	if (mkdir(out, 0755) < 0 && errno != EEXIST) {
		fprintf(stderr, "feedctl dump: cannot create %s: %s\n", out, strerror(errno));
		return 1;
	}

	feed_client *c;
	if (connect_or_say(&c) < 0)
		return 1;
	int r = feed_client_attach(c, feed, rank, world, cursor);
	if (r < 0) {
		fprintf(stderr, "feedctl dump: attach to %s failed: %s\n", feed, feed_client_error(c));
		feed_client_close(c);
		return 1;
	}

	const char *names[3] = { "input_ids", "labels", "position_ids" };
	FILE *files[3] = { NULL }, *cursors = NULL, *cu = NULL;
	char path[4096];
	int ret = 1;
	uint32_t B = 0, L = 0;
	for (uint32_t i = 0; i < batches; i++) {
		struct feed_batch b;
		r = feed_client_next(c, 60000, &b);
		if (r < 0) {
			fprintf(stderr, "feedctl dump: batch %u: %s\n", i, feed_client_error(c));
			goto out;
		}
		if (i == 0) {
			B = b.batch_size;
			L = b.seq_len;
			size_t shape[3] = { batches, B, L };
			for (size_t k = 0; k < 3; k++) {
				snprintf(path, sizeof(path), "%s/%s.npy", out, names[k]);
				files[k] = npy_create_i32(path, shape, 3);
				if (!files[k]) {
					fprintf(stderr, "feedctl dump: cannot create %s: %s\n", path, strerror(errno));
					goto out;
				}
			}
			snprintf(path, sizeof(path), "%s/cursors.txt", out);
			cursors = fopen(path, "we");
			snprintf(path, sizeof(path), "%s/cu_seqlens.txt", out);
			cu = fopen(path, "we");
			if (!cursors || !cu) {
				fprintf(stderr, "feedctl dump: cannot create files in %s: %s\n", out, strerror(errno));
				goto out;
			}
		}
		const int32_t *arrays[3] = { b.input_ids, b.labels, b.position_ids };
		for (size_t k = 0; k < 3; k++)
			fwrite(arrays[k], sizeof(int32_t), (size_t)B * L, files[k]);
		fprintf(cursors, "%s\n", b.cursor);
		for (uint32_t k = 0; k < b.n_cu_seqlens; k++)
			fprintf(cu, "%s%d", k ? " " : "", b.cu_seqlens[k]);
		fputc('\n', cu);
		feed_client_release(c, &b);
	}
	ret = 0;
out:
	for (size_t k = 0; k < 3; k++)
		if (files[k] && fclose(files[k]) != 0)
			ret = 1;
	if (cursors && fclose(cursors) != 0)
		ret = 1;
	if (cu && fclose(cu) != 0)
		ret = 1;
	feed_client_close(c);
	if (ret == 0)
		fprintf(stderr, "feedctl dump: %u batches of %ux%u from %s rank %u/%u written to %s\n", batches, B, L,
			feed, rank, world, out);
	return ret;
}

/* reload / drain FEED: an operator command and feedd's one-line answer. */
static int cmd_admin(int argc, char **argv)
{
	bool drain = strcmp(argv[0], "drain") == 0;
	if (argc != (drain ? 2 : 1)) {
		fprintf(stderr, "Usage: feedctl %s\n", drain ? "drain FEED" : "reload");
		return 2;
	}
	feed_client *c;
	if (connect_operator_or_say(&c) < 0)
		return 1;
	char *msg = NULL;
	int r = drain ? feed_client_drain(c, argv[1], &msg) : feed_client_reload(c, &msg);
	if (r < 0)
		fprintf(stderr, "feedctl %s: %s\n", argv[0], feed_client_error(c));
	else
		printf("%s\n", msg);
	free(msg);
	feed_client_close(c);
	return r < 0 ? 1 : 0;
}

/* Every subcommand: its name, what it runs (argv[0] is the name), and its line in --help. */
static const struct command command_table[] = {
	{ "status", cmd_status, "status [--json [--brief]]", "daemon, feeds, clients and their diagnoses" },
	{ "top", cmd_top, "top [--interval S]", "status, refreshed in place (q quits)" },
	{ "report", cmd_report, "report --out DIR [--minutes N]", "PNG plots per client and a markdown summary" },
	{ "dump", cmd_dump, "dump FEED --rank R --world W --batches N --out DIR [--cursor C | --state S]",
	  "write what rank R receives as .npy files" },
	{ "explain", cmd_explain, "explain FEED [--rank R --world W] [--cursor C | --state S] [--batches N]",
	  "which shard, document and tokens each row of the next batches holds" },
	{ "merge", cmd_merge, "merge STATE...", "one global state from every rank's (elastic resume, any new world)" },
	{ "prep", cmd_prep, "prep --tokenizer F --out PREFIX INPUT...",
	  "tokenize text into a Megatron .bin/.idx (no daemon needed)" },
	{ "verify", cmd_verify, "verify [--write-sums] SHARD...",
	  "check Megatron shards and their checksum sidecars; --write-sums makes them (no daemon needed)" },
	{ "parquet-info", cmd_parquet_info, "parquet-info [--rows COLUMN] FILE",
	  "a Parquet shard's schema and row groups, as feedd reads them (no daemon needed)" },
	{ "reload", cmd_admin, "reload", "make feedd re-read its config (privileged)" },
	{ "drain", cmd_admin, "drain FEED", "FEED takes no new attaches; attached clients stream on (privileged)" },
	{ 0 },
};

static const struct command *commands(void)
{
	return command_table;
}

int main(int argc, char **argv)
{
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if ((strcmp(argv[i], "--socket") == 0 || strcmp(argv[i], "-s") == 0) && i + 1 < argc) {
			socket_path = argv[++i];
		} else if (strncmp(argv[i], "--socket=", 9) == 0) {
			socket_path = argv[i] + 9;
		} else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(argv[i], "--version") == 0) {
			printf("feedctl %s\n", FEEDD_VERSION);
			return 0;
		} else {
			fprintf(stderr, "feedctl: unknown option '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	for (const struct command *c = commands(); c->name; c++)
		if (strcmp(argv[i], c->name) == 0)
			return c->run(argc - i, argv + i);
	fprintf(stderr, "feedctl: unknown command '%s'\n", argv[i]);
	usage(stderr);
	return 2;
}
