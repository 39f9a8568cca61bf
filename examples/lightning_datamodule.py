#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""PyTorch Lightning fed by feedd: a LightningDataModule over feed.Loader.

    python3 examples/lightning_datamodule.py --feed web --steps 50 --vocab 4001

feedd deals each rank its own stream ($RANK / $WORLD_SIZE, which Lightning's
launchers set), so the DataModule returns the DataLoader as it is and tells
Lightning not to add a DistributedSampler (use_distributed_sampler=False,
replace_sampler_ddp=False before Lightning 2.0). The stream is endless: set
max_steps. Needs pytorch_lightning or lightning (not in Debian 12).
"""

import argparse
import os
import sys
from pathlib import Path

import torch

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

try:
    import feed
except ImportError:  # not installed: the source tree's package and build's libfeed
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo / "client" / "python"))
    os.environ.setdefault("FEEDD_BUILD_DIR", str(repo / "build"))
    import feed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_causal_lm import TinyCausalLM  # noqa: E402


class FeedDataModule(pl.LightningDataModule):
    def __init__(self, feed_name, socket=None):
        super().__init__()
        self.feed_name, self.socket = feed_name, socket
        self.loader = None

    def train_dataloader(self):
        # Created here, in the process that trains (after Lightning spawned it and set RANK).
        self.loader = feed.Loader(self.feed_name, socket=self.socket, labels="hf")
        return torch.utils.data.DataLoader(self.loader, batch_size=None, num_workers=0,
                                           collate_fn=feed.Batch.for_hf)

    def state_dict(self):
        return {"feed": self.loader.state_dict()} if self.loader else {}

    def load_state_dict(self, state):
        if state and self.loader:
            self.loader.load_state_dict(state["feed"])


class LitLM(pl.LightningModule):
    def __init__(self, vocab, lr):
        super().__init__()
        self.model = TinyCausalLM(vocab, d_model=32)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch)["loss"]
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--feed", default="web")
    ap.add_argument("--socket", default=None)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()
    major = int(pl.__version__.split(".")[0])
    sampler = {"use_distributed_sampler": False} if major >= 2 else {"replace_sampler_ddp": False}
    trainer = pl.Trainer(max_steps=a.steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         **sampler)
    trainer.fit(LitLM(a.vocab, a.lr), datamodule=FeedDataModule(a.feed, a.socket))
    print(f"done: {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
