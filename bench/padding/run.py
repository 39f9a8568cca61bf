#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The padding tax, packer and end to end (bench/padding/README.md).

1. Runs build/bench/padding: efficiency, truncation and cut documents of
   naive padding, concat and bestfit over one epoch of the Debian docs corpus
   (instruction-sized paragraphs and whole files), and how fast the packer
   alone packs each mode (the calls a session makes, one thread).
2. End to end, on the same documents: writes them as Megatron shards, starts
   a real feedd with one feed per packing mode (concat, pad, bestfit with the
   default buffer, 64 x seq_len), and takes batches with a real client
   (bench/consume, libfeed, release after each) from each in turn, rounds
   interleaved. Prints batches/s, positions/s and real (non-padding) tokens/s
   of each mode and the ratio of real tokens/s to concat's measured in the
   same run; the efficiency column is the daemon's own status counter
   (`feedctl status --json`, feeds[].packing.efficiency).

   padding.py [--build DIR] [--seq-len 4096] [--batch 32] [--batches 150] [--rounds 3] [--seconds 1.5]

Exit 77 when the corpus (scripts/fetch-tok-data.sh) is missing.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / "scripts"))
import gen_megatron  # noqa: E402

sys.path.insert(0, str(SRC / "bench"))
import common  # noqa: E402

EOT = 100257  # <|endoftext|> in cl100k_base, the eos of bench/padding/padding.c
MODES = ("concat", "pad", "bestfit")


def write_shard(out, name):
    lens = np.fromfile(out / f"{name}.len", np.uint32)
    tok = np.fromfile(out / f"{name}.tok", np.int32)
    ends = np.cumsum(lens, dtype=np.int64)
    docs = [[tok[e - n:e]] for e, n in zip(ends.tolist(), lens.tolist())]
    gen_megatron.write_shard(str(out / name), docs, "i32")
    return len(docs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.environ.get("FEEDD_BUILD_DIR", str(SRC / "build")))
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--batches", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.5)
    a = ap.parse_args()
    build = Path(a.build).resolve()
    packer = build / "bench" / "padding"
    if not packer.exists() or not (build / "bench" / "consume").exists():
        print(f"padding: {packer} or bench/consume is not built")
        return 1

    r = subprocess.run([str(packer), "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--seconds",
                        str(a.seconds)], capture_output=True, text=True)
    sys.stdout.write(r.stdout)
    if r.returncode != 0:
        sys.stdout.write(r.stderr)
        return r.returncode

    tmp = Path(tempfile.mkdtemp(prefix="feedd-padding-"))
    feedd = None
    try:
        subprocess.run([str(packer), "--write-docs", str(tmp)], check=True, capture_output=True)
        n_docs = {name: write_shard(tmp, name) for name in ("paragraphs", "files")}
        conf = "[feedd]\nring_slots = 4\n"
        for name in n_docs:
            for mode in MODES:
                conf += (f"[feed.{name}-{mode}]\nshards = {tmp}/{name}.idx\nseq_len = {a.seq_len}\n"
                         f"batch_size = {a.batch}\nseed = 1\nshuffle = true\neos = {EOT}\n")
                if mode != "concat":
                    conf += f"packing = {mode}\n"
        feedd, sock = common.start_feedd(build, conf, tmp)

        print(f"\n## End to end: feedd + libfeed client (bench/consume), {a.batches} batches of "
              f"{a.batch} x {a.seq_len} per mode and round, {a.rounds} rounds interleaved, median\n")
        for name in n_docs:
            rates = {m: [] for m in MODES}
            for _ in range(a.rounds):
                for mode in MODES:
                    rates[mode].append(common.consume(build, sock, f"{name}-{mode}", a.batches, samples=0))
            st = json.loads(subprocess.run([str(build / "client" / "feedctl" / "feedctl"), "--socket", str(sock),
                                            "status", "--json"], capture_output=True, text=True,
                                           check=True).stdout)
            packing = {f["name"]: f["packing"] for f in st["feeds"]}
            print(f"### {name} ({n_docs[name]} documents)\n")
            print("| mode | efficiency (status) | truncated (status) | batches/s | positions/s | real tokens/s | vs concat |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            real = {}
            rows = []
            for mode in MODES:
                pk = packing[f"{name}-{mode}"]
                bps = statistics.median(x["batches"] / x["seconds"] for x in rates[mode])
                pos = bps * a.batch * a.seq_len
                real[mode] = pos * pk["efficiency"]
                trunc = pk["truncated"] / (pk["tokens"] + pk["truncated"]) if pk["tokens"] else 0.0
                rows.append((mode, pk["efficiency"], trunc, bps, pos))
            for mode, eff, trunc, bps, pos in rows:
                print(f"| {mode} | {100 * eff:.2f}% | {100 * trunc:.2f}% | {bps:.0f} | {pos / 1e6:.1f} M | "
                      f"{real[mode] / 1e6:.1f} M | {real[mode] / real['concat']:.2f}x |")
            print()
        print("efficiency = the daemon's packing.efficiency over every batch it published (real positions / "
              "positions); real tokens/s = positions/s x efficiency, as a client receives them; vs concat = "
              "that rate over concat's, same run, same machine.")
    finally:
        if feedd:
            common.stop(feedd)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
