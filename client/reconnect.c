/* SPDX-License-Identifier: MIT */
/*
 * libfeed: transparent reconnect. When feedd goes away (stops, crashes, is
 * restarted or upgraded) the client waits for the next daemon with capped
 * exponential backoff plus jitter, attaches again at the cursor of the last
 * batch it delivered, and next() goes on: the stream is deterministic, so it
 * continues exactly where it was. The caller sees a longer next().
 *
 * Batches still held point into the old ring: its mapping is kept (a
 * retired_ring) until they are released. Client sequences go on across
 * rings: the current ring's sequence 0 is client sequence seq_base.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client/libfeed-internal.h"

#define BACKOFF_FIRST_MS 5
#define BACKOFF_MAX_MS 250

int64_t client_reconnect_default(void)
{
	const char *e = secure_getenv("FEED_RECONNECT_TIMEOUT");
	if (!e || !*e)
		return FEED_RECONNECT_TIMEOUT_DEFAULT_MS;
	char *end;
	double s = strtod(e, &end);
	/* A value that does not parse keeps the default: a typo must not turn reconnecting off. */
	return *end || !(s >= 0 && s < 1e12) ? FEED_RECONNECT_TIMEOUT_DEFAULT_MS : (int64_t)(s * 1000.0);
}

FEED_EXPORT int feed_client_set_reconnect_timeout(feed_client *c, int64_t timeout_ms)
{
	assert_return(c, -EINVAL);
	if (timeout_ms < 0)
		return client_fail(c, -EINVAL, "reconnect_timeout must be >= 0 ms (0: do not reconnect)");
	c->reconnect_timeout_ms = timeout_ms;
	return 0;
}

FEED_EXPORT int feed_client_reconnect_stats(const feed_client *c, uint64_t *ret_reconnects, uint64_t *ret_ns)
{
	assert_return(c, -EINVAL);
	if (ret_reconnects)
		*ret_reconnects = c->reconnects;
	if (ret_ns)
		*ret_ns = c->reconnect_ns;
	return 0;
}

void client_stats_carry(const feed_client *c, struct feed_stats *s)
{
	const struct feed_stats *k = &c->carry;
	s->delivered += k->delivered;
	s->wait_ns_total += k->wait_ns_total;
	s->step_ns_total += k->step_ns_total;
	s->reported_step_ns_total += k->reported_step_ns_total;
	s->h2d_ns_total += k->h2d_ns_total;
	for (size_t i = 0; i < ARRAY_SIZE(s->hist_wait); i++) {
		s->hist_wait[i] += k->hist_wait[i];
		s->hist_step[i] += k->hist_step[i];
	}
}

void client_retired_free(feed_client *c, bool all)
{
	struct retired_ring **p = &c->retired;
	while (*p) {
		struct retired_ring *r = *p;
		if (all || r->end_seq <= c->tail) {
			munmap(r->hdr, r->size);
			device_ring_free(r->dev);
			*p = r->next;
			free(r);
		} else
			p = &r->next;
	}
}

/*
 * Lets the daemon's attachment go: the counters are carried over, the ring
 * (and its device buffers) kept while batches point into it. The current
 * ring holds client sequences seq_base .. next_seq - 1 of which those from
 * tail on are not released.
 */
static void retire(feed_client *c)
{
	if (c->cons) {
		struct feed_stats s;
		if (feed_client_stats(c, &s) == 0) /* with the carry already in it */
			c->carry = s;
		munmap(c->cons, FEED_CONSUMER_PAGE_SIZE);
		c->cons = NULL;
	}
	struct device_ring *dev = c->dev;
	c->dev = NULL;
	c->device = -1;
	bool held = c->next_seq > MAX(c->tail, c->seq_base);
	if (c->hdr) {
		struct retired_ring *r = held ? calloc(1, sizeof(*r)) : NULL;
		if (r) {
			*r = (struct retired_ring){ .next = c->retired, .hdr = c->hdr, .size = c->ring_size,
						    .end_seq = c->next_seq, .dev = dev };
			c->retired = r;
			dev = NULL;
		} else if (!held)
			munmap(c->hdr, c->ring_size);
		else /* out of memory with batches held: the mappings leak rather than fault under them */
			dev = NULL;
		c->hdr = NULL;
	}
	device_ring_free(dev);
	if (c->data_efd >= 0)
		close(c->data_efd);
	if (c->space_efd >= 0)
		close(c->space_efd);
	if (c->fd >= 0)
		close(c->fd);
	c->fd = c->data_efd = c->space_efd = -1;
	c->attached = false;
	c->stopped = 0;
	c->seq_base = c->next_seq;
}

/*
 * Codes a daemon that is (re)starting answers with: worth another try. A
 * missing socket (-ENOENT) or one nobody listens on is transient at connect;
 * at attach -ENOENT is the daemon saying it has no such feed.
 */
static bool transient(int r, bool connecting)
{
	if (connecting && (r == -ENOENT || r == -ECONNREFUSED))
		return true;
	return r == -ECONNRESET || r == -ETIMEDOUT || r == -ESHUTDOWN || r == -EAGAIN || r == -EUSERS ||
	       r == -EPIPE || r == -EINTR;
}

