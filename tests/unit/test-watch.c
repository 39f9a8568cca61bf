/* SPDX-License-Identifier: MIT */
/*
 * The change watch (daemon/source/watch.h): one watch per file per daemon.
 * Several adds of one file, under one name or a hard link, share one lease
 * (on the descriptor its source holds: no descriptor more) or one inotify
 * watch; a change tells every watcher once; the last removal drops the
 * watch; past the watch's share of RLIMIT_NOFILE files go to inotify and
 * no add fails. Leases are broken by a real writer (a child's open(2) for
 * writing, held by the kernel until dispatch lets it go). A file readied
 * off the main loop (source_watch_prepare) is added with no path lookup:
 * inotify on /proc/self/fd/N watches the file itself.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "daemon/source/source.h"
#include "daemon/source/watch.h"
#include "unit.h"

static char dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void make_file(const char *name, char *path, size_t n)
{
	snprintf(path, n, "%s/%s", dir, name);
	FILE *f = fopen(path, "we");
	REQUIRE(f && fputs("0123456789", f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	REQUIRE(d, "opendir /proc/self/fd");
	int n = 0;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3; /* ., .. and the DIR's own */
}

/* inotify watches the kernel holds on the watch's instance (/proc/self/fdinfo). */
static int inotify_watches(const struct source_watch *w)
{
	char p[64], line[512];
	snprintf(p, sizeof(p), "/proc/self/fdinfo/%d", source_watch_fd(w));
	FILE *f = fopen(p, "re");
	REQUIRE(f, "%s", p);
	int n = 0;
	while (fgets(line, sizeof(line), f))
		n += strncmp(line, "inotify wd:", 11) == 0;
	fclose(f);
	return n;
}

struct told {
	uint32_t ids[16];
	int n;
};

static void on_change(void *ctx, uint32_t id, const char *path, const char *what)
{
	struct told *t = ctx;
	if (t->n < 16)
		t->ids[t->n++] = id;
}

static bool told_of(const struct told *t, uint32_t id)
{
	for (int i = 0; i < t->n; i++)
		if (t->ids[i] == id)
			return true;
	return false;
}

static void write_byte(const char *path)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	REQUIRE(fd >= 0 && pwrite(fd, "x", 1, 0) == 1 && close(fd) == 0, "cannot write %s", path);
}

/* inotify only (no signal: leases are not tried). */
static void test_inotify(void)
{
	char c[128], ln[128];
	make_file("c", c, sizeof(c));
	snprintf(ln, sizeof(ln), "%s/c-link", dir);
	REQUIRE(link(c, ln) == 0, "link");
	struct source_watch *w;
	REQUIRE(source_watch_new(0, &w) == 0, "source_watch_new");
	int fds0 = open_fds();
	uint32_t id[4];
	CHECK_INT(source_watch_add(w, c, &id[0], NULL), SOURCE_WATCH_INOTIFY);
	CHECK_INT(source_watch_add(w, c, &id[1], NULL), SOURCE_WATCH_INOTIFY);
	CHECK_INT(source_watch_add(w, ln, &id[2], NULL), SOURCE_WATCH_INOTIFY);
	CHECK_INT(source_watch_files(w), 1);
	CHECK_INT(inotify_watches(w), 1);
	CHECK_INT(open_fds(), fds0);

	write_byte(ln);
	CHECK(source_watch_pending(w), "a write through the link is pending");
	struct told t = { 0 };
	CHECK_INT(source_watch_dispatch(w, on_change, &t), 3);
	CHECK(told_of(&t, id[0]) && told_of(&t, id[1]) && told_of(&t, id[2]), "every watcher of c is told");
	/* Told once: a second write tells nobody already told, but a watcher added since. */
	CHECK_INT(source_watch_add(w, c, &id[3], NULL), SOURCE_WATCH_INOTIFY);
	write_byte(c);
	t = (struct told){ 0 };
	CHECK_INT(source_watch_dispatch(w, on_change, &t), 1);
	CHECK(told_of(&t, id[3]), "the watcher added after the first change is told of the second");

	source_watch_remove(w, id[0]);
	source_watch_remove(w, id[2]);
	source_watch_remove(w, id[3]);
	CHECK_INT(inotify_watches(w), 1);
	source_watch_remove(w, id[1]);
	CHECK_INT(source_watch_files(w), 0);
	CHECK_INT(inotify_watches(w), 0);
	source_watch_remove(w, id[1]); /* twice: nothing */
	write_byte(c);
	t = (struct told){ 0 };
	CHECK_INT(source_watch_dispatch(w, on_change, &t), 0);
	source_watch_free(w);
}

