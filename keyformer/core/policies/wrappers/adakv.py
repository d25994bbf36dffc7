"""Ada-KV (Feng et al. 2024, arXiv 2407.11550): adaptive per-head budgets inside a layer, over any scorer
whose priorities are comparable across heads.

At the prompt cut the layer's total budget ``H * k`` is shared among its ``H`` KV heads: every head first
secures its top ``floor(alpha_safeguard * k)`` tokens (and its recent window), then the remaining places go to
the highest priorities of the whole layer, whichever head they are in (kvpress's ``AdaKVPress`` rule). The
per-head budgets fixed at the prompt then hold for the whole generation: a scorer that cuts at every decode
step evicts one token per head and step, so each head stays at its own budget; a prompt compressor keeps every
generated token. Heads are stored physically: a head's unused slots up to the layer's largest head budget are
dead, so the tensors hold ``max_h k_h`` slots per head while ``kv_bytes`` counts the live tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context, Policy
from ..compose import Wrapper


def _rank(prio: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rank along the last dim (0 = kept first): priority descending, ties to the more recent position."""
    by_pos = pos.argsort(dim=-1, descending=True, stable=True)
    order = by_pos.gather(-1, prio.gather(-1, by_pos).argsort(dim=-1, descending=True, stable=True))
    idx = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, idx)


class AdaKVMixin:
    """Ada-KV's head allocation (``alpha_safeguard`` is a dataclass field of the class using it)."""

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
class AdaKV(AdaKVMixin, Wrapper):
    """Ada-KV over the scorer it wraps (``wrap=[adakv]``)."""

    alpha_safeguard: float = 0.2

    wrap_name: ClassVar[str] = "adakv"
    owns: ClassVar[tuple[str, ...]] = ("head_budgets",)
    paper: ClassVar[str] = "Feng et al. 2024, arXiv 2407.11550"
    family: ClassVar[str] = "head allocation"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        self._check_ada()
        hr = getattr(self, "head_reduction", "per_head")
        if hr != "per_head":
            raise ValueError(f"head_reduction={hr!r}: Ada-KV allocates per head; valid: per_head")

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        return None if inner.head_comparable else "its priorities are not comparable across heads"