/* Sleeps ms; false when a signal handler ran meanwhile (the caller gets control back). */
static bool sleep_ms(uint64_t ms)
{
	struct timespec ts = { .tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L };
	return nanosleep(&ts, NULL) == 0 || errno != EINTR;
}

/* One connect and re-attach at the resume cursor. Returns 0, or a code with the reason in last. */
static int attempt(feed_client *c, char *last, size_t lastlen, bool *ret_connected)
{
	/* A socket kept by systemd accepts before a daemon serves it: wait for the HELLO no longer than is left. */
	uint64_t now = now_ns(), left_ms = now < c->resume_limit ? (c->resume_limit - now) / NSEC_PER_MSEC + 1 : 1;
	feed_client *n = NULL;
	int r = client_connect(c->socket_path, true, (int)MIN(left_ms, (uint64_t)REPLY_TIMEOUT_MS), last, lastlen, &n);
	*ret_connected = r == 0;
	if (r < 0)
		return r;
	c->fd = n->fd, c->daemon_pid = n->daemon_pid, c->daemon_flags = n->daemon_flags;
	n->fd = -1;
	feed_client_close(n);
	char feed[sizeof(c->feed)];
	memcpy(feed, c->feed, sizeof(feed));
	c->intr = true;
	r = client_attach(c, feed, c->rank, c->world, c->resume_cursor, c->attach_flags, c->attach_device);
	c->intr = false;
	if (r == 0)
		return 0;
	snprintf(last, lastlen, "%s", c->error);
	/* Half attached (the ring mapped, the device half failed): nothing of it was handed out. */
	retire(c);
	return r;
}

bool client_resume(feed_client *c, int *code)
{
	int saved = errno;
	if (!c->resuming) {
		if (c->reconnect_timeout_ms <= 0 || (*code != -ESHUTDOWN && *code != -ECONNRESET))
			return false;
		/* Any length: an elastic state may be longer than a cursor field (state.c). */
		free(c->resume_cursor);
		c->resume_cursor = strdup(c->next_seq > 0 ? feed_client_cursor(c)
					  : c->long_start ? c->long_start : c->start_cursor);
		if (!c->resume_cursor) {
			*code = client_fail(c, -ENOMEM, "%s; out of memory",
					    *code == -ESHUTDOWN ? "feedd stopped" : "feedd's connection was lost");
			return false;
		}
		c->resuming = true;
		c->resume_code = *code;
		c->resume_t0 = now_ns();
		c->resume_limit = c->resume_t0 + (uint64_t)c->reconnect_timeout_ms * NSEC_PER_MSEC;
		c->resume_backoff = BACKOFF_FIRST_MS;
		/* Jitter from the pid and the clock: ranks of one node do not knock in step. */
		c->resume_rnd = c->resume_t0 ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)c;
		retire(c);
	}
	const char *cause = c->resume_code == -ESHUTDOWN ? "feedd stopped" : "feedd's connection was lost";
	char last[sizeof(c->error)] = "";
	int r;
	for (;;) {
		bool connected;
		r = attempt(c, last, sizeof(last), &connected);
		if (r == -EINTR)
			goto interrupted;
		if (r == 0) {
			c->resuming = false;
			c->reconnects++;
			c->reconnect_ns += now_ns() - c->resume_t0;
			__atomic_store_n(&c->cons->reconnects, c->reconnects, __ATOMIC_RELAXED);
			__atomic_store_n(&c->cons->reconnect_ns_total, c->reconnect_ns, __ATOMIC_RELAXED);
			*code = 0;
			errno = saved;
			return true;
		}
		if (connected && !transient(r, false)) {
			*code = client_fail(c, r, "%s; feedd (pid %u) is back but refused to attach feed \"%s\" again "
					    "at the last batch's cursor: %s", cause, c->daemon_pid, c->feed, last);
			break;
		}
		if (!connected && !transient(r, true)) {
			*code = client_fail(c, r, "%s; reconnecting to %s failed: %s", cause, c->socket_path, last);
			break;
		}
		uint64_t now = now_ns();
		if (now >= c->resume_limit) {
			*code = client_fail(c, c->resume_code, "%s and did not come back within %.1f s (reconnect_timeout); "
					    "last attempt: %s", cause, (double)c->reconnect_timeout_ms / 1e3, last);
			break;
		}
		uint64_t rnd = c->resume_rnd, backoff = c->resume_backoff;
		rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
		c->resume_rnd = rnd;
		uint64_t wait = backoff / 2 + rnd % (backoff + 1); /* 0.5x .. 1.5x */
		wait = MIN(wait, (c->resume_limit - now) / NSEC_PER_MSEC + 1);
		c->resume_backoff = MIN(backoff * 2, (uint64_t)BACKOFF_MAX_MS);
		if (!sleep_ms(wait))
			goto interrupted;
	}
	c->resuming = false;
	c->reconnect_ns += now_ns() - c->resume_t0;
	c->stopped = *code;
	errno = saved;
	return false;

interrupted:
	/*
	 * A signal handler ran (Ctrl-C in Python), in the backoff or while a
	 * daemon that accepted (a socket kept by systemd) had not answered yet:
	 * the caller gets control now, and its next next() goes on.
	 */
	*code = client_fail(c, -EINTR, "%s; reconnecting was interrupted by a signal (call next() again to go on)",
			    cause);
	errno = saved;
	return false;
}
