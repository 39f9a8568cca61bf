/* SPDX-License-Identifier: MIT */
/*
 * The status document's "clients" array, written straight into one buffer.
 *
 * The jansson tree of 1,000 clients is some 200,000 values: building,
 * dumping and freeing it took 90-110 ms of the main loop for 1,000 clients
 * with 10 s of history each (2.5 MB; tests/unit/test-status prints it), the
 * dump alone two thirds of that, and left the heap full of small holes.
 * This writes the same bytes jansson wrote (tests/unit/test-status compares
 * them with the tree's output): members in the same order, reals as
 * json_dumps writes them ("%.17g", a ".0" when neither '.' nor 'e', the
 * exponent without '+' or leading zeros), strings escaped as jansson does
 * without JSON_ENSURE_ASCII, and what jansson left out left out: a member
 * whose real is not finite or whose string is not UTF-8 (json_real and
 * json_string gave NULL), a whole client whose json_pack failed.
 */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/server/status.h"
#include "daemon/telemetry/telemetry.h"
#include "proto/macro.h"
#include "proto/wire.h"

struct jw {
	char *p;
	size_t len, cap;
	size_t after; /* bytes kept free at the end for the caller */
	bool comma;   /* the next member or element needs a ',' first */
	bool oom;
};

static bool jw_room(struct jw *w, size_t n)
{
	if (w->oom)
		return false;
	if (w->len + n + w->after + 1 <= w->cap)
		return true;
	size_t cap = MAX(w->cap * 2, w->len + n + w->after + 1 + 4096);
	char *p = realloc(w->p, cap);
	if (!p) {
		w->oom = true;
		return false;
	}
	w->p = p;
	w->cap = cap;
	return true;
}

static void jw_raw(struct jw *w, const char *s, size_t n)
{
	if (!jw_room(w, n))
		return;
	memcpy(w->p + w->len, s, n);
	w->len += n;
}

#define jw_lit(w, s) jw_raw((w), (s), sizeof(s) - 1)

static void jw_open(struct jw *w, const char *c)
{
	jw_raw(w, c, 1);
	w->comma = false;
}

static void jw_close(struct jw *w, const char *c)
{
	jw_raw(w, c, 1);
	w->comma = true;
}

/* Before an array element. */
static void jw_sep(struct jw *w)
{
	if (w->comma)
		jw_lit(w, ",");
	w->comma = true;
}

/* A member's key: the keys here are ASCII literals, nothing to escape. */
static void jw_key(struct jw *w, const char *k)
{
	size_t n = strlen(k);
	if (!jw_room(w, n + 4))
		return;
	char *p = w->p + w->len;
	if (w->comma)
		*p++ = ',';
	*p++ = '"';
	memcpy(p, k, n);
	p += n;
	*p++ = '"';
	*p++ = ':';
	w->len = (size_t)(p - w->p);
	w->comma = true;
}

/* v in decimal at b (at least 21 bytes), as "%lld" writes it, without printf; returns its length. */
static size_t fmt_ll(char *b, long long v)
{
	char t[24];
	size_t n = 0, k = 0;
	unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
	do
		t[n++] = (char)('0' + u % 10);
	while (u /= 10);
	if (v < 0)
		b[k++] = '-';
	while (n)
		b[k++] = t[--n];
	return k;
}

static void jw_int(struct jw *w, long long v)
{
	char b[24];
	jw_raw(w, b, fmt_ll(b, v));
}

/* A finite real, as jansson's jsonp_dtostr() writes it with precision 17. */
static void jw_real(struct jw *w, double v)
{
	char b[40];
	int n;
	/* Integral values print as the integer: the common 0.0, 20.0, without printf's %g. */
	if (fabs(v) < 9007199254740992.0 && v == trunc(v) && !(v == 0 && signbit(v))) {
		size_t k = fmt_ll(b, (long long)v);
		memcpy(b + k, ".0", 2);
		jw_raw(w, b, k + 2);
		return;
	}
	n = snprintf(b, sizeof(b), "%.17g", v);
	if (n < 0 || (size_t)n >= sizeof(b) - 3)
		return;
	size_t len = (size_t)n;
	if (!strchr(b, '.') && !strchr(b, 'e')) {
		memcpy(b + len, ".0", 3);
		len += 2;
	}
	char *e = strchr(b, 'e');
	if (e) {
		char *start = e + 1, *end = start + 1;
		if (*start == '-')
			start++;
		while (*end == '0')
			end++;
		if (end != start) {
			memmove(start, end, len - (size_t)(end - b));
			len -= (size_t)(end - start);
		}
	}
	jw_raw(w, b, len);
}

