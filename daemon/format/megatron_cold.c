/* SPDX-License-Identifier: MIT */
/*
 * Reading a large mapped .idx cold (issue #22): a window permuted per use
 * (docs/sample-order.md section 3.1) reads three random places of the index
 * per document (doc_idx, sizes, pointers). Left to page faults, each is a
 * synchronous read of the kernel's read-around (read_ahead_kb: 8 MiB on
 * some VMs) for 12-20 bytes, one after the other: seconds for the first
 * batch of a cold 1 B-document feed. The walk's prefetch
 * (megatron_doc_prefetch, DOC_WALK_AHEAD documents ahead) asks for the
 * pages a document will need with MADV_WILLNEED instead: the reads are
 * queued at once, many in flight, and the walk finds the pages cached or
 * arriving (a page being read is waited for, never read around again).
 *
 * What is asked for grows with what a shard was asked for: its first
 * COLD_SINGLE pages one by one (the first batches need tens of thousands
 * of pages of a window of gigabytes), then the aligned COLD_CHUNK around a
 * page (a window read for long is read nearly whole: large reads, as the
 * read-around made them, but asynchronous). Tried and dropped: the mapping
 * MADV_RANDOM with single pages only: the first batch as fast, but steady
 * reading of a cold window 20-40x slower (4 KiB random reads for all of it);
 * the chunks asked for at idle I/O priority: no gain seen.
 *
 * Only what is next is asked for: an elastic session's 1,024 virtual
 * streams open cold (doc_walk.cold: each stream's first document only,
 * every stream's pages in flight together) and a stream is warmed whole
 * when its rows come up (session-virtual.c, warm_next). Warming all of
 * them at attach (h-coldidx) asked for ~100,000 pages for a first batch of
 * ~2,000 documents.
 *
 * A cached index asks for nothing: the first COLD_PROBE pages a shard
 * wants are looked up with mincore, and with COLD_CACHED of them cached
 * the shard is taken as cached (a warm start: no system call per page;
 * h-coldidx's madvise per page first touched made a warm first batch
 * 0.06 -> 0.2 s). A page evicted later is faulted in, as before #22.
 *
 * Measured (bench/scale/cold.py, 1 B documents in 40 shards, cold, 6 GiB
 * cap, 3 alternating rounds, load 7.5-9.3; docs/benchmarks.md "Scale"):
 * READY 0.04-0.09 s (main 0.50-1.04: the doc_idx ends checked at load were
 * two 8 MiB read-arounds per shard, now single pages, megatron.c); first
 * batch 1.05-1.43 s, median 1.21 (main 2.61-4.71, median 3.17; h-coldidx
 * 3.06-4.56); major faults 11-13 (main 434). At COLD_SINGLE 4,096 the 4
 * batches planned at attach (~22,000 pages of a window's 4 shards) crossed
 * into 2 MiB chunks: 1.9 GB read before the first batch, 1.4-4.3 s. The
 * cost: a cold window's steady reading right after, 0.42-0.66 M tokens/s
 * against main's 0.60-0.71 M (single pages for longer). Warm (index
 * cached, 100 M documents): first batch 0.06-0.16 s, main 0.10-0.17.
 *
 * A bitmap remembers the pages asked for (one bit per page: 640 KiB at
 * 20 GB of index), so that a walk asks for a page once; a page evicted
 * since is only faulted in again, as before.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/format/megatron.h"
#include "proto/macro.h"

void megatron_cold_init(struct megatron_shard *s)
{
	if (!s->idx_mapped || s->cold)
		return;
	long page = sysconf(_SC_PAGESIZE);
	if (page <= 0 || (page & (page - 1)) != 0)
		return;
	size_t pages = (s->idx_len + (size_t)page - 1) / (size_t)page;
	size_t words = (pages + 63) / 64;
	uint64_t *bits = calloc(words + 3, sizeof(uint64_t));
	if (!bits)
		return; /* faults as before: slower, never wrong */
	s->cold = bits;
	s->cold_asked = bits + words;
	s->cold_page_shift = (unsigned)__builtin_ctzl((unsigned long)page);
}

void megatron_cold_free(struct megatron_shard *s)
{
	free(s->cold);
	s->cold = s->cold_asked = NULL;
}

#define COLD_SINGLE 16384u      /* pages of a shard asked for one by one (64 MiB) */
#define COLD_CHUNK (2u << 20)    /* then bytes asked for at once around a page */
#define COLD_PROBE 32u           /* the first pages wanted: looked up in the page cache first (mincore) */
#define COLD_CACHED 30u          /* of which this many cached: the shard is taken as cached, asked for nothing */

/* Whether page p of the index is in the page cache (one system call); false when it cannot say. */
static bool page_cached(const struct megatron_shard *s, uint64_t p)
{
	unsigned char v = 0;
	return mincore((void *)(s->idx + (p << s->cold_page_shift)), (size_t)1 << s->cold_page_shift, &v) == 0 &&
	       (v & 1);
}

/* Pages of bytes off .. off + len - 1 of the index not asked for yet: asked for now (reads queued, not waited for). */
void megatron_cold_want(const struct megatron_shard *s, uint64_t off, uint64_t len)
{
	if (!s->cold || len == 0 || off >= s->idx_len)
		return;
	uint64_t *probed = &s->cold_asked[1], *cached = &s->cold_asked[2];
	/* A cached index (a warm start): nothing asked for, no system call. */
	if (__atomic_load_n(cached, __ATOMIC_RELAXED) >= COLD_CACHED)
		return;
	uint64_t end = off + len < s->idx_len ? off + len : s->idx_len;
	unsigned sh = s->cold_page_shift;
	for (uint64_t p = off >> sh; p <= (end - 1) >> sh; p++) {
		if (__atomic_load_n(&s->cold[p / 64], __ATOMIC_RELAXED) & (1ull << (p % 64)))
			continue;
		/* Two threads may both probe: the counts are a sample, not exact. */
		if (__atomic_load_n(probed, __ATOMIC_RELAXED) < COLD_PROBE) {
			__atomic_fetch_add(probed, 1, __ATOMIC_RELAXED);
			if (page_cached(s, p)) {
				__atomic_fetch_or(&s->cold[p / 64], 1ull << (p % 64), __ATOMIC_RELAXED);
				if (__atomic_add_fetch(cached, 1, __ATOMIC_RELAXED) >= COLD_CACHED)
					return;
				continue;
			}
		}
		/* Two threads may both ask for a page: harmless, the second finds it being read. */
		uint64_t a = p, b = p + 1;
		if (__atomic_fetch_add(s->cold_asked, 1, __ATOMIC_RELAXED) >= COLD_SINGLE) {
			uint64_t per = COLD_CHUNK >> sh;
			a = p / per * per;
			b = MIN(a + per, (s->idx_len + (1ull << sh) - 1) >> sh);
		}
		for (uint64_t q = a; q < b; q++)
			__atomic_fetch_or(&s->cold[q / 64], 1ull << (q % 64), __ATOMIC_RELAXED);
		(void)madvise((void *)(s->idx + (a << sh)), (size_t)(b - a) << sh, MADV_WILLNEED);
	}
}
