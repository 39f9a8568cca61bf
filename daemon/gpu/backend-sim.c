/* SPDX-License-Identifier: MIT */
/*
 * The host simulation backend: the semantics of backend.h without a GPU, so
 * the staging state machine, the protocol and the crash paths can be tested
 * anywhere. A stream is a worker thread running its queue in order; an event
 * is a pair of counters: `recorded` counts records queued (taken at call
 * time, like CUDA's "most recent record"), `completed` the records the
 * stream has reached. A wait captures `recorded` when it is queued and blocks
 * its stream until `completed` reaches it. Device memory is malloc'd.
 *
 * One mutex and condition variable per backend guard every queue and event:
 * the simulation is about ordering, not speed. A stream being freed abandons
 * waits that can no longer complete (a client that died without recording),
 * runs its other queued work, and joins its thread; device memory is freed
 * only after every stream that copies into it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/gpu/backend.h"
#include "proto/macro.h"

#define SIM_EVENT_MAGIC UINT64_C(0x544e564556494d53) /* "SIMEVENT" */

struct sim {
	struct gpu_backend b;
	unsigned devices;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned live;
	unsigned copy_delay_us;
	uint64_t touched;  /* a bit per device anything was created or registered on */
	uint64_t unusable; /* a bit per device device_check refuses (the tests set it) */
};

struct gpu_event {
	uint64_t magic;
	uint64_t recorded;  /* records queued so far */
	uint64_t completed; /* records the streams have reached */
	uint64_t at_ns;     /* when the stream reached the latest record (timers) */
};

enum op_kind { OP_WAIT, OP_COPY, OP_RECORD, OP_NOTIFY };

struct op {
	struct op *next;
	enum op_kind kind;
	struct gpu_event *event;
	uint64_t target;
	void *dst;
	const void *src;
	size_t len;
	int fd;
};

struct gpu_stream {
	struct sim *sim;
	pthread_t thread;
	struct op *head, *tail;
	bool closing;
	bool stalled; /* a dead process's stream: runs nothing more, its queue is dropped when freed */
};

struct gpu_mem {
	uint8_t *p;
	size_t size;
};

static struct sim *to_sim(struct gpu_backend *b)
{
	return (struct sim *)b;
}

static void *stream_run(void *arg)
{
	struct gpu_stream *s = arg;
	struct sim *sim = s->sim;
	pthread_mutex_lock(&sim->lock);
	for (;;) {
		while ((!s->head || s->stalled) && !s->closing)
			pthread_cond_wait(&sim->cond, &sim->lock);
		struct op *o = s->head;
		if (!o || s->stalled)
			break; /* closing and drained, or dead */
		switch (o->kind) {
		case OP_WAIT:
			/* A stream being freed gives up on a record that may never come. */
			while (o->event->completed < o->target && !s->closing)
				pthread_cond_wait(&sim->cond, &sim->lock);
			break;
		case OP_COPY: {
			unsigned delay = sim->copy_delay_us;
			pthread_mutex_unlock(&sim->lock);
			if (delay)
				usleep(delay);
			memcpy(o->dst, o->src, o->len);
			pthread_mutex_lock(&sim->lock);
			break;
		}
		case OP_NOTIFY: {
			uint64_t one = 1;
			ssize_t _unused_ n = write(o->fd, &one, sizeof(one));
			break;
		}
		case OP_RECORD:
			if (o->event->completed < o->target) {
				o->event->completed = o->target;
				o->event->at_ns = now_ns();
			}
			pthread_cond_broadcast(&sim->cond);
			break;
		}
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		free(o);
		pthread_cond_broadcast(&sim->cond);
	}
	pthread_mutex_unlock(&sim->lock);
	return NULL;
}

static int enqueue(struct gpu_stream *s, const struct op *tmpl)
{
	struct op *o = malloc(sizeof(*o));
	if (!o)
		return -ENOMEM;
	*o = *tmpl;
	o->next = NULL;
	struct sim *sim = s->sim;
	pthread_mutex_lock(&sim->lock);
	if (o->kind == OP_RECORD)
		o->target = ++o->event->recorded;
	else if (o->kind == OP_WAIT)
		o->target = o->event->recorded;
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	pthread_cond_broadcast(&sim->cond);
	pthread_mutex_unlock(&sim->lock);
	return 0;
}

static void sim_free(struct gpu_backend *b)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_destroy(&sim->lock);
	pthread_cond_destroy(&sim->cond);
	free(sim);
}

static int sim_device_count(struct gpu_backend *b)
{
	return (int)to_sim(b)->devices;
}

