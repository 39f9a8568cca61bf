/* SPDX-License-Identifier: MIT */
/*
 * Encoding and bounds-checked decoding of the control messages in wire.h.
 * A writer/reader pair walks a byte buffer field by field; every read checks
 * the remaining length first and every string is checked for its NUL.
 */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/wire.h"

struct writer {
	uint8_t *p;
	size_t cap, len;
	int err;
};

struct reader {
	const uint8_t *p;
	size_t len, off;
	bool bad;
};

static void put(struct writer *w, const void *src, size_t n)
{
	if (w->err)
		return;
	if (w->cap - w->len < n) {
		w->err = -ENOBUFS;
		return;
	}
	memcpy(w->p + w->len, src, n);
	w->len += n;
}

static void put_u16(struct writer *w, uint16_t v)
{
	v = htole16(v);
	put(w, &v, sizeof(v));
}

static void put_u32(struct writer *w, uint32_t v)
{
	v = htole32(v);
	put(w, &v, sizeof(v));
}

static void put_u64(struct writer *w, uint64_t v)
{
	v = htole64(v);
	put(w, &v, sizeof(v));
}

/* A fixed-size string field: the text, then zeros up to `size`. */
static void put_str(struct writer *w, const char *s, size_t size)
{
	size_t n = strnlen(s, size);
	if (n >= size) {
		if (!w->err)
			w->err = -ENAMETOOLONG;
		return;
	}
	put(w, s, n);
	if (w->err)
		return;
	if (w->cap - w->len < size - n) {
		w->err = -ENOBUFS;
		return;
	}
	memset(w->p + w->len, 0, size - n);
	w->len += size - n;
}

static void get(struct reader *r, void *dst, size_t n)
{
	if (r->bad || r->len - r->off < n) {
		r->bad = true;
		memset(dst, 0, n);
		return;
	}
	memcpy(dst, r->p + r->off, n);
	r->off += n;
}

static uint16_t get_u16(struct reader *r)
{
	uint16_t v;
	get(r, &v, sizeof(v));
	return le16toh(v);
}

static uint32_t get_u32(struct reader *r)
{
	uint32_t v;
	get(r, &v, sizeof(v));
	return le32toh(v);
}

static uint64_t get_u64(struct reader *r)
{
	uint64_t v;
	get(r, &v, sizeof(v));
	return le64toh(v);
}

/* Copies a fixed-size string field; it must hold a NUL. */
static void get_str(struct reader *r, char *dst, size_t size)
{
	get(r, dst, size);
	if (!r->bad && !memchr(dst, 0, size))
		r->bad = true;
	if (r->bad)
		dst[0] = 0;
}

static void put_header(struct writer *w, uint16_t type, size_t payload)
{
	put_u32(w, WIRE_MAGIC);
	put_u16(w, WIRE_VERSION);
	put_u16(w, type);
	put_u32(w, (uint32_t)payload);
	put_u32(w, 0);
}

static int finish(struct writer *w)
{
	return w->err ? w->err : (int)w->len;
}

static int done(struct reader *r)
{
	/* Trailing bytes are as wrong as missing ones: the sizes are fixed. */
	return r->bad || r->off != r->len ? -EBADMSG : 0;
}

int wire_header_decode(const void *buf, size_t len, size_t max_length, struct wire_header *ret)
{
	struct reader r = { .p = buf, .len = len };
	if (len < WIRE_HEADER_SIZE)
		return -EBADMSG;
	uint32_t magic = get_u32(&r);
	uint16_t version = get_u16(&r);
	uint16_t type = get_u16(&r);
	uint32_t length = get_u32(&r);
	uint32_t reserved = get_u32(&r);
	/* The version is the caller's to judge: a HELLO of another version must still be answered. */
	if (magic != WIRE_MAGIC || version == 0 || reserved != 0)
		return -EBADMSG;
	if (type == 0 || type >= _WIRE_TYPE_MAX)
		return -EBADMSG;
	if (length > max_length)
		return -EMSGSIZE;
	*ret = (struct wire_header){ .version = version, .type = type, .length = length };
	return 0;
}

