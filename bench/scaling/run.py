#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment 7: daemon throughput, cost per token and memory as clients, shards and documents grow.

Runs with Debian's /usr/bin/python3 and the build's daemon/feedd and
bench/scaling (one trainer rank; all ranks of a run start together). The
shards are page-cached. Three sweeps, each changing one thing:

  clients: 1 -> 8 ranks of one feed (rank i of world n), same shards, the
      same total number of batches split between them;
  shards: 1 -> 100 shards holding the same documents (same tokens);
  documents: 8 shards of 1,000 -> 40,000 documents each (the data grows).

Per run: aggregate tokens/s (all ranks' tokens over the time from the start
signal until the last rank is done), the daemon's CPU milliseconds per
million tokens (/proc/PID/stat) and the clients' own, and the daemon's
memory (/proc/PID/status, sampled every 20 ms while the ranks run: VmHWM; RssAnon, its own heap: shard
indexes, plans; RssShmem: the clients' rings it fills). The cost per token
must stay flat: every row prints its ratio to the first row of its sweep.

  bench/scaling/run.py [--build build] [--full] [--rounds 2] [--json out.json] [--note TEXT]
"""

import json
import os
import subprocess
import tempfile
import threading
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

B, L = 8, 4096
SIZES = {
    "default": {"clients": [1, 2, 4, 8], "shards": [1, 10, 100], "docs": [1000, 10000, 40000], "batches": 4000},
    "full": {"clients": [1, 2, 4, 8, 16, 32], "shards": [1, 10, 100, 1000], "docs": [1000, 10000, 100000, 400000],
             "batches": 20000},
}


def run(build, tmp, shards, clients, batches):
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\n[feed.b]\nshards = {shards}\nseq_len = {L}\n"
            f"batch_size = {B}\nseed = 1\nshuffle = true\nshuffle_window = 4\n")
    d, sock = common.start_feedd(build, conf, tmp)
    procs = []
    try:
        per = batches // clients
        for rank in range(clients):
            procs.append(subprocess.Popen([str(build / "bench/scaling"), sock, "b", str(rank), str(clients), str(per)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"scaling client exited with {p.wait()}")
        # Memory is sampled while the ranks run: their rings go when they detach.
        mem, done = {}, threading.Event()

        def sample():
            while not done.wait(0.02):
                for k, v in common.proc_mem(d.pid).items():
                    mem[k] = max(mem.get(k, 0), v)

        sampler = threading.Thread(target=sample)
        cpu0 = common.proc_cpu(d.pid)
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        sampler.start()
        outs = []
        try:
            for p in procs:
                outs.append(json.loads(p.stdout.readline()))
        finally:
            done.set()
            sampler.join()
        wall = time.perf_counter() - t0
        cpu = common.proc_cpu(d.pid) - cpu0
        for p in procs:
            if p.wait() != 0:
                raise RuntimeError(f"scaling client exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        common.stop(d)
    tokens = sum(o["tokens"] for o in outs)
    return {"tokens_per_s": tokens / wall, "daemon_ms_per_mtok": 1000 * cpu / (tokens / 1e6),
            "client_ms_per_mtok": 1000 * sum(o["cpu_s"] for o in outs) / (tokens / 1e6), "tokens": tokens, **mem}


def gen(tmp, name, shards, docs, mean_len=800):
    out = tmp / name
    common.gen_megatron.main([str(out), "--shards", str(shards), "--docs-per-shard", str(docs), "--mean-len",
                              str(mean_len), "--seed", "1"])
    files = sorted(str(p) for p in out.iterdir())
    common.warm(files)
    return f"{out}/shard_*.idx", sum(os.path.getsize(p) for p in files if p.endswith(".bin"))


def main():
    ap = common.arg_parser()
    a = ap.parse_args()
    build = Path(a.build).resolve()
    sz = SIZES["full" if a.full else "default"]
    total_docs = 24000

    tables, plot = [], {"kind": "lines", "series": []}
    with tempfile.TemporaryDirectory(prefix="feedd-bench-scale-", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        base, base_size = gen(tmp, "base", 8, total_docs // 8)
        sweeps = [("clients", "clients (ranks)", [(n, base, n, base_size) for n in sz["clients"]])]
        shard_runs = []
        for n in sz["shards"]:
            glob, size = gen(tmp, f"shards{n}", n, total_docs // n)
            shard_runs.append((n, glob, 1, size))
        sweeps.append(("shards", "shards", shard_runs))
        doc_runs = []
        for n in sz["docs"]:
            glob, size = gen(tmp, f"docs{n}", 8, n)
            doc_runs.append((8 * n, glob, 1, size))
        sweeps.append(("documents", "documents", doc_runs))

        for key, label, points in sweeps:
            res = {}
            for _ in range(a.rounds):
                for x, glob, clients, size in points:
                    r = run(build, tmp, glob, clients, sz["batches"])
                    res.setdefault(x, []).append(r)
                    common.progress(f"scaling: {key} {x}: {r['tokens_per_s'] / 1e6:.0f} M tokens/s, daemon "
                                    f"{r['daemon_ms_per_mtok']:.2f} CPU ms per M tokens, VmHWM {r['VmHWM']:.0f} MiB")
            sizes = {x: size for x, _, _, size in points}
            # Cost per token: the lowest of the rounds; throughput: the best; memory: the largest.
            agg = {x: {"tokens_per_s": max(r["tokens_per_s"] for r in v),
                       "daemon": min(r["daemon_ms_per_mtok"] for r in v),
                       "client": min(r["client_ms_per_mtok"] for r in v),
                       "hwm": max(r["VmHWM"] for r in v), "anon": max(r["RssAnon"] for r in v),
                       "shmem": max(r["RssShmem"] for r in v)} for x, v in res.items()}
            first = agg[points[0][0]]
            rows = [[f"{x:,}", f"{sizes[x] / 1e6:.0f} MB", v["tokens_per_s"],
                     common.ratio(v["tokens_per_s"], first["tokens_per_s"]), v["daemon"],
                     common.ratio(v["daemon"], first["daemon"]), v["client"], v["hwm"], v["anon"], v["shmem"]]
                    for x, v in agg.items()]
            tables.append({
                "caption": f"{label}: aggregate tokens/s (best of {a.rounds}), CPU ms per million tokens (lowest), "
                           f"daemon memory in MiB (largest); ratios to the first row",
                "columns": [label, ".bin", "tokens/s", "/ first", "daemon CPU ms/Mtok", "/ first",
                            "clients CPU ms/Mtok", "VmHWM", "RssAnon", "RssShmem"],
                "rows": rows,
            })
            plot["series"].append({"name": key, "x": [p[0] for p in points],
                                   "y": [agg[p[0]]["daemon"] for p in points]})

    res = {
        "experiment": "scaling",
        "title": "7. Scaling: clients, shards, documents",
        "command": "bench/scaling/run.py" + (" --full" if a.full else ""),
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": (f"generated Megatron shards (u16), mean 800 tokens a document; clients and shards sweeps: "
                 f"{total_docs:,} documents, {base_size / 1e6:.0f} MB; B = {B}, L = {L}, shuffled (window 4); "
                 f"feedd 2 threads, 4 ring slots a client; {sz['batches']} batches per run in all"),
        "cache": "warm: every file read before its sweep",
        "tables": tables,
        "notes": ["the goal is a flat daemon CPU per token (ratio near 1.00x); memory grows with the documents "
                  "(the .idx arrays are held in memory) and with the clients (one ring each, RssShmem)"],
        "plot": {**plot, "xlabel": "clients, shards or documents (log scale)",
                 "ylabel": "daemon CPU ms per million tokens"},
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
