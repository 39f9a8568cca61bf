#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Parquet: the text path from Parquet (snappy, zstd) against JSONL (.zst), and
feedd's Parquet decoding alone against DuckDB's reader.

Runs with Debian's /usr/bin/python3. The corpus is the Debian docs corpus of
scripts/fetch-tok-data.sh (as bench/textpath.py): its documents as 4 JSONL
shards compressed with zstd -3, and the same documents as 4 Parquet shards
written by DuckDB (scripts/fetch-parquet-data.sh) with snappy and with zstd
(2048 rows per row group, DuckDB's dictionary choice, page v1).

  load: a feedd started on an empty cache_dir until it listens: decoding a
      Parquet shard's text column into the cache, or decompressing a .zst
      JSONL shard and indexing its lines (each is done once per shard);
  serve: a real feedd (cl100k_base, eos, shuffled, B = 8, L = 2048, threads
      = T) serving bench/consume 90 % of an epoch, in MB of document text per
      second, each format in the same round;
  decode: the text column of every shard decoded once (best of 3), by
      feedd's reader (bench/pqdecode, one thread) and by DuckDB's
      (bench/parquet/parquet.mjs, SELECT sum(strlen(text)), 1 thread and all CPUs),
      each shard 10 times per side and round.

  bench/parquet/run.py [--build build] [--rounds 2] [--json out.json] [--note TEXT]
"""

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import common
import textpath

B, L = 8, 2048
THREADS = (1, 2)
REPEAT = 10  # decodes of each shard per side and round; the best counts
PQDATA = Path(os.environ.get("FEEDD_PQDATA") or common.SRC / "build/pqdata")


def conf(fmt, paths, ranks, cache, threads):
    shards = ",\n  ".join(paths)
    return (f"[feedd]\nthreads = {threads}\nring_slots = 8\ncache_dir = {cache}\n"
            f"[feed.t]\nformat = {fmt}\nshards = {shards}\ntokenizer = {ranks}\ntokenizer_preset = cl100k_base\n"
            f"eos = <|endoftext|>\nseq_len = {L}\nbatch_size = {B}\nseed = 1\nshuffle = true\n")


def write_parquet(plain, out):
    """The JSONL shards' documents as Parquet, snappy and zstd; returns {codec: [paths]}."""
    inputs = []
    for p in plain:
        q = out / (Path(p).stem + ".pq.jsonl")
        with open(p, encoding="utf-8") as src, open(q, "w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                dst.write(json.dumps({"id": i, "text": json.loads(line)["text"], "null": False},
                                     ensure_ascii=False) + "\n")
        inputs.append(str(q))
    specs = ["snappy:dict:v1:2048", "zstd:dict:v1:2048"]
    subprocess.run(["node", str(common.SRC / "tests/parquet/mkparquet.mjs"), str(PQDATA), str(out / "pq"), *specs,
                    "--", *inputs], check=True)
    for q in inputs:
        os.unlink(q)
    return {s.split(":")[0]: sorted(str(p) for p in (out / "pq" / s.replace(":", "-")).glob("*.parquet"))
            for s in specs}


def load(build, tmp, fmt, paths, ranks):
    """Seconds until a feedd on an empty cache_dir listens with the feed loaded."""
    cache = tmp / "cache-load"
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.monotonic()
    d, sock = common.start_feedd(build, conf(fmt, paths, ranks, cache, 1), tmp, name="load")
    t = time.monotonic() - t0
    st = json.loads(subprocess.run([str(build / "client/feedctl/feedctl"), "--socket", sock, "status", "--json"],
                                   capture_output=True, text=True, check=True).stdout)
    common.stop(d)
    shutil.rmtree(cache, ignore_errors=True)
    f = st["feeds"][0]
    if f["state"] != "ready":
        raise RuntimeError(f"parquet bench: feed failed: {f['error']}")
    return t


