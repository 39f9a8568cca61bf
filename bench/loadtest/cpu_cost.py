#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""feedd's own CPU per attach and per batch, this build against a peer build
(issue 18: on a saturated node every microsecond of feedd's is taken from the
trainers). Prints feedd's CPU seconds per 10,000 attaches and per 100,000
batches for each build, and the ratio this / peer.

Each round runs both builds one after the other (peer first, then this), each
with a feedd of its own on the load test's feed (bench/loadtest/run.py: 4 x
1024 tokens, shuffled), so that a machine whose load drifts weighs on both
alike; the figure of a build is its median over the rounds. Two phases a
round, feedd's CPU (/proc/PID/stat, all its threads) over each:

- attaches: --attach-clients threads of bench/lt-client attach, read
  nothing and leave, again and again, for --seconds: a connection, HELLO,
  ATTACH, the ring, its first fill (up to ring_slots batches produced, none
  read) and the detach. The figure includes that fill, as a real attach's
  cost does.
- batches: --batch-clients threads attach once and read back to back (no
  step) for --seconds.

Both builds are driven by this build's bench/lt-client (and its libfeed).

Usage: bench/loadtest/cpu_cost.py --peer-build DIR [--build DIR] [--rounds 3] [--seconds 10]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import shutil
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

CONF = ("[feedd]\nmax_connections_per_uid = 256\nmax_connections = 1024\n[feed.web]\nshards = {data}/shard_*.idx\n"
        "seq_len = 1024\nbatch_size = 4\nseed = 7\nshuffle = true\nshuffle_window = 2\nbos = none\neos = none\n")


def phase(build, client, data, tmp, clients, seconds, batches):
    """feedd CPU seconds and (batches read, attaches) for one phase on a fresh feedd of `build`, driven by
    `client` (one lt-client for both builds: the daemon is what is compared)."""
    daemon, sock = common.start_feedd(build, CONF.format(data=data), tmp, name="feedd-cost")
    try:
        cpu0 = common.proc_cpu(daemon.pid)
        out = subprocess.run([client, "trainers", sock, "web", str(clients),
                              str(seconds), str(batches), "0"], capture_output=True, text=True, check=True).stdout
        cpu = common.proc_cpu(daemon.pid) - cpu0
    finally:
        common.stop(daemon)
    got, failed, attaches = map(int, out.split())
    return cpu, got, attaches - failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(common.SRC / "build"))
    ap.add_argument("--peer-build", required=True, help="the build to compare with (e.g. main's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--attach-clients", type=int, default=16)
    ap.add_argument("--batch-clients", type=int, default=8)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="feedd-cpu-cost-"))
    builds = {"peer": a.peer_build, "this": a.build}
    client = str(Path(a.build) / "bench/lt-client")
    per_attach = {k: [] for k in builds}
    per_batch = {k: [] for k in builds}
    try:
        data = tmp / "data"
        common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                                  "--seed", "3"])
        for rnd in range(a.rounds):
            for name, build in builds.items():
                common.progress(f"cpu_cost: round {rnd + 1}/{a.rounds}, {name}")
                cpu, _, att = phase(build, client, data, tmp, a.attach_clients, a.seconds, 0)
                per_attach[name].append(cpu / max(att, 1) * 10000)
                cpu, got, _ = phase(build, client, data, tmp, a.batch_clients, a.seconds, 10 ** 9)
                per_batch[name].append(cpu / max(got, 1) * 100000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"# cpu_cost: {common.machine()}; {common.date()}; {a.rounds} rounds of {a.seconds:g} s a phase, "
          f"median; peer = {a.peer_build}, this = {a.build}")
    print(f"# attaches: {a.attach_clients} clients attach, read nothing, leave (the ring's first fill included); "
          f"batches: {a.batch_clients} clients read back to back; feedd CPU seconds (all threads)")
    print(f"{'':<34} {'peer':>8} {'this':>8} {'this/peer':>9}   rounds (peer | this)")
    for label, d in (("per 10,000 attaches", per_attach), ("per 100,000 batches", per_batch)):
        p, t = statistics.median(d["peer"]), statistics.median(d["this"])
        print(f"{'feedd CPU s ' + label:<34} {p:>8.2f} {t:>8.2f} {t / p:>9.3f}   "
              f"{' '.join(f'{x:.2f}' for x in d['peer'])} | {' '.join(f'{x:.2f}' for x in d['this'])}")


if __name__ == "__main__":
    main()
