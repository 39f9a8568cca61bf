# SPDX-License-Identifier: MIT
"""A stand-in for a Hugging Face causal LM, for machines without transformers.

Debian 12 has torch 1.13 but not transformers, so the examples and tests that
show feed with Hugging Face run against this module when transformers is
missing. What matters is the same as in transformers:

- for_causal_lm_loss() is transformers' ForCausalLMLoss (loss_utils.py,
  4.46 and later; older versions do the same with logits[..., :-1, :] and
  labels[..., 1:]): the labels are shifted inside, -100 is ignored, the mean
  is over the supervised positions.
- TinyCausalLM.forward() takes exactly the keyword arguments a causal LM's
  forward() takes for training (input_ids, attention_mask, position_ids,
  labels) and nothing else, so an extra key (cu_seqlens) fails as it does with
  transformers before 4.46, and returns an output with .loss and .logits.

The model itself is tiny: logits[q] depend on input_ids[q] and position_ids[q]
only, so the loss of a batch is a function of exactly the (token, position,
target) triples it supervises, which is what the label tests compare with the
reference stream.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100


def fixed_cross_entropy(source, target, num_items_in_batch=None, ignore_index=IGNORE_INDEX, **kwargs):
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(source, target, ignore_index=ignore_index, reduction=reduction)
    if reduction == "sum":
        loss = loss / num_items_in_batch
    return loss


def for_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=IGNORE_INDEX,
                       shift_labels=None, **kwargs):
    """transformers.loss.loss_utils.ForCausalLMLoss."""
    logits = logits.float()
    if shift_labels is None:
        labels = labels.to(logits.device)
        labels = F.pad(labels, (0, 1), value=ignore_index)  # shift left by one, -100 at the end
        shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab_size)
    shift_labels = shift_labels.view(-1).to(logits.device)
    return fixed_cross_entropy(logits, shift_labels, num_items_in_batch, ignore_index, **kwargs)


def megatron_loss(logits, labels):
    """Megatron-LM's convention: labels are already the next token; no shift."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1).long(),
                           ignore_index=IGNORE_INDEX)


class CausalLMOutput(dict):
    """Like transformers' ModelOutput: a dict with attribute access."""

    __getattr__ = dict.__getitem__


class TinyCausalLM(nn.Module):
    def __init__(self, vocab_size, max_positions=4096, d_model=16, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_positions, d_model)
        self.head = nn.Linear(d_model, vocab_size)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[-1]).expand_as(input_ids)
        h = torch.tanh(self.embed(input_ids) + self.pos(position_ids))
        logits = self.head(h)
        loss = None if labels is None else for_causal_lm_loss(logits, labels, self.vocab_size)
        return CausalLMOutput(loss=loss, logits=logits)
