/* SPDX-License-Identifier: MIT */
/*
 * One open file per daemon for each file it reads, however many feeds and
 * shards name it: 1,000 feeds over the same 2 files hold 2 descriptors, not
 * 2,000. A file is shared by its identity (device, inode, size, mtime,
 * ctime: source_id), so a file rewritten in between gets a descriptor of its
 * own, and a name that now points elsewhere never borrows the old file's.
 * Reads are positional (pread, io_uring at an offset): nothing of an fd's
 * state is shared but the file itself.
 *
 * The table is process-wide, guarded by a mutex: sources are opened by the
 * loading threads and closed wherever their last shard goes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "daemon/source/fdshare.h"

struct shared {
	struct shared *next;
	struct source_id id;
	int fd;
	unsigned refs;
};

#define BUCKETS 4096 /* a power of two */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static size_t n_shared; /* descriptors in the table */
static struct shared *table[BUCKETS];

static struct shared **bucket(const struct source_id *id)
{
	uint64_t h = (id->dev * UINT64_C(0x9e3779b97f4a7c15)) ^ (id->ino * UINT64_C(0xbf58476d1ce4e5b9));
	return &table[(h ^ (h >> 29)) & (BUCKETS - 1)];
}

int fdshare_take(int fd, const struct source_id *id)
{
	pthread_mutex_lock(&lock);
	struct shared **b = bucket(id);
	for (struct shared *e = *b; e; e = e->next)
		if (source_id_equal(&e->id, id)) {
			e->refs++;
			pthread_mutex_unlock(&lock);
			close(fd);
			return e->fd;
		}
	struct shared *e = malloc(sizeof(*e));
	if (e) {
		*e = (struct shared){ .next = *b, .id = *id, .fd = fd, .refs = 1 };
		*b = e;
		n_shared++;
	}
	pthread_mutex_unlock(&lock);
	return fd; /* out of memory: this source keeps its own fd, fdshare_drop closes it */
}

int fdshare_ref(const struct source_id *id)
{
	int fd = -ENOENT;
	pthread_mutex_lock(&lock);
	for (struct shared *e = *bucket(id); e; e = e->next)
		if (source_id_equal(&e->id, id)) {
			e->refs++;
			fd = e->fd;
			break;
		}
	pthread_mutex_unlock(&lock);
	return fd;
}

void fdshare_drop(int fd, const struct source_id *id)
{
	pthread_mutex_lock(&lock);
	for (struct shared **p = bucket(id); *p; p = &(*p)->next) {
		struct shared *e = *p;
		if (e->fd != fd)
			continue;
		if (--e->refs == 0) {
			*p = e->next;
			free(e);
			n_shared--;
			pthread_mutex_unlock(&lock);
			close(fd);
			return;
		}
		pthread_mutex_unlock(&lock);
		return;
	}
	pthread_mutex_unlock(&lock);
	close(fd); /* never shared */
}

size_t fdshare_count(void)
{
	pthread_mutex_lock(&lock);
	size_t n = n_shared;
	pthread_mutex_unlock(&lock);
	return n;
}
