#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment: start-up, memory and throughput against corpus size (issue #22).

Runs with Debian's /usr/bin/python3, the build's daemon/feedd and
bench/consume, and a peer build of v0.1 (main before issue #22; --peer
BUILD, e.g. a `git worktree add /tmp/v01 main` built with meson). For each
corpus size, each daemon in turn, on the same files:

  ready_s        from exec to the socket answering (feeds are loaded first: READY=1)
  first_batch_s  from exec to the first batch received by a client attached at once
  index_s        from exec to the whole index validated (v0.1: at load; this version:
                 status work_ahead.index_shards_pending reaching 0)
  anon_mib       the daemon's anonymous memory after that first batch and at the
                 end (/proc/PID/smaps_rollup "Anonymous"); the rings are shared
                 memory (RssShmem) and not in it
  file_mib       its file-backed resident memory (mapped .idx pages: page cache)
  tok_s          steady tokens/s of one client taking BATCHES batches, after the index
                 is validated; the best of ROUNDS runs

Megatron shards are synthetic: SHARDS shards of DOCS/SHARDS documents of 8
u16 tokens each, one sequence per document. The .idx is written with numpy
(a few seconds for 100 M documents); the .bin is a sparse file (its tokens
are all 0: content does not matter here). A cold page cache is not asked
for: both daemons read the same files, which stay cached between runs.

  bench/scale/run.py [--build build] [--peer /tmp/v01/build] [--full] [--json out.json]
     default sizes: 1 M, 10 M, 100 M documents; --full adds 1 B (about 20 GB of .idx)
  bench/scale/run.py --text 100,1000,10000 [--tokenizer tokenizer.json]
     N .jsonl.zst shards: ready, first batch, anonymous memory, bytes in cache_dir
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

TOKENS_PER_DOC = 8
B, L = 8, 2048
BATCHES = 2000
ROUNDS = 2


def write_shard(prefix, n_docs):
    """One Megatron shard of n_docs documents of TOKENS_PER_DOC u16 tokens; .bin sparse."""
    idx = Path(str(prefix) + ".idx")
    if idx.exists():
        return idx
    with open(str(prefix) + ".bin", "wb") as f:
        f.truncate(n_docs * TOKENS_PER_DOC * 2)
    tmp = Path(str(idx) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], "<u8").tobytes())
        f.write(bytes([8]))  # u16
        f.write(np.array([n_docs, n_docs + 1], "<u8").tobytes())
        step = 1 << 24
        for a in range(0, n_docs, step):
            f.write(np.full(min(step, n_docs - a), TOKENS_PER_DOC, "<i4").tobytes())
        for a in range(0, n_docs, step):
            f.write((np.arange(a, min(a + step, n_docs), dtype="<i8") * (TOKENS_PER_DOC * 2)).tobytes())
        for a in range(0, n_docs + 1, step):
            f.write(np.arange(a, min(a + step, n_docs + 1), dtype="<i8").tobytes())
    tmp.rename(idx)
    return idx