/* A child writes `path`: its open(2) waits for the lease to be released. */
static pid_t writer(const char *path)
{
	fflush(NULL);
	pid_t pid = fork();
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		alarm(60);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		_exit(fd >= 0 && pwrite(fd, "y", 1, 1) == 1 ? 0 : 1);
	}
	return pid;
}

static void test_leases(void)
{
	int signo = SIGRTMIN + 1;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, signo);
	REQUIRE(sigprocmask(SIG_BLOCK, &set, NULL) == 0, "sigprocmask");
	char a[128], a2[128], b[128], err[256];
	make_file("a", a, sizeof(a));
	make_file("b", b, sizeof(b));
	snprintf(a2, sizeof(a2), "%s/a-link", dir);
	REQUIRE(link(a, a2) == 0, "link");
	struct source *src;
	REQUIRE(source_open(a, &src, err, sizeof(err)) == 0, "%s", err);
	struct source_watch *w;
	REQUIRE(source_watch_new(signo, &w) == 0, "source_watch_new");
	int fds0 = open_fds();
	uint32_t ia[3], ib[2];
	int lease_err = 0;
	int r = source_watch_add(w, a, &ia[0], &lease_err);
	if (r == SOURCE_WATCH_INOTIFY) {
		printf("leases not granted here (%s): lease checks skipped\n", strerror(-lease_err));
		source_watch_free(w);
		source_close(src);
		return;
	}
	CHECK_INT(r, SOURCE_WATCH_LEASE);
	CHECK_INT(source_watch_add(w, a, &ia[1], NULL), SOURCE_WATCH_LEASE);
	CHECK_INT(source_watch_add(w, a2, &ia[2], NULL), SOURCE_WATCH_LEASE);
	/* a: leased on its source's descriptor; no descriptor more however many watch it. */
	CHECK_INT(open_fds(), fds0);
	CHECK_INT(source_watch_add(w, b, &ib[0], NULL), SOURCE_WATCH_LEASE);
	CHECK_INT(source_watch_add(w, b, &ib[1], NULL), SOURCE_WATCH_LEASE);
	/* b: no source holds it open: one descriptor of the watch's, for both. */
	CHECK_INT(open_fds(), fds0 + 1);
	CHECK_INT(source_watch_files(w), 2);
	CHECK_INT(inotify_watches(w), 0);

	pid_t pid = writer(a);
	struct timespec ts = { .tv_sec = 10 };
	CHECK_INT(sigtimedwait(&set, NULL, &ts), signo);
	int st;
	CHECK_INT(waitpid(pid, &st, WNOHANG), 0); /* held until dispatch */
	struct told t = { 0 };
	CHECK_INT(source_watch_dispatch(w, on_change, &t), 3);
	CHECK(told_of(&t, ia[0]) && told_of(&t, ia[1]) && told_of(&t, ia[2]), "every watcher of a is told");
	CHECK(!told_of(&t, ib[0]) && !told_of(&t, ib[1]), "b's watchers are not");
	CHECK_INT(waitpid(pid, &st, 0), pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer went on after dispatch");

	/* The last of b's watchers drops its lease and closes the watch's descriptor. */
	source_watch_remove(w, ib[0]);
	CHECK_INT(open_fds(), fds0 + 1);
	source_watch_remove(w, ib[1]);
	CHECK_INT(open_fds(), fds0);
	pid = writer(b);
	CHECK_INT(waitpid(pid, &st, 0), pid); /* no lease left to hold it */
	t = (struct told){ 0 };
	CHECK_INT(source_watch_dispatch(w, on_change, &t), 0);
	for (int i = 0; i < 3; i++)
		source_watch_remove(w, ia[i]);
	CHECK_INT(source_watch_files(w), 0);
	/* The source's descriptor outlives the lease taken on it: still open, closed by the source. */
	CHECK_INT(open_fds(), fds0);
	source_watch_free(w);
	source_close(src);
	CHECK_INT(open_fds(), fds0 - 2); /* the source's and the inotify instance */
	while (sigtimedwait(&set, NULL, &(struct timespec){ 0 }) > 0)
		;
}

