#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment 1: random vs sequential reads from a cold cache, feedd vs fio.

Runs with Debian's /usr/bin/python3; needs fio (io_uring engine) and the
build's daemon/feedd, bench/consume and bench/io. Every row starts from a
cold cache (common.make_cold: fadvise DONTNEED on the data files, and as
root drop_caches; fincore checks that nothing is left).

Rows, all on the same Megatron shards (u16, lognormal document lengths):
  fio, io_uring, sequential 1 MiB reads, depth 16 over the .bin files: the
      device's limit and the peer of every row;
  fio, io_uring, random reads of one mean document's size, depth 64: the
      device's limit for reading documents in shuffled order;
  feedd serving one client (bench/consume), shuffle = false and true: the
      daemon's read path as it runs, MB/s of .bin consumed;
  feedd's io_reader alone (bench/io, linked against feedd-core): whole files
      in large requests, and one read per document in stored and in shuffled
      order, batched like a worker does;
  one file per document, opened and read one by one: the sample-per-file
      loader.

  bench/io/run.py [--build build] [--full] [--rounds 2] [--json out.json] [--note TEXT]
"""

import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

SIZES = {
    # shards, documents per shard, documents written as single files
    "default": (4, 40000, 5000),
    "full": (16, 80000, 100000),
}
B, L = 8, 4096


def fio(files, rw, bs, depth, size=None):
    cmd = ["fio", "--name=peer", "--filename=" + ":".join(files), "--ioengine=io_uring", f"--rw={rw}",
           f"--bs={bs}", f"--iodepth={depth}", "--direct=0", "--file_service_type=sequential",
           "--output-format=json"]
    if size:
        cmd.append(f"--size={size}")
    j = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    job = j["jobs"][0]
    r = job["read"]
    # fio's own CPU over its run (usr_cpu and sys_cpu are percent of the job's runtime).
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000
    return {"mb_per_s": r["bw_bytes"] / 1e6, "bytes": r["io_bytes"], "reads": r["total_ios"], "cpu_s": cpu}


def io_driver(build, *args):
    cpu0 = common.children_cpu()
    out = subprocess.run([str(build / "bench/io"), *map(str, args)], capture_output=True, text=True, check=True)
    return {**json.loads(out.stdout), "cpu_s": common.children_cpu() - cpu0}


def feedd_read(build, tmp, idx_glob, bins, shuffle, batches):
    conf = (f"[feedd]\nthreads = 2\n[feed.b]\nshards = {idx_glob}\nseq_len = {L}\nbatch_size = {B}\n"
            f"seed = 1\nshuffle = {'true' if shuffle else 'false'}\n")
    d, sock = common.start_feedd(build, conf, tmp)
    try:
        # The daemon has read the .idx files; the .bin files are what a batch reads.
        common.make_cold(bins)
        r = common.consume(build, sock, "b", batches, daemon=d)
    finally:
        common.stop(d)
    cpu = r["cpu_s"]
    # u16 tokens: 2 bytes of .bin per position (B*L + 1 per batch, the look-ahead included).
    return {"mb_per_s": r["tokens_per_s"] * 2 / 1e6, "bytes": batches * (B * L + 1) * 2, "seconds": r["seconds"],
            "cpu_s": cpu}


def write_doc_files(idx, binf, outdir, n):
    """Writes the first n documents of one shard as one file each; returns their paths."""
    raw = Path(idx).read_bytes()
    S = int(np.frombuffer(raw, "<u8", 1, 18)[0])
    lengths = np.frombuffer(raw, "<i4", S, 34)
    pointers = np.frombuffer(raw, "<i8", S, 34 + 4 * S)
    data = np.memmap(binf, "u1", "r")
    outdir.mkdir()
    paths = []
    for i in range(min(n, S)):
        p = outdir / f"{i:07d}.bin"
        p.write_bytes(data[pointers[i]:pointers[i] + 2 * lengths[i]].tobytes())
        paths.append(str(p))
    return paths


def main():
    ap = common.arg_parser()
    a = ap.parse_args()
    build = Path(a.build).resolve()
    if not shutil.which("fio"):
        raise SystemExit("io: fio is not installed (scripts/install-deps.sh installs it)")
    n_shards, docs, n_files = SIZES["full" if a.full else "default"]

    with tempfile.TemporaryDirectory(prefix="feedd-bench-io-", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        common.gen_megatron.main([str(tmp / "data"), "--shards", str(n_shards), "--docs-per-shard", str(docs),
                                  "--mean-len", "800", "--seed", "1"])
        idx = sorted(str(p) for p in (tmp / "data").glob("*.idx"))
        bins = sorted(str(p) for p in (tmp / "data").glob("*.bin"))
        total = sum(os.path.getsize(p) for p in bins)
        files = write_doc_files(idx[0], bins[0], tmp / "files", n_files)
        random.Random(1).shuffle(files)
        (tmp / "files.list").write_text("\n".join(files) + "\n")
        files_bytes = sum(os.path.getsize(p) for p in files)
        mean_doc = total // (n_shards * docs)
        batches = total // 2 // (B * L + 1) - 1

        runs = {}

        def run(name, fn, paths):
            t0 = time.monotonic()
            how = common.make_cold(paths)
            r = fn()
            runs.setdefault(name, []).append(r)
            common.progress(f"io: {name}: {r['mb_per_s']:.0f} MB/s ({time.monotonic() - t0:.1f} s)")
            return how

        for _ in range(a.rounds):
            how = run("fio_seq", lambda: fio(bins, "read", "1M", 16), bins)
            run("fio_rand", lambda: fio(bins, "randread", f"{mean_doc // 512 * 512 or 512}", 64,
                                        size=f"{total // 8 // n_shards}"), bins)
            run("feedd_seq", lambda: feedd_read(build, tmp, f"{tmp}/data/*.idx", bins, False, batches), [])
            run("feedd_shuf", lambda: feedd_read(build, tmp, f"{tmp}/data/*.idx", bins, True, batches), [])
            run("reader_chunks", lambda: io_driver(build, "chunks", 8, 64, *bins), bins)
            run("reader_docs_seq", lambda: io_driver(build, "docs", "seq", 1, B * L, 64, *idx), bins)
            run("reader_docs_shuf", lambda: io_driver(build, "docs", "shuffle", 1, B * L, 64, *idx), bins)
            run("files", lambda: io_driver(build, "files", tmp / "files.list"), files)

    best = {k: max(v, key=lambda r: r["mb_per_s"]) for k, v in runs.items()}
    seq, rnd = best["fio_seq"]["mb_per_s"], best["fio_rand"]["mb_per_s"]
    reads = best["reader_docs_shuf"]["reads"]
    avg_read = best["reader_docs_shuf"]["bytes"] / reads

    def row(label, k, pattern, random_peer=False):
        v = best[k]["mb_per_s"]
        cpu_per_gb = min(r["cpu_s"] / (r["bytes"] / 1e9) for r in runs[k])
        return [label, pattern, v, common.ratio(v, seq), common.ratio(v, rnd) if random_peer else "-", cpu_per_gb]

    rows = [
        row("fio io_uring, 1 MiB, depth 16 (peer)", "fio_seq", "sequential"),
        row(f"fio io_uring, {mean_doc // 512 * 512} B random, depth 64", "fio_rand", "random", True),
        row("feedd serving a client, shuffle = false", "feedd_seq", "documents in stored order"),
        row("feedd serving a client, shuffle = true", "feedd_shuf", "documents shuffled", True),
        row("feedd io_reader, 8 MiB requests", "reader_chunks", "sequential"),
        row("feedd io_reader, a read per document", "reader_docs_seq", "documents in stored order"),
        row("feedd io_reader, a read per document, shuffled", "reader_docs_shuf", "documents shuffled", True),
        row("one file per document, read(2) one by one", "files", "files in shuffled order", True),
    ]
    g_seq = best["feedd_seq"]["mb_per_s"] / seq
    res = {
        "experiment": "io",
        "title": "1. Random vs sequential reads, cold cache: feedd vs fio",
        "command": "bench/io/run.py" + (" --full" if a.full else ""),
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": (f"{n_shards} Megatron shards (u16), {n_shards * docs:,} documents, lognormal lengths, mean "
                 f"{mean_doc} bytes, {total / 1e6:.0f} MB of .bin; one-file-per-document set: {len(files):,} "
                 f"files, {files_bytes / 1e6:.0f} MB. feedd: B = {B}, L = {L}, 2 threads, io_depth 64"),
        "cache": f"cold before every row: {how}",
        "tables": [{
            "caption": f"MB/s of token data read, best of {a.rounds} rounds; ratios to fio sequential and to fio "
                       f"random reads of one document's size; CPU seconds per GB read of the reading processes (feedd: "
                       f"daemon and client), lowest of the rounds",
            "columns": ["reader", "access pattern", "MB/s", "/ fio seq", "/ fio random", "CPU s / GB"],
            "rows": rows,
        }],
        "notes": [
            f"goal: feedd >= 0.9 of fio sequential; feedd with shuffle = false reaches {g_seq:.2f}",
            f"shuffled reads are one read per document: {reads:,} reads of {avg_read:.0f} bytes on average; "
            f"the device's own limit for that pattern is fio's random row ({rnd:.0f} MB/s, "
            f"{rnd / seq:.2f} of sequential)",
        ],
        "plot": {"kind": "barh", "xlabel": "MB/s (cold cache)",
                 "labels": [r[0] for r in rows], "values": [r[2] for r in rows]},
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
