/* SPDX-License-Identifier: MIT */
/*
 * Experiment 5 of #10: host-to-device staging of batches.
 *
 *   gpu_h2d [B L [batches]]
 *
 * In one run, on one device, for the slot size of a B x L batch:
 *  - plain:    n cudaMemcpyAsync on one non-blocking stream from a pinned
 *              (cudaHostRegister'd memfd) buffer, one synchronise at the end:
 *              the peer, pipelined as staging is (a loop of synchronous
 *              cudaMemcpy would pay a host round trip per copy and flatter
 *              staging);
 *  - staging:  feedd's path (daemon/gpu/staging, CUDA backend) over a real ring:
 *              wait(release) -> cudaMemcpyAsync -> record(ready) per batch, with a
 *              consumer stream that waits on ready and records release, as a client does;
 *  - pageable: the same from malloc'd memory (what an unpinned DataLoader pays);
 * and prints GB/s of each, staging/plain (goal >= 0.9), pinned/pageable, and the
 * client's CPU time per batch (its wait + record calls; goal <= 10 us).
 * Without a CUDA device it prints one "skipped" line with the CUDA error and
 * exits 77 (bench/run.sh and scripts/gpu-check.sh report it as skipped).
 */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/gpu/backend.h"
#include "daemon/gpu/staging.h"
#include "daemon/ring/ring.h"
#include "proto/macro.h"

static double gbps(size_t bytes, uint64_t ns)
{
	return ns ? (double)bytes / (double)ns : 0;
}

/* Wall time of n asynchronous copies of len bytes queued on one stream, or 0 on a CUDA error. */
static uint64_t plain_copy(void *dst, const void *src, size_t len, unsigned n)
{
	cudaStream_t s;
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess)
		return 0;
	cudaError_t e = cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, s); /* warm */
	e = e == cudaSuccess ? cudaStreamSynchronize(s) : e;
	uint64_t t0 = now_ns();
	for (unsigned i = 0; i < n && e == cudaSuccess; i++)
		e = cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, s);
	e = e == cudaSuccess ? cudaStreamSynchronize(s) : e;
	uint64_t ns = now_ns() - t0;
	cudaStreamDestroy(s);
	if (e != cudaSuccess) {
		fprintf(stderr, "gpu_h2d: plain copy: %s\n", cudaGetErrorString(e));
		return 0;
	}
	return ns;
}

int main(int argc, char **argv)
{
	uint32_t B = argc > 2 ? (uint32_t)atoi(argv[1]) : 8, L = argc > 2 ? (uint32_t)atoi(argv[2]) : 4096;
	unsigned n = argc > 3 ? (unsigned)atoi(argv[3]) : 2000;
	char err[256];
	struct gpu_backend *b;
	int r = gpu_backend_cuda_new(&b, err, sizeof(err));
	if (r < 0) {
		printf("gpu_h2d: skipped: no CUDA device (%s)\n", err);
		return 77;
	}
	struct ring_geometry g = { .slot_count = 8, .batch_size = B, .seq_len = L, .rank = 0, .world = 1 };
	struct ring *ring;
	if (ring_new(&g, &ring) < 0) {
		fprintf(stderr, "gpu_h2d: cannot create a ring of B=%u L=%u\n", B, L);
		return 1;
	}
	int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct staging *st;
	r = staging_new(b, 0, ring->hdr, ring->size, wake, &st, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "gpu_h2d: %s\n", err);
		return 1;
	}
	for (uint32_t s = 0; s < ring->slot_count; s++) {
		struct feed_slot_header *h = (struct feed_slot_header *)ring_slot(ring, s);
		h->n_cu_seqlens = B + 1;
		memset((uint8_t *)h + ring->hdr->off_input_ids, s, ring->hdr->off_cu_seqlens - ring->hdr->off_input_ids);
	}
	size_t len = ring->hdr->off_cu_seqlens + 4u * (B + 1);

	/* The client's side, in this process: a stream that waits on ready and records release. */
	struct gpu_stream *cs;
	b->ops->stream_new(b, 0, &cs);
	uint64_t client_ns = 0, tail = 0;
	cudaDeviceSynchronize();
	uint64_t t0 = now_ns();
	for (uint64_t seq = 0; seq < n; seq++) {
		while (seq - tail >= ring->slot_count || staging_host_reusable(st, seq) == 0) {
			/* The consumer releases the oldest batch it holds. */
			if (seq - tail >= ring->slot_count) {
				uint64_t c0 = now_ns();
				b->ops->record(b, cs, st->slots[tail % ring->slot_count].release);
				client_ns += now_ns() - c0;
				tail++;
			} else {
				uint64_t v;
				while (read(wake, &v, sizeof(v)) < 0)
					usleep(10);
			}
		}
		if ((r = staging_publish(st, seq, tail)) < 0) {
			fprintf(stderr, "gpu_h2d: staging batch %" PRIu64 ": %s\n", seq, b->error);
			return 1;
		}
		uint64_t c0 = now_ns();
		b->ops->wait(b, cs, st->slots[seq % ring->slot_count].ready);
		client_ns += now_ns() - c0;
	}
	cudaDeviceSynchronize();
	uint64_t staging_ns = now_ns() - t0;

	void *dev, *pageable = malloc(len);
	memcpy(pageable, ring_slot(ring, 0), len);
	cudaMalloc(&dev, len);
	uint64_t pinned_ns = plain_copy(dev, ring_slot(ring, 0), len, n);
	uint64_t pageable_ns = plain_copy(dev, pageable, len, n);
	int dev_id = 0;
	struct cudaDeviceProp prop;
	cudaGetDeviceProperties(&prop, dev_id);
	printf("gpu_h2d: %s, B=%u L=%u, %zu bytes per batch, %u batches, device memory via %s\n", prop.name, B, L,
	       len, n, st->export.kind == WIRE_DEVICE_VMM ? "VMM" : "legacy IPC");
	if (!pinned_ns || !pageable_ns)
		return 1;
	printf("  plain pinned cudaMemcpyAsync %7.2f GB/s\n", gbps(len * n, pinned_ns));
	printf("  feedd staging                %7.2f GB/s   ratio staging/plain %.3f (goal >= 0.9)\n",
	       gbps(len * n, staging_ns), (double)pinned_ns / (double)staging_ns);
	printf("  pageable cudaMemcpyAsync     %7.2f GB/s   ratio pinned/pageable %.2f\n", gbps(len * n, pageable_ns),
	       (double)pageable_ns / (double)pinned_ns);
	printf("  client CPU per batch         %7.2f us (wait + record; goal <= 10)\n", (double)client_ns / n / 1e3);
	cudaFree(dev);
	free(pageable);
	b->ops->stream_free(b, cs);
	staging_free(st, NULL);
	ring_free(ring);
	gpu_backend_free(b);
	return 0;
}