/*
 * Readied off the main loop (source_watch_prepare): the add looks up no path.
 * The name is moved away between prepare and add, and a stranger put in its
 * place: inotify (through /proc/self/fd/N) and the lease still watch the file
 * that was prepared, not whatever the name leads to now; a prep dropped
 * unused (a reload refused) closes its descriptor.
 */
static void test_prepared(void)
{
	char d[128], d2[128], other[128];
	make_file("d", d, sizeof(d));
	make_file("other", other, sizeof(other));
	snprintf(d2, sizeof(d2), "%s/d-moved", dir);
	int fds0 = open_fds();

	/* Dropped unused: nothing stays open. */
	struct source_watch_prep p;
	CHECK_INT(source_watch_prepare(d, NULL, &p), 0);
	CHECK(p.fd >= 0 && p.own, "prepare opened d");
	CHECK_INT(open_fds(), fds0 + 1);
	source_watch_prep_drop(&p);
	source_watch_prep_drop(&p); /* idempotent */
	CHECK_INT(open_fds(), fds0);
	struct source_watch_prep none;
	CHECK_INT(source_watch_prepare(d2, NULL, &none), -ENOENT);
	CHECK_INT(none.fd, -1);

	for (int lease = 0; lease < 2; lease++) {
		int signo = lease ? SIGRTMIN + 1 : 0;
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGRTMIN + 1);
		REQUIRE(sigprocmask(SIG_BLOCK, &set, NULL) == 0, "sigprocmask");
		struct source_watch *w;
		REQUIRE(source_watch_new(signo, &w) == 0, "source_watch_new");
		int fds1 = open_fds();
		CHECK_INT(source_watch_prepare(d, NULL, &p), 0);
		/* The name now leads elsewhere: the add must not follow it. */
		REQUIRE(rename(d, d2) == 0 && link(other, d) == 0, "rename");
		uint32_t id;
		int lease_err = 0;
		int r = source_watch_add_prepared(w, d, &p, &id, &lease_err);
		CHECK_INT(p.fd, -1); /* taken by the add */
		if (lease)
			CHECK(r == SOURCE_WATCH_LEASE || r == SOURCE_WATCH_INOTIFY, "add: %d", r);
		else
			CHECK_INT(r, SOURCE_WATCH_INOTIFY);
		CHECK_INT(open_fds(), fds1 + (r == SOURCE_WATCH_LEASE)); /* inotify keeps no descriptor */
		struct told t = { 0 };
		if (r == SOURCE_WATCH_INOTIFY) {
			write_byte(d); /* the stranger now at the name: not watched */
			CHECK(!source_watch_pending(w), "a write to the file now at the name is not the watched file's");
			write_byte(d2);
			CHECK(source_watch_pending(w), "a write to the prepared file, moved, is seen");
			CHECK_INT(source_watch_dispatch(w, on_change, &t), 1);
		} else {
			pid_t pid = writer(d2);
			struct timespec ts = { .tv_sec = 10 };
			CHECK_INT(sigtimedwait(&set, NULL, &ts), SIGRTMIN + 1);
			CHECK_INT(source_watch_dispatch(w, on_change, &t), 1);
			int st;
			CHECK_INT(waitpid(pid, &st, 0), pid);
		}
		CHECK(told_of(&t, id), "the prepared file's watcher is told");
		source_watch_remove(w, id);
		CHECK_INT(open_fds(), fds1);
		source_watch_free(w);
		REQUIRE(unlink(d) == 0 && rename(d2, d) == 0, "rename back");
		while (sigtimedwait(&set, NULL, &(struct timespec){ 0 }) > 0)
			;
	}
	CHECK_INT(open_fds(), fds0);
}

