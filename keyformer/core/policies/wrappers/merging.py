"""Merge-on-evict into the nearest survivor (kvpress's ``MergingPress``, after Token Merging, Bolya et al.
2023, and D2O, Wan et al. 2024, arXiv 2406.13035) over any scorer: the scorer decides what is kept; each token
a cut evicts folds its value into the kept token whose key is the most cosine-similar. Keys never change.

At every cut, per (sample, layer, KV head), for each evicted token ``e``: its target ``t(e)`` is the kept
token of highest cosine similarity ``s_e`` between the held keys (as cached: after RoPE; norms clamped below
at 1e-6); ``e`` is merged when ``s_e >= similarity_threshold``, with weight ``w_e = max(s_e, 0) * |v_e| /
(|v_e| + |v_t(e)| + 1e-6)``; a kept token ``t`` that receives then holds ``(v_t + sum_e w_e v_e) / (1 + sum_e
w_e)`` (the sums over the tokens merged into it; every weight and norm from the values before the cut). A
prompt cut merges every evicted prompt token; a per-step scorer's decode cut the one it evicts per head.
kvpress also has ``merge_fraction`` (only the most similar share of the evicted tokens merge); here all
above the threshold do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context, Policy
from ..compose import Wrapper

EPS = 1e-6
ROWS = 512  # evicted rows compared at once


def nearest_kept(keys: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot, the kept slot of highest key cosine similarity and that similarity ([B, H, S] each)."""
    k = keys.float()
    k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp(min=EPS)
    S = k.shape[2]
    best = k.new_full(keep.shape, -torch.inf)
    target = torch.zeros_like(keep, dtype=torch.long)
    for s0 in range(0, S, ROWS):
        sim = (k[:, :, s0 : s0 + ROWS] @ k.transpose(-1, -2)).masked_fill(~keep.unsqueeze(2), -torch.inf)
        best[..., s0 : s0 + ROWS], target[..., s0 : s0 + ROWS] = sim.max(dim=-1)
    return target, best


def merge_nearest(values: torch.Tensor, keys: torch.Tensor, keep: torch.Tensor, live: torch.Tensor,
                  threshold: float) -> None:
    """Fold the evicted values (``live & ~keep``) into their nearest kept tokens, in place (module
    docstring)."""
    target, sim = nearest_kept(keys, keep)
    ok = live & ~keep & (sim >= threshold) & sim.isfinite()
    if not bool(ok.any()):
        return
    v = values.float()
    norm = torch.linalg.vector_norm(v, dim=-1)
    w = torch.where(ok, sim.clamp(min=0) * norm / (norm + norm.gather(-1, target) + EPS), 0.0)
    acc = torch.zeros_like(v).scatter_add_(2, target.unsqueeze(-1).expand_as(v), w.unsqueeze(-1) * v)
    wsum = torch.zeros_like(w).scatter_add_(-1, target, w)
    merged = ((v + acc) / (1.0 + wsum).unsqueeze(-1)).to(values.dtype)
    values.copy_(torch.where((wsum > 0).unsqueeze(-1), merged, values))


@dataclass
class Merging(Wrapper):
    similarity_threshold: float = 0.0

    wrap_name: ClassVar[str] = "merging"
    owns: ClassVar[tuple[str, ...]] = ("on_evict",)
    adds_reads: ClassVar[frozenset[str]] = frozenset({"tensors"})  # the held keys
    paper: ClassVar[str] = "kvpress MergingPress (Token Merging; D2O, arXiv 2406.13035)"
    family: ClassVar[str] = "merge-on-evict"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        t = self.similarity_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not -1.0 <= t <= 1.0:
            raise ValueError(f"similarity_threshold={t!r} must be in [-1, 1] (least key cosine similarity "
                             "that merges)")

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        return "it scores the prompt in a forward of its own" if "prompt" in inner.reads else None

    def on_evict(self, keep: torch.Tensor, prio: torch.Tensor, ctx: Context) -> torch.Tensor:
        live = ctx.live & (ctx.pos >= 0)
        if bool((live & ~keep).any()):
            merge_nearest(ctx.values, ctx.keys, keep, live, self.similarity_threshold)
        return keep
