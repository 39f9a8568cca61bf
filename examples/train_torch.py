#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""A real (small) PyTorch training run fed by feedd: a 2-layer causal transformer
LM on CPU, data-parallel over torchrun ranks (gloo), each rank reading its own
batches with feed.Loader. Prints loss, tokens/s and the share of time spent
waiting for data; saves and resumes the data position with the model.

From a build tree (docs/python.md has the same, step by step):

    /usr/bin/python3 scripts/gen_megatron.py /tmp/tt/data --shards 4 --docs-per-shard 2000 --vocab 4000 --seed 1
    printf '[feed.web]\\nshards = /tmp/tt/data/shard_*.idx\\nseq_len = 256\\nbatch_size = 4\\neos = 4000\\n' \\
        > /tmp/tt/feedd.conf
    build/daemon/feedd -c /tmp/tt/feedd.conf -s /tmp/tt/feedd.sock &
    FEEDD_SOCKET=/tmp/tt/feedd.sock torchrun --redirects 1 --tee 1 --nproc_per_node=2 \\
        examples/train_torch.py --feed web --steps 60

(Debian's torch 1.13 on Python 3.11: torchrun's default --redirects 0 crashes in
to_map() because IntFlag no longer iterates its zero member; "--redirects 1
--tee 1" avoids that path and still prints every rank's output.)

Options: --feed NAME, --steps N, --log-every N, --d-model D, --vocab V,
--ckpt DIR (save every --save-every steps; resume from it if present).
Run from the source tree it imports client/python and loads build/client/libfeed.so.0.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

try:
    import feed
except ImportError:  # not installed: use the source tree's package and build's libfeed
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "client" / "python"))
    os.environ.setdefault("FEEDD_BUILD_DIR", str(repo / "build"))
    import feed


class TinyLM(nn.Module):
    """Token + position embeddings, 2 pre-norm transformer layers, tied LM head.

    Rows are packed with several documents: attention is causal *within* a
    document only (documents start where position_ids is 0)."""

    def __init__(self, vocab, d_model, layers, heads, max_pos):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_pos, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(d_model)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, input_ids, labels, position_ids, cu_seqlens=None):
        B, L = input_ids.shape
        doc = torch.cumsum((position_ids == 0).to(torch.int32), dim=1)          # [B, L] document number
        i = torch.arange(L)
        allowed = (i[None, :, None] >= i[None, None, :]) & (doc[:, :, None] == doc[:, None, :])
        mask = (~allowed).repeat_interleave(self.heads, dim=0)                   # [B*heads, L, L], True = masked
        x = self.tok(input_ids) + self.pos(position_ids.clamp(max=self.pos.num_embeddings - 1))
        x = self.norm(self.blocks(x, mask=mask))
        logits = x @ self.tok.weight.t()
        return F.cross_entropy(logits.view(B * L, -1), labels.reshape(-1).long(), ignore_index=-100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feed", default="web")
    ap.add_argument("--socket", default=None, help="feedd's socket (default: $FEEDD_SOCKET)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=4096, help="must exceed every token id of the feed")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--ckpt", default=None, help="directory for per-rank checkpoints (model, optimizer, data)")
    ap.add_argument("--save-every", type=int, default=20)
    a = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)  # same initial weights on every rank
    # rank and world from torchrun's RANK / WORLD_SIZE; labels="shifted": TinyLM's loss does not shift (Megatron)
    loader = feed.Loader(a.feed, socket=a.socket, labels="shifted")
    info = next(f for f in loader.status()["feeds"] if f["name"] == a.feed)  # feedd's status document
    B, L = info["batch_size"], info["seq_len"]

    model = TinyLM(a.vocab, a.d_model, layers=2, heads=4, max_pos=L)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    start = 0
    ckpt = Path(a.ckpt) / f"rank{rank}.pt" if a.ckpt else None
    if ckpt and ckpt.exists():
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["data"])  # continues with exactly the next batch
        start = state["step"] + 1
        print(f"rank {rank}: resumed at step {start}, batch {state['data']['next_batch']}", flush=True)

    if rank == 0:
        print(f"feed '{a.feed}': B={B} L={L}, {world} rank(s), model {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M "
              f"params, torch {torch.__version__}, {torch.get_num_threads()} thread(s)/rank", flush=True)
    t_log, wait_log, steps_log = time.perf_counter(), 0.0, 0
    it = iter(loader)
    for step in range(start, a.steps):
        t0 = time.perf_counter()
        batch = next(it)  # read-only views of the shared-memory slot; the slot is given back when dropped
        t1 = time.perf_counter()
        if int(batch["input_ids"].max()) >= a.vocab:
            sys.exit(f"token id {int(batch['input_ids'].max())} >= --vocab {a.vocab}")
        loss = model(**batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        loader.report(step_time=t2 - t1)  # optional: libfeed already measures waits and steps on its own
        wait_log += t1 - t0
        steps_log += 1
        if ckpt and (step + 1) % a.save_every == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "data": loader.state_dict(),
                        "step": step}, ckpt)
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            now = time.perf_counter()
            tok_s = steps_log * B * L * world / (now - t_log)
            print(f"rank {rank} step {step + 1:5d}  loss {loss.item():7.4f}  {tok_s:9.0f} tokens/s (all ranks)  "
                  f"data wait {100 * wait_log / (now - t_log):5.2f} %", flush=True)
            t_log, wait_log, steps_log = now, 0.0, 0
    s = loader.stats()
    print(f"rank {rank} done: libfeed saw {s['batches']} batches, stall {s['stall_pct']:.2f} %, "
          f"wait p50 {s['wait_p50_s'] * 1e6:.0f} us p99 {s['wait_p99_s'] * 1e6:.0f} us, "
          f"step p50 {s['step_p50_s'] * 1e3:.1f} ms", flush=True)
    loader.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
