#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The same PyTorch training loop fed by feed.Loader and by the DataLoader baseline.

Runs with Debian's /usr/bin/python3 (python3-torch 1.13). One process, one
model (examples/train_torch.py's TinyLM: 2 layers, CPU), the same shards and
the same batches (docs/sample-order.md: the baseline computes them with
tests/ref/feed_ref.py), in the same run, rounds alternating. Per side: data
wait % (time blocked in next() over wall time) and tokens/s.

  bench/torch_loop/run.py [--build build] [--steps 30] [--rounds 2] [--workers 0,1] [--json out.json]
"""

import argparse
import importlib.util
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(SRC / "scripts"))
sys.path.insert(0, str(SRC / "bench"))
sys.path.insert(0, str(SRC / "client" / "python"))
import gen_megatron  # noqa: E402
from spine.run import start_feedd  # noqa: E402
import common  # noqa: E402


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(SRC / "build"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="0,1")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    build = Path(a.build).resolve()
    os.environ.setdefault("FEEDD_BUILD_DIR", str(build))
    import torch
    import feed
    tt = load("train_torch", SRC / "examples" / "train_torch.py")
    dlb = load("dataloader_baseline", SRC / "bench" / "dataloader_baseline.py")
    torch.set_num_threads(1)  # the model gets one core; the feeder (daemon or workers) the other
    vocab, L, B = 4096, a.seq_len, a.batch_size
    res = {"feed.Loader": []}
    workers = [int(w) for w in a.workers.split(",")]
    for w in workers:
        res[f"DataLoader workers={w}"] = []
    with tempfile.TemporaryDirectory(prefix="feedd-torch-bench-") as tmp:
        tmp = Path(tmp)
        gen_megatron.main([str(tmp / "data"), "--shards", "4", "--docs-per-shard", "2000", "--mean-len", "700",
                           "--vocab", "4000", "--seed", "1"])
        for f in (tmp / "data").iterdir():
            f.read_bytes()
        shards = f"{tmp}/data/shard_*.idx"
        conf = tmp / "feedd.conf"
        conf.write_text(f"[feedd]\nthreads = 1\n[feed.b]\nshards = {shards}\nseq_len = {L}\nbatch_size = {B}\n"
                        "seed = 1\nshuffle = true\nshuffle_window = 2\neos = 4000\n")
        sock = str(tmp / "feedd.sock")
        paths = dlb.feed_ref.expand_globs([shards])
        for _ in range(a.rounds):
            sides = [("feed.Loader", None)] + [(f"DataLoader workers={w}", w) for w in workers]
            for name, w in sides:
                torch.manual_seed(0)
                model = tt.TinyLM(vocab, 64, layers=2, heads=4, max_pos=L)
                opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
                if w is None:
                    d = start_feedd(build, conf, sock, tmp / "feedd.log")
                    try:
                        loader = feed.Loader("b", socket=sock, labels="shifted")  # TinyLM does not shift
                        wall, waited, tokens = common.train_steps(loader, model, opt, a.steps)
                        loader.close()
                    finally:
                        d.send_signal(signal.SIGTERM)
                        d.wait()
                else:
                    loader = dlb.make_loader(paths, 1, True, 2, 1, 0, L, B, a.steps + 1, w, eos=4000)
                    wall, waited, tokens = common.train_steps(loader, model, opt, a.steps)
                res[name].append({"tokens_per_s": tokens / wall, "wait_pct": 100 * waited / wall,
                                  "step_ms": 1000 * wall / a.steps})
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
           "torch": torch.__version__, "B": B, "L": L, "steps": a.steps, "rounds": a.rounds,
           "results": {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in res.items()}}
    print(f"torch loop: TinyLM (2 layers, d=64, vocab 4096) on 1 CPU thread, B={B} L={L}, {a.steps} steps, "
          f"best of {a.rounds} alternating rounds, {out['machine']}, torch {torch.__version__}, {out['date']}")
    for k, r in out["results"].items():
        print(f"  {k:22s}: {r['tokens_per_s']:8.0f} tokens/s  data wait {r['wait_pct']:6.2f} %  "
              f"step {r['step_ms']:7.1f} ms")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
