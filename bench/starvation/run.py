#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment 3: the seed's starvation experiment ("The Data Journey"), with feedd's own diagnosis.

A trainer whose step takes G (a sleep: the GPU works while the CPU is free)
reads from a feed whose per-batch cost C on one worker thread exceeds G, and
on two threads does not (C/2 < G; this machine has 2 cores). For each thread
count it prints the data wait per step and the GPU-idle fraction, and checks
that feedd's diagnosis agrees with what the trainer measured on its own clock.

The feed: JSONL text tokenized online with cl100k_base when the tokenizer data
of scripts/fetch-tok-data.sh is there (the seed's case: a tokenizer that
cannot keep up), else Megatron shards with large batches (packing is the
cost). C is measured first (one thread, a client that takes batches back to
back: the workers' CPU time per batch, from feedd's run-queue counters and
batch rate, so that a loaded host does not inflate it); G = 0.7 C.

The check, per thread count (exit status 1 when one fails):
- the verdict must match the trainer's own GPU-idle share I: I below half the
  starved threshold S must be "compute-bound", I above 2 S "starved"; between
  S/2 and 2 S either is accepted, because the trainer's clock also counts the
  Python work inside next() that libfeed does not, a few hundred µs on a
  loaded host;
- a "starved" verdict must name a cause its own figures support: "host" only
  with the workers' run-queue share at or above host_pct, a stage only with
  the workers busy at or above busy_pct, "latency" only below it, "storage"
  never "storage" (the shards are in the page cache);
- with one thread on a host that is not oversubscribed the cause must be a
  stage (the design makes one thread too slow), and with two threads a stage
  is accepted only when the job time per batch measured in that run, spread
  over both threads, exceeds the step (the host slowed feedd's threads down
  without queueing them: the numbers then say it is too slow).
A loaded host legitimately turns the two-thread case into "starved: host CPUs
oversubscribed" or lengthens the one-thread wait; a wrong rule or threshold
fails the check.

Usage: starvation.py [--build DIR] [--out result.json] [--seconds S] [--megatron]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

TOKDATA = Path(os.environ.get("FEEDD_TOKDATA", common.SRC / "build" / "tokdata"))
STAGES = ("read", "decompress", "tokenize", "pack", "h2d", "job")


