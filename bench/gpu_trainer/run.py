#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A trainer loop with a synthetic GPU step: data wait per step, feedd's device batches vs PyTorch's peer.

The step is real GPU work: chained fp16 matmuls on one CUDA stream, sized so
that one step takes --step-ms on this GPU (calibrated first). Two loaders feed
the same batches (Megatron shards written by scripts/gen_megatron.py, the
order of feedd's contract) into that loop:

- feedd: feed.Loader(device="cuda:0"): batches staged in device memory by
  the daemon (pinned ring, async H2D on its stream, CUDA IPC events); the
  step's stream waits on the batch's `ready` event, no CPU copy;
- peer: PyTorch DataLoader (bench/dataloader_baseline.py, --workers worker
  processes) with pin_memory=True, and .to("cuda", non_blocking=True), the
  seeds' recommended setup.

Per loader it prints the data wait per step (the time the trainer's CPU
spends in next() plus the copy call, measured with a CUDA event pair on the
step's stream too: GPU idle waiting for data), the step time, and the ratio of
the waits. Exits 77 after saying "no GPU: skipped" where torch sees no CUDA
device or feedd has no GPU staging.

Usage: gpu_trainer.py [--build DIR] [--steps N] [--step-ms G] [--workers W] [--json FILE]
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402


def skip(why):
    print(f"gpu_trainer: no GPU: skipped ({why})")
    sys.exit(77)


def calibrate(torch, step_ms, dim=2048):
    """Matmuls per step so that one step takes about step_ms on this GPU."""
    a = torch.randn(dim, dim, device="cuda", dtype=torch.float16)
    b = torch.randn(dim, dim, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    n, t0 = 50, time.perf_counter()
    for _ in range(n):
        a @ b
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / n * 1e3
    return max(1, round(step_ms / per)), a, b


def run(torch, batches, k, a, b, steps):
    """The loop: take a batch (on the GPU), one step of k matmuls that reads it; returns per-step figures."""
    stream = torch.cuda.current_stream()
    waits, gpu_idle = [], []
    it = iter(batches)
    x = a
    prev_end = None
    t_loop = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(it)
        ids = batch["input_ids"]
        if ids.device.type != "cuda":
            ids = ids.to("cuda", non_blocking=True)
        waits.append(time.perf_counter() - t0)
        got = torch.cuda.Event(enable_timing=True)
        got.record(stream)
        # The step reads the batch (a reduction folded into the chain) and does its matmuls.
        s = ids[:, :8].float().sum() * 0
        x = a + s.half()
        for _ in range(k):
            x = x @ b
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        if prev_end is not None:
            gpu_idle.append((prev_end, got))
        prev_end = end
        del batch, ids
    torch.cuda.synchronize()
    wall = time.perf_counter() - t_loop
    idle_ms = [e0.elapsed_time(e1) for e0, e1 in gpu_idle]
    steady = slice(len(waits) // 5, None)
    w = waits[steady]
    gi = idle_ms[len(idle_ms) // 5:]
    return {
        "wait_ms": 1e3 * sum(w) / len(w),
        "gpu_gap_ms": sum(gi) / len(gi) if gi else 0.0,
        "step_ms": 1e3 * wall / steps,
    }


def main():
    ap = common.arg_parser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-ms", type=float, default=20.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=8)
    a, _ = ap.parse_known_args()
    build = Path(os.environ.get("FEEDD_BUILD_DIR", a.build))

    try:
        import torch
    except ImportError:
        skip("no torch")
    if not torch.cuda.is_available():
        skip("torch.cuda.is_available() is False")
    cfg = build / "config.h"
    if not cfg.exists() or "#define HAVE_CUDA 1" not in cfg.read_text():
        skip(f"feedd in {build} was built without CUDA (meson -Dcuda=enabled)")

    sys.path.insert(0, str(common.SRC / "client" / "python"))
    os.environ["FEEDD_BUILD_DIR"] = str(build)
    import feed
    import dataloader_baseline as peer

    tmp = Path(tempfile.mkdtemp(prefix="feedd-gpu-trainer-"))
    data = tmp / "data"
    common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "4000", "--mean-len", "800",
                              "--seed", "5"])
    L, B = a.seq_len, a.batch_size
    conf = (f"[feedd]\nthreads = 2\nring_slots = 8\n\n[feed.web]\nshards = {data}/shard_*.idx\nseq_len = {L}\n"
            f"batch_size = {B}\nseed = 1\nshuffle = true\nshuffle_window = 2\n")
    p, sock = common.start_feedd(build, conf, tmp, "feedd")
    try:
        st = feed.Loader("web", rank=0, world_size=1, socket=sock).status()
        if not st["daemon"]["gpu"].startswith("cuda"):
            skip(f"feedd has no GPU staging: {st['daemon']['gpu']}")
        k, ma, mb = calibrate(torch, a.step_ms)
        common.progress(f"step: {k} fp16 2048x2048 matmuls (~{a.step_ms:.0f} ms)")
        rows = []
        fl = feed.Loader("web", rank=0, world_size=1, socket=sock, device="cuda:0")
        r_feed = run(torch, fl, k, ma, mb, a.steps)
        gpu = next(c for c in fl.status()["clients"] if c["pid"] == os.getpid()).get("gpu") or {}
        fl.close()
        rows.append(["feedd, device='cuda:0'", r_feed["step_ms"], r_feed["wait_ms"], r_feed["gpu_gap_ms"],
                     gpu.get("h2d_gb_per_s"), 1.0])
        paths = sorted(str(x) for x in data.glob("shard_*.idx"))
        ds = peer.FeedDataset(paths, 1, True, 2, 1, 0, L, B, a.steps + 8)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=a.workers, pin_memory=True)
        r_peer = run(torch, dl, k, ma, mb, a.steps)
        rows.append([f"DataLoader, {a.workers} workers, pin_memory, non_blocking (peer)", r_peer["step_ms"],
                     r_peer["wait_ms"], r_peer["gpu_gap_ms"], None,
                     r_peer["wait_ms"] / r_feed["wait_ms"] if r_feed["wait_ms"] > 0 else None])
    finally:
        common.stop(p)

    res = {
        "title": "Trainer loop with a synthetic GPU step: data wait per step",
        "command": "bench/gpu_trainer/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(a.note) + f"; GPU {torch.cuda.get_device_name(0)}",
        "date": common.date(),
        "data": f"4 Megatron u16 shards, ~12.8 M tokens; batches of {B}x{L} tokens; {a.steps} steps",
        "cache": "warm (page cache)",
        "tables": [{
            "caption": f"step: {k} chained fp16 2048x2048 matmuls (~{a.step_ms:.0f} ms); first 20 % of steps dropped",
            "columns": ["loader", "step ms", "data wait ms/step (CPU)", "GPU gap ms/step", "H2D GB/s (feedd)",
                        "peer wait / feedd wait"],
            "rows": rows,
        }],
        "notes": ["data wait: CPU time in next() plus the .to() call; GPU gap: time between one step's last kernel "
                  "and the next batch being usable on the step's stream (CUDA events)"],
    }
    common.emit(res, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