/*
 * v = round(x * scale) / scale, scale 10 or 1000 (the history's reals):
 * "%.17g" of v is the short decimal m / scale whenever v is within half a
 * unit of the 17th significant digit of it, which is told here without
 * printf (the history is most of a long document's reals); otherwise, and
 * near that bound, printf as jw_real() does.
 */
static void jw_real_scaled(struct jw *w, double v, unsigned scale)
{
	double m = round(v * scale);
	/* The check needs a long double of 64 bits of mantissa or more (x86's, or quad): else printf. */
	if (LDBL_MANT_DIG >= 64 && v != 0 && isfinite(v) && fabs(m) >= 1 && fabs(m) < 1e15) {
		unsigned long long am = (unsigned long long)fabs(m), p = 1;
		int digits = 0;
		for (unsigned long long t = am; t; t /= 10)
			digits++;
		for (int i = 1; i < digits; i++)
			p *= 10;
		/* D = m / scale: its leading digit's exponent; one less when D is a power of ten (v may be below it). */
		int e = digits - 1 - (scale == 10 ? 1 : 3) - (am == p);
		long double d = (long double)m / (long double)scale, diff = fabsl((long double)v - d);
		static const long double pow10[] = { 1e-21L, 1e-20L, 1e-19L, 1e-18L, 1e-17L, 1e-16L, 1e-15L, 1e-14L,
						     1e-13L, 1e-12L, 1e-11L, 1e-10L, 1e-9L,  1e-8L,  1e-7L,  1e-6L,
						     1e-5L,  1e-4L,  1e-3L,  1e-2L,  1e-1L,  1.0L };
		/* e - 16 is within -21 .. -5 here (1 <= |m| < 1e15, scale 10 or 1000). */
		long double half = 0.5L * pow10[e - 16 + 21];
		if (diff < half * (1 - 1e-6L) - fabsl(d) * 1e-18L) {
			char b[40];
			unsigned long long ip = am / scale, fp = am % scale;
			size_t n = fmt_ll(b, m < 0 ? -(long long)ip : (long long)ip);
			if (m < 0 && ip == 0)
				b[n - 1] = '-', b[n++] = '0';
			b[n++] = '.';
			if (fp == 0) {
				b[n++] = '0';
			} else if (scale == 10) {
				b[n++] = (char)('0' + fp);
			} else {
				b[n++] = (char)('0' + fp / 100);
				if (fp % 100) {
					b[n++] = (char)('0' + fp / 10 % 10);
					if (fp % 10)
						b[n++] = (char)('0' + fp % 10);
				}
			}
			jw_raw(w, b, n);
			return;
		}
	}
	jw_real(w, v);
}

/* jansson's utf8_check_string(): what json_string() accepts. */
static bool utf8_valid(const char *s)
{
	if (!s)
		return false;
	const unsigned char *p = (const unsigned char *)s;
	while (*p) {
		unsigned c = *p, n;
		uint32_t cp;
		if (c < 0x80) {
			p++;
			continue;
		} else if (c >= 0xc2 && c <= 0xdf) {
			n = 2;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			n = 3;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			n = 4;
			cp = c & 0x07;
		} else {
			return false;
		}
		for (unsigned i = 1; i < n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000))
			return false;
		p += n;
	}
	return true;
}

/* A string known to be UTF-8, escaped as json_dumps() does without JSON_ENSURE_ASCII. */
static void jw_str(struct jw *w, const char *s)
{
	jw_lit(w, "\"");
	const char *run = s;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		jw_raw(w, run, (size_t)(s - run));
		run = s + 1;
		char b[8];
		switch (c) {
		case '"': jw_lit(w, "\\\""); break;
		case '\\': jw_lit(w, "\\\\"); break;
		case '\b': jw_lit(w, "\\b"); break;
		case '\f': jw_lit(w, "\\f"); break;
		case '\n': jw_lit(w, "\\n"); break;
		case '\r': jw_lit(w, "\\r"); break;
		case '\t': jw_lit(w, "\\t"); break;
		default:
			snprintf(b, sizeof(b), "\\u%04X", c);
			jw_raw(w, b, 6);
		}
	}
	jw_raw(w, run, (size_t)(s - run));
	jw_lit(w, "\"");
}

