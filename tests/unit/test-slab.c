/* SPDX-License-Identifier: MIT */
/*
 * The slab allocator libevent's objects come from (daemon/slab/slab.h): what
 * it hands out holds what was written, realloc keeps the contents across
 * size classes and into and out of a large object's own mapping, and once
 * every object of a class is freed its slabs are gone but one kept empty.
 */
#include <sys/mman.h>

#include "daemon/slab/slab.h"
#include "proto/macro.h"
#include "unit.h"

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

static bool holds(const uint8_t *p, size_t n, uint8_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)(seed + i * 7))
			return false;
	return true;
}

static void test_contents_and_return(void)
{
	struct slab_stats s0, s1, s2;
	slab_stats(&s0);
	enum { N = 20000 };
	static uint8_t *p[N];
	static size_t n[N];
	for (size_t i = 0; i < N; i++) {
		n[i] = 1 + (i * 2654435761u) % (i % 50 ? 200 : 9000); /* mostly small, some large */
		p[i] = slab_malloc(n[i]);
		REQUIRE(p[i], "slab_malloc(%zu) failed", n[i]);
		CHECK(((uintptr_t)p[i] & 15) == 0, "object %zu at %p is not 16-byte aligned", i, (void *)p[i]);
		fill(p[i], n[i], (uint8_t)i);
	}
	slab_stats(&s1);
	CHECK(s1.objects == s0.objects + N, "%" PRIu64 " live objects, expected %" PRIu64, s1.objects, s0.objects + N);
	size_t bad = 0;
	for (size_t i = 0; i < N; i++)
		bad += !holds(p[i], n[i], (uint8_t)i);
	CHECK(bad == 0, "%zu objects do not hold what was written to them", bad);
	/* Every third grows or shrinks, across classes and to and from large objects. */
	for (size_t i = 0; i < N; i += 3) {
		size_t m = i % 2 ? n[i] * 3 + 5000 : n[i] / 2 + 1;
		uint8_t *q = slab_realloc(p[i], m);
		REQUIRE(q, "slab_realloc(%zu -> %zu) failed", n[i], m);
		CHECK(holds(q, MIN(n[i], m), (uint8_t)i), "realloc %zu -> %zu lost the contents", n[i], m);
		p[i] = q;
		n[i] = m;
		fill(p[i], n[i], (uint8_t)i);
	}
	bad = 0;
	for (size_t i = 0; i < N; i++)
		bad += !holds(p[i], n[i], (uint8_t)i);
	CHECK(bad == 0, "%zu objects do not hold what was written to them after the reallocs", bad);
	for (size_t i = 0; i < N; i++)
		slab_free(p[i]);
	slab_stats(&s2);
	CHECK(s2.objects == s0.objects && s2.bytes == s0.bytes, "%" PRIu64 " objects of %" PRIu64 " bytes left",
	      s2.objects, s2.bytes);
	/* At most the one empty slab kept per size class (28) stays mapped; large objects' mappings all went. */
	CHECK(s2.slabs <= s0.slabs + 28 && s2.mapped_bytes == s2.slabs * (64u << 10),
	      "%" PRIu64 " slabs and %" PRIu64 " bytes still mapped after every object was freed (%" PRIu64 " before)",
	      s2.slabs, s2.mapped_bytes, s0.slabs);
	CHECK(s1.slabs > 28, "only %" PRIu64 " slabs for %d objects", s1.slabs, N);
	slab_free(NULL);
	CHECK(slab_realloc(slab_malloc(10), 0) == NULL, "realloc to 0 does not free");
}

int main(void)
{
	test_contents_and_return();
	return unit_exit("slab");
}
