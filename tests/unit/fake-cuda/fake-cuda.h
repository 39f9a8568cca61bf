/* SPDX-License-Identifier: MIT */
/* What the fake CUDA driver (fake-cuda.c) counted, for the test that loads it. */
#pragma once

#include <stdint.h>

struct fake_cuda_state {
	unsigned contexts;           /* primary contexts retained and not released */
	unsigned imports, mem_releases, maps, unmaps;
	unsigned events_opened, events_destroyed;
	unsigned records, waits;
	uint8_t last_record[8];      /* the first 8 bytes of the handle of the event last recorded */
	uint8_t last_wait[8];        /* ... and last waited on */
};

/* The counters (the fake driver's only export besides cuGetProcAddress_v2). */
__attribute__((visibility("default"))) struct fake_cuda_state *fake_cuda_state(void);