/* More files than the watch's share of descriptors: the rest go to inotify, no add fails. */
static void test_out_of_fds(void)
{
	int signo = SIGRTMIN + 1;
	struct rlimit was, rl;
	REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0, "getrlimit");
	rl = was;
	rl.rlim_cur = 40; /* the watch's share: 10 */
	REQUIRE(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
	struct source_watch *w;
	REQUIRE(source_watch_new(signo, &w) == 0, "source_watch_new");
	int fds0 = open_fds();
	uint32_t id[30];
	int leases = 0, inotify = 0, emfile = 0;
	for (int i = 0; i < 30; i++) {
		char name[32], path[128];
		snprintf(name, sizeof(name), "many-%d", i);
		make_file(name, path, sizeof(path));
		int lease_err = 0;
		int r = source_watch_add(w, path, &id[i], &lease_err);
		CHECK(r > 0, "add %d: %s", i, strerror(-r));
		leases += r == SOURCE_WATCH_LEASE;
		inotify += r == SOURCE_WATCH_INOTIFY;
		emfile += lease_err == -EMFILE;
	}
	if (leases) {
		CHECK_INT(leases, 10);
		CHECK_INT(emfile, 20);
	}
	CHECK_INT(leases + inotify, 30);
	CHECK(open_fds() <= fds0 + 10, "%d descriptors, %d before", open_fds(), fds0);

	/*
	 * Past the share, a prep has no descriptor: its inotify watch is added
	 * by path when prepared (a loader's thread), not by the add (the main
	 * loop). So a name moved away and replaced between the two still has
	 * the prepared file watched, not the stranger now at the name.
	 */
	char late[128], moved[128], other[128];
	make_file("late", late, sizeof(late));
	make_file("late-other", other, sizeof(other));
	snprintf(moved, sizeof(moved), "%s/late-moved", dir);
	struct source_watch_prep p;
	CHECK_INT(source_watch_prepare(late, NULL, &p), 0);
	if (p.by_name) {
		CHECK(p.fd == -1 && p.wd > 0, "a prep past the share: fd %d, wd %d (%s)", p.fd, p.wd, strerror(-p.wd_err));
		REQUIRE(rename(late, moved) == 0 && link(other, late) == 0, "rename");
		uint32_t lid;
		int lease_err = 0;
		CHECK_INT(source_watch_add_prepared(w, late, &p, &lid, &lease_err), SOURCE_WATCH_INOTIFY);
		CHECK_INT(lease_err, -EMFILE);
		/* Watched since it was prepared: its move is seen (by the old way, the add watched the stranger). */
		struct told t = { 0 };
		CHECK_INT(source_watch_dispatch(w, on_change, &t), 1);
		CHECK(told_of(&t, lid), "the prepared file's watcher is told it moved");
		write_byte(late);
		CHECK(!source_watch_pending(w), "a write to the file now at the name is not the prepared file's");
		write_byte(moved);
		CHECK(source_watch_pending(w), "a write to the prepared file, moved, is seen");
		source_watch_dispatch(w, on_change, &t);
		source_watch_remove(w, lid);
		/* Prepared and dropped unused: its inotify watch goes too. */
		unsigned before = inotify_watches(w);
		CHECK_INT(source_watch_prepare(other, NULL, &p), 0);
		CHECK(p.by_name && p.wd > 0, "a second prep past the share");
		CHECK_INT(inotify_watches(w), before + 1);
		source_watch_prep_drop(&p);
		CHECK_INT(inotify_watches(w), before);
	} else {
		printf("no prep past the watch's share here (leases not granted): the by-name prep is not checked\n");
		source_watch_prep_drop(&p);
	}
	for (int i = 0; i < 30; i++)
		source_watch_remove(w, id[i]);
	CHECK_INT(open_fds(), fds0);
	CHECK_INT(inotify_watches(w), 0);
	source_watch_free(w);
	REQUIRE(setrlimit(RLIMIT_NOFILE, &was) == 0, "setrlimit");
}

int main(void)
{
	char tmpl[] = "/tmp/feedd-watch-XXXXXX";
	REQUIRE(mkdtemp(tmpl), "mkdtemp");
	snprintf(dir, sizeof(dir), "%s", tmpl);

	test_inotify();
	test_leases();
	test_out_of_fds();
	test_prepared();

	nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
	return unit_exit("test-watch");
}
