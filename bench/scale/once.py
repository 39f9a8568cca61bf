#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Compressed text on first use (issue #22): how many times a cold epoch decompresses each .jsonl.zst shard, and
what the first batches cost. N shards of about S MiB of text each (random words, zstd -3), a byte-level
tokenizer (so that decompression is not hidden behind BPE), count_ahead = false (what the walks do, alone), an
empty cache_dir per run. Per build: time to READY, to the first 200 batches, tokens/s over the next BATCHES
batches of epoch 0, the daemon's CPU seconds, and work_ahead's counters (text_decompressions where the build has
it; text_copies_made, text_shards_indexed).

  bench/scale/once.py --build build --peer /work/wt/integ/build --shards 200 --mib 1 [--batches 4000]
"""
import argparse
import base64
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common  # noqa: E402


def write_shards(folder, n, mib):
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "done").exists():
        return
    rng = random.Random(7)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(4000)]
    # A pool of 32 MiB of documents, each shard drawn from it (writing 1 GB of fresh random words takes minutes).
    pool, size = [], 0
    while size < 32 << 20:
        line = json.dumps({"text": " ".join(rng.choice(vocab) for _ in range(rng.randint(50, 400)))})
        pool.append(line)
        size += len(line) + 1
    for i in range(n):
        lines, size = [], 0
        while size < mib << 20:
            line = pool[rng.randrange(len(pool))]
            lines.append(line)
            size += len(line) + 1
        (folder / f"t{i:05d}.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run(["sh", "-c", f"cd {folder} && ls | grep '[.]jsonl$' | xargs zstd -q -T2 --rm"], check=True)
    (folder / "bytes.tiktoken").write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n"
                                                   for i in range(256)))
    (folder / "done").write_text("")


def status(build, sock):
    out = subprocess.run([str(Path(build) / "client/feedctl/feedctl"), "--socket", sock, "status", "--json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["feeds"][0]["work_ahead"]


def run(build, folder, batches, vranks):
    with tempfile.TemporaryDirectory(prefix="feedd-once-") as tmp:
        conf = (f"[feedd]\nthreads = 2\nring_slots = 4\ncache_dir = {tmp}/cache\n[feed.b]\nformat = jsonl\n"
                f"shards = {folder}/t*.jsonl.zst\ntokenizer = {folder}/bytes.tiktoken\ntokenizer_preset = gpt2\n"
                f"seq_len = 1024\nbatch_size = 8\nseed = 1\nshuffle = true\nshuffle_window = 4\neos = 10\n"
                f"count_ahead = false\n" + (f"virtual_ranks = {vranks}\n" if vranks is not None else ""))
        t0 = time.monotonic()
        d, sock = common.start_feedd(build, conf, tmp, wait_s=120)
        ready = time.monotonic() - t0
        try:
            first = common.consume(build, sock, "b", 200, daemon=d)
            t200 = time.monotonic() - t0
            wa200 = status(build, sock)
            rest = common.consume(build, sock, "b", batches, daemon=d)
            wa = status(build, sock)
        finally:
            common.stop(d)
    return {"ready_s": round(ready, 3), "first_200_s": round(t200, 3), "tokens_per_s": round(rest["tokens_per_s"]),
            "daemon_cpu_s": round(first["daemon_cpu_s"] + rest["daemon_cpu_s"], 2),
            "decompressions_at_200": wa200.get("text_decompressions"), "decompressions": wa.get("text_decompressions"),
            "copies_made": wa["text_copies_made"], "indexed": wa["text_shards_indexed"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--peer", default=None, help="another build, run on the same shards in the same run")
    ap.add_argument("--shards", type=int, default=200)
    ap.add_argument("--mib", type=int, default=1, help="MiB of text per shard")
    ap.add_argument("--batches", type=int, default=4000, help="batches timed after the first 200 (8 KiB each)")
    ap.add_argument("--data", default=None, help="where to keep the shards (default: a temporary folder)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--virtual-ranks", type=int, default=None, help="the feed's virtual_ranks (default: feedd's)")
    a = ap.parse_args()
    data = Path(a.data or tempfile.mkdtemp(prefix="feedd-once-data-")) / f"s{a.shards}x{a.mib}"
    common.progress(f"once: writing {a.shards} shards of {a.mib} MiB")
    write_shards(data, a.shards, a.mib)
    builds = [("this", a.build)] + ([("peer", a.peer)] if a.peer else [])
    for k in range(a.repeat):
        for name, b in builds:
            r = run(b, data, a.batches, a.virtual_ranks)
            print(json.dumps({"build": name, "shards": a.shards, "mib": a.mib, "vranks": a.virtual_ranks, "run": k, **r}),
                  flush=True)


if __name__ == "__main__":
    main()
