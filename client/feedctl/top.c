/* SPDX-License-Identifier: MIT */
/*
 * feedctl top: the status view, redrawn in place every interval until q (or
 * Ctrl-C). Plain ANSI escapes and termios: the cursor goes home, each line
 * overwrites the last frame's and clears its rest, and whatever is left
 * below is cleared, so the screen does not flicker. The terminal's mode is
 * restored on every way out.
 *
 * The frame fits the terminal: its size is asked with TIOCGWINSZ before each
 * frame, and a SIGWINCH (the terminal resized) redraws at once. Lines are cut
 * at the width (counting UTF-8 characters, not bytes) and the frame at the
 * height less one row, so the cursor never reaches the last row and the
 * header never scrolls away. Output that is not a terminal is not cut.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "client/feedctl/feedctl.h"

static volatile sig_atomic_t stop, resized;

static void on_signal(int sig)
{
	stop = 1;
}

static void on_winch(int sig)
{
	resized = 1;
}

/* The bytes of the first `cols` UTF-8 characters of p[0..n) (continuation bytes do not count). */
static size_t fit(const char *p, size_t n, unsigned cols)
{
	size_t i = 0;
	for (unsigned chars = 0; i < n; i++) {
		if (((unsigned char)p[i] & 0xC0) != 0x80 && chars++ == cols)
			break;
	}
	return i;
}

/*
 * Writes a frame in rows x cols (0: no limit): every line is cut at cols and
 * ends by clearing the rest of the screen line; at most rows - 1 lines.
 */
static void draw(const char *frame, unsigned rows, unsigned cols)
{
	fputs("\033[H", stdout);
	unsigned row = 0;
	for (const char *p = frame; *p && (rows == 0 || row + 1 < rows); row++) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		fwrite(p, 1, cols ? fit(p, n, cols) : n, stdout);
		fputs(rows && row + 2 == rows ? "\033[K" : "\033[K\n", stdout);
		p += n + (nl != NULL);
	}
	fputs("\033[J", stdout);
	fflush(stdout);
}

/* The terminal's size, or 0 x 0 when stdout is not one. */
static void term_size(unsigned *rows, unsigned *cols)
{
	struct winsize ws;
	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	} else {
		*rows = *cols = 0;
	}
}

int cmd_top(int argc, char **argv)
{
	double interval = 1.0;
	long iterations = -1; /* for scripts: stop after N frames */
	for (int i = 1; i < argc; i++) {
		char *end;
		if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
			interval = strtod(argv[++i], &end);
			if (*end || !(interval >= 0.1 && interval <= 3600)) {
				fprintf(stderr, "feedctl top: --interval: '%s' is not a number of seconds in 0.1..3600\n", argv[i]);
				return 2;
			}
		} else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
			iterations = strtol(argv[++i], &end, 10);
			if (*end || iterations < 1) {
				fprintf(stderr, "feedctl top: --iterations: '%s' is not a positive integer\n", argv[i]);
				return 2;
			}
		} else {
			fprintf(stderr, "feedctl top: unknown argument '%s'\n", argv[i]);
			return 2;
		}
	}

	struct termios saved;
	bool tty = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
	if (tty) {
		struct termios raw = saved;
		raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		raw.c_cc[VMIN] = 0;
		raw.c_cc[VTIME] = 0;
		tcsetattr(STDIN_FILENO, TCSANOW, &raw);
	}
	struct sigaction sa = { .sa_handler = on_signal };
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	struct sigaction sw = { .sa_handler = on_winch }; /* no SA_RESTART: poll() returns, the frame is redrawn */
	sigaction(SIGWINCH, &sw, NULL);
	fputs("\033[?25l\033[2J", stdout); /* hide the cursor, clear once */

	int ret = 0;
	bool keys = true;
	for (long n = 0; !stop && (iterations < 0 || n < iterations); n++) {
		json_t *root;
		char *frame = NULL;
		size_t len = 0;
		FILE *m = open_memstream(&frame, &len);
		if (!m) {
			ret = 1;
			break;
		}
		time_t t = time(NULL);
		char when[16];
		strftime(when, sizeof(when), "%H:%M:%S", localtime(&t));
		fprintf(m, "feedctl top  %s  every %.1f s, q quits\n", when, interval);
		if (fetch_status(STATUS_PRINTED, &root) == 0) {
			json_t *worst = path(root, "telemetry", "worst", "text");
			fprintf(m, "worst: %s\n\n", json_is_string(worst) ? json_string_value(worst) : "-");
			print_status(root, m);
			json_decref(root);
		} else {
			fprintf(m, "\nfeedd is not answering; retrying\n");
		}
		fclose(m);
		unsigned rows, cols;
		term_size(&rows, &cols);
		draw(frame, rows, cols);
		free(frame);

		/* Sleep until the next frame, or a key; once stdin has ended (a pipe, /dev/null), just sleep. */
		struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
		resized = 0;
		int k = poll(&p, keys ? 1 : 0, (int)(interval * 1000));
		if (k < 0 && resized) {
			if (iterations >= 0)
				n--; /* a redraw for the new size is not one of the frames asked for */
			continue;
		}
		if (k > 0 && (p.revents & (POLLIN | POLLHUP))) {
			char c;
			ssize_t r = read(STDIN_FILENO, &c, 1);
			if (r == 0 || (r < 0 && errno != EINTR))
				keys = false;
			else if (c == 'q' || c == 'Q')
				break;
		}
	}
	fputs("\033[?25h", stdout);
	fflush(stdout);
	if (tty)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved);
	return ret;
}
