"""TOVA (Oren et al. 2024): the current query alone decides.

At every step the token with the lowest attention probability from the newest query is evicted; nothing
accumulates across steps. The prompt is cut by the attention of its last query. The original has no recent
window (``recent = 0``) and keeps one set per layer: the attention averaged over all heads
(``head_reduction = "layer"``, the authors' ``tova_cache.py``: ``mean(attn[:, :, -1, :], dim=1)``).
``head_reduction = "per_head"`` keeps one set per KV head instead (the sum over its query group).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy

HEAD_REDUCTIONS = ("layer", "per_head")


@dataclass
class TOVAPolicy(Policy):
    recent: float = 0.0
    head_reduction: str = "layer"

    name: ClassVar[str] = "tova"
    paper: ClassVar[str] = "Oren et al. 2024, arXiv 2401.06104"
    family: ClassVar[str] = "attention"
    reads: ClassVar[frozenset[str]] = frozenset({"attention"})
    observe_rows: ClassVar[int | None] = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.head_reduction not in HEAD_REDUCTIONS:
            raise ValueError(f"head_reduction={self.head_reduction!r} is unknown; valid: "
                             f"{', '.join(HEAD_REDUCTIONS)}")

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        if self.head_reduction == "layer":  # every KV head gets the layer's mean: one kept set per layer
            s = s.mean(dim=1, keepdim=True).expand_as(s)
        state.copy_(s)