/* Members, left out where json_object_set_new() got NULL. */
static void m_int(struct jw *w, const char *k, long long v)
{
	jw_key(w, k);
	jw_int(w, v);
}

static void m_real(struct jw *w, const char *k, double v)
{
	if (!isfinite(v))
		return;
	jw_key(w, k);
	jw_real(w, v);
}

static void m_null(struct jw *w, const char *k)
{
	jw_key(w, k);
	jw_lit(w, "null");
}

/* null when NaN (ms_or_null), left out when infinite. */
static void m_real_or_null(struct jw *w, const char *k, double v, bool null)
{
	if (null)
		m_null(w, k);
	else
		m_real(w, k, v);
}

static void m_str(struct jw *w, const char *k, const char *s)
{
	if (!utf8_valid(s))
		return;
	jw_key(w, k);
	jw_str(w, s);
}

static void m_bool(struct jw *w, const char *k, bool v)
{
	jw_key(w, k);
	if (v)
		jw_lit(w, "true");
	else
		jw_lit(w, "false");
}

/* {count, mean_ms, p50_ms, p95_ms, p99_ms, max_ms} of a histogram and its exact total (status.c's dist_json). */
static void dist(struct jw *w, const char *k, const uint64_t *h, uint64_t sum_ns)
{
	uint64_t n = 0;
	for (unsigned b = 0; b < FEED_HIST_BUCKETS; b++)
		n += h[b];
	jw_key(w, k);
	jw_open(w, "{");
	m_int(w, "count", (long long)n);
	m_real_or_null(w, "mean_ms", n ? (double)sum_ns / (double)n / 1e6 : 0, !n);
	static const char *const names[4] = { "p50_ms", "p95_ms", "p99_ms", "max_ms" };
	static const double q[4] = { 0.50, 0.95, 0.99, 1.0 };
	for (unsigned i = 0; i < 4; i++) {
		double ns = telemetry_quantile(h, q[i]);
		m_real_or_null(w, names[i], ns / 1e6, isnan(ns));
	}
	jw_close(w, "}");
}

static void period(struct jw *w, const char *k, const struct telemetry_period *p)
{
	uint64_t span_ns = (uint64_t)(p->span_s * 1e9);
	jw_key(w, k);
	jw_open(w, "{");
	m_real(w, "span_s", p->span_s);
	m_int(w, "batches", (long long)p->batches);
	m_real(w, "batches_per_s", p->span_s > 0 ? (double)p->batches / p->span_s : 0.0);
	m_real(w, "wait_s", (double)p->wait_ns / 1e9);
	m_real(w, "step_s", (double)p->step_ns / 1e9);
	m_real(w, "h2d_s", (double)p->h2d_ns / 1e9);
	m_int(w, "reports", (long long)p->reports);
	m_real(w, "stall_pct", telemetry_pct(p->wait_ns, p->wait_ns + p->step_ns));
	m_real(w, "h2d_pct_of_step", telemetry_pct(p->h2d_ns, p->step_ns));
	m_real(w, "ring_full_pct", MIN(100.0, telemetry_pct(p->full_ns, span_ns)));
	m_real(w, "ring_empty_pct", MIN(100.0, telemetry_pct(p->wait_ns, span_ns)));
	dist(w, "wait", p->hist_wait, p->wait_ns);
	dist(w, "step", p->hist_step, p->step_ns);
	dist(w, "h2d", p->hist_h2d, p->h2d_ns);
	jw_close(w, "}");
}

/* The k-th per-second series of a sample, as status.c's tree had it (reals rounded; NaN and inf left out). */
static double sample_value(const struct sample *x, unsigned k)
{
	switch (k) {
	case 0: return round(x->wait_ms * 1000.0) / 1000.0;
	case 1: return round(x->step_ms * 1000.0) / 1000.0;
	case 2: return round(x->h2d_ms * 1000.0) / 1000.0;
	case 3: return x->batches;
	case 4: return round(x->full_pct * 10.0) / 10.0;
	case 5: return x->fill;
	default: return x->held;
	}
}

