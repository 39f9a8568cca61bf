/* SPDX-License-Identifier: MIT */
/*
 * Parquet decoding alone (bench/parquet.py): feedd's reader
 * (daemon/format/parquet.h) decodes a file's text column, every row group,
 * from a file in the page cache, touching each value's bytes once (as
 * copying it into the cache does), on one thread.
 *   pqdecode FILE [COLUMN [REPEAT]]
 * prints: seconds S bytes N rows R (the best of REPEAT passes)
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/format/parquet.h"

struct sum {
	uint64_t bytes, rows, check;
};

static int on_value(void *ctx, uint64_t row, const uint8_t *p, size_t n, bool null)
{
	struct sum *s = ctx;
	s->rows++;
	s->bytes += n;
	if (n)
		s->check += p[0] + p[n / 2] + p[n - 1];
	return 0;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: pqdecode FILE [COLUMN [REPEAT]]\n");
		return 2;
	}
	const char *column = argc > 2 ? argv[2] : "text";
	int repeat = argc > 3 ? atoi(argv[3]) : 3;
	int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		perror(argv[1]);
		return 1;
	}
	double best = 1e30;
	struct sum s = { 0 };
	char err[512];
	for (int k = 0; k < repeat; k++) {
		double t0 = now();
		struct parquet_source src = { .name = argv[1], .size = (uint64_t)st.st_size, .read = parquet_read_fd,
					      .ctx = (void *)(intptr_t)fd };
		struct parquet_file *f = NULL;
		int r = parquet_open(&src, &f, err, sizeof(err));
		int col = r < 0 ? r : parquet_text_column(f, column, err, sizeof(err));
		r = col < 0 ? col : 0;
		s = (struct sum){ 0 };
		for (uint32_t g = 0; r == 0 && g < f->n_row_groups; g++)
			r = parquet_read_column(f, g, (uint32_t)col, on_value, &s, err, sizeof(err));
		parquet_free(f);
		if (r < 0) {
			fprintf(stderr, "pqdecode: %s\n", err);
			return 1;
		}
		double t = now() - t0;
		if (t < best)
			best = t;
	}
	printf("seconds %.6f bytes %" PRIu64 " rows %" PRIu64 " check %" PRIu64 "\n", best, s.bytes, s.rows, s.check);
	close(fd);
	return 0;
}
