"""Sliding window: keep the k most recent tokens; with ``sinks > 0`` the first ``sinks`` tokens of the
prompt are always kept too (StreamingLLM, Xiao et al. 2023), and the window shrinks to k - sinks.

Kept tokens keep their original positions (no re-rotation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy


@dataclass
class WindowPolicy(Policy):
    sinks: int = 0
    name: ClassVar[str] = "window"
    paper: ClassVar[str] = "sliding window"
    family: ClassVar[str] = "recency"
    head_comparable: ClassVar[bool] = False  # every head ranks the same positions: nothing to share

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks={self.sinks!r} must be an int >= 0")

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(k)  # the whole budget is ranked by recency below

    def priority(self, score: torch.Tensor, ctx: Context) -> torch.Tensor:
        pos = ctx.pos
        prio = pos.to(torch.float64)
        if self.sinks:
            prio = torch.where(pos < self.sinks, prio + 2.0**52, prio)
        return prio


@dataclass
class StreamingPolicy(WindowPolicy):
    """Window with 4 attention sinks (StreamingLLM's default)."""

    sinks: int = 4
    name: ClassVar[str] = "streaming"
    paper: ClassVar[str] = "Xiao et al. 2023, arXiv 2309.17453"
