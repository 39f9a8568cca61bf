#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Spine benchmark: tokens/s delivered to one client, feedd vs PyTorch DataLoader.

Runs with Debian's /usr/bin/python3 (python3-torch, python3-numpy). Both sides
read the same shards (page-cached: each is read once before timing), produce
the same contract (docs/sample-order.md; B=8, L=4096, shuffled), in the same
run. The DataLoader is the best of num_workers 0, 1, 2 (bench/dataloader_baseline.py).
Also the latency of feed_client_next() when a batch is already waiting.

  bench/spine/run.py [--build build] [--threads 2] [--batches 600] [--json out.json]
"""

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / "scripts"))
import gen_megatron  # noqa: E402


def start_feedd(build, conf, sock, log):
    p = subprocess.Popen([str(build / "daemon/feedd"), "-c", str(conf), "-s", sock], stderr=open(log, "w"))
    for _ in range(400):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            return p
        except OSError:
            time.sleep(0.025)
    raise RuntimeError(open(log).read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(SRC / "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, default=600)
    ap.add_argument("--dl-batches", type=int, default=300)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternate feedd and DataLoader runs this many times; best of each")
    ap.add_argument("--json")
    a = ap.parse_args()
    build = Path(a.build).resolve()

    with tempfile.TemporaryDirectory(prefix="feedd-bench-") as tmp:
        tmp = Path(tmp)
        gen_megatron.main([str(tmp / "data"), "--shards", "8", "--docs-per-shard", "3000", "--mean-len", "800",
                           "--seed", "1"])
        for f in (tmp / "data").iterdir():
            f.read_bytes()  # page-cache the shards for both sides
        shards = f"{tmp}/data/shard_*.idx"
        conf = tmp / "feedd.conf"
        conf.write_text(f"[feedd]\nthreads = {a.threads}\nring_slots = 8\n[feed.b]\nshards = {shards}\n"
                        "seq_len = 4096\nbatch_size = 8\nseed = 1\nshuffle = true\nshuffle_window = 2\n")
        sock = str(tmp / "feedd.sock")
        runs, dl = [], {0: [], 1: [], 2: []}
        for _ in range(a.rounds):
            # Rounds alternate the two sides so that a noisy moment hurts both alike.
            d = start_feedd(build, conf, sock, tmp / "feedd.log")
            try:
                out = subprocess.run([str(build / "bench/consume"), sock, "b", str(a.batches), str(a.samples),
                                      "20"], capture_output=True, text=True, check=True).stdout
                runs.append(json.loads(out))
                out = subprocess.run([str(build / "bench/consume"), sock, "b", "8", str(a.samples), "1"],
                                     capture_output=True, text=True, check=True).stdout
                warm = json.loads(out)
            finally:
                d.send_signal(signal.SIGTERM)
                d.wait()
            for w in dl:
                out = subprocess.run(["/usr/bin/python3", str(SRC / "bench/dataloader_baseline.py"), "--shards",
                                      shards, "--seq-len", "4096", "--batch-size", "8", "--seed", "1", "--shuffle",
                                      "--window", "2", "--world", "1", "--rank", "0", "--workers", str(w),
                                      "--batches", str(a.dl_batches), "--json"],
                                     capture_output=True, text=True, check=True).stdout
                dl[w].append(json.loads(out.strip().splitlines()[-1]))
        feedd = max(runs, key=lambda r: r["tokens_per_s"])
        dl = {w: max(v, key=lambda r: r["tokens_per_s"]) for w, v in dl.items()}
        best_w = max(dl, key=lambda w: dl[w]["tokens_per_s"])
        best = dl[best_w]["tokens_per_s"]

    ratio = feedd["tokens_per_s"] / best
    res = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "feedd_threads": a.threads,
        "feedd": feedd,
        "feedd_warm": warm,
        "dataloader": {str(k): v["tokens_per_s"] for k, v in dl.items()},
        "dataloader_best_workers": best_w,
        "ratio": ratio,
    }
    print(f"spine: B=8 L=4096, 8 shards x 3000 docs, page-cached, {res['machine']}, {res['date']}, "
          f"best of {a.rounds} alternating rounds")
    print(f"  feedd ({a.threads} threads) : {feedd['tokens_per_s'] / 1e6:8.1f} M tokens/s")
    for w, v in dl.items():
        print(f"  DataLoader workers={w}  : {v['tokens_per_s'] / 1e6:8.1f} M tokens/s")
    print(f"  ratio feedd / best DataLoader (workers={best_w}): {ratio:.1f}x  (goal >= 20x)")
    for label, r in (("after 20 ms idle (cold)", feedd), ("after 1 ms idle (warm)", warm)):
        print(f"  next() with a batch waiting, {label}: p50 {r['next_p50_ns'] / 1000:.2f} us, "
              f"p99 {r['next_p99_ns'] / 1000:.2f} us, max {r['next_max_ns'] / 1000:.2f} us "
              f"(goal p50 <= 5 us, p99 <= 50 us)")
    print(f"  release(): p50 {feedd['release_p50_ns'] / 1000:.2f} us, p99 {feedd['release_p99_ns'] / 1000:.2f} us")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
