/* SPDX-License-Identifier: MIT */
/*
 * The slab allocator (slab.h). Every mapping it makes is SLAB_CHUNK bytes
 * aligned, with a struct slab header at its start, so an object's header is
 * found by masking its address. A small-object slab is one SLAB_CHUNK of a
 * single size class: its objects are handed out from a free list (objects
 * freed, linked through their first word) or else from the never-used rest
 * (so pages are touched only when needed). A class keeps a list of its slabs
 * with room; objects are taken from the first. A large object's mapping
 * holds it alone, right after the header.
 */
#include <assert.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/slab/slab.h"
#include "proto/macro.h"

#define SLAB_CHUNK (64u << 10)
#define SLAB_HEADER 64u /* room for struct slab; keeps objects 16-byte aligned */
#define SLAB_MAGIC 0x62616c73u  /* "slab" */
#define LARGE_MAGIC 0x6772616cu /* "larg" */

struct slab {
	uint32_t magic;
	uint32_t cls;             /* small: the size class (index into sizes) */
	size_t map_len;           /* the mapping's length */
	size_t size;              /* large: the bytes asked */
	struct slab *prev, *next; /* small: in its class's list of slabs with room */
	void *free;               /* small: freed objects */
	uint32_t bump;            /* small: where the never-used rest starts */
	uint32_t live;            /* small: objects handed out and not freed */
	bool listed;              /* small: in the list of slabs with room */
};
_Static_assert(sizeof(struct slab) <= SLAB_HEADER, "struct slab fits its header");

static const uint32_t sizes[] = { 16,  32,  48,  64,  80,  96,  112, 128,	160,  192,  224,  256,	320,  384,
				  448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096 };
#define N_CLASSES ARRAY_SIZE(sizes)
_Static_assert(SLAB_MAX_SMALL == 4096, "the largest class is SLAB_MAX_SMALL");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct slab *avail[N_CLASSES]; /* slabs with room, by class */
static struct slab *spare[N_CLASSES]; /* one empty slab kept by class, its pages but the first given back */
static struct slab_stats stats;

static unsigned class_of(size_t n)
{
	unsigned c = 0;
	while (sizes[c] < n)
		c++;
	return c;
}

/* A mapping of len bytes (a multiple of the page size) aligned to SLAB_CHUNK; NULL when out of memory. */
static void *map_aligned(size_t len)
{
	uint8_t *m = mmap(NULL, len + SLAB_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return NULL;
	uint8_t *a = (uint8_t *)(((uintptr_t)m + SLAB_CHUNK - 1) & ~(uintptr_t)(SLAB_CHUNK - 1));
	if (a > m)
		munmap(m, (size_t)(a - m));
	munmap(a + len, (size_t)(m + len + SLAB_CHUNK - (a + len)));
	return a;
}

static struct slab *slab_of(const void *p)
{
	struct slab *s = (struct slab *)((uintptr_t)p & ~(uintptr_t)(SLAB_CHUNK - 1));
	assert(s->magic == SLAB_MAGIC || s->magic == LARGE_MAGIC);
	return s;
}

static void list_add(struct slab *s)
{
	s->prev = NULL;
	s->next = avail[s->cls];
	if (s->next)
		s->next->prev = s;
	avail[s->cls] = s;
	s->listed = true;
}

static void list_remove(struct slab *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		avail[s->cls] = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->prev = s->next = NULL;
	s->listed = false;
}

static void *large_alloc(size_t n)
{
	if (n > SIZE_MAX - SLAB_HEADER - SLAB_CHUNK)
		return NULL;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t len = (SLAB_HEADER + n + page - 1) & ~(page - 1);
	struct slab *s = map_aligned(len);
	if (!s)
		return NULL;
	*s = (struct slab){ .magic = LARGE_MAGIC, .map_len = len, .size = n };
	stats.objects++;
	stats.bytes += n;
	stats.mapped_bytes += len;
	return (uint8_t *)s + SLAB_HEADER;
}

static void *small_alloc(size_t n)
{
	unsigned c = class_of(n);
	struct slab *s = avail[c];
	if (!s) {
		s = spare[c];
		spare[c] = NULL;
		if (!s) {
			s = map_aligned(SLAB_CHUNK);
			if (!s)
				return NULL;
			stats.mapped_bytes += SLAB_CHUNK;
			stats.slabs++;
		}
		*s = (struct slab){ .magic = SLAB_MAGIC, .cls = c, .map_len = SLAB_CHUNK, .bump = SLAB_HEADER };
		list_add(s);
	}
	void *p = s->free;
	if (p) {
		s->free = *(void **)p;
	} else {
		p = (uint8_t *)s + s->bump;
		s->bump += sizes[c];
	}
	s->live++;
	if (!s->free && s->bump + sizes[c] > SLAB_CHUNK)
		list_remove(s); /* full */
	stats.objects++;
	stats.bytes += sizes[c];
	return p;
}

static void free_locked(void *p)
{
	struct slab *s = slab_of(p);
	stats.objects--;
	if (s->magic == LARGE_MAGIC) {
		stats.bytes -= s->size;
		stats.mapped_bytes -= s->map_len;
		s->magic = 0;
		munmap(s, s->map_len);
		return;
	}
	unsigned c = s->cls;
	stats.bytes -= sizes[c];
	*(void **)p = s->free;
	s->free = p;
	assert(s->live > 0);
	if (--s->live > 0) {
		if (!s->listed)
			list_add(s);
		return;
	}
	/* Empty: kept as the class's spare (all but its header's page given back), or unmapped. */
	if (s->listed)
		list_remove(s);
	if (!spare[c]) {
		size_t page = (size_t)sysconf(_SC_PAGESIZE);
		madvise((uint8_t *)s + page, SLAB_CHUNK - page, MADV_DONTNEED);
		spare[c] = s;
		return;
	}
	s->magic = 0;
	stats.mapped_bytes -= SLAB_CHUNK;
	stats.slabs--;
	munmap(s, SLAB_CHUNK);
}

void *slab_malloc(size_t n)
{
	pthread_mutex_lock(&lock);
	void *p = n > SLAB_MAX_SMALL ? large_alloc(n) : small_alloc(MAX(n, (size_t)1));
	pthread_mutex_unlock(&lock);
	return p;
}

void slab_free(void *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&lock);
	free_locked(p);
	pthread_mutex_unlock(&lock);
}

void *slab_realloc(void *p, size_t n)
{
	if (!p)
		return slab_malloc(n);
	if (n == 0) {
		slab_free(p);
		return NULL;
	}
	pthread_mutex_lock(&lock);
	struct slab *s = slab_of(p);
	size_t have = s->magic == LARGE_MAGIC ? s->map_len - SLAB_HEADER : sizes[s->cls];
	bool fits = n <= have && (s->magic == LARGE_MAGIC ? n > SLAB_MAX_SMALL : true);
	if (fits && s->magic == LARGE_MAGIC) {
		stats.bytes = stats.bytes - s->size + n;
		s->size = n;
	}
	size_t old = s->magic == LARGE_MAGIC ? s->size : have;
	pthread_mutex_unlock(&lock);
	if (fits)
		return p;
	void *q = slab_malloc(n);
	if (!q)
		return NULL;
	memcpy(q, p, MIN(old, n));
	slab_free(p);
	return q;
}

void slab_stats(struct slab_stats *ret)
{
	pthread_mutex_lock(&lock);
	*ret = stats;
	pthread_mutex_unlock(&lock);
}
