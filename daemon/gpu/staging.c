/* SPDX-License-Identifier: MIT */
/*
 * The per-slot state machine of staging.h. Nothing here waits on the GPU:
 * publishing queues three operations on the daemon's stream and returns.
 * The slot's state is kept only to refuse a publish that would break the
 * alternation (a bug in the caller, or a client whose tail lies), which the
 * hardware would otherwise turn into a silent data race.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/gpu/staging.h"
#include "proto/macro.h"

static int fail(char *err, size_t errlen, int r, const char *what, const struct gpu_backend *b)
{
	snprintf(err, errlen, "%s: %s", what, b->error[0] ? b->error : strerror(-r));
	return r;
}

int staging_new(struct gpu_backend *b, int device, struct feed_ring_header *hdr, size_t ring_size, int wake_fd,
		struct staging **ret, char *err, size_t errlen)
{
	int r;
	if (device < 0 || device >= b->ops->device_count(b)) {
		snprintf(err, errlen, "there is no device cuda:%d (feedd sees %d)", device, b->ops->device_count(b));
		return -ENODEV;
	}
	if (hdr->slot_count < 2 || hdr->slot_count > WIRE_DEVICE_MAX_SLOTS) {
		snprintf(err, errlen, "a ring of %u slots cannot be staged (2..%u)", hdr->slot_count,
			 WIRE_DEVICE_MAX_SLOTS);
		return -EINVAL;
	}
	struct staging *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->backend = b;
	st->device = device;
	st->hdr = hdr;
	st->ring_size = ring_size;
	st->slot_count = hdr->slot_count;
	st->stride = hdr->slot_size;
	st->export.fd = -1;
	st->wake_fd = wake_fd;
	b->error[0] = 0;

	st->slots = calloc(st->slot_count, sizeof(*st->slots));
	st->handles = calloc(st->slot_count, 2 * WIRE_IPC_HANDLE_SIZE);
	if (!st->slots || !st->handles) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* Pinned once per attach, never per batch: the copies below are then true async DMA. */
	r = b->ops->host_register(b, device, hdr, ring_size);
	if (r < 0) {
		fail(err, errlen, r, "cannot pin the ring for DMA", b);
		goto fail;
	}
	st->registered = true;
	r = b->ops->stream_new(b, device, &st->stream);
	if (r < 0) {
		fail(err, errlen, r, "cannot create the copy stream", b);
		goto fail;
	}
	r = b->ops->mem_new(b, device, st->stride * st->slot_count, &st->mem, &st->mem_size, &st->export);
	if (r < 0) {
		char what[96];
		snprintf(what, sizeof(what), "cannot allocate %zu bytes on cuda:%d", st->stride * st->slot_count,
			 device);
		fail(err, errlen, r, what, b);
		goto fail;
	}
	for (uint32_t i = 0; i < st->slot_count; i++) {
		uint8_t *h = st->handles + (size_t)i * 2 * WIRE_IPC_HANDLE_SIZE;
		r = b->ops->event_new(b, device, &st->slots[i].ready, h);
		if (r == 0)
			r = b->ops->event_new(b, device, &st->slots[i].release, h + WIRE_IPC_HANDLE_SIZE);
		if (r == 0)
			r = b->ops->timer_new(b, device, &st->slots[i].t0);
		if (r == 0)
			r = b->ops->timer_new(b, device, &st->slots[i].t1);
		if (r < 0) {
			fail(err, errlen, r, "cannot create the slot events", b);
			goto fail;
		}
	}
	*ret = st;
	return 0;
fail:
	staging_free(st, NULL);
	return r;
}

/* Adds a finished timed copy of slot to the counters; a copy still running stays pending. */
static void collect_slot(struct staging *st, struct staging_slot *slot)
{
	uint64_t ns;
	if (!slot->timing || st->backend->ops->elapsed(st->backend, slot->t0, slot->t1, &ns) != 1)
		return;
	st->n.h2d_ns += ns;
	st->n.timed++;
	st->n.timed_bytes += slot->len;
	slot->timing = false;
}

void staging_collect(struct staging *st)
{
	for (uint32_t i = 0; i < st->slot_count; i++)
		collect_slot(st, &st->slots[i]);
}

