"""Ada-KV (Feng et al. 2024): adaptive per-head budgets inside a layer, on top of a scoring policy.

At the prompt cut the layer's total budget ``H * k`` is shared among its ``H`` KV heads: every head first
secures its top ``floor(alpha_safeguard * k)`` tokens (and its recent/observation window), then the
remaining places go to the highest-scored tokens of the whole layer, whichever head they are in (kvpress's
``AdaKVPress`` rule). Scores are comparable across heads because both inner policies score with attention
probabilities (SnapKV: pooled observation-window attention; Keyformer: Gumbel-softmax probabilities).

The per-head budgets fixed at the prompt then hold for the whole generation: ``adakv_snapkv`` keeps every
generated token (prompt compression only); ``adakv_keyformer`` evicts one token per head at every decode
step, so each head stays at its own budget. Heads are stored physically (no mask simulation): a head's unused
slots up to the layer's largest head budget are dead, so the tensors hold ``max_h k_h`` slots per head while
``kv_bytes`` counts the live tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context
from .keyformer import KeyformerPolicy
from .snapkv import SnapKVPolicy


def _rank(prio: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rank along the last dim (0 = kept first): priority descending, ties to the more recent position."""
    by_pos = pos.argsort(dim=-1, descending=True, stable=True)
    order = by_pos.gather(-1, prio.gather(-1, by_pos).argsort(dim=-1, descending=True, stable=True))
    idx = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, idx)


class AdaKVMixin:
    """Adds Ada-KV's head allocation to a scoring policy (``alpha_safeguard`` is a dataclass field)."""

    alpha_safeguard: float

    def _check_ada(self) -> None:
        a = self.alpha_safeguard
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise ValueError(f"alpha_safeguard={a!r} must be in [0, 1] (share of k every head keeps)")
        if not isinstance(self.budget, float):  # type: ignore[attr-defined]
            budget = self.budget  # type: ignore[attr-defined]
            raise ValueError(f"budget={budget!r}: Ada-KV needs a fractional budget in (0, 1] "
                             "(per-head budgets are shared out of a cut prompt)")

    def head_budgets(self, prio: torch.Tensor, keep_n: torch.Tensor, ctx: Context) -> torch.Tensor:
        B, H, S = prio.shape
        pos = ctx.pos
        safe = (keep_n.double() * self.alpha_safeguard).floor().long()
        boosted = prio.masked_fill(_rank(prio, pos) < safe.unsqueeze(-1), torch.inf)
        total = keep_n.sum(dim=1, keepdim=True)  # [B, 1]: the layer's budget
        kept = _rank(boosted.reshape(B, 1, H * S), pos.reshape(B, 1, H * S)).view(B, H * S) < total
        return kept.view(B, H, S).sum(dim=-1)


@dataclass
class AdaKVSnapKVPolicy(AdaKVMixin, SnapKVPolicy):
    alpha_safeguard: float = 0.2

    name: ClassVar[str] = "adakv_snapkv"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_ada()


@dataclass
class AdaKVKeyformerPolicy(AdaKVMixin, KeyformerPolicy):
    alpha_safeguard: float = 0.2

    name: ClassVar[str] = "adakv_keyformer"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_ada()
        if self.head_reduction != "per_head":
            raise ValueError(f"head_reduction={self.head_reduction!r}: Ada-KV allocates per head; valid: "
                             f"per_head")