/*
 * Whether device is one of ours; if so, remembers that it was used, as CUDA
 * would create its context (the tests check no other device's context is).
 */
static bool touch(struct sim *sim, int device)
{
	if (device < 0 || (unsigned)device >= sim->devices)
		return false;
	pthread_mutex_lock(&sim->lock);
	if (device < 64)
		sim->touched |= UINT64_C(1) << device;
	pthread_mutex_unlock(&sim->lock);
	return true;
}

static int sim_device_check(struct gpu_backend *b, int device, char *why, size_t whylen)
{
	struct sim *sim = to_sim(b);
	if (device < 0 || (unsigned)device >= sim->devices)
		return -ENODEV;
	if (device < 64 && sim->unusable & (UINT64_C(1) << device)) {
		snprintf(why, whylen, "cuda:%d is in EXCLUSIVE_PROCESS compute mode (simulated)", device);
		return -EOPNOTSUPP;
	}
	return 0;
}

static int sim_host_register(struct gpu_backend *b, int device, void *addr, size_t len)
{
	if (!touch(to_sim(b), device))
		return -ENODEV;
	return addr && len && (uintptr_t)addr % 4096 == 0 ? 0 : -EINVAL;
}

static void sim_host_unregister(struct gpu_backend *b, void *addr)
{
}

static void live(struct sim *sim, int delta)
{
	pthread_mutex_lock(&sim->lock);
	sim->live += (unsigned)delta;
	pthread_mutex_unlock(&sim->lock);
}

static int sim_stream_new(struct gpu_backend *b, int device, struct gpu_stream **ret)
{
	struct sim *sim = to_sim(b);
	if (!touch(sim, device))
		return -ENODEV;
	struct gpu_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->sim = sim;
	int r = pthread_create(&s->thread, NULL, stream_run, s);
	if (r) {
		free(s);
		return -r;
	}
	live(sim, 1);
	*ret = s;
	return 0;
}

static int sim_stream_query(struct gpu_backend *b, struct gpu_stream *s)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	int idle = !s->head; /* an op stays at the head until it has run */
	pthread_mutex_unlock(&sim->lock);
	return idle;
}

static int sim_stream_free(struct gpu_backend *b, struct gpu_stream *s)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	s->closing = true;
	pthread_cond_broadcast(&sim->cond);
	pthread_mutex_unlock(&sim->lock);
	pthread_join(s->thread, NULL);
	while (s->head) {
		struct op *o = s->head;
		s->head = o->next;
		free(o);
	}
	free(s);
	live(sim, -1);
	return 0;
}

static int sim_mem_new(struct gpu_backend *b, int device, size_t size, struct gpu_mem **ret, size_t *ret_size,
		       struct gpu_mem_export *ret_export)
{
	struct sim *sim = to_sim(b);
	if (!touch(sim, device))
		return -ENODEV;
	size_t real = ALIGN_UP(size, (size_t)(2u << 20)); /* like VMM's granularity */
	struct gpu_mem *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->p = aligned_alloc(4096, real);
	if (!m->p) {
		free(m);
		return -ENOMEM;
	}
	memset(m->p, 0xa5, real); /* garbage, as fresh device memory would hold */
	m->size = real;
	live(sim, 1);
	*ret = m;
	*ret_size = real;
	*ret_export = (struct gpu_mem_export){ .kind = WIRE_DEVICE_IPC, .fd = -1 };
	memcpy(ret_export->ipc, &m, sizeof(m));
	return 0;
}

static void sim_mem_free(struct gpu_backend *b, struct gpu_mem *m)
{
	free(m->p);
	free(m);
	live(to_sim(b), -1);
}

static int sim_event_new(struct gpu_backend *b, int device, struct gpu_event **ret,
			 uint8_t ret_handle[WIRE_IPC_HANDLE_SIZE])
{
	struct sim *sim = to_sim(b);
	if (!touch(sim, device))
		return -ENODEV;
	struct gpu_event *e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->magic = SIM_EVENT_MAGIC;
	memset(ret_handle, 0, WIRE_IPC_HANDLE_SIZE);
	memcpy(ret_handle, &e, sizeof(e));
	live(sim, 1);
	*ret = e;
	return 0;
}

static void sim_event_free(struct gpu_backend *b, struct gpu_event *e)
{
	e->magic = 0;
	free(e);
	live(to_sim(b), -1);
}

static int sim_wait(struct gpu_backend *b, struct gpu_stream *s, struct gpu_event *e)
{
	return enqueue(s, &(struct op){ .kind = OP_WAIT, .event = e });
}

