#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Experiment 6: end to end, a small real PyTorch model trained from feedd vs from a DataLoader.

Runs with Debian's /usr/bin/python3 (python3-torch; with libopenblas0-pthread
a step of this model takes tens of milliseconds, so the feeder's share shows).
One process, one CPU thread for the model, the model being
examples/train_torch.py's TinyLM (1 transformer layer, d = 64, vocab 4096),
B = 4, L = 128. Every side trains the same model from the same seed on the
same batches (docs/sample-order.md; the DataLoader computes them with
tests/ref/feed_ref.py), rounds alternating the sides:

  feed.Loader (client/python/feed) from a feedd with 1 worker thread;
  the PyTorch DataLoader baseline (bench/dataloader_baseline.py) with
      num_workers 0, 1, 2;
  no feeder: one batch, reused every step (the model's own speed, the upper
      bound for tokens/s).

Per side: data wait (time blocked in next() over wall time), tokens/s and
mean step time.

  bench/e2e/run.py [--build build] [--full] [--steps N] [--rounds 2] [--json out.json] [--note TEXT]
"""

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

# One thread for the model, whichever BLAS torch finds.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: common.py
import common  # noqa: E402

SIZES = {"default": (150, 4, 128), "full": (1000, 8, 256)}  # steps, B, L
VOCAB, EOS = 4096, 4000


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def repeat(batch):
    while True:
        yield batch


def main():
    ap = common.arg_parser()
    ap.add_argument("--steps", type=int)
    a = ap.parse_args()
    build = Path(a.build).resolve()
    steps, B, L = SIZES["full" if a.full else "default"]
    steps = a.steps or steps
    os.environ.setdefault("FEEDD_BUILD_DIR", str(build))
    sys.path.insert(0, str(common.SRC / "client" / "python"))
    import torch
    import feed
    torch.set_num_threads(1)
    tt = load("train_torch", common.SRC / "examples" / "train_torch.py")
    dlb = load("dataloader_baseline", common.SRC / "bench" / "dataloader_baseline.py")

    sides = ["feed.Loader (feedd, 1 thread)", "DataLoader, num_workers=0", "DataLoader, num_workers=1",
             "DataLoader, num_workers=2", "no feeder (one batch reused)"]
    runs = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="feedd-bench-e2e-", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        common.gen_megatron.main([str(tmp / "data"), "--shards", "4", "--docs-per-shard", "2000", "--mean-len", "700",
                                  "--vocab", str(EOS), "--seed", "1"])
        files = sorted(str(p) for p in (tmp / "data").iterdir())
        common.warm(files)
        size = sum(os.path.getsize(p) for p in files if p.endswith(".bin"))
        shards = f"{tmp}/data/shard_*.idx"
        paths = dlb.feed_ref.expand_globs([shards])
        conf = (f"[feedd]\nthreads = 1\n[feed.b]\nshards = {shards}\nseq_len = {L}\nbatch_size = {B}\n"
                f"seed = 1\nshuffle = true\nshuffle_window = 2\neos = {EOS}\n")
        for _ in range(a.rounds):
            for side in sides:
                torch.manual_seed(0)
                model = tt.TinyLM(VOCAB, 64, layers=1, heads=4, max_pos=L)
                opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
                if side.startswith("feed."):
                    d, sock = common.start_feedd(build, conf, tmp)
                    try:
                        loader = feed.Loader("b", socket=sock, labels="shifted")  # TinyLM does not shift
                        wall, waited, tokens = common.train_steps(loader, model, opt, steps)
                        loader.close()
                    finally:
                        common.stop(d)
                elif side.startswith("DataLoader"):
                    w = int(side[-1])
                    loader = dlb.make_loader(paths, 1, True, 2, 1, 0, L, B, steps + 1, w, eos=EOS)
                    wall, waited, tokens = common.train_steps(loader, model, opt, steps)
                    del loader
                else:
                    one = next(iter(dlb.make_loader(paths, 1, True, 2, 1, 0, L, B, 1, 0, eos=EOS)))
                    wall, waited, tokens = common.train_steps(repeat(one), model, opt, steps)
                r = {"tokens_per_s": tokens / wall, "wait_pct": 100 * waited / wall, "step_ms": 1000 * wall / steps}
                runs[side].append(r)
                common.progress(f"e2e: {side}: {r['tokens_per_s']:.0f} tokens/s, data wait {r['wait_pct']:.2f} %, "
                                f"step {r['step_ms']:.1f} ms")

    best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
    peer = max((k for k in best if k.startswith("DataLoader")), key=lambda k: best[k]["tokens_per_s"])
    ceiling = best["no feeder (one batch reused)"]["tokens_per_s"]
    rows = [[k, best[k]["tokens_per_s"], common.ratio(best[k]["tokens_per_s"], best[peer]["tokens_per_s"]),
             f"{best[k]['wait_pct']:.2f} %", best[k]["step_ms"], f"{100 * best[k]['tokens_per_s'] / ceiling:.0f} %"]
            for k in sides]
    res = {
        "experiment": "e2e",
        "title": "6. End to end: a small PyTorch model trained from feedd vs from a DataLoader",
        "command": "bench/e2e/run.py" + (" --full" if a.full else ""),
        "machine": common.machine(a.note) + f"; torch {torch.__version__}, model on 1 CPU thread",
        "date": common.date(),
        "data": (f"4 Megatron shards (u16), 8,000 documents, mean 700 tokens, {size / 1e6:.1f} MB; TinyLM "
                 f"(1 layer, d = 64, vocab {VOCAB}, AdamW), B = {B}, L = {L}, {steps} steps per run, eos {EOS}"),
        "cache": "warm: every file read before timing",
        "tables": [{
            "caption": f"best of {a.rounds} alternating rounds (by tokens/s); peer: the best DataLoader ({peer}); "
                       f"last column: share of the model's own speed (no feeder)",
            "columns": ["feeder", "tokens/s", "/ best DataLoader", "data wait", "step ms", "of no feeder"],
            "rows": rows,
        }],
        "notes": [],
        "plot": {"kind": "barh", "xlabel": "data wait, % of wall time", "labels": sides[:-1],
                 "values": [best[k]["wait_pct"] for k in sides[:-1]]},
    }
    common.emit(res, a.json)


if __name__ == "__main__":
    main()
