"""SnapKV (Li et al. 2024): compress the prompt once, by the attention of its last queries.

The last ``window_size`` prompt queries (the observation window) score every prompt token before the window:
their attention probabilities, summed over the window's rows and the query heads of a GQA group, then
average-pooled along the keys (``kernel_size``, zero padding, the window cut off first, as the authors'
``avg_pool1d`` over ``attn[..., -window:, :-window]``). The cache keeps the observation window
plus the top ``k - window`` other prompt tokens, per (sample, layer, KV head), once after the prompt; every
generated token is then kept. Defaults are the authors' code's (window 64, kernel 5, average pooling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .base import PROMPT, Context, Policy, Schedule


@dataclass
class SnapKVPolicy(Policy):
    window_size: int = 64
    kernel_size: int = 5

    name: ClassVar[str] = "snapkv"
    paper: ClassVar[str] = "Li et al. 2024, arXiv 2404.14469"
    family: ClassVar[str] = "attention"
    reads: ClassVar[frozenset[str]] = frozenset({"attention"})
    cuts: ClassVar[Schedule] = PROMPT

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("window_size", "kernel_size"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key}={v!r} must be an int >= 1")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={self.kernel_size!r} must be odd (centred pooling)")

    @property
    def observe_rows(self) -> int:  # type: ignore[override]
        return self.window_size

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        """The observation window is always kept (``recent`` is not used)."""
        return k.clamp(max=self.window_size)

    def after_prompt(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Pool the scores of the keys before the observation window (the window itself is kept); as the
        authors' ``attn[..., -window:, :-window]`` then ``avg_pool1d``, the window counts as zero padding."""
        B, H, n = state.shape
        window = ctx.pos[..., :n] > (ctx.newest - self.window_size).view(-1, 1, 1)
        state = state.masked_fill(window, 0.0)
        pooled = (F.avg_pool1d(state.reshape(B * H, 1, n), self.kernel_size, stride=1,
                               padding=self.kernel_size // 2))
        return pooled.view(B, H, n)
