"""TOVA (Oren et al. 2024): the current query alone decides.

At every step the token with the lowest attention probability from the newest query (summed over the query
heads of a GQA group, per KV head) is evicted; nothing accumulates across steps. The prompt is cut by the
attention of its last query. The original has no recent window (``recent = 0``); it keeps one set per layer
by averaging heads, where we keep one per KV head as every policy here does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy


@dataclass
class TOVAPolicy(Policy):
    recent: float = 0.0

    name: ClassVar[str] = "tova"
    needs_attention: ClassVar[bool] = True
    observe_rows: ClassVar[int | None] = 1

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        state.copy_(s)