def status(build, sock):
    out = subprocess.run([str(Path(build) / "client/feedctl/feedctl"), "-s", sock, "status", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def text_data(tmp, max_bytes=12 << 20):
    """JSONL of the corpus's documents (Debian reST sources), up to max_bytes of text; None without the data."""
    corpus, idx = TOKDATA / "corpus.txt", TOKDATA / "corpus.idx"
    ranks = TOKDATA / "ranks" / "cl100k_base.tiktoken"
    if not (corpus.exists() and idx.exists() and ranks.exists()):
        return None
    out = tmp / "text"
    out.mkdir()
    text = corpus.read_bytes()
    at, n, shard, lines = 0, 0, 0, []
    for size in (int(x) for x in idx.read_text().split()):
        doc = text[at:at + size].decode("utf-8", errors="replace")
        at += size
        lines.append(json.dumps({"text": doc}))
        n += size
        if len(lines) == 200 or n >= max_bytes:
            (out / f"s{shard:02d}.jsonl").write_text("\n".join(lines) + "\n")
            shard, lines = shard + 1, []
        if n >= max_bytes:
            break
    if lines:
        (out / f"s{shard:02d}.jsonl").write_text("\n".join(lines) + "\n")
    desc = (f"{n / 1e6:.1f} MB of Debian reST documentation as JSONL, tokenized online with cl100k_base; "
            f"batches of 32x2048 tokens")
    feed = (f"format = jsonl\nshards = {out}/s*.jsonl\ntokenizer = {ranks}\ntokenizer_preset = cl100k_base\n"
            f"eos = <|endoftext|>\nseq_len = 2048\nbatch_size = 32\n")
    return feed, desc


def megatron_data(tmp):
    data = tmp / "data"
    common.gen_megatron.main([str(data), "--shards", "4", "--docs-per-shard", "4000", "--mean-len", "600",
                              "--seed", "3"])
    return (f"shards = {data}/shard_*.idx\nseq_len = 16384\nbatch_size = 64\n",
            "4 Megatron u16 shards, ~9.6 M tokens; batches of 64x16384 tokens (packing is the cost)")


def conf(feed, threads):
    return (f"[feedd]\nthreads = {threads}\nring_slots = 8\n\n[diagnosis]\nwindow_s = 10\n\n"
            f"[feed.big]\n{feed}")


def train(build, sock, step_s, seconds):
    """The trainer: next(), a step of step_s (sleep), report(); returns its waits and feedd's status at the end."""
    sys.path.insert(0, str(common.SRC / "client" / "python"))
    os.environ.setdefault("FEEDD_BUILD_DIR", str(build))
    import feed
    loader = feed.Loader("big", rank=0, world_size=1, socket=sock, as_numpy=True)
    waits, t_end = [], time.monotonic() + seconds
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        b = next(loader)
        waits.append(time.monotonic() - t0)
        time.sleep(step_s)
        del b
        loader.report(step_time=step_s)
    st = status(build, sock)
    loader.close()
    return waits, st


def judge(threads, idle_pct, step_ms, st):
    """Whether feedd's verdict is right given the trainer's idle share and feedd's own figures: (ok, why)."""
    th = st["telemetry"]["thresholds"]
    host = st["telemetry"].get("host", {})
    runq = host.get("runqueue_pct")
    dg = st["clients"][0]["diagnosis"]
    stages = st["feeds"][0]["stages"]
    S = th["starved_pct"]
    if dg["kind"] not in ("starved", "compute-bound"):
        return False, f"verdict {dg['kind']} is neither starved nor compute-bound"
    if idle_pct < S / 2 and dg["kind"] != "compute-bound":
        return False, f"the trainer idled {idle_pct:.1f} % (< {S / 2:g}) but feedd says {dg['kind']}"
    if idle_pct >= 2 * S and dg["kind"] != "starved":
        return False, f"the trainer idled {idle_pct:.1f} % (>= {2 * S:g}) but feedd says {dg['kind']}"
    if dg["kind"] != "starved":
        return True, "compute-bound, as the trainer saw"
    cause = dg["cause"]
    busy = st["telemetry"]["pool_busy_pct"]
    if cause == "host":
        if runq is None or runq < th["host_pct"]:
            return False, f"blamed on the host with a run-queue share of {runq} (< {th['host_pct']})"
        return True, f"host oversubscribed: run queue {runq:.0f} %"
    if cause == "storage":
        return False, "storage blamed, but every shard is in the page cache"
    if cause == "latency":
        if busy >= th["busy_pct"]:
            return False, f"latency blamed with workers busy {busy:.0f} % (>= {th['busy_pct']})"
        return True, "latency"
    if cause not in STAGES:
        return False, f"unknown cause {cause!r}"
    if busy < th["busy_pct"]:
        return False, f"stage {cause} blamed with workers busy only {busy:.0f} %"
    if threads > 1:
        per = stages["workers"]["ms_per_batch"] or 0
        if per / threads < step_ms:
            return False, (f"{threads} threads blamed on {cause}, but a batch costs {per:.1f} ms of one thread, "
                           f"{per / threads:.1f} ms spread over {threads}, less than the {step_ms:.1f} ms step")
    return True, f"{cause}-bound with workers busy {busy:.0f} %"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("FEEDD_BUILD_DIR", str(common.SRC / "build")))
    ap.add_argument("--out")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--megatron", action="store_true", help="use Megatron shards even with tokenizer data")
    a, _ = ap.parse_known_args()  # bench/run.sh passes the harness's common options

    tmp = Path(tempfile.mkdtemp(prefix="feedd-starvation-"))
    picked = None if a.megatron else text_data(tmp)
    feed_conf, data_desc = picked or megatron_data(tmp)

    # C: the cost of one batch on one thread, as feedd's job counter measures it.
    common.progress("measuring the per-batch cost on one thread")
    p, sock = common.start_feedd(a.build, conf(feed_conf, 1), tmp, "probe")
    try:
        _, st = train(a.build, sock, 0.0, 5)
    finally:
        common.stop(p)
    # CPU time, not wall time: on a loaded host a job's wall time includes waiting for a CPU.
    stages, host = st["feeds"][0]["stages"], st["telemetry"]["host"]
    if host.get("workers_cpu_per_s") and stages["job"]["items_per_s"]:
        cost_ms = 1e3 * host["workers_cpu_per_s"] / stages["job"]["items_per_s"]
    else:
        cost_ms = stages["workers"]["ms_per_batch"]
    step_ms = 0.7 * cost_ms

    rows, ok = [], True
    for threads in (1, 2):
        common.progress(f"threads={threads}: trainer step {step_ms:.1f} ms for {a.seconds:.0f} s")
        p, sock = common.start_feedd(a.build, conf(feed_conf, threads), tmp, f"t{threads}")
        try:
            waits, st = train(a.build, sock, step_ms / 1e3, a.seconds)
        finally:
            common.stop(p)
        c = st["clients"][0]
        w = c["telemetry"]["window"]
        dg = c["diagnosis"]
        # The trainer's own figures, over the steady state (the first ring fill is free).
        steady = waits[len(waits) // 4:]
        wait_ms = 1e3 * sum(steady) / len(steady)
        idle = 100 * wait_ms / (wait_ms + step_ms)
        right, why = judge(threads, idle, w["step"]["mean_ms"] or step_ms, st)
        ok &= right
        host = st["telemetry"].get("host", {})
        rows.append([f"{threads} thread{'s' if threads > 1 else ''}", w["step"]["mean_ms"], wait_ms, idle,
                     w["stall_pct"], st["telemetry"]["pool_busy_pct"], host.get("runqueue_pct"),
                     host.get("load_avg"), dg["text"], ("yes: " if right else "NO: ") + why])

    res = {
        "title": "Starvation: a feed slower than the step on 1 thread, faster on 2",
        "command": "bench/starvation/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(),
        "date": common.date(),
        "data": data_desc + "; ring_slots 8",
        "cache": "warm (page cache)",
        "tables": [{
            "caption": f"per-batch cost on one thread C = {cost_ms:.1f} ms (feedd's workers' CPU time per batch); step G = 0.7 C",
            "columns": ["feed threads", "step ms (measured)", "data wait ms/step", "GPU idle %", "feedd stall %",
                        "workers busy %", "workers' run-queue %", "load avg", "feedd diagnosis",
                        "agrees with the trainer"],
            "rows": rows,
        }],
        "notes": ["GPU idle % = wait / (wait + G), from the trainer's own clock; feedd stall % is the daemon's "
                  "window figure from the same run; step ms is what feedd saw between next() calls (a sleep of G "
                  "oversleeps on a loaded host)",
                  "workers' run-queue %: of the time feedd's workers could run, the share they waited for a CPU "
                  "(/proc/self/task/*/schedstat); at host_pct or more a starved client is blamed on the host",
                  "the step is a sleep: a GPU step leaves the host CPUs to the feed"],
    }
    common.emit(res, a.out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
