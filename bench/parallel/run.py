#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment 2: loader parallelism, PyTorch DataLoader with 0/1/2 workers vs feedd with 1/2 threads.

Runs with Debian's /usr/bin/python3 (python3-torch, python3-numpy) and the
build's daemon/feedd and bench/consume. Same shards (page-cached), same
contract (docs/sample-order.md: B = 8, L = 4096, seed 1, shuffled), same run,
rounds alternating the sides. Per loader: tokens/s delivered to one
consumer, and CPU seconds per million tokens, counting every process that
does the work:

  DataLoader: the loading process and its worker processes (getrusage of
      itself and its reaped children, from the first batch asked for until
      the workers have been joined), measured in a child process of its own
      (this script with --dl-child);
  feedd: the daemon (utime + stime from /proc/PID/stat, from before the
      client connects until it has taken its last batch) plus the client
      (bench/consume, getrusage of the reaped child).

  bench/parallel/run.py [--build build] [--full] [--rounds 2] [--json out.json] [--note TEXT]
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common

B, L = 8, 4096
SIZES = {"default": (8, 3000, 2000, 300), "full": (32, 10000, 10000, 1500)}  # shards, docs, feedd/DL batches


def dl_child(a):
    """Runs one DataLoader in this process; prints tokens/s and CPU seconds (self + workers)."""
    spec = importlib.util.spec_from_file_location("dataloader_baseline", common.SRC / "bench/dataloader_baseline.py")
    dlb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dlb)
    paths = dlb.feed_ref.expand_globs([a.shards])
    loader = dlb.make_loader(paths, 1, True, 2, 1, 0, L, B, a.batches, a.dl_child)
    cpu0 = common.self_cpu() + common.children_cpu()
    t0 = time.perf_counter()
    it = iter(loader)
    n = 0
    for batch in it:
        int(batch["input_ids"][-1, -1])  # touch, as the feedd client does
        n += 1
    secs = time.perf_counter() - t0
    del batch
    it._shutdown_workers() if hasattr(it, "_shutdown_workers") else None
    del it
    cpu = common.self_cpu() + common.children_cpu() - cpu0
    print(json.dumps({"tokens_per_s": n * B * L / secs, "cpu_s": cpu, "tokens": n * B * L, "seconds": secs}))


def run_dl(shards, workers, batches):
    out = subprocess.run(["/usr/bin/python3", __file__, "--dl-child", str(workers), "--shards", shards,
                          "--batches", str(batches)], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_feedd(build, tmp, shards, threads, batches):
    conf = (f"[feedd]\nthreads = {threads}\nring_slots = 8\n[feed.b]\nshards = {shards}\nseq_len = {L}\n"
            f"batch_size = {B}\nseed = 1\nshuffle = true\nshuffle_window = 2\n")
    d, sock = common.start_feedd(build, conf, tmp)
    try:
        r = common.consume(build, sock, "b", batches, daemon=d)
    finally:
        common.stop(d)
    return {"tokens_per_s": r["tokens_per_s"], "cpu_s": r["cpu_s"], "daemon_cpu_s": r["daemon_cpu_s"],
            "tokens": batches * B * L, "seconds": r["seconds"]}


def main():
    ap = common.arg_parser()
    ap.add_argument("--dl-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--shards", help=argparse.SUPPRESS)
    ap.add_argument("--batches", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.dl_child is not None:
        return dl_child(a)
    build = Path(a.build).resolve()
    n_shards, docs, f_batches, dl_batches = SIZES["full" if a.full else "default"]

    sides = [("DataLoader, num_workers=0", "dl", 0), ("DataLoader, num_workers=1", "dl", 1),
             ("DataLoader, num_workers=2", "dl", 2), ("feedd, 1 thread", "feedd", 1),
             ("feedd, 2 threads", "feedd", 2)]
    runs = {name: [] for name, _, _ in sides}
    with tempfile.TemporaryDirectory(prefix="feedd-bench-par-", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        common.gen_megatron.main([str(tmp / "data"), "--shards", str(n_shards), "--docs-per-shard", str(docs),
                                  "--mean-len", "800", "--seed", "1"])
        files = sorted(str(p) for p in (tmp / "data").iterdir())
        common.warm(files)
        size = sum(os.path.getsize(p) for p in files if p.endswith(".bin"))
        shards = f"{tmp}/data/shard_*.idx"
        for _ in range(a.rounds):
            for name, kind, n in sides:
                r = run_dl(shards, n, dl_batches) if kind == "dl" else run_feedd(build, tmp, shards, n, f_batches)
                r["cpu_ms_per_mtok"] = 1000 * r["cpu_s"] / (r["tokens"] / 1e6)
                runs[name].append(r)
                common.progress(f"parallel: {name}: {r['tokens_per_s'] / 1e6:.1f} M tokens/s, "
                                f"{r['cpu_ms_per_mtok']:.1f} CPU ms per M tokens")
        resident = common.resident_bytes(files)

    best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
    # CPU per token: the lowest of the rounds (the least disturbed by other load).
    cpu = {k: min(r["cpu_ms_per_mtok"] for r in v) for k, v in runs.items()}
    dl_best = max((k for k in best if k.startswith("DataLoader")), key=lambda k: best[k]["tokens_per_s"])
    peer_tps, peer_cpu = best[dl_best]["tokens_per_s"], cpu["DataLoader, num_workers=0"]
    rows = [[k, best[k]["tokens_per_s"], common.ratio(best[k]["tokens_per_s"], peer_tps), cpu[k],
             common.ratio(cpu[k], peer_cpu)] for k in best]
    f2, f1 = best["feedd, 2 threads"]["tokens_per_s"], best["feedd, 1 thread"]["tokens_per_s"]
    res = {
        "experiment": "parallel",
        "title": "2. Loader parallelism: DataLoader workers vs feedd threads",
        "command": "bench/parallel/run.py" + (" --full" if a.full else ""),
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": (f"{n_shards} Megatron shards (u16), {n_shards * docs:,} documents, mean 800 tokens, "
                 f"{size / 1e6:.0f} MB; B = {B}, L = {L}, shuffled (window 2); feedd {f_batches} batches, "
                 f"DataLoader {dl_batches} batches per run"),
        "cache": f"warm: every file read before timing ({resident if resident is not None else '?'} bytes "
                 f"resident at the end)",
        "tables": [{
            "caption": f"tokens/s to one consumer (best of {a.rounds} alternating rounds) and CPU milliseconds per "
                       f"million tokens of every process doing the work (lowest of the rounds); peers: the best "
                       f"DataLoader ({dl_best}) for speed, num_workers=0 for CPU",
            "columns": ["loader", "tokens/s", "/ best DataLoader", "CPU ms / M tokens", "/ DataLoader(0)"],
            "rows": rows,
        }],
        "notes": [f"feedd 2 threads / 1 thread: {f2 / f1:.2f}x on {os.cpu_count()} CPUs shared with the client"],
        "plot": {"kind": "barh", "xlabel": "M tokens/s (page-cached)", "labels": [r[0] for r in rows],
                 "values": [r[1] / 1e6 for r in rows]},
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