int staging_publish(struct staging *st, uint64_t seq, uint64_t tail)
{
	struct gpu_backend *b = st->backend;
	uint32_t n = st->slot_count;
	if (seq != st->next_seq || tail > seq || seq - tail >= n) {
		snprintf(b->error, sizeof(b->error), "batch %" PRIu64 " cannot be staged (next %" PRIu64 ", tail %" PRIu64 ")",
			 seq, st->next_seq, tail);
		return seq != st->next_seq ? -EINVAL : -EBUSY;
	}
	struct staging_slot *slot = &st->slots[seq % n];
	bool reused = slot->state == STAGING_SLOT_PUBLISHED;
	/* The slot's previous batch must be the one n before, and released (tail past it). */
	if (reused && (slot->seq + n != seq || tail <= slot->seq)) {
		snprintf(b->error, sizeof(b->error), "slot %" PRIu64 " still holds batch %" PRIu64 ", not released",
			 seq % n, slot->seq);
		return -EBUSY;
	}

	const uint8_t *host = (const uint8_t *)st->hdr + st->hdr->header_size + (size_t)(seq % n) * st->stride;
	const struct feed_slot_header *sh = (const struct feed_slot_header *)host;
	uint32_t n_cu = MIN(sh->n_cu_seqlens, st->hdr->cu_capacity);
	/* The header and the arrays in use: the unused tail of cu_seqlens is not worth the bandwidth. */
	size_t len = MIN((size_t)st->hdr->off_cu_seqlens + 4u * (size_t)n_cu, st->stride);

	/* The previous copy's time, before its timers are recorded again (one still running goes uncounted). */
	collect_slot(st, slot);
	slot->timing = false;
	int r = 0;
	if (reused)
		r = b->ops->wait(b, st->stream, slot->release);
	if (r == 0)
		r = b->ops->record(b, st->stream, slot->t0);
	if (r == 0)
		r = b->ops->copy_h2d(b, st->stream, st->mem, (size_t)(seq % n) * st->stride, host, len);
	if (r == 0)
		r = b->ops->record(b, st->stream, slot->t1);
	if (r == 0)
		r = b->ops->record(b, st->stream, slot->ready);
	if (r < 0)
		return r;
	slot->seq = seq;
	slot->state = STAGING_SLOT_PUBLISHED;
	slot->timing = true;
	slot->len = len;
	st->next_seq++;
	st->n.copies++;
	st->n.bytes += len;
	st->n.waits += reused;
	return 0;
}

int staging_host_reusable(struct staging *st, uint64_t seq)
{
	struct gpu_backend *b = st->backend;
	struct staging_slot *slot = &st->slots[seq % st->slot_count];
	if (slot->state != STAGING_SLOT_PUBLISHED || slot->seq >= seq)
		return 1;
	int r = b->ops->query(b, slot->ready);
	if (r != 0) {
		st->notify_armed = false;
		if (r == 1)
			collect_slot(st, slot);
		return r;
	}
	st->n.not_ready++;
	/* The stream runs in order: a kick queued now comes after that copy. One is enough. */
	if (!st->notify_armed) {
		r = b->ops->notify(b, st->stream, st->wake_fd);
		if (r < 0)
			return r;
		st->notify_armed = true;
	}
	return 0;
}

void staging_reply(const struct staging *st, struct wire_device_reply *ret)
{
	*ret = (struct wire_device_reply){
		.kind = st->export.kind,
		.device = (uint32_t)st->device,
		.mem_size = st->mem_size,
		.slot_stride = st->stride,
		.slot_count = st->slot_count,
		.n_fds = st->export.kind == WIRE_DEVICE_VMM,
		.handles = st->handles,
	};
	memcpy(ret->mem_handle, st->export.ipc, sizeof(ret->mem_handle));
}

int staging_query(struct staging *st)
{
	return !st->stream || st->backend->ops->stream_query(st->backend, st->stream);
}

struct staging *staging_free(struct staging *st, bool *ret_leaked)
{
	bool leaked = false;
	if (!st)
		goto out;
	struct gpu_backend *b = st->backend;
	/* The stream first: its copies read the ring and write the buffers freed below. */
	if (st->stream)
		leaked = b->ops->stream_free(b, st->stream) < 0;
	for (uint32_t i = 0; st->slots && i < st->slot_count; i++) {
		if (st->slots[i].ready)
			b->ops->event_free(b, st->slots[i].ready);
		if (st->slots[i].release)
			b->ops->event_free(b, st->slots[i].release);
		if (st->slots[i].t0)
			b->ops->event_free(b, st->slots[i].t0);
		if (st->slots[i].t1)
			b->ops->event_free(b, st->slots[i].t1);
	}
	if (st->mem && !leaked)
		b->ops->mem_free(b, st->mem);
	/* Memory kept under a copy that may still run stays counted against gpu_memory_max: it is still in use. */
	if (st->mem && st->charge && !leaked)
		*st->charge -= MIN(*st->charge, (uint64_t)st->mem_size);
	if (st->registered && !leaked)
		b->ops->host_unregister(b, st->hdr);
	free(st->slots);
	free(st->handles);
	free(st);
out:
	if (ret_leaked)
		*ret_leaked = leaked;
	return NULL;
}
