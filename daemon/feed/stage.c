/* SPDX-License-Identifier: MIT */
/*
 * The stage names and the switch that turns stage timing on and off
 * (stage.h). The switch is written by the main thread on start and reload and
 * read by every worker, hence the relaxed atomics.
 */
#include "daemon/feed/stage.h"

static int timing = 1;

const char *stage_name(enum stage_id id)
{
	static const char *const names[_STAGE_MAX] = {
		[STAGE_READ] = "read",	[STAGE_DECOMPRESS] = "decompress", [STAGE_TOKENIZE] = "tokenize",
		[STAGE_PACK] = "pack",	[STAGE_H2D] = "h2d",		   [STAGE_JOB] = "job",
	};
	return (unsigned)id < _STAGE_MAX ? names[id] : "?";
}

void stage_timing_set(bool on)
{
	__atomic_store_n(&timing, on, __ATOMIC_RELAXED);
}

bool stage_timing_on(void)
{
	return __atomic_load_n(&timing, __ATOMIC_RELAXED) != 0;
}
