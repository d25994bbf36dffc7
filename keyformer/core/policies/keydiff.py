"""KeyDiff (Park et al. 2025, arXiv 2504.15364): keep the keys that differ most from the mean key.

Score-free: no attention weight is ever computed, so the attention runs through SDPA (flash attention on a
GPU) and the policy only reads the held keys. Per (sample, layer, KV head), over the ``S`` held slots:

    anchor = mean_j( k_j / ||k_j|| )            (the mean of the normalised held keys)
    priority_j = -cos(k_j, anchor)               (higher = more different = kept)

At the prompt the cache keeps the ``k`` prompt tokens of highest priority (kvpress's ``KeyDiffPress``:
``-cosine_similarity(keys, normalize(keys).mean)``); at every decode step the anchor is recomputed over the
``k + 1`` held keys and the token most similar to it is evicted: the paper's block-wise eviction with a block
of one token. The paper and kvpress keep no recent window, so ``recent`` defaults to 0; pads and (mask mode)
evicted slots count neither in the anchor nor as candidates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .base import Context, Policy


def keydiff_priority(keys: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """``-cos(k_j, mean_i normalize(k_i))`` over the live slots: keys [B, H, S, D], live [B, H, S] ->
    [B, H, S]."""
    k = keys.float()
    w = live.unsqueeze(-1).float()
    anchor = (F.normalize(k, p=2, dim=-1) * w).sum(-2, keepdim=True) / w.sum(-2, keepdim=True).clamp(min=1.0)
    return -F.cosine_similarity(k, anchor, dim=-1)


@dataclass
class KeyDiffPolicy(Policy):
    recent: float = 0.0

    name: ClassVar[str] = "keydiff"
    paper: ClassVar[str] = "Park et al. 2025, arXiv 2504.15364"
    family: ClassVar[str] = "key geometry"
    reads: ClassVar[frozenset[str]] = frozenset({"tensors"})  # the held keys; never the attention weights

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        return keydiff_priority(ctx.keys, ctx.live)