static struct writer writer_start(void *buf, size_t cap, uint16_t type, size_t payload)
{
	struct writer w = { .p = buf, .cap = cap };
	put_header(&w, type, payload);
	return w;
}

int wire_encode_hello(void *buf, size_t cap, const struct wire_hello *m)
{
	struct writer w = writer_start(buf, cap, WIRE_HELLO, WIRE_HELLO_SIZE);
	put_u16(&w, m->min_version);
	put_u16(&w, m->max_version);
	put_u32(&w, m->pid);
	put_str(&w, m->name, sizeof(m->name));
	return finish(&w);
}

int wire_decode_hello(const void *p, size_t len, struct wire_hello *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_hello m;
	m.min_version = get_u16(&r);
	m.max_version = get_u16(&r);
	m.pid = get_u32(&r);
	get_str(&r, m.name, sizeof(m.name));
	int e = done(&r);
	if (e < 0 || m.min_version > m.max_version)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_hello_reply(void *buf, size_t cap, const struct wire_hello_reply *m)
{
	struct writer w = writer_start(buf, cap, WIRE_HELLO_REPLY, WIRE_HELLO_REPLY_SIZE);
	put_u16(&w, m->version);
	put_u16(&w, 0);
	put_u32(&w, m->daemon_pid);
	put_u32(&w, m->flags);
	put_str(&w, m->daemon_version, sizeof(m->daemon_version));
	return finish(&w);
}

int wire_decode_hello_reply(const void *p, size_t len, struct wire_hello_reply *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_hello_reply m;
	m.version = get_u16(&r);
	(void)get_u16(&r);
	m.daemon_pid = get_u32(&r);
	m.flags = get_u32(&r);
	get_str(&r, m.daemon_version, sizeof(m.daemon_version));
	int e = done(&r);
	if (e < 0)
		return e;
	*ret = m;
	return 0;
}

int wire_encode_attach(void *buf, size_t cap, const struct wire_attach *m)
{
	struct writer w = writer_start(buf, cap, WIRE_ATTACH, WIRE_ATTACH_SIZE);
	put_u32(&w, m->rank);
	put_u32(&w, m->world);
	put_u32(&w, m->flags);
	put_u32(&w, m->device);
	put_str(&w, m->feed, sizeof(m->feed));
	put_str(&w, m->cursor, sizeof(m->cursor));
	return finish(&w);
}

int wire_decode_attach(const void *p, size_t len, struct wire_attach *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_attach m;
	m.rank = get_u32(&r);
	m.world = get_u32(&r);
	m.flags = get_u32(&r);
	m.device = get_u32(&r);
	get_str(&r, m.feed, sizeof(m.feed));
	get_str(&r, m.cursor, sizeof(m.cursor));
	int e = done(&r);
	if (e < 0)
		return -EBADMSG;
	if (m.world == 0 || m.rank >= m.world || m.feed[0] == 0)
		return -EBADMSG;
	if (!!(m.flags & WIRE_ATTACH_RESUME) != (m.cursor[0] != 0) || (m.flags & ~(uint32_t)WIRE_ATTACH_FLAGS))
		return -EBADMSG;
	/* The device field is only meaningful with DEVICE, and the fallback only qualifies a device request. */
	if ((m.flags & WIRE_ATTACH_DEVICE) ? m.device > WIRE_MAX_DEVICE
					  : (m.device != 0 || (m.flags & WIRE_ATTACH_HOST_FALLBACK)))
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_attach_reply(void *buf, size_t cap, const struct wire_attach_reply *m)
{
	struct writer w = writer_start(buf, cap, WIRE_ATTACH_REPLY, WIRE_ATTACH_REPLY_SIZE);
	put_u64(&w, m->ring_size);
	put_u64(&w, m->consumer_size);
	put_u64(&w, m->fingerprint);
	put_u64(&w, m->first_batch);
	put_u32(&w, m->slot_count);
	put_u32(&w, m->batch_size);
	put_u32(&w, m->seq_len);
	put_u32(&w, m->n_fds);
	return finish(&w);
}

int wire_decode_attach_reply(const void *p, size_t len, struct wire_attach_reply *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_attach_reply m;
	m.ring_size = get_u64(&r);
	m.consumer_size = get_u64(&r);
	m.fingerprint = get_u64(&r);
	m.first_batch = get_u64(&r);
	m.slot_count = get_u32(&r);
	m.batch_size = get_u32(&r);
	m.seq_len = get_u32(&r);
	m.n_fds = get_u32(&r);
	int e = done(&r);
	if (e < 0 || m.n_fds != WIRE_ATTACH_FDS)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_error(void *buf, size_t cap, const struct wire_error *m)
{
	struct writer w = writer_start(buf, cap, WIRE_ERROR, WIRE_ERROR_SIZE);
	put_u32(&w, (uint32_t)m->code);
	put_u32(&w, 0);
	put_str(&w, m->message, sizeof(m->message));
	return finish(&w);
}

int wire_decode_error(const void *p, size_t len, struct wire_error *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_error m;
	m.code = (int32_t)get_u32(&r);
	(void)get_u32(&r);
	get_str(&r, m.message, sizeof(m.message));
	int e = done(&r);
	if (e < 0 || m.code >= 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_status(void *buf, size_t cap, const struct wire_status *m)
{
	struct writer w = writer_start(buf, cap, WIRE_STATUS, WIRE_STATUS_SIZE);
	put_u32(&w, m->flags);
	put_u32(&w, 0);
	return finish(&w);
}

int wire_decode_status(const void *p, size_t len, struct wire_status *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_status m;
	m.flags = get_u32(&r);
	uint32_t reserved = get_u32(&r);
	int e = done(&r);
	if (e < 0 || reserved != 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_detach(void *buf, size_t cap)
{
	struct writer w = writer_start(buf, cap, WIRE_DETACH, 0);
	return finish(&w);
}

int wire_encode_device_reply(void *buf, size_t cap, const struct wire_device_reply *m)
{
	if (m->slot_count > WIRE_DEVICE_MAX_SLOTS || (m->slot_count && !m->handles))
		return -EINVAL;
	struct writer w = writer_start(buf, cap, WIRE_DEVICE_REPLY, WIRE_DEVICE_REPLY_SIZE(m->slot_count));
	put_u32(&w, m->kind);
	put_u32(&w, m->device);
	put_u64(&w, m->mem_size);
	put_u64(&w, m->slot_stride);
	put_u32(&w, m->slot_count);
	put_u32(&w, m->n_fds);
	put(&w, m->mem_handle, sizeof(m->mem_handle));
	put_str(&w, m->reason, sizeof(m->reason));
	if (m->slot_count)
		put(&w, m->handles, (size_t)m->slot_count * 2 * WIRE_IPC_HANDLE_SIZE);
	return finish(&w);
}

int wire_decode_device_reply(const void *p, size_t len, struct wire_device_reply *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_device_reply m;
	m.kind = get_u32(&r);
	m.device = get_u32(&r);
	m.mem_size = get_u64(&r);
	m.slot_stride = get_u64(&r);
	m.slot_count = get_u32(&r);
	m.n_fds = get_u32(&r);
	get(&r, m.mem_handle, sizeof(m.mem_handle));
	get_str(&r, m.reason, sizeof(m.reason));
	m.handles = NULL;
	if (r.bad || m.slot_count > WIRE_DEVICE_MAX_SLOTS)
		return -EBADMSG;
	size_t hl = (size_t)m.slot_count * 2 * WIRE_IPC_HANDLE_SIZE;
	if (r.len - r.off != hl)
		return -EBADMSG;
	m.handles = hl ? r.p + r.off : NULL;
	r.off += hl;
	if (done(&r) < 0)
		return -EBADMSG;
	switch (m.kind) {
	case WIRE_DEVICE_HOST:
		if (m.slot_count || m.n_fds || m.mem_size)
			return -EBADMSG;
		break;
	case WIRE_DEVICE_VMM:
	case WIRE_DEVICE_IPC:
		if (m.slot_count < 2 || m.n_fds != (m.kind == WIRE_DEVICE_VMM) || m.slot_stride == 0 ||
		    m.slot_stride > m.mem_size / m.slot_count)
			return -EBADMSG;
		break;
	default:
		return -EBADMSG;
	}
	*ret = m;
	return 0;
}

int wire_encode_reload(void *buf, size_t cap, const struct wire_reload *m)
{
	struct writer w = writer_start(buf, cap, WIRE_RELOAD, WIRE_RELOAD_SIZE);
	put_u32(&w, m->flags);
	put_u32(&w, 0);
	return finish(&w);
}

int wire_decode_reload(const void *p, size_t len, struct wire_reload *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_reload m;
	m.flags = get_u32(&r);
	uint32_t reserved = get_u32(&r);
	if (done(&r) < 0 || m.flags != 0 || reserved != 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_drain(void *buf, size_t cap, const struct wire_drain *m)
{
	struct writer w = writer_start(buf, cap, WIRE_DRAIN, WIRE_DRAIN_SIZE);
	put_str(&w, m->feed, sizeof(m->feed));
	return finish(&w);
}

int wire_decode_drain(const void *p, size_t len, struct wire_drain *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_drain m;
	get_str(&r, m.feed, sizeof(m.feed));
	if (done(&r) < 0 || m.feed[0] == 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_admin_reply(void *buf, size_t cap, const struct wire_admin_reply *m)
{
	struct writer w = writer_start(buf, cap, WIRE_ADMIN_REPLY, WIRE_ADMIN_REPLY_SIZE);
	put_str(&w, m->message, sizeof(m->message));
	return finish(&w);
}

int wire_decode_admin_reply(const void *p, size_t len, struct wire_admin_reply *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_admin_reply m;
	get_str(&r, m.message, sizeof(m.message));
	if (done(&r) < 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_status_reply_header(void *buf, size_t cap, size_t json_len)
{
	if (json_len > WIRE_MAX_REPLY)
		return -EMSGSIZE;
	struct writer w = writer_start(buf, cap, WIRE_STATUS_REPLY, json_len);
	return finish(&w);
}

int wire_encode_epoch_info(void *buf, size_t cap, const struct wire_epoch_info *m)
{
	struct writer w = writer_start(buf, cap, WIRE_EPOCH_INFO, WIRE_EPOCH_INFO_SIZE);
	put_u32(&w, m->flags);
	put_u32(&w, 0);
	put_str(&w, m->cursor, sizeof(m->cursor));
	return finish(&w);
}

int wire_decode_epoch_info(const void *p, size_t len, struct wire_epoch_info *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_epoch_info m;
	m.flags = get_u32(&r);
	uint32_t pad = get_u32(&r);
	get_str(&r, m.cursor, sizeof(m.cursor));
	if (done(&r) < 0 || m.flags != 0 || pad != 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_epoch_info_reply(void *buf, size_t cap, const struct wire_epoch_info_reply *m)
{
	struct writer w = writer_start(buf, cap, WIRE_EPOCH_INFO_REPLY, WIRE_EPOCH_INFO_REPLY_SIZE);
	put_u64(&w, m->epoch);
	put_u64(&w, m->batches);
	put_u64(&w, m->first_batch);
	put_u64(&w, m->units);
	return finish(&w);
}

int wire_decode_epoch_info_reply(const void *p, size_t len, struct wire_epoch_info_reply *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_epoch_info_reply m;
	m.epoch = get_u64(&r);
	m.batches = get_u64(&r);
	m.first_batch = get_u64(&r);
	m.units = get_u64(&r);
	if (done(&r) < 0)
		return -EBADMSG;
	*ret = m;
	return 0;
}

int wire_encode_explain(void *buf, size_t cap, const struct wire_explain *m)
{
	struct writer w = writer_start(buf, cap, WIRE_EXPLAIN, WIRE_EXPLAIN_SIZE);
	put_u32(&w, m->rank);
	put_u32(&w, m->world);
	put_u32(&w, m->batches);
	put_u32(&w, m->flags);
	put_str(&w, m->feed, sizeof(m->feed));
	put_str(&w, m->cursor, sizeof(m->cursor));
	return finish(&w);
}

int wire_encode_explain_reply_header(void *buf, size_t cap, size_t text_len)
{
	if (text_len > WIRE_MAX_REPLY)
		return -EMSGSIZE;
	struct writer w = writer_start(buf, cap, WIRE_EXPLAIN_REPLY, text_len);
	return finish(&w);
}

int wire_encode_state_header(void *buf, size_t cap, size_t len)
{
	if (len == 0 || len > WIRE_MAX_REQUEST - WIRE_HEADER_SIZE)
		return -EMSGSIZE;
	struct writer w = writer_start(buf, cap, WIRE_STATE, len);
	return finish(&w);
}

int wire_decode_explain(const void *p, size_t len, struct wire_explain *ret)
{
	struct reader r = { .p = p, .len = len };
	struct wire_explain m;
	m.rank = get_u32(&r);
	m.world = get_u32(&r);
	m.batches = get_u32(&r);
	m.flags = get_u32(&r);
	get_str(&r, m.feed, sizeof(m.feed));
	get_str(&r, m.cursor, sizeof(m.cursor));
	if (done(&r) < 0 || m.flags != 0 || m.world == 0 || m.rank >= m.world || m.batches == 0 ||
	    m.batches > WIRE_EXPLAIN_MAX_BATCHES)
		return -EBADMSG;
	*ret = m;
	return 0;
}

const char *wire_type_name(unsigned type)
{
	static const char *const names[_WIRE_TYPE_MAX] = {
		[WIRE_HELLO] = "HELLO",
		[WIRE_HELLO_REPLY] = "HELLO_REPLY",
		[WIRE_ATTACH] = "ATTACH",
		[WIRE_ATTACH_REPLY] = "ATTACH_REPLY",
		[WIRE_ERROR] = "ERROR",
		[WIRE_STATUS] = "STATUS",
		[WIRE_STATUS_REPLY] = "STATUS_REPLY",
		[WIRE_DETACH] = "DETACH",
		[WIRE_DEVICE_REPLY] = "DEVICE_REPLY",
		[WIRE_RELOAD] = "RELOAD",
		[WIRE_DRAIN] = "DRAIN",
		[WIRE_ADMIN_REPLY] = "ADMIN_REPLY",
		[WIRE_EPOCH_INFO] = "EPOCH_INFO",
		[WIRE_EPOCH_INFO_REPLY] = "EPOCH_INFO_REPLY",
		[WIRE_EXPLAIN] = "EXPLAIN",
		[WIRE_EXPLAIN_REPLY] = "EXPLAIN_REPLY",
		[WIRE_STATE] = "STATE",
	};
	return type < _WIRE_TYPE_MAX && names[type] ? names[type] : "unknown";
}

int wire_operator_socket_path(const char *socket_path, char *buf, size_t cap)
{
	size_t n = strlen(socket_path);
	int k;
	if (n > 5 && strcmp(socket_path + n - 5, ".sock") == 0)
		k = snprintf(buf, cap, "%.*s-operator.sock", (int)(n - 5), socket_path);
	else
		k = snprintf(buf, cap, "%s-operator", socket_path);
	return k < 0 || (size_t)k >= cap ? -ENAMETOOLONG : 0;
}

int wire_socket_path(const char *override, char *buf, size_t cap)
{
	const char *env = getenv("FEEDD_SOCKET");
	int n;
	if (override && *override)
		n = snprintf(buf, cap, "%s", override);
	else if (env && *env)
		n = snprintf(buf, cap, "%s", env);
	else if (geteuid() != 0 && getenv("XDG_RUNTIME_DIR") && *getenv("XDG_RUNTIME_DIR"))
		n = snprintf(buf, cap, "%s/feedd.sock", getenv("XDG_RUNTIME_DIR"));
	else
		n = snprintf(buf, cap, "/run/feedd/feedd.sock");
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}
