"""Independent chunks (kvpress's ``ChunkPress``; FINCH, Corallo & Papotti 2024, TACL): the prompt cut is made
per chunk of ``chunk_tokens`` consecutive positions, each chunk keeping its share, so the kept tokens spread
over the whole prompt.

At the prompt cut, per (sample, layer, KV head): chunk ``c`` holds the prompt tokens at positions
``[c * chunk_tokens, (c + 1) * chunk_tokens)`` (``m_c`` of them, the last chunk maybe fewer); its share is
``q_c = max(1, floor(m_c * k / n))`` (``k`` the budget's tokens, ``n`` the prompt's; under a layer
wrapper the shares stay the budget's and the cut keeps the layer's count); the ``q_c`` tokens of highest
scorer priority in the chunk (ties: the more recent) rank above every other token, by priority among
themselves.
The cut then keeps the recent window and the ``k - w`` highest of that order: each chunk's share when the
shares fill the budget, the best of the rest where they leave places, and the best shares where the ``max(1,
.)`` floors or a recent window overfill it. Decode cuts (a per-step scorer) are the scorer's own.

A selection rule only: the scorer's priorities come from the whole prompt. kvpress scores each chunk alone
(the scorer sees only the chunk's tokens), which gives the same priorities for a scorer whose priority of a
token depends on that token alone (KnormPress, Random; attention scorers see causal attention from the whole
prompt in both) and different ones where it depends on the others (SnapKV's window queries, LeverageScore's
centring, LagKV's partitions). ChunkKV (``wrap=[chunkkv]``) ranks whole chunks instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context
from ..compose import Wrapper, check_int
from .adakv import _rank

LONG_MAX = torch.iinfo(torch.long).max


def chunk_shares(prio: torch.Tensor, pos: torch.Tensor, length: int, k: torch.Tensor, n: torch.Tensor
                 ) -> torch.Tensor:
    """[B, H, S] bool: the tokens within their chunk's share (``pos >= 0`` are the prompt's tokens; ``k``,
    ``n`` [B] the budget and prompt tokens)."""
    S = prio.shape[-1]
    use = pos >= 0
    rank = _rank(torch.where(use, prio.double(), -torch.inf), pos)  # ties: the more recent first
    cid = torch.where(use, pos // length, LONG_MAX)
    by_rank = rank.argsort(dim=-1)
    order = by_rank.gather(-1, cid.gather(-1, by_rank).argsort(dim=-1, stable=True))  # by chunk, then rank
    c_sorted = cid.gather(-1, order)
    idx = torch.arange(S, device=pos.device).expand_as(c_sorted)
    change = torch.ones_like(c_sorted, dtype=torch.bool)
    change[..., 1:] = c_sorted[..., 1:] != c_sorted[..., :-1]
    start = torch.where(change, idx, 0).cummax(dim=-1).values
    local = torch.empty_like(order).scatter_(-1, order, idx - start)  # rank within the chunk
    chunk = torch.where(use, cid, 0)
    sizes = torch.zeros_like(pos).scatter_add_(-1, chunk, use.long())  # m_c at index c
    m = sizes.gather(-1, chunk)
    share = torch.maximum(m * k.view(-1, 1, 1) // n.view(-1, 1, 1), torch.ones_like(m))
    return use & (local < share)


@dataclass
class Chunk(Wrapper):
    chunk_tokens: int = 1024  # kvpress 0.5.5's chunk_length

    wrap_name: ClassVar[str] = "chunk"
    paper: ClassVar[str] = "Corallo & Papotti 2024, TACL (FINCH); kvpress ChunkPress"
    family: ClassVar[str] = "chunked selection"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        check_int("chunk_tokens", self.chunk_tokens, 1, "prompt tokens per chunk")

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        prio = super().priority(state, ctx)  # type: ignore[misc]
        if ctx.step > 0:
            return prio
        pos = ctx.pos
        n = (pos[:, 0] >= 0).sum(-1)  # [B] prompt tokens
        k = self.budget_tokens(n)  # type: ignore[attr-defined]
        inside = chunk_shares(prio, pos, self.chunk_tokens, torch.minimum(k, n), n)
        rank = _rank(torch.where(pos >= 0, prio.double(), -torch.inf), pos)  # the prompt's tokens: [0, n)
        m = n.view(-1, 1, 1).double()  # values in [1, 2n] whatever the padding: the shares first, by priority
        return inside.double() * m + (m - rank.double())
