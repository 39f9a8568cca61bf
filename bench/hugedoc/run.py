#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Huge documents (issue #18, finding 9): time to the first batch and feedd's
peak RSS for one document of 32/128/512 MB, this build against a peer build
(main) in the same run, with the ratio.

Two documents per size, in JSONL, with the small byte-level BPE
tokenizer.json of tests/integration/test_huge_document.py (no fetched data):
one word of 'a's (merged in 256 KiB chunks) and words full of JSON escapes
and multibyte UTF-8. Each build gets a fresh feedd per document: started,
asked for one batch (`feedctl dump --batches 1`), its VmHWM read; then a
second feed over the same document (seq_len 16384, batch_size 4) streams
one whole epoch, every id of the document (tests/integration/stream-client,
until the first batch of epoch 1: "epoch" columns, its CPU the daemon's for
that epoch, its peak the whole process's VmHWM by then); stopped.
The peak is feedd's whole process (the idle daemon is printed beside it);
feedd's CPU seconds (user + system, start to first batch) are printed too,
since on a loaded machine the wall time mostly measures the load.

  bench/hugedoc/run.py --build build --peer-build /path/to/main/build [--sizes 32,128,512] [--rounds 1]

The peer is any other build directory (e.g. `git worktree add /tmp/main main`
and build it there). Needs about 4 x the largest size of free disk.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
sys.modules.setdefault("conftest", types.SimpleNamespace(DAEMON_WRAPPER=None, FEEDCTL=None))
sys.path.insert(0, str(SRC / "tests" / "integration"))
sys.path.insert(0, str(SRC / "bench"))
import common  # noqa: E402
import test_huge_document as T  # noqa: E402  (the tokenizer and the escaped words)


def status_kib(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def whole_epoch(client, sock):
    """stream-client on feed w until its first batch of epoch 1: every id of the document delivered."""
    c = subprocess.Popen([str(client), sock, "w", "0", "1", "1000000000"], stdout=subprocess.PIPE, text=True)
    n = 0
    try:
        for line in c.stdout:
            f = line.split()
            if f[0] == "batch":
                n += 1
                if int(f[2]) > 0:
                    break
            elif f[0] == "error":
                raise SystemExit(f"stream-client: {line}")
    finally:
        c.kill()
        c.wait()
    return n


def first_batch(build, tmp, shard, tok, size, client):
    p, sock = common.start_feedd(build, f"[feedd]\nthreads = 2\n[feed.t]\nformat = jsonl\nshards = {shard}\ntokenizer = {tok}\n"
                    f"seq_len = 1024\nbatch_size = 2\neos = <|endoftext|>\nshuffle = false\n"
                    f"max_document_bytes = {2 * size + (1 << 20)}\n"
                    f"[feed.w]\nformat = jsonl\nshards = {shard}\ntokenizer = {tok}\n"
                    f"seq_len = 16384\nbatch_size = 4\neos = <|endoftext|>\nshuffle = false\n"
                    f"max_document_bytes = {2 * size + (1 << 20)}\n", tmp)
    try:
        idle = status_kib(p.pid, "VmRSS") / 1024
        t0 = time.monotonic()
        r = subprocess.run([str(build / "client" / "feedctl" / "feedctl"), "--socket", sock, "dump", "t", "--batches",
                            "1", "--out", str(tmp / "out")], capture_output=True, text=True, timeout=1800)
        if r.returncode:
            raise SystemExit(f"{build}: feedctl dump failed: {r.stderr}{(tmp / 'feedd.log').read_text()[-2000:]}")
        took = time.monotonic() - t0
        peak = status_kib(p.pid, "VmHWM") / 1024
        cpu = cpu_s(p.pid)
        t0 = time.monotonic()
        whole_epoch(client, sock)
        whole = time.monotonic() - t0
        whole_cpu = cpu_s(p.pid) - cpu
        whole_peak = status_kib(p.pid, "VmHWM") / 1024
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()
    return took, peak, idle, cpu, whole, whole_cpu, whole_peak


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def make_docs(tmp, size):
    word = tmp / f"word-{size >> 20}.jsonl"
    with open(word, "w") as f:
        f.write('{"text": "' + "a" * size + '"}\n')
    block = T.escaped_block(random.Random(2), 40000)
    words = tmp / f"words-{size >> 20}.jsonl"
    with open(words, "w", encoding="utf-8") as f:
        f.write('{"text": "' + block * (size // len(block)) + '"}\n')
    return [("one word", word), ("escaped words", words)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(SRC / "build"))
    ap.add_argument("--peer-build", default="/tmp/v01/build",
                    help="a build of main before the streamed reading (default: the one bench/scale uses)")
    ap.add_argument("--sizes", default="32,128,512")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    builds = [("this", Path(a.build).resolve()), ("peer", Path(a.peer_build).resolve())]
    if not (builds[1][1] / "daemon/feedd").exists():
        print(f"peer: no build at {builds[1][1]} (pass --peer-build); this build only, no ratio", flush=True)
        builds = builds[:1]
    rows = []
    client = Path(a.build).resolve() / "tests" / "integration" / "stream-client"
    print(f"{'document':>22} {'build':>5} {'first batch s':>14} {'feedd CPU s':>12} {'peak RSS MB':>12} {'idle MB':>8}"
          f" {'epoch s':>8} {'epoch CPU s':>12} {'epoch peak MB':>14}")
    with tempfile.TemporaryDirectory(prefix="bench-hugedoc-") as d:
        tmp = Path(d)
        tok = tmp / "tokenizer.json"
        T.make_tokenizer(tok)
        for mb in [int(x) for x in a.sizes.split(",")]:
            for name, shard in make_docs(tmp, mb << 20):
                got = {}
                for bname, build in builds:
                    best = None
                    for _ in range(a.rounds):
                        r = first_batch(build, tmp, shard, tok, mb << 20, client)
                        best = r if best is None or r[0] < best[0] else best
                    got[bname] = best
                    print(f"{f'{mb} MB {name}':>22} {bname:>5} {best[0]:14.2f} {best[3]:12.2f} {best[1]:12.0f} "
                          f"{best[2]:8.0f} {best[4]:8.2f} {best[5]:12.2f} {best[6]:14.0f}",
                          flush=True)
                t, p = got["this"], got.get("peer")
                rows.append({"size_mb": mb, "document": name, "this": t, "peer": p})
                shard.unlink()
                if p is None:
                    continue
                print(f"{'':>22} ratio this/peer: first batch {t[0] / p[0]:.2f}x, CPU {t[3] / max(p[3], 0.01):.2f}x, "
                      f"peak RSS {t[1] / p[1]:.2f}x; epoch CPU {t[5] / max(p[5], 0.01):.2f}x, epoch peak RSS {t[6] / p[6]:.2f}x",
                      flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