/*
 * "history": the newest `keep` of each series and how many older ones were
 * left out (status.c's trim_history() on the tree). Adds to *st the bytes
 * of the samples it wrote, the arrays' contents (status_json_fit() sizes
 * the next render with them).
 */
static void history(struct jw *w, const struct telemetry_client_view *v, unsigned keep, struct status_render *st)
{
	static const char *const keys[7] = { "wait_ms", "step_ms", "h2d_ms", "batches", "ring_full_pct", "ring_fill", "held" };
	static const bool integer[7] = { false, false, false, true, false, true, true };
	unsigned n[7] = { 0 }, longest = 0, omitted = 0;
	for (unsigned k = 0; k < 7; k++) {
		for (unsigned i = 0; i < v->hist_n; i++)
			n[k] += integer[k] || isfinite(sample_value(&v->hist[(v->hist_head + i) % v->hist_cap], k));
		longest = MAX(longest, n[k]);
		if (n[k] > keep)
			omitted = n[k] - keep;
	}
	jw_key(w, "history");
	jw_open(w, "{");
	m_int(w, "interval_s", 1);
	for (unsigned k = 0; k < 7; k++) {
		unsigned skip = n[k] > keep ? n[k] - keep : 0;
		jw_key(w, keys[k]);
		jw_open(w, "[");
		size_t start = w->len;
		for (unsigned i = 0; i < v->hist_n; i++) {
			const struct sample *x = &v->hist[(v->hist_head + i) % v->hist_cap];
			double d = sample_value(x, k);
			if (!integer[k] && !isfinite(d))
				continue;
			if (skip) {
				skip--;
				continue;
			}
			jw_sep(w);
			if (integer[k])
				jw_int(w, (long long)d);
			else
				jw_real_scaled(w, d, k == 4 ? 10 : 1000);
		}
		st->history_bytes += w->len - start;
		jw_close(w, "]");
	}
	m_int(w, "omitted", omitted);
	jw_close(w, "}");
	st->longest = MAX(st->longest, longest);
	st->history_samples += MIN(longest, keep);
}

static void diagnosis(struct jw *w, const struct telemetry_client_view *v)
{
	const struct diag *d = v->diag;
	jw_key(w, "diagnosis");
	jw_open(w, "{");
	m_str(w, "kind", d->kind ? d->kind : "warming-up");
	m_int(w, "severity", d->severity);
	m_str(w, "text", d->text);
	if (d->cause[0])
		m_str(w, "cause", d->cause);
	else
		m_null(w, "cause");
	if (d->needed_x > 0 && isfinite(d->needed_x))
		m_real(w, "needed_x", d->needed_x);
	else
		m_null(w, "needed_x");
	if (v->straggler[0])
		m_str(w, "straggler", v->straggler);
	else
		m_null(w, "straggler");
	jw_close(w, "}");
}

/* GPU staging (status.c's gpu_json was one json_pack: left out whole where it failed). */
static void gpu(struct jw *w, const struct gpu_client_view *g)
{
	const struct staging_counters *n = &g->n;
	double h2d_ms = (double)n->h2d_ns / 1e6, rate = n->h2d_ns ? (double)n->timed_bytes / (double)n->h2d_ns : 0;
	if (!isfinite(h2d_ms) || !isfinite(rate))
		return;
	jw_key(w, "gpu");
	jw_open(w, "{");
	m_int(w, "device", g->device);
	m_str(w, "export", g->vmm ? "vmm" : "ipc");
	m_int(w, "memory_bytes", (long long)g->memory_bytes);
	m_int(w, "copies", (long long)n->copies);
	m_int(w, "h2d_bytes", (long long)n->bytes);
	m_int(w, "events_waited", (long long)n->waits);
	m_real(w, "h2d_ms", h2d_ms);
	m_int(w, "copies_timed", (long long)n->timed);
	m_real_or_null(w, "h2d_gb_per_s", rate, !n->h2d_ns);
	m_int(w, "refills_deferred", (long long)n->not_ready);
	jw_close(w, "}");
}