def smaps(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("Rss", "Anonymous", "Pss_File", "Pss_Shmem"):
                out[k] = int(v.split()[0]) / 1024
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("RssFile", "RssShmem", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


def run_one(build, tmp, shards, shuffle, window):
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\n[feed.b]\nshards = {shards}\nseq_len = {L}\n"
            f"batch_size = {B}\nseed = 1\nshuffle = {'true' if shuffle else 'false'}\nshuffle_window = {window}\n")
    t0 = time.monotonic()
    d, sock = common.start_feedd(build, conf, tmp)
    ready = time.monotonic() - t0
    try:
        r = subprocess.run([str(Path(build) / "bench/consume"), sock, "b", "1", "1", "0"], capture_output=True,
                           text=True)
        first = time.monotonic() - t0
        if r.returncode:
            raise RuntimeError(f"consume: {r.stderr}")
        m1 = smaps(d.pid)
        # Index validation after load (this version): steady state is measured once it is done.
        index = ready
        for _ in range(6000):
            st = subprocess.run([str(Path(build) / "client/feedctl/feedctl"), "-s", sock, "status", "--json"],
                                capture_output=True, text=True)
            wa = json.loads(st.stdout)["feeds"][0].get("work_ahead") if st.returncode == 0 else None
            if not wa or wa["index_shards_pending"] == 0:
                break
            time.sleep(0.05)
        index = time.monotonic() - t0 if wa else ready
        steady = max((common.consume(build, sock, "b", BATCHES, daemon=d) for _ in range(ROUNDS)),
                     key=lambda x: x["tokens_per_s"])
        m2 = smaps(d.pid)
    finally:
        common.stop(d)
    return {"ready_s": ready, "first_batch_s": first, "index_s": index, "anon_mib": m1["Anonymous"], "anon_end_mib": m2["Anonymous"],
            "file_mib": m2["RssFile"], "shmem_mib": m2["RssShmem"], "hwm_mib": m2["VmHWM"],
            "tok_s": steady["tokens_per_s"]}


def write_text_shards(folder, n_shards, docs=50):
    """n_shards .jsonl.zst shards of `docs` short documents each (zstd(1) compresses them)."""
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()
    for i in range(n_shards):
        lines = [json.dumps({"text": " ".join(words[(i + k + j) % len(words)] for j in range(40))})
                 for k in range(docs)]
        raw = folder / f"t{i:05d}.jsonl"
        raw.write_text("\n".join(lines) + "\n")
    subprocess.run(["sh", "-c", f"cd {folder} && ls | grep '[.]jsonl$' | xargs zstd -q --rm"], check=True)
    (folder / "done").write_text("")


def du(path):
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def run_text(build, tmp, shards, tokenizer):
    cache = Path(tmp) / "cache"
    conf = (f"[feedd]\nthreads = 2\nring_slots = 4\ncache_dir = {cache}\n[feed.b]\nformat = jsonl\n"
            f"shards = {shards}\ntokenizer = {tokenizer}\nseq_len = 1024\nbatch_size = 8\nseed = 1\n"
            f"shuffle = true\nshuffle_window = 4\neos = 50256\n")
    t0 = time.monotonic()
    d, sock = common.start_feedd(build, conf, tmp)
    ready = time.monotonic() - t0
    try:
        r = subprocess.run([str(Path(build) / "bench/consume"), sock, "b", "1", "1", "0"], capture_output=True,
                           text=True)
        first = time.monotonic() - t0
        if r.returncode:
            raise RuntimeError(f"consume: {r.stderr}")
        m1 = smaps(d.pid)
        steady = common.consume(build, sock, "b", 100, daemon=d)
        m2 = smaps(d.pid)
    finally:
        common.stop(d)
    return [ready, first, m1["Anonymous"], m2["Anonymous"], du(cache), steady["tokens_per_s"]]


def main_text(a):
    build, peer = Path(a.build), Path(a.peer)
    tokenizer = Path(a.tokenizer or (Path(a.build) / "tokdata/hf/gpt2.json"))
    counts = [int(x) for x in a.text.split(",")]
    data = Path(a.data or tempfile.mkdtemp(prefix="feedd-scale-"))
    rows, notes = [], []
    for n in counts:
        folder = data / f"t{n}"
        common.progress(f"scale: writing {n} .jsonl.zst shards")
        write_text_shards(folder, n)
        for name, b in (("this", build), ("v0.1", peer)):
            with tempfile.TemporaryDirectory() as tmp:
                common.progress(f"scale: {name} {n} text shards")
                try:
                    rows.append([name, n] + run_text(b, tmp, f"{folder}/*.jsonl.zst", tokenizer))
                except Exception as e:
                    notes.append(f"{name} at {n} shards: {str(e)[:200]}")
                    continue
            print(json.dumps(rows[-1]), flush=True)
    res = {
        "title": "Scale: JSONL.zst shards, start-up and cache against shard count (issue #22)",
        "command": "bench/scale/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(a.note), "date": common.date(),
        "data": f"N .jsonl.zst shards of 50 short documents, GPT-2 tokenizer ({tokenizer.name}), shuffle_window 4",
        "cache": "cache_dir empty at start",
        "tables": [{"caption": "per daemon and shard count",
                    "columns": ["daemon", "shards", "ready s", "first batch s", "anon MiB (first batch)",
                                "anon MiB (end)", "cache bytes", "tokens/s"], "rows": rows}],
        "notes": notes,
    }
    common.emit(res, a.json)


def main():
    ap = common.arg_parser()
    ap.add_argument("--peer", default="/tmp/v01/build", help="a build of v0.1 (main before #22)")
    ap.add_argument("--data", default=None, help="where to keep the shards (default: a temporary folder)")
    ap.add_argument("--sizes", default=None, help="comma-separated document counts (overrides the defaults)")
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--shuffle", default="off,on", help="off, on or off,on")
    ap.add_argument("--text", default=None, help="comma-separated .jsonl.zst shard counts: the text table instead")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json for --text (default BUILD/tokdata/hf/gpt2.json)")
    a = ap.parse_args()
    if a.text:
        return main_text(a)
    build, peer = Path(a.build), Path(a.peer)
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [10**6, 10**7, 10**8] + ([10**9] if a.full else [])
    data = Path(a.data or tempfile.mkdtemp(prefix="feedd-scale-"))
    rows, notes = [], []
    for n in sizes:
        folder = data / f"m{n}-{a.shards}"
        folder.mkdir(parents=True, exist_ok=True)
        common.progress(f"scale: writing {a.shards} shards of {n // a.shards} documents")
        for i in range(a.shards):
            write_shard(folder / f"s{i:05d}", n // a.shards)
        shards = str(folder / "*.idx")
        for shuffle in [x == "on" for x in a.shuffle.split(",")]:
            for name, b in (("this", build), ("v0.1", peer)):
                if not (b / "daemon/feedd").exists():
                    notes.append(f"{name}: no build at {b}")
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    common.progress(f"scale: {name} {n} documents shuffle={shuffle}")
                    try:
                        res = run_one(b, tmp, shards, shuffle, 4)
                    except Exception as e:  # the peer may not fit in memory at the largest sizes
                        notes.append(f"{name} at {n} documents, shuffle {shuffle}: {str(e)[:200]}")
                        continue
                rows.append([name, n, "on" if shuffle else "off", res["ready_s"], res["first_batch_s"], res["index_s"],
                             res["anon_mib"], res["anon_end_mib"], res["file_mib"], res["hwm_mib"], res["tok_s"]])
                print(json.dumps(rows[-1]), flush=True)
    res = {
        "title": "Scale: start-up, memory and throughput against corpus size (issue #22)",
        "command": "bench/scale/run.py " + " ".join(sys.argv[1:]),
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": f"Megatron, {a.shards} shards of 8-token u16 documents (sparse .bin), shuffle_window 4, "
                f"B={B} L={L}, one client, {BATCHES} batches for tokens/s",
        "cache": "page-cached (both daemons read the same files)",
        "tables": [{
            "caption": "per daemon and corpus size",
            "columns": ["daemon", "documents", "shuffle", "ready s", "first batch s", "index valid s",
                        "anon MiB (first batch)",
                        "anon MiB (end)", "file MiB", "VmHWM MiB", "tokens/s"],
            "rows": rows,
        }],
        "notes": notes,
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
