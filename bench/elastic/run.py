#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The cost of being elastic (issue 25, docs/sample-order.md section 17).

1. Throughput and memory, in the same run, of one feed read by R ranks
   (R parallel clients, tests/integration/stream-client, each taking N
   batches back to back) configured three ways: no virtual ranks (today's
   stream per rank, the peer), virtual_ranks = R (the elastic path with one
   stream per rank: the cost of composing rows) and virtual_ranks = 1024
   (1024 / R streams per rank: the cost of being able to resize to any
   world up to 1024). feedd's CPU time per batch (all its threads, from
   /proc/PID/task/*/schedstat; the clients hash every
   batch, so the wall-clock rate is theirs, and noisy on a shared VM),
   tokens/s over all ranks, feedd's peak and anonymous memory, and the
   state's length after the last batch.
2. virtual_ranks = 1024: what attaching costs (time to ATTACH_REPLY, which
   builds every served stream, and feedd's memory) when a rank serves
   1024 / R streams.
3. Resume latency: a global state merged from 4 ranks after 70 batches
   (virtual_ranks = 1024, every stream with an entry: about 20 KB), attached
   by rank 0 of R' = 1 .. 64: time from starting the client to its first
   batch, against a fresh start.

Scaled down for a small VM (--full: more data and batches); every rank is a
process of its own, so on 2 CPUs the clients compete with feedd.

Usage: bench/elastic/run.py [--build DIR] [--full]
"""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

L, B = 2048, 8


def conf(shards, vranks, batch_size=B):
    return (f"[feed.f]\nshards = {shards}/shard_*.idx\nseq_len = {L}\nbatch_size = {batch_size}\nseed = 1\n"
            f"shuffle = true\nshuffle_window = 2\neos = 0\nvirtual_ranks = {vranks}\n")


def client(build, sock, rank, world, n, cursor=None):
    exe = Path(build) / "tests/integration/stream-client"
    return subprocess.Popen([str(exe), sock, "f", str(rank), str(world), str(n), cursor or "-", "0", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(p):
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"stream-client failed: {err.strip()}")
    return [ln.split() for ln in out.splitlines() if ln.startswith("batch ")]


def cpu_ns(pid):
    """CPU seconds of every thread of a live process, from /proc/PID/task/*/schedstat (ns, not 10 ms ticks)."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def throughput(build, tmp, shards, world, vranks, n):
    d, sock = common.start_feedd(build, conf(shards, vranks), tmp, name=f"t{world}-{vranks}")
    try:
        cpu0 = cpu_ns(d.pid)
        t0 = time.monotonic()
        ps = [client(build, sock, r, world, n) for r in range(world)]
        outs = [lines(p) for p in ps]
        got = sum(len(o) for o in outs)
        wall = time.monotonic() - t0
        mem = common.proc_mem(d.pid)
        state = len(outs[0][-1][4]) if outs[0][-1][4:] else 0
        return got * B * L / wall, cpu_ns(d.pid) - cpu0, mem["VmHWM"], mem["RssAnon"], state
    finally:
        common.stop(d)


def attach_time(build, sock, rank, world):
    """Seconds from starting a client to its ATTACH_REPLY (the session and its streams built)."""
    t0 = time.monotonic()
    p = client(build, sock, rank, world, 1)
    for ln in p.stdout:
        if ln.startswith("attached"):
            t = time.monotonic() - t0
            break
    else:
        raise RuntimeError(f"attach failed: {p.stderr.read().strip()}")
    p.kill()
    p.wait()
    return t


def first_batch(build, sock, rank, world, cursor=None, n=1):
    t0 = time.monotonic()
    ls = lines(client(build, sock, rank, world, n, cursor))
    return time.monotonic() - t0, ls[-1][4]


def main():
    ap = common.arg_parser()
    ap.add_argument("--before", help="a build of an earlier feedd: section 1 adds its virtual_ranks = 1024 row, same run")
    ap.add_argument("--sections", default="123", help="which sections to run (default 123)")
    args = ap.parse_args()
    build = args.build
    n_docs, n = (8000, 3000) if args.full else (2000, 1000)
    with tempfile.TemporaryDirectory() as tmp:
        shards = Path(tmp) / "data"
        common.gen_megatron.main([str(shards), "--shards", "8", "--docs-per-shard", str(n_docs), "--mean-len", "500",
                                  "--seed", "5"])
        print(f"# bench/elastic, {common.date()}; {common.machine(args.note)}")
        print(f"# data: 8 Megatron shards x {n_docs} documents (mean 500 tokens, u16), page cache warm; "
              f"seq_len {L}, batch_size {B}, shuffle")
        print()
        if "1" in args.sections:
            section1(args, build, tmp, shards, n)
        if "2" in args.sections:
            section2(build, tmp, shards)
        if "3" in args.sections:
            section3(build, tmp, shards)


