"""RandomPress (kvpress): uniform random priorities, the floor every comparison needs.

The priority of a token is a uniform draw in [0, 1) that is a hash of (``seed``, layer, KV head, position):
fixed for the token's life, the same in every batch, slot layout and mode, drawn without any state. At the
prompt the cache keeps the recent window and ``k - w`` uniformly chosen others; at every decode step the
token of lowest draw outside the recent window leaves, so the kept set is a uniform sample of the tokens seen
(per head) given the window. kvpress draws ``torch.rand`` over the prompt once (a different stream: its kept
sets are not comparable token by token). No recent window by default (kvpress)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..noise import C1, C2, C3, C4, M32, mix32, seed32
from .base import Context, Policy


def uniform_hash(seed: int, layer: int, heads: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Uniform [0, 1) float64 draws hashed from (seed, layer, head, position): ``heads`` and ``pos``
    broadcast (int64, positions >= 0)."""
    base = mix32(torch.tensor((seed32(seed) * C1 + int(layer) * C2) & M32, dtype=torch.int64))
    hk = mix32(base.to(pos.device) ^ (heads.long() * C3 & M32))
    h = mix32(hk ^ (pos.long() * C4 & M32))
    return (h.double() + 0.5) / 2.0**32


@dataclass
class RandomPolicy(Policy):
    recent: float = 0.0
    seed: int = 0

    name: ClassVar[str] = "random"
    # the draw depends on the KV head, which the contract's per-head naive replay cannot show a policy (it
    # calls ``priority`` one head at a time): declared a tensor reader, its rule test is
    # tests/test_methods_rules.py (the held keys are not read)
    reads: ClassVar[frozenset[str]] = frozenset({"tensors"})
    paper: ClassVar[str] = "kvpress RandomPress (baseline)"
    family: ClassVar[str] = "baseline"
    nonnegative: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        pos = ctx.pos
        heads = torch.arange(pos.shape[1], device=pos.device).view(1, -1, 1)
        return uniform_hash(self.seed, ctx.layer, heads, pos.clamp(min=0))
