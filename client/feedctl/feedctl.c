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

#include "client/feedctl/npy.h"
#include "config.h"
#include "feed/feed.h"
#include "proto/macro.h"

static const char *socket_path;

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: feedctl [--socket PATH] COMMAND ...\n"
		"Inspect and use a running feedd.\n\n"
		"Commands:\n"
		"  status [--json]                    daemon, feeds and attached clients\n"
		"  dump FEED --rank R --world W --batches N --out DIR [--cursor C]\n"
		"                                     write what rank R receives as .npy files\n\n"
		"Options:\n"
		"  -s, --socket PATH   control socket (default: $FEEDD_SOCKET, else feedd's default)\n"
		"  -h, --help          show this help\n"
		"      --version       show the version\n");
}

static int connect_or_say(feed_client **c)
{
	int r = feed_client_connect(socket_path, c);
	if (r < 0)
		fprintf(stderr, "feedctl: cannot reach feedd: %s\n", feed_strerror(r));
	return r;
}

static void human(double v, char *buf, size_t n)
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

static const char *str(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "-";
}

static double num(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

static void print_status(json_t *root)
{
	json_t *d = json_object_get(root, "daemon");
	char up[32], a[32], b[32];
	duration(num(d, "uptime_s"), up, sizeof(up));
	printf("feedd %s  pid %.0f  up %s  socket %s\n", str(d, "version"), num(d, "pid"), up, str(d, "socket"));
	printf("threads %.0f (%.0f busy)  io %s%s%s  gpu %s\n", num(d, "threads"), num(d, "threads_busy"),
	       str(d, "io_engine"), json_is_string(json_object_get(d, "io_fallback")) ? ": " : "",
	       json_is_string(json_object_get(d, "io_fallback")) ? str(d, "io_fallback") : "", str(d, "gpu"));

	json_t *feeds = json_object_get(root, "feeds"), *f;
	size_t i;
	printf("\n%-16s %-7s %7s %10s %9s %6s %4s %8s %9s\n", "FEED", "STATE", "SHARDS", "DOCUMENTS", "TOKENS",
	       "SEQLEN", "B", "CLIENTS", "BATCHES");
	json_array_foreach(feeds, i, f) {
		human(num(f, "tokens"), a, sizeof(a));
		printf("%-16s %-7s %7.0f %10.0f %9s %6.0f %4.0f %8.0f %9.0f\n", str(f, "name"), str(f, "state"),
		       num(f, "shards"), num(f, "documents"), a, num(f, "seq_len"), num(f, "batch_size"),
		       num(f, "clients"), num(f, "batches"));
		if (json_is_string(json_object_get(f, "error")))
			printf("  error: %s\n", str(f, "error"));
	}

	json_t *clients = json_object_get(root, "clients"), *c;
	if (json_array_size(clients) == 0) {
		printf("\nno clients attached\n");
		return;
	}
	printf("\n%-6s %-8s %-16s %-9s %10s %6s %9s %7s %-10s\n", "CLIENT", "PID", "FEED", "RANK", "DELIVERED",
	       "RING", "TOKENS/S", "STALL%", "STATE");
	json_array_foreach(clients, i, c) {
		char rank[24], ring[24];
		snprintf(rank, sizeof(rank), "%.0f/%.0f", num(c, "rank"), num(c, "world"));
		snprintf(ring, sizeof(ring), "%.0f/%.0f", num(c, "ring_fill"), num(c, "ring_slots"));
		human(num(c, "tokens_per_s"), b, sizeof(b));
		printf("%-6.0f %-8.0f %-16s %-9s %10.0f %6s %9s %7.1f %-10s\n", num(c, "id"), num(c, "pid"),
		       str(c, "feed"), rank, num(c, "batches_delivered"), ring, b, num(c, "stall_pct"), str(c, "state"));
	}
}

static int cmd_status(int argc, char **argv)
{
	bool json = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0) {
			json = true;
		} else {
			fprintf(stderr, "feedctl status: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	}
	feed_client *c;
	if (connect_or_say(&c) < 0)
		return 1;
	char *text = NULL;
	int r = feed_client_status(c, &text);
	if (r < 0) {
		fprintf(stderr, "feedctl: status: %s\n", feed_client_error(c));
		feed_client_close(c);
		return 1;
	}
	feed_client_close(c);
	if (json) {
		printf("%s\n", text);
		free(text);
		return 0;
	}
	json_error_t e;
	json_t *root = json_loads(text, 0, &e);
	free(text);
	if (!root) {
		fprintf(stderr, "feedctl: feedd sent status that is not JSON: %s\n", e.text);
		return 1;
	}
	print_status(root);
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
		{ "out", required_argument, NULL, 'o' },    { 0 },
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
	if (strcmp(argv[i], "status") == 0)
		return cmd_status(argc - i, argv + i);
	if (strcmp(argv[i], "dump") == 0)
		return cmd_dump(argc - i, argv + i);
	fprintf(stderr, "feedctl: unknown command '%s'\n", argv[i]);
	usage(stderr);
	return 2;
}