static void client(struct jw *w, const struct status_client *c, unsigned flags, unsigned history_max,
		   struct status_render *st)
{
	double attached_s = (double)c->attached_ns / 1e9, full_pct = telemetry_pct(c->full_ns, c->attached_ns),
	       wait_s = (double)c->wait_ns / 1e9, step_s = (double)c->step_ns / 1e9;
	/* What made the tree's json_pack fail left the client out. */
	if (!utf8_valid(c->name) || !utf8_valid(c->feed->name) || !isfinite(attached_s) || !isfinite(full_pct) ||
	    !isfinite(c->tokens_per_s) || !isfinite(wait_s) || !isfinite(step_s))
		return;
	jw_sep(w);
	jw_open(w, "{");
	m_int(w, "id", (long long)c->id);
	m_int(w, "pid", (int)c->pid);
	m_int(w, "uid", (int)c->uid);
	m_str(w, "name", c->name);
	m_str(w, "feed", c->feed->name);
	m_int(w, "rank", (int)c->rank);
	m_int(w, "world", (int)c->world);
	m_real(w, "attached_s", attached_s);
	m_int(w, "first_batch", (long long)c->first_batch);
	m_int(w, "batches_published", (long long)c->published);
	m_int(w, "batches_delivered", (long long)c->delivered);
	m_int(w, "ring_slots", (int)c->ring_slots);
	m_int(w, "ring_fill", (long long)c->fill);
	m_real(w, "ring_full_pct", full_pct);
	m_real(w, "tokens_per_s", c->tokens_per_s);
	m_real(w, "wait_s", wait_s);
	m_real(w, "step_s", step_s);
	m_str(w, "state", c->failed ? "failed" : c->opening ? "opening" : "streaming");
	m_real(w, "stall_pct", c->stall_pct);
	m_int(w, "reports", (long long)c->reports);
	m_real(w, "reported_step_s", (double)c->reported_step_ns / 1e9);
	m_real(w, "h2d_s", (double)c->h2d_ns / 1e9);
	m_int(w, "reconnects", (long long)MIN(c->reconnects, (uint64_t)INT64_MAX));
	m_real(w, "reconnect_s", (double)c->reconnect_ns / 1e9);
	if (c->tv.tracked)
		diagnosis(w, &c->tv);
	else
		m_null(w, "diagnosis");
	if (c->tv.tracked) {
		const struct telemetry_client_view *v = &c->tv;
		jw_key(w, "telemetry");
		jw_open(w, "{");
		period(w, "window", &v->window);
		/* What the request left out (WIRE_STATUS_*) is left out whole, key and all. */
		if (!(flags & WIRE_STATUS_NO_SINCE_ATTACH))
			period(w, "since_attach", &v->since_attach);
		m_int(w, "ring_fill", (long long)v->ring_fill);
		m_int(w, "held", (long long)v->held);
		if (!(flags & WIRE_STATUS_NO_HISTORY))
			history(w, v, history_max, st);
		jw_close(w, "}");
	} else {
		m_null(w, "telemetry");
	}
	if (c->gpu)
		gpu(w, &c->gpu_view);
	else
		m_null(w, "gpu");
	m_bool(w, "stuck", c->stuck);
	m_real(w, "idle_s", (double)c->idle_ns / 1e9);
	m_int(w, "memory_bytes", (long long)c->memory);
	m_int(w, "epoch", (long long)c->epoch);
	jw_close(w, "}");
}

char *status_clients_json(const struct status_input *in, unsigned flags, unsigned history_max,
			  struct status_render *ret_stats, size_t before, size_t after, size_t *ret_len)
{
	struct jw w = { .after = after };
	/* About 2.5 KiB a client with a short history: one allocation in the common case. */
	if (!jw_room(&w, before + 64 + in->n_clients * 2560))
		return NULL;
	w.len = before;
	jw_open(&w, "[");
	for (size_t i = 0; i < in->n_clients; i++)
		client(&w, &in->clients[i], flags, history_max, ret_stats);
	jw_close(&w, "]");
	if (w.oom) {
		free(w.p);
		return NULL;
	}
	*ret_len = w.len;
	return w.p;
}

int status_client_probe(const struct status_input *in, size_t i, unsigned flags, size_t *ret_bytes,
			struct status_render *ret_stats)
{
	struct jw w = { 0 };
	struct status_render st = { 0 };
	client(&w, &in->clients[i], flags, UINT_MAX, &st);
	free(w.p);
	if (w.oom)
		return -ENOMEM;
	*ret_bytes = w.len;
	*ret_stats = st;
	return 0;
}
