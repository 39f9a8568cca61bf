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

Usage: bench/loadtest/rss_waves.py [--build DIR] [--waves N] [--clients N] [--variant TUNABLES]...
"""

import argparse
import os
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


def run_variant(build, data, tmp, tunables, waves, clients, batches):
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
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
    a = ap.parse_args()
    variants = a.variant if a.variant is not None else [""]
    with tempfile.TemporaryDirectory() as t:
        data = Path(t) / "data"
        data.mkdir()
        gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                           "--empty-frac", "0.05", "--multi-seq-frac", "0.2", "--seed", "3"])
        print(f"{a.waves} waves of {a.clients} clients ({a.batches} batches each); RSS MiB: start, then peak/after "
              "for each wave")
        for v in variants:
            tmp = Path(t) / f"v{variants.index(v)}"
            tmp.mkdir()
            row, fds0, fds1 = run_variant(a.build.resolve(), data, tmp, v, a.waves, a.clients, a.batches)
            print(f"{v or '(defaults)':60s} {' '.join(row)}   fds {fds0} -> {fds1}", flush=True)


if __name__ == "__main__":
    main()
