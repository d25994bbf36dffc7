"""LU-KV (arXiv 2602.08585; kvpress's ``LUKVPress``): per-layer-and-head budgets from a budget curve computed
offline, over any scorer; the curve is the user's file, never fetched.

The curve (``lukv_curve``: a ``.npy`` of shape ``[99, layers, KV heads]``, as the LU-KV repository's
``curve_data`` writes it) holds prune ratios: row ``t`` is for the compression ratio ``(t + 1) / 100``. At the
prompt cut of a run at ``budget`` (a fraction), row ``t = clamp(round(100 (1 - budget)) - 1, 0, 98)`` gives
layer ``l``'s heads their keep rates ``r_h = clamp(1 - curve[t, l, h], 0, 1)``; with ``n`` prompt tokens the
heads keep ``floor(r_h n)`` tokens, and the ``round(sum_h r_h n) - sum_h floor(r_h n)`` heads of largest
fractional part (ties: the lower head) one more; each count is clamped to ``[1, n]`` and the layer's total to
``[H, H n]`` (kvpress's rule, in float32 as kvpress computes it). Each head keeps its count of the scorer's
highest priorities, the first ``lukv_sink`` positions and the ``lukv_window`` newest always among them, and
holds that count at every decode cut (as Ada-KV's heads do). The budget is the curve's: a layer may hold more
or fewer than ``H k`` tokens (``kv_bytes`` counts what it holds); LU-KV's curves average to the target ratio.

A missing ``lukv_curve`` or file, or a curve whose shape does not fit the model, is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from ..base import Context
from ..compose import PreparingWrapper, check_int, own

SOURCE = "the LU-KV repository's curve_data (github.com/baidu-baige/LU-KV; docs/add-a-policy.md)"


def lukv_counts(rates: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Tokens kept per (sample, head), [B, H], from keep rates [H] (float32) and prompt lengths ``n`` [B]."""
    H = rates.numel()
    ideal = rates.float().view(1, H) * n.float().view(-1, 1)  # [B, H]
    total = torch.round(ideal.sum(-1)).long()
    total = torch.minimum(torch.maximum(total, torch.full_like(total, H)), H * n)
    base = ideal.floor().long()
    rem = (total - base.sum(-1)).clamp(min=0).view(-1, 1)
    frac = ideal - base
    order = frac.argsort(dim=-1, descending=True, stable=True)  # ties: the lower head first
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(H, device=order.device).expand_as(order))
    return torch.minimum((base + (rank < rem).long()).clamp(min=1), n.view(-1, 1))


@dataclass
class LUKV(PreparingWrapper):
    lukv_curve: str | None = None
    lukv_sink: int = 4
    lukv_window: int = 1

    wrap_name: ClassVar[str] = "lukv"
    owns: ClassVar[tuple[str, ...]] = ("head_budgets",)
    adds_reads: ClassVar[frozenset[str]] = frozenset({"tensors"})  # ctx.prepared (its curve) at the cut
    paper: ClassVar[str] = "arXiv 2602.08585 (kvpress LUKVPress)"
    family: ClassVar[str] = "layer and head budgets"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if self.lukv_curve is None:
            raise ValueError(f"lukv_curve=None: LU-KV needs its budget curve; valid: a path to the .npy "
                             f"curve [99, layers, KV heads] from {SOURCE}")
        if not Path(self.lukv_curve).is_file():
            raise ValueError(f"lukv_curve={self.lukv_curve!r}: no such file; valid: a path to the .npy curve "
                             f"[99, layers, KV heads] from {SOURCE}")
        for knob in ("lukv_sink", "lukv_window"):
            check_int(knob, getattr(self, knob), 0, "tokens always kept")
        hr = getattr(self, "head_reduction", "per_head")
        if hr != "per_head":  # one set per layer cannot hold a count per head
            raise ValueError(f"head_reduction={hr!r}: LU-KV budgets each head; valid: per_head")
        budget = self.budget  # type: ignore[attr-defined]
        if not isinstance(budget, float):
            raise ValueError(f"budget={budget!r}: LU-KV reads its curve at a ratio; valid: a fraction in "
                             "(0, 1]")

    def prepare_own(self, model: Any) -> torch.Tensor:
        import numpy as np

        curve = torch.from_numpy(np.load(self.lukv_curve, allow_pickle=False)).float()
        cfg = model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        want = (99, cfg.num_hidden_layers, heads)
        if tuple(curve.shape) != want:
            raise ValueError(f"lukv_curve={self.lukv_curve!r} has shape {tuple(curve.shape)}; valid: {want} "
                             f"(99 ratios, this model's layers and KV heads)")
        return curve

    def _rates(self, ctx: Context) -> torch.Tensor:
        t = min(max(round(100 * (1 - self.budget)) - 1, 0), 98)  # type: ignore[attr-defined]
        return (1.0 - own(ctx)[t, ctx.layer]).clamp(0.0, 1.0)

    def head_budgets(self, prio: torch.Tensor, keep_n: torch.Tensor, ctx: Context) -> torch.Tensor:
        n = (ctx.pos[:, 0] >= 0).sum(-1)  # [B] prompt tokens
        return lukv_counts(self._rates(ctx).to(prio.device), n)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        prio = super().priority(state, ctx)
        pos = ctx.pos
        keep = (pos >= 0) & ((pos < self.lukv_sink) | (pos > ctx.newest.view(-1, 1, 1) - self.lukv_window))
        return torch.where(keep, torch.inf, prio)
