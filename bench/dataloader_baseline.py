#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""The PyTorch DataLoader that feedd is benchmarked against.

Runs with Debian's /usr/bin/python3 (python3-numpy, python3-torch 1.13).

This is the loader a user would reasonably write without feedd: an
IterableDataset over numpy memmaps of the same Megatron shards, producing the
same batches as feedd's contract (tests/ref/feed_ref.py supplies the order and
the batch layout, so the two cannot drift apart). With N workers, worker i
produces batches b = i, i+N, i+2N, ...; each worker finds its place by walking
document lengths, not tokens. The DataLoader runs with batch_size=None and
hands worker outputs back round-robin, i.e. in batch order.

    dataloader_baseline.py --shards 'data/shard_*' --seq-len 4096 --batch-size 8 \
        --seed 1 --shuffle --window 2 --world 1 --rank 0 --workers 2 --batches 200 [--json]

prints tokens/s (tokens = batches * batch_size * seq_len). --json prints one JSON
object: tokens_per_s, seconds, batches, plus first_batch_s (worker start-up and
the first batch) and steady_tokens_per_s (excluding the first batch).
"""

import argparse
import importlib.util
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_feed_ref():
    """Import tests/ref/feed_ref.py by path, registered so workers can pickle it."""
    if "feed_ref" in sys.modules:
        return sys.modules["feed_ref"]
    path = os.path.join(REPO, "tests", "ref", "feed_ref.py")
    spec = importlib.util.spec_from_file_location("feed_ref", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["feed_ref"] = mod
    spec.loader.exec_module(mod)
    return mod


feed_ref = _import_feed_ref()


class FeedDataset(IterableDataset):
    """Batches start_batch .. start_batch+batches-1 of one rank, as int32 tensors."""

    def __init__(self, idx_paths, seed, shuffle, window, world, rank, seq_len,
                 batch_size, batches, start_batch=0, bos=None, eos=None):
        super().__init__()
        self.idx_paths = list(idx_paths)
        self.order = dict(seed=seed, shuffle=shuffle, window=window, world=world,
                          rank=rank, bos=bos, eos=eos)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.batches, self.start_batch = batches, start_batch

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        # Open the shards in the worker: each process gets its own memmaps.
        stream = feed_ref.RankStream(feed_ref.load_shards(self.idx_paths), **self.order)
        n = self.seq_len * self.batch_size
        cur = stream.cursor()
        first = self.start_batch + worker
        cur.advance(first * n)
        for b in range(first, self.start_batch + self.batches, workers):
            epoch = cur.epoch
            tokens, starts = cur.read(n + 1)
            batch = feed_ref.make_batch(tokens, starts, self.batch_size, self.seq_len)
            out = {k: torch.from_numpy(v) for k, v in batch.items()}
            out["epoch"] = epoch
            out["batch"] = b
            yield out
            cur.advance(workers * n)  # this batch and the other workers' ones


def make_loader(idx_paths, seed, shuffle, window, world, rank, seq_len, batch_size,
                batches, workers, start_batch=0, bos=None, eos=None):
    """A DataLoader yielding the rank's batches in order (batch_size=None)."""
    ds = FeedDataset(idx_paths, seed, shuffle, window, world, rank, seq_len,
                     batch_size, batches, start_batch, bos, eos)
    return DataLoader(ds, batch_size=None, num_workers=workers)


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch DataLoader baseline for feedd")
    ap.add_argument("--shards", action="append", required=True,
                    help="glob of shard .idx files or prefixes; repeat for more, in order")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--window", type=int, default=1)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--bos", type=int, default=None)
    ap.add_argument("--eos", type=int, default=None)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    paths = feed_ref.expand_globs(args.shards)
    if not paths:
        ap.error(f"no shard .idx files match {args.shards}")
    loader = make_loader(paths, args.seed, args.shuffle, args.window, args.world,
                         args.rank, args.seq_len, args.batch_size, args.batches,
                         args.workers, bos=args.bos, eos=args.eos)
    t0 = time.perf_counter()
    t_first = None
    got = 0
    for batch in loader:
        # Touch the data as a trainer's H2D copy would, so lazy work is counted.
        int(batch["input_ids"][-1, -1])
        got += 1
        if t_first is None:
            t_first = time.perf_counter()
    seconds = time.perf_counter() - t0
    per_batch = args.batch_size * args.seq_len
    res = {
        "tokens_per_s": got * per_batch / seconds,
        "seconds": seconds,
        "batches": got,
        "first_batch_s": (t_first or t0) - t0,
        "steady_tokens_per_s": ((got - 1) * per_batch / (seconds - (t_first - t0))
                                if got > 1 else None),
        "workers": args.workers,
        "shards": len(paths),
    }
    if args.json:
        print(json.dumps(res))
    else:
        print(f"dataloader_baseline: {got} batches of {args.batch_size}x{args.seq_len} "
              f"in {seconds:.2f}s: {res['tokens_per_s'] / 1e6:.2f} M tokens/s "
              f"({args.workers} workers, first batch {res['first_batch_s']:.2f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