def section1(args, build, tmp, shards, n):
    """Throughput and memory of the three configurations (and an earlier build's V = 1024: --before)."""
    if True:
        print("## 1. Throughput and memory: R ranks, each taking", n, "batches; the least CPU of",
              max(args.rounds, 1), "rounds")
        print()
        print("| R | configuration | feedd CPU ms per 100 batches | ratio | Mtokens/s, all ranks (wall) | "
              "feedd peak MiB | feedd anon MiB | cursor characters |")
        print("|---|---|---|---|---|---|---|---|")
        for world in ((1, 2, 4, 8) if args.full else (1, 2, 4)):
            peer = None
            rows = [("no virtual ranks (peer)", 0, build), ("virtual_ranks = R", world, build),
                    ("virtual_ranks = 1024", 1024, build)]
            if args.before:
                rows.append(("virtual_ranks = 1024, before (--before)", 1024, args.before))
            # Rounds interleave the configurations; each keeps its least CPU (the others' load only adds).
            best = {}
            for _ in range(max(args.rounds, 1)):
                for label, v, b in rows:
                    m = throughput(b, tmp, shards, world, v, n)
                    if label not in best or m[1] < best[label][1]:
                        best[label] = m
            for label, v, b in rows:
                tps, cpu, hwm, anon, state = best[label]
                per100 = cpu * 1e3 * 100 / (n * world)
                peer = peer or per100
                print(f"| {world} | {label} | {per100:.2f} | {per100 / peer:.2f} | {tps / 1e6:.1f} | {hwm:.1f} | "
                      f"{anon:.1f} | {state} |", flush=True)
        print()


def section2(build, tmp, shards):
    """Attach cost with virtual_ranks = 1024."""
    if True:
        print("## 2. virtual_ranks = 1024: attaching and feedd's memory")
        print()
        print("| R | streams per rank | attach s | feedd anon MiB after | peer (no virtual ranks) attach s |")
        print("|---|---|---|---|---|")
        for world in (1, 8, 64, 1024):
            d, sock = common.start_feedd(build, conf(shards, 1024), tmp, name=f"v1024-{world}")
            p, psock = common.start_feedd(build, conf(shards, 0), tmp, name=f"peer-{world}")
            try:
                t = attach_time(build, sock, 0, world)
                anon = common.proc_mem(d.pid)["RssAnon"]
                tp = attach_time(build, psock, 0, world)
                print(f"| {world} | {(1024 + world - 1) // world} | {t:.3f} | {anon:.1f} | {tp:.3f} |", flush=True)
            finally:
                common.stop(d)
                common.stop(p)
        print()


def section3(build, tmp, shards):
    """Resume latency from a merged state."""
    if True:
        print("## 3. Resume latency: a state merged from 4 ranks, attached as rank 0 of R' (virtual_ranks = 1024)")
        print()
        os.environ.setdefault("FEEDD_BUILD_DIR", str(build))
        sys.path.insert(0, str(common.SRC / "client" / "python"))
        import feed
        d, sock = common.start_feedd(build, conf(shards, 1024, batch_size=4), tmp, name="resume")
        try:
            # 70 batches of 4 rows: every one of a rank's 256 streams has delivered a row, a full-size state.
            states = [first_batch(build, sock, r, 4, n=70)[1] for r in range(4)]
            t0 = time.monotonic()
            merged = feed.merge_states(states)
            merge_s = time.monotonic() - t0
            print(f"merge_states of 4 states: {merge_s * 1e3:.2f} ms; merged state {len(merged)} characters")
            print()
            print("| R' | streams of rank 0 | attach to first batch s | fresh start s |")
            print("|---|---|---|---|")
            for world in (1, 2, 4, 8, 16, 32, 64):
                t, _ = first_batch(build, sock, 0, world, merged)
                f, _ = first_batch(build, sock, 0, world)
                print(f"| {world} | {(1024 + world - 1) // world} | {t:.3f} | {f:.3f} |", flush=True)
        finally:
            common.stop(d)


if __name__ == "__main__":
    main()
