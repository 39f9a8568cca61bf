#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment: the first batch of a cold shuffled feed, two builds in alternating rounds (issue #22).

Runs with Debian's /usr/bin/python3. The shards are bench/scale/run.py's (written there when
missing: SHARDS synthetic Megatron shards of DOCS/SHARDS 8-token documents, .bin sparse). Each round
runs every build in turn, in rotating order, each on a cold page cache (posix_fadvise(DONTNEED) on
every shard file, checked with fincore; nothing else on the machine is dropped), then again at once
with what that run left cached ("after": the window's index pages the first batch read, not the whole
index); --states cached runs each build with every shard file read into the page cache first (as
run.py's page-cached runs). Per run: the load average at its start, ready and first batch from exec (as run.py measures
them), and the daemon's major page faults and bytes read from storage (/proc/PID/stat, /proc/PID/io)
when its first batch is received. The daemon is stopped after its first batch.

  bench/scale/cold.py --build build --build /tmp/cold2-main/build --names this,main \\
      --sizes 1000000000 --shards 40 --mem-cap 6144 --data DIR [--rounds 3] [--json out.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # run.py
import common  # noqa: E402
import run as scale  # noqa: E402


def drop(paths):
    """These files out of the page cache (only these); raises when fincore still finds 1 % of them."""
    common.evict(paths)
    resident = common.resident_bytes(paths)
    if resident is not None and resident > 0.01 * sum(os.path.getsize(p) for p in paths):
        raise RuntimeError(f"cache not cold: {resident} bytes of the shards still resident")
    return resident


def proc_io(pid):
    """(major faults, bytes read from storage) of process pid so far."""
    with open(f"/proc/{pid}/stat") as f:
        majflt = int(f.read().rsplit(")", 1)[1].split()[9])
    read = 0
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                read = int(line.split()[1])
    return majflt, read


def threads_io(pid):
    """{thread name: [MiB read from storage, major faults]} of process pid's threads (summed by name)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            comm = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
            majflt, read = proc_io(f"{pid}/task/{t}")
        except OSError:
            continue
        e = out.setdefault(comm, [0.0, 0])
        e[0] += read / 2**20
        e[1] += majflt
    return out


def first_batch(build, tmp, shards, shuffle, cap, steady_batches=0):
    """One daemon: ready, first batch, faults and bytes read at it; stopped after."""
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\n[feed.b]\nshards = {shards}\nseq_len = {scale.L}\n"
            f"batch_size = {scale.B}\nseed = 1\nshuffle = {'true' if shuffle else 'false'}\nshuffle_window = 4\n")
    load = os.getloadavg()[0]
    if cap:
        cap.start()
    try:
        t0 = time.monotonic()
        d, sock = common.start_feedd(build, conf, tmp, preexec_fn=cap.join if cap else None, wait_s=300)
        ready = time.monotonic() - t0
        try:
            r = subprocess.run([str(Path(build) / "bench/consume"), sock, "b", "1", "1", "0"], capture_output=True,
                               text=True)
            first = time.monotonic() - t0
            if r.returncode:
                raise RuntimeError(f"consume: {r.stderr}")
            majflt, read = proc_io(d.pid)
            threads = threads_io(d.pid)
            steady = common.consume(build, sock, "b", steady_batches, daemon=d)["tokens_per_s"] if steady_batches else None
        finally:
            common.stop(d)
    finally:
        if cap:
            cap.finish()
    return {"load": load, "ready_s": ready, "first_batch_s": first, "majflt": majflt, "read_mib": read / 2**20,
            "threads": threads, "steady_tok_s": steady}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="append", required=True, help="a build (repeat: the builds compared)")
    ap.add_argument("--names", default=None, help="their names, comma-separated")
    ap.add_argument("--data", required=True)
    ap.add_argument("--sizes", default="1000000000")
    ap.add_argument("--shards", type=int, default=40)
    ap.add_argument("--shuffle", default="on")
    ap.add_argument("--mem-cap", type=int, default=None, metavar="MIB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steady", type=int, default=0, metavar="N",
                    help="after the first batch, N batches more: tokens/s of a feed still being read cold")
    ap.add_argument("--states", default="cold,after", help="cold, after (a cold run's pages), cached (every file)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    builds = [Path(b) for b in a.build]
    names = a.names.split(",") if a.names else [str(b) for b in builds]
    cap = scale.MemCap(a.mem_cap) if a.mem_cap else None
    rows = []
    try:
        for n in [int(x) for x in a.sizes.split(",")]:
            folder = Path(a.data) / f"m{n}-{a.shards}"
            folder.mkdir(parents=True, exist_ok=True)
            common.progress(f"cold: writing {a.shards} shards of {n // a.shards} documents")
            for i in range(a.shards):
                scale.write_shard(folder / f"s{i:05d}", n // a.shards, drop_cache=True)
            paths = sorted(str(p) for p in folder.iterdir() if p.suffix in (".idx", ".bin"))
            for rnd in range(a.rounds):
                order = list(range(len(builds)))
                order = order[rnd % len(order):] + order[:rnd % len(order)]
                for bi in order:
                    for state in a.states.split(","):
                        if state == "cold":
                            drop(paths)
                        elif state == "cached":
                            common.warm(paths)
                        with tempfile.TemporaryDirectory() as tmp:
                            res = first_batch(builds[bi], tmp, str(folder / "*.idx"), a.shuffle == "on", cap, a.steady)
                        row = {"build": names[bi], "documents": n, "round": rnd, "cache": state, **res}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        if cap:
            cap.close()
    for n in sorted({r["documents"] for r in rows}):
        for state in a.states.split(","):
            for name in names:
                sel = [r for r in rows if r["documents"] == n and r["cache"] == state and r["build"] == name]
                if sel:
                    med = {k: statistics.median(r[k] or 0 for r in sel)
                           for k in ("first_batch_s", "majflt", "read_mib", "steady_tok_s")}
                    print(f"{n} {state} {name}: first batch " +
                          ", ".join(f"{r['first_batch_s']:.2f}" for r in sel) +
                          f" s (median {med['first_batch_s']:.2f}); steady tokens/s median {med['steady_tok_s'] / 1e6:.2f} M; ready " +
                          ", ".join(f"{r['ready_s']:.2f}" for r in sel) +
                          f"; major faults median {med['majflt']:.0f}; read median {med['read_mib']:.0f} MiB; load " +
                          ", ".join(f"{r['load']:.1f}" for r in sel))
    if a.json:
        Path(a.json).write_text(json.dumps({"command": "bench/scale/cold.py " + " ".join(sys.argv[1:]),
                                            "machine": common.machine(None), "date": common.date(),
                                            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
