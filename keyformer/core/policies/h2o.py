"""H2O (Zhang et al. 2023): accumulated softmax attention per (sample, layer, KV head); keep the recent
window w plus the top (k - w) older tokens ("heavy hitters")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, ScorePolicy


@dataclass
class H2OPolicy(ScorePolicy):
    """Score = attention probability, summed over query rows, GQA heads and steps (the base defaults)."""

    name: ClassVar[str] = "h2o"
    paper: ClassVar[str] = "Zhang et al. 2023, arXiv 2306.14048"
    family: ClassVar[str] = "attention"

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        return probs
