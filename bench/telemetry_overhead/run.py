#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What keeping the stage counters on costs (docs/telemetry.md).

One worker thread (so the daemon is the bottleneck), bench/consume taking
batches back to back, feedd with `[diagnosis] stage_counters = true` and
`false` in alternating runs on the same data; prints tokens/s of each and the
ratio on/off (the peer is counters off). The per-second sampling on the main
thread runs either way: it costs per second, not per batch.

Usage: telemetry_overhead.py [--build DIR] [--out result.json] [--rounds N]
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(common.SRC / "build"))
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=3000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="feedd-tmoverhead-"))
    data = tmp / "data"
    common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "500", "--mean-len", "600",
                              "--seed", "3"])
    B, L = 8, 2048  # small batches: the most counter updates per token
    res_tps = {True: [], False: []}
    res_cpu = {True: [], False: []}  # feedd CPU microseconds per batch: robust to a busy host, unlike wall time
    for r in range(a.rounds):
        for on in (True, False):
            conf = (f"[feedd]\nthreads = 1\n\n[diagnosis]\nstage_counters = {'true' if on else 'false'}\n\n"
                    f"[feed.web]\nshards = {data}/shard_*.idx\nseq_len = {L}\nbatch_size = {B}\n")
            p, sock = common.start_feedd(a.build, conf, tmp, f"r{r}{int(on)}")
            try:
                cpu0 = common.proc_cpu(p.pid)
                out = subprocess.run([str(Path(a.build) / "bench/consume"), sock, "web", str(a.batches), "0", "0"],
                                     capture_output=True, text=True, check=True).stdout
                res_cpu[on].append((common.proc_cpu(p.pid) - cpu0) / a.batches * 1e6)
            finally:
                common.stop(p)
            res_tps[on].append(json.loads(out)["tokens_per_s"])
            common.progress(f"round {r}: counters {'on' if on else 'off'}: {res_tps[on][-1] / 1e6:.1f} M tokens/s")
    on, off = statistics.median(res_tps[True]), statistics.median(res_tps[False])
    con, coff = statistics.median(res_cpu[True]), statistics.median(res_cpu[False])
    res = {
        "title": "Telemetry overhead: stage counters on vs off",
        "command": "bench/telemetry_overhead/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(),
        "date": common.date(),
        "data": f"4 Megatron u16 shards, ~1.2 M tokens; batches of {B}x{L}; 1 worker thread; {a.batches} batches a run",
        "cache": "warm (page cache)",
        "tables": [{
            "caption": f"median of {a.rounds} alternating runs each (bench/consume, back to back)",
            "columns": ["stage counters", "feedd CPU us/batch", "ratio vs off", "tokens/s", "ratio vs off"],
            "rows": [["on (default)", con, common.ratio(con, coff), on, common.ratio(on, off)],
                     ["off (peer)", coff, common.ratio(coff, coff), off, common.ratio(off, off)]],
        }],
        "notes": ["CPU per batch is feedd's user+system time over the run (clock ticks: 10 ms resolution, hence "
                  "thousands of batches) divided by the batches; wall-clock tokens/s swings with the host's load",
                  f"CPU us/batch, on: {[round(x, 1) for x in res_cpu[True]]}, off: {[round(x, 1) for x in res_cpu[False]]}",
                  f"all runs, on: {[round(x / 1e6, 1) for x in res_tps[True]]} M tokens/s, "
                  f"off: {[round(x / 1e6, 1) for x in res_tps[False]]}"],
    }
    common.emit(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
