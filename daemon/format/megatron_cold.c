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
 * COLD_SINGLE pages one by one (the first batches need a few thousand
 * pages of a window of gigabytes), then the aligned COLD_CHUNK around a
 * page (a window read for long is read nearly whole: large reads, as the
 * read-around made them, but asynchronous). Tried and dropped: the mapping
 * MADV_RANDOM with single pages only: the first batch as fast, but steady
 * reading of a cold window 20-40x slower (4 KiB random reads for all of it).
 *
 * Measured (bench/scale 1 B documents, 40 shards, cold, 6 GiB cap, load 3-5):
 * the daemon's major faults by the first batch 432 -> 86; first batch
 * 2.3-2.7 s against 2.9-4.0 s. Most of what is still read before it is
 * the warming of every virtual rank's stream (1,024 x 32 documents for a
 * batch of ~2,000), and the chunks that follow COLD_SINGLE; 16,384 single
 * pages per shard instead of 4,096 was slower (3.7-4.0 s: system calls).
 *
 * A bitmap remembers the pages asked for (one bit per page: 640 KiB at
 * 20 GB of index), so that a warm walk costs no system call; a page
 * evicted since is only faulted in again, as before.
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
