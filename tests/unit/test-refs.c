/* SPDX-License-Identifier: MIT */
/*
 * Reference counts are unsigned: an unref without a reference must stop the
 * daemon at the assert, not wrap to UINT_MAX (a leak, or a free later under
 * a holder). Each case runs in a child that must die of SIGABRT.
 */
#include "daemon/feed/feed.h"
#include "tests/unit/unit.h"

static void expect_abort(const char *what, void (*fn)(void))
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGABRT, SIG_DFL);
		fclose(stderr); /* the assert's message is expected */
		fn();
		_exit(0);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s: the child %s %d, expected SIGABRT", what,
	      WIFSIGNALED(status) ? "died of signal" : "exited with", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

static void feed_unref_unreferenced(void)
{
	struct feed *f = calloc(1, sizeof(*f)); /* refs == 0: nobody holds it */
	feed_unref(f);
}

int main(void)
{
	CHECK(feed_unref(NULL) == NULL, "feed_unref(NULL)");
	expect_abort("feed_unref of a feed nobody holds", feed_unref_unreferenced);
	return unit_exit("test-refs");
}
