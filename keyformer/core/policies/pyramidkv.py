"""PyramidKV (Cai et al. 2024): SnapKV with per-layer budgets that shrink with depth.

Scores and the single prompt cut are SnapKV's (observation window of the last ``window_size`` queries,
pooled). Every layer keeps the window ``w = min(window_size, k)``; the budget outside it, ``k - w`` on
average, falls linearly from ``max`` at the first layer to ``min`` at the last, with ``min = (k - w) / beta``
and ``max = 2 (k - w) - min``, so the mean over layers is ``k`` (the same total as SnapKV, up to rounding). If
``max`` would exceed ``n - w`` it is capped there and ``min = 2 (k - w) - max``. This is the authors'
KVCache-Factory rule (``PyramidKVCluster``: the pyramid is over the budget outside the window). Budgets are
clamped to [1, n]. Defaults are the authors' (beta 20, window 64, kernel 5).

Depth is counted over the layers the policy acts on: on a hybrid model (Gemma 2/3) the full-attention layers,
ranked by depth (the sliding layers keep the model's window), so the mean over those layers is still ``k``, as
for every other policy; a model with one such layer gets ``k``.

``fallback``: kvpress falls back to uniform (SnapKV) budgets whenever its ``min`` is below ``window_size``,
i.e. for every prompt shorter than about ``beta * window_size / (1 - compression)`` tokens; the paper has no
such rule, so it is off by default and exists for the kvpress cross-check (applied here to the budget outside
the window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context
from .snapkv import SnapKVPolicy


def pyramid_budget(k: torch.Tensor, n: torch.Tensor, w: torch.Tensor, layer: int, num_layers: int,
                   beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PyramidKV's budget of ``layer`` (of ``num_layers``): the window ``w`` plus an arithmetic sequence of
    the rest ``k - w`` from ``2(k - w) - lo`` (first layer) down to ``lo = (k - w) / beta`` (last), capped at
    the ``n - w`` tokens there are; returns ``(budget, lo)``."""
    wf = w.double()
    kk, nf = k.double() - wf, n.double()
    lo = kk / beta
    hi = 2 * kk - lo
    cap = hi >= nf - wf
    hi = torch.where(cap, nf - wf, hi)
    lo = torch.where(cap, 2 * kk - hi, lo)
    steps = (hi - lo) / max(num_layers - 1, 1)
    return (wf + torch.round(hi - layer * steps)).long(), lo


@dataclass
class PyramidKVPolicy(SnapKVPolicy):
    beta: int = 20
    fallback: bool = False

    name: ClassVar[str] = "pyramidkv"
    paper: ClassVar[str] = "Cai et al. 2024, arXiv 2406.02069"
    family: ClassVar[str] = "attention, layer budgets"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or self.beta < 1:
            raise ValueError(f"beta={self.beta!r} must be a number >= 1 (the pyramid's max/min budget ratio)")

    def layer_budget(self, k: torch.Tensor, n: torch.Tensor, ctx: Context) -> torch.Tensor:
        layer, num_layers = ctx.policy_layer, ctx.policy_layers  # the layers it acts on (hybrid: global ones)
        if num_layers == 1:  # one layer: the pyramid's mean is its only value
            return torch.minimum(k.clamp(min=1), n)
        w = k.clamp(max=self.window_size)
        out, lo = pyramid_budget(k, n, w, layer, num_layers, self.beta)
        if self.fallback:
            out = torch.where(lo >= self.window_size, out, k)
        return torch.minimum(out.clamp(min=1), n)
