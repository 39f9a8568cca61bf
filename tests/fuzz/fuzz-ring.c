/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the shared-memory ring as libfeed reads it. The ring header
 * and every slot header come from the daemon's memory, so libfeed validates
 * them (check_ring at attach, the slot check in feed_client_next) before it
 * computes a single pointer from them.
 *
 * This file compiles client/libfeed.c (and device.c, which it calls) into itself to reach those static
 * functions without exporting them from the library: the code fuzzed is the
 * code shipped. Input: a 48-byte ATTACH_REPLY payload, then the ring's bytes
 * (zero-filled up to ring_size; rings over 16 MiB are skipped). The ring
 * lives in an exact-size heap block, so ASan flags any read past ring_size.
 * Promises checked: an accepted ring lets next() hand out batches whose
 * arrays and cursor lie wholly inside the ring (every element is read), and
 * an inconsistent slot stops the stream with -EPROTO instead of being read.
 */
#include <assert.h>
#include <sys/socket.h>

#include "client/device.c"
#include "client/libfeed.c"
#include "client/peer.c"
#include "client/reconnect.c"
#include "client/stats.c"
#include "client/state.c"
#include "client/strerror.c"
#include "tests/fuzz/fuzz.h"

#define RING_MAX (16u << 20)

static int hung_up = -1; /* a socket whose peer is gone: libfeed reads EOF at once */

unsigned long fuzz_accepted;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	close(sv[1]);
	hung_up = sv[0];
	return 0;
}

static uint64_t sum(const int32_t *p, size_t n)
{
	uint64_t s = 0;
	for (size_t i = 0; i < n; i++)
		s += (uint32_t)p[i];
	return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wire_attach_reply rep;
	if (size < WIRE_ATTACH_REPLY_SIZE || wire_decode_attach_reply(data, WIRE_ATTACH_REPLY_SIZE, &rep) < 0)
		return 0;
	if (rep.ring_size < sizeof(struct feed_ring_header) || rep.ring_size > RING_MAX)
		return 0;
	uint8_t *ring = calloc(1, rep.ring_size);
	struct feed_consumer_page *cons = aligned_alloc(64, sizeof(*cons));
	feed_client *c = calloc(1, sizeof(*c));
	assert(ring && cons && c);
	memset(cons, 0, sizeof(*cons));
	memcpy(ring, data + WIRE_ATTACH_REPLY_SIZE, MIN(size - WIRE_ATTACH_REPLY_SIZE, rep.ring_size));

	*c = (feed_client){ .fd = hung_up, .data_efd = -1, .space_efd = -1, .hdr = (void *)ring,
			    .ring_size = rep.ring_size, .cons = cons };
	if (check_ring(c, &rep, &c->geo) == 0) {
		/* What feed_client_attach does once the ring passed. */
		c->slot_count = rep.slot_count;
		c->batch_size = rep.batch_size;
		c->seq_len = rep.seq_len;
		c->attached = true;
		volatile uint64_t sink = 0;
		for (unsigned i = 0; i < 8; i++) {
			struct feed_batch b;
			int r = feed_client_next(c, 0, &b);
			if (r < 0) {
				assert(r == -EPROTO || r == -ETIMEDOUT || r == -ECONNRESET || r == -ESHUTDOWN ||
				       r == -EIO);
				break;
			}
			size_t n = (size_t)b.batch_size * b.seq_len;
			assert(n == (size_t)rep.batch_size * rep.seq_len);
			sink += sum(b.input_ids, n) + sum(b.labels, n) + sum(b.position_ids, n);
			sink += sum(b.cu_seqlens, b.n_cu_seqlens) + strlen(b.cursor);
			assert(feed_client_release(c, &b) == 0);
			sink += strlen(feed_client_cursor(c));
			fuzz_accepted++;
		}
		(void)sink;
	}
	c->fd = -1; /* shared across inputs, not this client's */
	free(c);
	free(cons);
	free(ring);
	return 0;
}