def serve(build, tmp, fmt, paths, ranks, threads, batches):
    d, sock = common.start_feedd(build, conf(fmt, paths, ranks, tmp / "cache", threads), tmp)
    try:
        return common.consume(build, sock, "t", batches, daemon=d)
    finally:
        common.stop(d)


def decode_feedd(build, paths):
    s, n = 0.0, 0
    for p in paths:
        f = subprocess.run([str(build / "bench/pqdecode"), p, "text", str(REPEAT)], capture_output=True, text=True,
                           check=True).stdout.split()
        v = dict(zip(f[0::2], f[1::2]))
        s += float(v["seconds"])
        n += int(v["bytes"])
    return s, n


def decode_duckdb(paths, threads):
    out = subprocess.run(["node", str(common.SRC / "bench/parquet/parquet.mjs"), str(PQDATA), str(threads), str(REPEAT), *paths],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out)
    return sum(v["seconds"] for v in r.values()), sum(v["bytes"] for v in r.values())


def main():
    a = common.arg_parser().parse_args()
    build = Path(a.build).resolve()
    data = textpath.tokdata()
    ranks = data / "ranks/cl100k_base.tiktoken"
    if not (data / "corpus.txt").exists() or not ranks.exists():
        raise SystemExit(f"parquet: no corpus in {data}: run scripts/fetch-tok-data.sh")
    if not (PQDATA / "node_modules/@duckdb/node-api").exists():
        raise SystemExit(f"parquet: no DuckDB in {PQDATA}: run scripts/fetch-parquet-data.sh")
    runs = {}
    with tempfile.TemporaryDirectory(prefix="feedd-bench-pq-", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        (tmp / "data").mkdir()
        plain, zst, text_bytes, n_docs = textpath.write_shards(data, tmp / "data")
        pq = write_parquet(plain, tmp / "data")
        sources = {"jsonl.zst": ("jsonl", zst), "parquet snappy": ("parquet", pq["snappy"]),
                   "parquet zstd": ("parquet", pq["zstd"])}
        size = {name: sum(os.path.getsize(p) for p in paths) / 1e6 for name, (_, paths) in sources.items()}
        common.warm(zst + pq["snappy"] + pq["zstd"])
        ref = textpath.tok_only(build, data, 1)
        bytes_per_token = ref["bytes"] / (ref["ids"] + ref["docs"])
        batches = int(0.9 * (ref["ids"] + ref["docs"]) / (B * L))
        loads = {}
        for name, (fmt, paths) in sources.items():
            loads[name] = min(load(build, tmp, fmt, paths, ranks) for _ in range(a.rounds))
            serve(build, tmp, fmt, paths, ranks, 1, 2)  # builds the cache the timed runs use
            common.progress(f"parquet: load {name}: {loads[name]:.2f} s")
        for rnd in range(a.rounds):
            for t in THREADS:
                for name, (fmt, paths) in sources.items():
                    r = serve(build, tmp, fmt, paths, ranks, t, batches)
                    r["mbps"] = r["tokens_per_s"] * bytes_per_token / 1e6
                    runs.setdefault((name, t), []).append(r["mbps"])
                    common.progress(f"parquet: round {rnd + 1}: {name}, {t} thread(s): {r['mbps']:.1f} MB/s")
        dec = {}
        for rnd in range(a.rounds):
            for codec in ("snappy", "zstd"):
                got = {"feedd": decode_feedd(build, pq[codec]), "duckdb1": decode_duckdb(pq[codec], 1),
                       "duckdbN": decode_duckdb(pq[codec], os.cpu_count())}
                for k, v in got.items():
                    assert v[1] == got["feedd"][1], "DuckDB and feedd disagree on the bytes"
                    if (codec, k) not in dec or v[0] < dec[(codec, k)][0]:
                        dec[(codec, k)] = v
                common.progress(f"parquet: round {rnd + 1}: decode {codec}: " + ", ".join(
                    f"{k} {v[1] / v[0] / 1e6:.0f} MB/s" for k, v in got.items()))

    def pairs(name, t):
        # Each round's Parquet run over the same round's JSONL run: the ratio least moved by other load.
        v = [p / z for p, z in zip(runs[(name, t)], runs[("jsonl.zst", t)])]
        return f"{min(v):.2f} / {statistics.median(v):.2f} / {max(v):.2f}"

    serve_rows = []
    for t in THREADS:
        z = max(runs[("jsonl.zst", t)])
        serve_rows.append([f"{t} thread{'s' if t > 1 else ''}", z, max(runs[("parquet snappy", t)]),
                           common.ratio(max(runs[("parquet snappy", t)]), z), pairs("parquet snappy", t),
                           max(runs[("parquet zstd", t)]), common.ratio(max(runs[("parquet zstd", t)]), z),
                           pairs("parquet zstd", t)])
    load_rows = [[name, size[name], loads[name], text_bytes / 1e6 / loads[name]] for name in sources]
    dec_rows = []
    for codec in ("snappy", "zstd"):
        mbps = {k: dec[(codec, k)][1] / dec[(codec, k)][0] / 1e6 for k in ("feedd", "duckdb1", "duckdbN")}
        dec_rows.append([codec, mbps["feedd"], mbps["duckdb1"], common.ratio(mbps["feedd"], mbps["duckdb1"]),
                         mbps["duckdbN"], common.ratio(mbps["feedd"], mbps["duckdbN"])])
    res = {
        "experiment": "parquet",
        "title": "Parquet: text path vs JSONL (.zst), and decoding vs DuckDB",
        "command": "bench/parquet/run.py",
        "machine": common.machine(a.note),
        "date": common.date(),
        "data": (f"Debian docs corpus (scripts/fetch-tok-data.sh): {text_bytes / 1e6:.1f} MB of text in {n_docs:,} "
                 f"documents, 4 shards: .jsonl.zst ({size['jsonl.zst']:.1f} MB), Parquet snappy "
                 f"({size['parquet snappy']:.1f} MB), Parquet zstd ({size['parquet zstd']:.1f} MB), written by "
                 f"DuckDB (2048 rows per row group); feedd: cl100k_base, eos, B = {B}, L = {L}, shuffled, "
                 f"{batches} batches (90 % of an epoch) per run"),
        "cache": "warm: shards read before timing; serve: the decoded copies and indexes built before timing",
        "tables": [
            {"caption": f"Serving: MB of document text per second (best of {a.rounds} rounds, formats alternating "
                        f"within each round), and each round's Parquet run over the same round's JSONL run",
             "columns": ["threads", "jsonl.zst MB/s", "parquet snappy MB/s", "/ jsonl.zst",
                         "pairs min / median / max", "parquet zstd MB/s", "/ jsonl.zst", "pairs min / median / max"],
             "rows": serve_rows},
            {"caption": f"Load on an empty cache_dir: seconds until feedd listens (best of {a.rounds}); MB of text "
                        f"made servable per second",
             "columns": ["shards", "MB on disk", "seconds", "text MB/s"],
             "rows": load_rows},
            {"caption": f"Decoding the text column alone, MB of text per second (per shard the best of {REPEAT} "
                        f"decodes, summed; the best of {a.rounds} rounds alternating the sides)",
             "columns": ["codec", "feedd 1 thread", "DuckDB 1 thread", "feedd / DuckDB", f"DuckDB {os.cpu_count()} "
                         f"threads", "feedd / DuckDB"],
             "rows": dec_rows},
        ],
        "notes": [
            "A Parquet shard is served from its text column decoded once into cache_dir (as a .jsonl.zst shard is "
            "from its decompressed copy), so serving reads plain document bytes either way; Parquet saves the JSON "
            "scan of each document and its load is a column decode instead of a decompression and line scan.",
            "DuckDB's figure includes planning the query and summing the lengths; feedd's includes reading the "
            "footer; both read the file from the page cache.",
        ],
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
