#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""feedd's RSS after waves of clients that come and go (issue 18: RSS returns
to its start), for several allocator settings in the same run.

Each variant starts its own feedd (the same binary) with GLIBC_TUNABLES set
as given ("" = glibc's defaults, or feedd's own mallopt() when it makes
any), then runs --waves waves of --clients tests/integration/stream-client
processes at once (each reads --batches batches and leaves), asks
`feedctl status --json` during each wave, and prints RSS at the start, at
each wave's peak and 2.5 s after each wave (a tick or two: the server trims
after departures), and the open fds.

With --trace, feedd runs under BUILD/bench/heaptrace.so (bench/loadtest/heaptrace.c)
instead, and what is printed is the allocations made during the waves and still live after
them, by call stack (addr2line), largest groups first: what pins the heap (its RSS figures are
then the tracer's too).

Usage: bench/loadtest/rss_waves.py [--build DIR] [--waves N] [--clients N] [--variant TUNABLES]... [--trace]
"""

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / "scripts"))
sys.path.insert(0, str(SRC / "bench"))
import common  # noqa: E402
import gen_megatron  # noqa: E402


def rss_mib(pid, key="VmRSS"):
    return int([l for l in open(f"/proc/{pid}/status") if l.startswith(key + ":")][0].split()[1]) / 1024


def anon_regions(pid):
    """Anonymous RSS by region (/proc/PID/smaps): the main heap, 8 MiB thread stacks, 64 MiB malloc arenas
    (and their reserved rest), other mappings (mmapped chunks, rings' bookkeeping)."""
    out, cur = {}, None
    for line in open(f"/proc/{pid}/smaps"):
        f = line.split()
        if "-" in f[0] and ":" not in f[0]:
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            name = f[5] if len(f) > 5 else ""
            size = hi - lo
            if name == "[heap]":
                cur = "heap"
            elif name:
                cur = None
            elif size in (8 << 20, (8 << 20) + 4096) or size == 8 << 20:
                cur = "stacks"
            elif size >= 60 << 20 or (lo & ((64 << 20) - 1)) == 0 or ((hi & ((64 << 20) - 1)) == 0):
                cur = "arenas"
            else:
                cur = "other"
        elif cur and f[0] == "Anonymous:":
            out[cur] = out.get(cur, 0) + int(f[1])
    return " ".join(f"{k} {v / 1024:.2f}" for k, v in sorted(out.items()))


def rss_parts(pid):
    """Anonymous (the heap, stacks), file-backed (mapped shards, libraries) and shmem (rings) MiB."""
    return "/".join(f"{rss_mib(pid, k):.1f}" for k in ("RssAnon", "RssFile", "RssShmem"))


def traced(dump, top=12):
    """The blocks of heaptrace's dump made after its mark, grouped by call stack: (count, bytes, in the main heap,
    frames) of the largest groups."""
    lines = open(dump).read().split("\n")
    mark = int(lines[0].split()[1])
    maps, blocks = [], []
    for line in lines[1:]:
        f = line.split()
        if line.startswith("A ") and int(f[3]) > mark:
            blocks.append((int(f[1], 16), int(f[2]), tuple(int(x, 16) if x != "(nil)" else 0 for x in f[5:11])))
        elif line.startswith("M "):
            lo, hi = (int(x, 16) for x in f[1].split("-"))
            maps.append((lo, hi, int(f[3], 16), f[6] if len(f) > 6 else ""))
    heap = [(lo, hi) for lo, hi, _, name in maps if name == "[heap]"] or [(0, 0)]
    names = {}

    def name(a):
        if a not in names:
            names[a] = hex(a)
            for lo, hi, off, path in maps:
                if lo <= a < hi and path.startswith("/"):
                    base = min(m[0] - m[2] for m in maps if m[3] == path)
                    out = subprocess.run(["addr2line", "-f", "-s", "-e", path, hex(a - base - 1)], capture_output=True,
                                         text=True).stdout.split("\n")
                    names[a] = f"{out[0]} {out[1]}" if out[0] != "??" else f"{path.rsplit('/', 1)[-1]}+{a - base:#x}"
                    break
        return names[a]
    groups = collections.defaultdict(list)
    for b in blocks:
        groups[b[2]].append(b)
    rows = []
    for frames, g in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:top]:
        in_heap = sum(heap[0][0] <= b[0] < heap[0][1] for b in g)
        rows.append((len(g), sum(b[1] for b in g), in_heap, [name(a) for a in frames if a]))
    return len(blocks), rows


def run_variant(build, data, tmp, tunables, waves, clients, batches, trace=False):
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    if trace:
        env["LD_PRELOAD"] = str(build / "bench" / "heaptrace.so")
        env["HEAPTRACE_OUT"] = str(tmp / "heaptrace")
    d, sock = common.start_feedd(build, "[feedd]\nmax_connections = 4000\nmax_connections_per_uid = 4000\n"
                                 f"[feed.web]\nshards = {data}/shard_*.idx\nseq_len = 2048\nbatch_size = 8\n", tmp,
                                 env=env)
    try:
        time.sleep(0.5)
        start = rss_mib(d.pid)
        fds0 = len(os.listdir(f"/proc/{d.pid}/fd"))
        row = [f"{start:.1f}"]
        parts0 = rss_parts(d.pid)
        regions0 = anon_regions(d.pid)
        if trace:
            os.kill(d.pid, signal.SIGRTMIN + 3)  # the mark: what is allocated from here on
        for _ in range(waves):
            ps = [subprocess.Popen([str(build / "tests" / "integration" / "stream-client"), sock, "web", str(i % 8),
                                    "8", str(batches), "-", "200"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL) for i in range(clients)]
            time.sleep(1)
            subprocess.run([str(build / "client" / "feedctl" / "feedctl"), "--socket", sock, "status", "--json"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            peak = rss_mib(d.pid)
            for p in ps:
                p.wait(timeout=300)
            time.sleep(2.5)
            row.append(f"{peak:.1f}/{rss_mib(d.pid):.1f}")
        fds1 = len(os.listdir(f"/proc/{d.pid}/fd"))
        if trace:
            os.kill(d.pid, signal.SIGRTMIN + 4)  # dumped at feedd's next allocation: a STATUS makes some
            subprocess.run([str(build / "client" / "feedctl" / "feedctl"), "--socket", sock, "status", "--json"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
            for _ in range(100):
                if (tmp / "heaptrace.0").exists():
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            return traced(tmp / "heaptrace.0"), fds0, fds1
        row.append(f"  anon/file/shmem {parts0} -> {rss_parts(d.pid)}\n      anon MiB by region: {regions0} -> "
                   f"{anon_regions(d.pid)}")
        return row, fds0, fds1
    finally:
        d.terminate()
        d.wait(timeout=20)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, default=SRC / "build")
    ap.add_argument("--waves", type=int, default=4)
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--variant", action="append", help="a GLIBC_TUNABLES value; '' for the defaults")
    ap.add_argument("--trace", action="store_true", help="which allocations made during the waves stay (heaptrace.so)")
    a = ap.parse_args()
    variants = a.variant if a.variant is not None else [""]
    with tempfile.TemporaryDirectory() as t:
        data = Path(t) / "data"
        data.mkdir()
        gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                           "--empty-frac", "0.05", "--multi-seq-frac", "0.2", "--seed", "3"])
        print(f"{a.waves} waves of {a.clients} clients ({a.batches} batches each); RSS MiB: start, then peak/after "
              "for each wave")
        if a.trace:
            tmp = Path(t) / "trace"
            tmp.mkdir()
            (n, rows), fds0, fds1 = run_variant(a.build.resolve(), data, tmp, variants[0], a.waves, a.clients,
                                                a.batches, trace=True)
            print(f"{n} allocations made during the waves still live after them; the largest groups by call stack:")
            for count, size, in_heap, frames in rows:
                print(f"{count:7d} blocks, {size:9d} bytes, {in_heap:7d} in the main heap:")
                for f in frames:
                    print(f"          {f}")
            return
        for v in variants:
            tmp = Path(t) / f"v{variants.index(v)}"
            tmp.mkdir()
            row, fds0, fds1 = run_variant(a.build.resolve(), data, tmp, v, a.waves, a.clients, a.batches)
            print(f"{v or '(defaults)':60s} {' '.join(row)}   fds {fds0} -> {fds1}", flush=True)


if __name__ == "__main__":
    main()
