#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Hugging Face Trainer fed by feedd: a custom train dataloader over feed.Loader.

    python3 examples/train_hf.py --feed web --steps 50 --vocab 4001            # transformers: a tiny Llama
    python3 examples/train_hf.py --feed web --steps 50 --vocab 4001 --standin  # without transformers

What the data side needs, whatever the model:

- feed.Loader(labels="hf") (the default): labels aligned with input_ids, -100
  on each document's first position, so the model's own shift
  (ForCausalLMLoss) never predicts across a document boundary; position_ids
  restart at each document (what flash-attention's packed path reads).
- DataLoader(loader, batch_size=None, num_workers=0, collate_fn=feed.Batch.for_hf):
  feedd already batches, shuffles and shards by rank; for_hf() keeps only the
  keys a causal LM's forward() takes (int64).
- Trainer.get_train_dataloader() returns that DataLoader as it is: feedd
  deals each rank its own stream ($RANK / $WORLD_SIZE), so nothing may shard
  it again (accelerate's prepare() would). The stream is endless: set max_steps.

--standin: Debian 12 ships no transformers; the same DataLoader then drives
examples/tiny_causal_lm.py (transformers' ForCausalLMLoss, an HF-shaped
forward()) through the steps Trainer.training_step takes. The tests run this.
"""

import argparse
import os
import sys
from pathlib import Path

import torch

try:
    import feed
except ImportError:  # not installed: the source tree's package and build's libfeed
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "client" / "python"))
    os.environ.setdefault("FEEDD_BUILD_DIR", str(repo / "build"))
    import feed


def train_dataloader(feed_name, socket=None):
    """The train dataloader: one rank's batches from feedd, as HF forward() keyword arguments."""
    loader = feed.Loader(feed_name, socket=socket, labels="hf")
    return torch.utils.data.DataLoader(loader, batch_size=None, num_workers=0, collate_fn=feed.Batch.for_hf)


def run_transformers(a, dl):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    class FeedTrainer(Trainer):
        def get_train_dataloader(self):
            return dl  # not accelerator.prepare()d: feedd already gave this rank its share

    config = LlamaConfig(vocab_size=a.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096)
    model = LlamaForCausalLM(config)
    args = TrainingArguments(output_dir=a.out, max_steps=a.steps, learning_rate=a.lr, logging_steps=a.log_every,
                             report_to=[], save_strategy="no", dataloader_num_workers=0,
                             remove_unused_columns=False)
    FeedTrainer(model=model, args=args).train()


def run_standin(a, dl):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from tiny_causal_lm import TinyCausalLM

    torch.manual_seed(0)
    model = TinyCausalLM(a.vocab, max_positions=4096, d_model=32)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    device = torch.device("cpu")
    for step, inputs in enumerate(dl):
        if step == a.steps:
            break
        # Trainer._prepare_inputs, then training_step: model(**inputs), outputs["loss"], backward, step.
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
        if step == 0:
            print("inputs:", ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in sorted(inputs.items())),
                  flush=True)
        loss = model(**inputs)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % a.log_every == 0:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feed", default="web")
    ap.add_argument("--socket", default=None, help="feedd's socket (default: $FEEDD_SOCKET)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=4096, help="must exceed every token id of the feed")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--out", default="/tmp/feed-hf-trainer")
    ap.add_argument("--standin", action="store_true", help="no transformers: tiny_causal_lm and Trainer's steps")
    a = ap.parse_args()
    dl = train_dataloader(a.feed, a.socket)
    if a.standin:
        run_standin(a, dl)
    else:
        run_transformers(a, dl)


if __name__ == "__main__":
    main()