static int sim_copy_h2d(struct gpu_backend *b, struct gpu_stream *s, struct gpu_mem *dst, size_t off, const void *src,
			size_t len)
{
	if (off > dst->size || len > dst->size - off)
		return -EINVAL;
	return enqueue(s, &(struct op){ .kind = OP_COPY, .dst = dst->p + off, .src = src, .len = len });
}

static int sim_record(struct gpu_backend *b, struct gpu_stream *s, struct gpu_event *e)
{
	return enqueue(s, &(struct op){ .kind = OP_RECORD, .event = e });
}

static int sim_query(struct gpu_backend *b, struct gpu_event *e)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	int done = e->completed >= e->recorded;
	pthread_mutex_unlock(&sim->lock);
	return done;
}

static int sim_notify(struct gpu_backend *b, struct gpu_stream *s, int fd)
{
	return enqueue(s, &(struct op){ .kind = OP_NOTIFY, .fd = fd });
}

static int sim_timer_new(struct gpu_backend *b, int device, struct gpu_event **ret)
{
	uint8_t handle[WIRE_IPC_HANDLE_SIZE];
	return sim_event_new(b, device, ret, handle);
}

static int sim_elapsed(struct gpu_backend *b, struct gpu_event *start, struct gpu_event *end, uint64_t *ret_ns)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	int done = end->completed >= end->recorded && start->completed >= start->recorded;
	if (done)
		*ret_ns = end->at_ns > start->at_ns ? end->at_ns - start->at_ns : 0;
	pthread_mutex_unlock(&sim->lock);
	return done;
}

static const struct gpu_backend_ops sim_ops = {
	.name = "sim",
	.free = sim_free,
	.device_count = sim_device_count,
	.device_check = sim_device_check,
	.host_register = sim_host_register,
	.host_unregister = sim_host_unregister,
	.stream_new = sim_stream_new,
	.stream_free = sim_stream_free,
	.stream_query = sim_stream_query,
	.mem_new = sim_mem_new,
	.mem_free = sim_mem_free,
	.event_new = sim_event_new,
	.event_free = sim_event_free,
	.wait = sim_wait,
	.copy_h2d = sim_copy_h2d,
	.record = sim_record,
	.query = sim_query,
	.notify = sim_notify,
	.timer_new = sim_timer_new,
	.elapsed = sim_elapsed,
};

int gpu_backend_sim_new(unsigned devices, struct gpu_backend **ret)
{
	struct sim *sim = calloc(1, sizeof(*sim));
	if (!sim)
		return -ENOMEM;
	sim->b.ops = &sim_ops;
	sim->devices = devices;
	pthread_mutex_init(&sim->lock, NULL);
	pthread_cond_init(&sim->cond, NULL);
	*ret = &sim->b;
	return 0;
}

void gpu_backend_sim_set_copy_delay(struct gpu_backend *b, unsigned usec)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	sim->copy_delay_us = usec;
	pthread_mutex_unlock(&sim->lock);
}

unsigned gpu_backend_sim_live_objects(struct gpu_backend *b)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	unsigned n = sim->live;
	pthread_mutex_unlock(&sim->lock);
	return n;
}

void gpu_backend_sim_stream_resume(struct gpu_backend *b, struct gpu_stream *s)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	s->stalled = false;
	pthread_cond_broadcast(&sim->cond);
	pthread_mutex_unlock(&sim->lock);
}

void gpu_backend_sim_set_unusable(struct gpu_backend *b, int device)
{
	struct sim *sim = to_sim(b);
	if (device >= 0 && device < 64)
		sim->unusable |= UINT64_C(1) << device;
}

uint64_t gpu_backend_sim_devices_touched(struct gpu_backend *b)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	uint64_t t = sim->touched;
	pthread_mutex_unlock(&sim->lock);
	return t;
}

void gpu_backend_sim_stream_stall(struct gpu_backend *b, struct gpu_stream *s)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	s->stalled = true;
	pthread_mutex_unlock(&sim->lock);
}

void gpu_backend_sim_stream_sync(struct gpu_backend *b, struct gpu_stream *s)
{
	struct sim *sim = to_sim(b);
	pthread_mutex_lock(&sim->lock);
	while (s->head)
		pthread_cond_wait(&sim->cond, &sim->lock);
	pthread_mutex_unlock(&sim->lock);
}

uint8_t *gpu_backend_sim_mem_ptr(struct gpu_mem *m)
{
	return m->p;
}

struct gpu_event *gpu_backend_sim_event_from_handle(const uint8_t handle[WIRE_IPC_HANDLE_SIZE])
{
	struct gpu_event *e;
	memcpy(&e, handle, sizeof(e));
	return e && e->magic == SIM_EVENT_MAGIC ? e : NULL;
}
