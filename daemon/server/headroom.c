/* SPDX-License-Identifier: MIT */
/*
 * How much memory feedd may still take before the kernel says no the hard
 * way (an OOM kill of the whole daemon): the least of the node's
 * MemAvailable and, for feedd's memory cgroup and each of its ancestors,
 * limit minus usage (v2: memory.max, memory.current; v1:
 * memory.limit_in_bytes, memory.usage_in_bytes). Read afresh for an attach
 * (limits change, and other processes of the group use memory too), at most
 * every HEADROOM_FRESH_NS while attaches come fast (request.c takes the rings
 * attached since off the last reading), and always before a refusal.
 *
 * A group's usage counts its page cache, which the kernel reclaims before
 * its OOM killer runs: the pages on the file LRU lists (memory.stat
 * active_file + inactive_file; v1 total_*, the group and its children, as
 * usage is) are room, not use. Mapped .idx pages are such cache, and a
 * corpus of a billion documents maps ~20 GB of them: once the index scan
 * had read them, a group capped below that refused every attach. The rings
 * (shared memory) are on the anonymous lists and stay counted.
 *
 * The cgroup file systems are looked for where systemd mounts them:
 * /sys/fs/cgroup (v2), /sys/fs/cgroup/unified (hybrid), /sys/fs/cgroup/memory
 * (v1). A group whose files cannot be read sets no bound.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/server/server-internal.h"

/* The first number in file, or 'max'/absent as UINT64_MAX. */
static uint64_t read_u64(const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return UINT64_MAX;
	char line[64] = "";
	bool ok = fgets(line, sizeof(line), f) != NULL;
	fclose(f);
	if (!ok || strncmp(line, "max", 3) == 0)
		return UINT64_MAX;
	char *end;
	unsigned long long v = strtoull(line, &end, 10);
	return end == line ? UINT64_MAX : (uint64_t)v;
}

/* Bytes on the file LRU lists of the group's memory.stat at path (keys prefix + "active_file", prefix +
 * "inactive_file"); 0 if it cannot be read. */
static uint64_t file_lru(const char *path, const char *prefix)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	char line[256], key[64];
	unsigned long long v;
	uint64_t sum = 0;
	size_t n = strlen(prefix);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%63s %llu", key, &v) == 2 && strncmp(key, prefix, n) == 0 &&
		    (strcmp(key + n, "active_file") == 0 || strcmp(key + n, "inactive_file") == 0))
			sum += v;
	fclose(f);
	return sum;
}

/* Bounds *best by limit - (usage - page cache) for the group at mount/rel and every ancestor, noting the
 * tightest in what. stat_prefix: memory.stat's prefix for counts that include child groups ("total_" in v1). */
static void walk_groups(const char *mount, const char *rel, const char *limit_file, const char *usage_file,
			const char *stat_prefix, uint64_t *best, char *what, size_t whatlen)
{
	char path[4096];
	char group[2048];
	snprintf(group, sizeof(group), "%s", rel);
	for (;;) {
		snprintf(path, sizeof(path), "%s%s/%s", mount, group, limit_file);
		uint64_t limit = read_u64(path);
		if (limit < (UINT64_C(1) << 62)) {
			snprintf(path, sizeof(path), "%s%s/%s", mount, group, usage_file);
			uint64_t usage = read_u64(path);
			if (usage != UINT64_MAX) {
				snprintf(path, sizeof(path), "%s%s/memory.stat", mount, group);
				uint64_t cache = file_lru(path, stat_prefix);
				uint64_t used = usage > cache ? usage - cache : 0;
				uint64_t room = used < limit ? limit - used : 0;
				if (room < *best) {
					*best = room;
					snprintf(what, whatlen,
						 "memory cgroup %s (%s %" PRIu64 " MiB, %" PRIu64 " MiB in use besides %" PRIu64
						 " MiB of page cache)",
						 group[0] ? group : "/", limit_file, limit >> 20, used >> 20, cache >> 20);
				}
			}
		}
		char *slash = strrchr(group, '/');
		if (!slash || !group[0])
			break;
		*slash = 0; /* "/a/b" -> "/a" -> "" (the root group) */
	}
}

int headroom_read(uint64_t *ret, char *what, size_t whatlen)
{
	uint64_t best = UINT64_MAX;
	snprintf(what, whatlen, "no limit known");
	FILE *f = fopen("/proc/meminfo", "re");
	if (f) {
		char line[256];
		unsigned long long kb;
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
				best = (uint64_t)kb << 10;
				snprintf(what, whatlen, "the node's MemAvailable (%" PRIu64 " MiB)", best >> 20);
				break;
			}
		fclose(f);
	}
	f = fopen("/proc/self/cgroup", "re");
	if (!f)
		return best == UINT64_MAX ? -ENOENT : (*ret = best, 0);
	char line[2048];
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = 0;
		const char *controllers = c1 + 1, *rel = c2 + 1;
		if (strcmp(rel, "/") == 0)
			rel = "";
		if (!*controllers) {
			walk_groups("/sys/fs/cgroup", rel, "memory.max", "memory.current", "", &best, what, whatlen);
			walk_groups("/sys/fs/cgroup/unified", rel, "memory.max", "memory.current", "", &best, what,
				    whatlen);
		} else if (strstr(controllers, "memory")) {
			walk_groups("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes", "memory.usage_in_bytes",
				    "total_", &best, what, whatlen);
		}
	}
	fclose(f);
	*ret = best;
	return 0;
}
