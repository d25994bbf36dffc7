"""KnormPress (Devoto et al. 2024, arXiv 2406.11430): keep the keys of lowest L2 norm.

Score-free: the attention runs through SDPA and the policy reads only the held keys. Per (sample, layer, KV
head) the priority of a held token is ``-||k_j||`` (computed in float32 or wider, as kvpress, so that
low-precision keys do not tie); at the prompt the ``k`` prompt tokens of lowest key norm are kept, and at
every decode step the held token of largest key norm (outside the recent window) leaves. A key's norm never
changes, so the per-step rule keeps the ``k`` lowest-norm tokens seen so far within the recent-window
constraint. The paper and kvpress keep no recent window (``recent`` 0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy


@dataclass
class KnormPolicy(Policy):
    recent: float = 0.0

    name: ClassVar[str] = "knorm"
    reads: ClassVar[frozenset[str]] = frozenset({"tensors"})
    paper: ClassVar[str] = "Devoto et al. 2024, arXiv 2406.11430"
    family: ClassVar[str] = "key geometry"

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        k = ctx.keys
        return -torch.linalg.vector_norm(k, dim=-1, dtype=torch.promote_types(k.dtype, torch.float32))
