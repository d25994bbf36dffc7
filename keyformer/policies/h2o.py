"""H2O (Zhang et al. 2023): accumulated softmax attention per (sample, layer, KV head); keep the recent
window w plus the top (k - w) older tokens ("heavy hitters")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Policy


@dataclass
class H2OPolicy(Policy):
    name: ClassVar[str] = "h2o"
    needs_scores: ClassVar[bool] = True

    def score(self, probs: torch.Tensor, *, step: int, noise: torch.Tensor | None) -> torch.Tensor:
        return probs
