"""Full cache: nothing is evicted. Token-identical to plain ``generate()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import NEVER, Policy, Schedule


@dataclass
class FullPolicy(Policy):
    budget: float | int = 1.0
    name: ClassVar[str] = "full"
    paper: ClassVar[str] = "reference (no eviction)"
    family: ClassVar[str] = "baseline"
    cuts: ClassVar[Schedule] = NEVER

    def budget_tokens(self, n: torch.Tensor) -> torch.Tensor:
        """Every token: the largest int64 per sample, whatever ``budget`` says."""
        return torch.full_like(n, torch.iinfo(torch.long).max)

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        """No recent window (nothing is cut)."""
        return torch.zeros_like(k)
