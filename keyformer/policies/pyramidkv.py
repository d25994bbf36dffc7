"""PyramidKV (Cai et al. 2024): SnapKV with per-layer budgets that shrink with depth.

Scores and the single prompt cut are SnapKV's (observation window of the last ``window_size`` queries,
pooled). The budget of layer ``l`` of ``L`` falls linearly from ``max`` at the first layer to ``min`` at the
last, with ``min = k / beta`` and ``max = 2k - min`` for the per-sample budget ``k``, so the mean over layers
is ``k`` (the same total as SnapKV, up to rounding). If ``max`` would exceed ``n - window_size`` it is capped
there and ``min = 2k - max`` (the authors' KVCache-Factory rule, also kvpress's). Budgets are clamped to
[1, n]. Defaults are the authors' (beta 20, window 64, kernel 5).

``fallback``: kvpress also falls back to uniform (SnapKV) budgets whenever ``min < window_size``, i.e. for
every prompt shorter than about ``beta * window_size / (1 - compression)`` tokens; the paper has no such rule,
so it is off by default and exists for the kvpress cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .snapkv import SnapKVPolicy


@dataclass
class PyramidKVPolicy(SnapKVPolicy):
    beta: int = 20
    fallback: bool = False

    name: ClassVar[str] = "pyramidkv"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) or self.beta < 1:
            raise ValueError(f"beta={self.beta!r} must be a number >= 1 (the pyramid's max/min budget ratio)")

    def layer_budget(self, k: torch.Tensor, n: torch.Tensor, layer: int, num_layers: int) -> torch.Tensor:
        kf, nf, win = k.double(), n.double(), float(self.window_size)
        lo = kf / self.beta
        hi = 2 * kf - lo
        cap = hi >= nf - win
        hi = torch.where(cap, nf - win, hi)
        lo = torch.where(cap, 2 * kf - hi, lo)
        steps = (hi - lo) / max(num_layers - 1, 1)
        out = torch.round(hi - layer * steps).long()
        if self.fallback:
            ok = (nf >= hi) & (hi >= lo) & (lo >= win)
            out = torch.where(ok, out, k)
        return torch.minimum(out.clamp(min=1), n)
