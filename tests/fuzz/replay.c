/* SPDX-License-Identifier: MIT */
/*
 * Corpus replay: the `main` of a fuzz target outside libFuzzer. Each argument
 * is a file or a directory of files (not recursive); every input is passed to
 * LLVMFuzzerTestOneInput once, in name order so a failure reproduces. A
 * missing directory is fine (the committed reproducer folder of a target may
 * not exist yet), but replaying nothing at all is a failure: a test that runs
 * no input cannot fail.
 *
 * Exit 0 when every input ran; a broken promise aborts inside the target.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		close(fd);
		return -1;
	}
	size_t size = (size_t)st.st_size;
	/* An exact-size heap copy, so ASan sees a read one byte past the input. */
	uint8_t *buf = malloc(size ? size : 1);
	size_t got = 0;
	while (buf && got < size) {
		ssize_t n = read(fd, buf + got, size - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (!buf || got != size) {
		fprintf(stderr, "replay: %s: short read\n", path);
		free(buf);
		return -1;
	}
	fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
	LLVMFuzzerTestOneInput(buf, size);
	free(buf);
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
	unsigned long n = 0;
	int failed = 0;
	LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0) {
			if (errno == ENOENT)
				continue;
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		if (!S_ISDIR(st.st_mode)) {
			failed |= run_file(argv[i]) < 0;
			n++;
			continue;
		}
		struct dirent **ents;
		int k = scandir(argv[i], &ents, NULL, NULL);
		if (k < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			return 1;
		}
		char **names = calloc((size_t)k + 1, sizeof(*names));
		int m = 0;
		for (int j = 0; j < k; j++) {
			if (ents[j]->d_name[0] != '.' && strcmp(ents[j]->d_name, "README.md") != 0 &&
			    asprintf(&names[m], "%s/%s", argv[i], ents[j]->d_name) >= 0)
				m++;
			free(ents[j]);
		}
		free(ents);
		qsort(names, (size_t)m, sizeof(*names), by_name);
		for (int j = 0; j < m; j++) {
			if (stat(names[j], &st) == 0 && S_ISREG(st.st_mode)) {
				failed |= run_file(names[j]) < 0;
				n++;
			}
			free(names[j]);
		}
		free(names);
	}
	if (n == 0) {
		fprintf(stderr, "replay: no inputs found\n");
		return 1;
	}
	printf("replayed %lu inputs, %lu accepted\n", n, fuzz_accepted);
	if (fuzz_accepted == 0) {
		fprintf(stderr, "replay: no input was accepted; the seeds no longer reach the code under test\n");
		return 1;
	}
	return failed;
}
