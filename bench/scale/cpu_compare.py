#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Steady tokens/s and the daemon's CPU per batch, this build against a peer,
rounds alternating the two daemons (issue #22's feed on a shared machine,
where wall-clock tokens/s swings with other load and CPU time per batch
moves least).

  bench/scale/cpu_compare.py --peer /tmp/v01/build --shards 'DATA/m100000000-4/*.idx' [--shuffle false] [--rounds 5]

Each round: start the daemon, take 400 batches (warm-up), then BATCHES
batches with bench/consume, reading the daemon's CPU time from /proc
before and after. Prints one line per run and the best tokens/s, the
median and the least CPU per daemon.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--peer", default="/tmp/v01/build")
    ap.add_argument("--shards", required=True, help="the feed's shard glob (bench/scale/run.py writes them)")
    ap.add_argument("--shuffle", default="true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=1500)
    a = ap.parse_args()
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\n[feed.b]\nshards = {a.shards}\nseq_len = 2048\n"
            f"batch_size = 8\nseed = 1\nshuffle = {a.shuffle}\nshuffle_window = 4\n")
    res = {"this": [], "peer": []}
    for _ in range(a.rounds):
        for name, b in (("this", a.build), ("peer", a.peer)):
            with tempfile.TemporaryDirectory() as tmp:
                d, sock = common.start_feedd(b, conf, tmp)
                try:
                    common.consume(b, sock, "b", 400, daemon=d)
                    x = common.consume(b, sock, "b", a.batches, daemon=d)
                finally:
                    common.stop(d)
            res[name].append((x["tokens_per_s"], x["daemon_cpu_s"]))
            print(f"{name} {x['tokens_per_s'] / 1e6:.2f} M tokens/s, daemon CPU {x['daemon_cpu_s']:.2f} s "
                  f"for {a.batches} batches", flush=True)
    for name, v in res.items():
        tok = [t for t, _ in v]
        print(f"{name}: best {max(tok) / 1e6:.2f} M tokens/s, median {statistics.median(tok) / 1e6:.2f} M, "
              f"least daemon CPU {min(c for _, c in v):.2f} s")


if __name__ == "__main__":
    main()
