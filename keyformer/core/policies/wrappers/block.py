"""Block-wise prompt processing (KeyDiff's, Park et al. 2025, arXiv 2504.15364; kvpress's ``BlockPress``):
the prompt cut selects its ``k`` tokens block by block, each round scoring only the tokens kept so far and the
next block, as a prompt processed in blocks under a fixed cache would.

At the prompt cut, per (sample, layer, KV head), with ``n`` prompt tokens and ``k = min(budget_tokens(n),
n)``: the first ``k`` prompt positions are kept; then for blocks of ``block_tokens`` positions ``[k + r b, k +
(r + 1) b)``, in order, the candidates are the kept tokens and the block's, the scorer ranks them as if they
were the only tokens held (``ctx.live`` narrowed to them), and the ``k`` of highest priority (ties: the more
recent) become the kept tokens. After the last block the ``k`` kept rank above every other token, by the
scorer's priority over them alone; the rest follow by the scorer's priority over the whole prompt. The cut
then keeps the recent window and the ``k - w`` highest of that order (the block selection itself where the
scorer keeps no recent window, as KeyDiff and key norm do). Decode cuts are the scorer's own.

A scorer whose priority of a token depends on the other held tokens (KeyDiff's anchor, leverage's centring)
ranks differently in blocks than over the whole prompt; one whose priority is the token's own (key norm,
Random) keeps the same set. kvpress computes the whole prompt in one forward and then selects in blocks, as
here; neither is a chunked prefill over an evicting cache. Scorers that read the prompt's attention (or run
their own prompt pass, KVzip) are refused: their priorities come from every query of the whole prompt, which a
block does not change (kvpress's ``BlockPress`` refuses attention too).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context, Policy
from ..compose import Wrapper, check_int
from .adakv import _rank

FLOOR = -1e300  # below any finite priority, above a non-candidate's -inf


def block_rounds(n: torch.Tensor, k: torch.Tensor, block: int) -> int:
    """Rounds the longest prompt of the batch takes: blocks of ``block`` after the first ``k`` tokens."""
    return int(((n - k).clamp(min=0) + block - 1).div(block, rounding_mode="floor").max())


@dataclass
class Block(Wrapper):
    block_tokens: int = 128  # kvpress 0.5.5's block_size

    wrap_name: ClassVar[str] = "block"
    paper: ClassVar[str] = ("Park et al. 2025, arXiv 2504.15364 (KeyDiff's block processing); "
                            "kvpress BlockPress")
    family: ClassVar[str] = "chunked selection"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        check_int("block_tokens", self.block_tokens, 1, "prompt tokens per block")

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        if {"attention", "prompt"} & set(inner.reads):
            return ("it ranks tokens by the whole prompt's attention (or its own prompt pass), which a block "
                    "does not change; block processing needs a scorer that reads only the held tokens")
        return None

    def _ranked(self, state: torch.Tensor, ctx: Context, live: torch.Tensor) -> torch.Tensor:
        """Rank (0 first) of the scorer's priorities over the ``live`` tokens alone; the others last."""
        prio = super().priority(state, dataclasses.replace(ctx, live=live))  # type: ignore[misc]
        key = torch.where(live, prio.double().nan_to_num(nan=FLOOR, neginf=FLOOR), -torch.inf)
        return _rank(key, ctx.pos)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        prio = super().priority(state, ctx)  # type: ignore[misc]
        if ctx.step > 0:
            return prio
        pos = ctx.pos
        real = pos >= 0
        if ctx.live is not None:
            real = real & ctx.live
        n = (pos[:, 0] >= 0).sum(-1)  # [B] prompt tokens
        k = torch.minimum(self.budget_tokens(n), n)  # type: ignore[attr-defined]
        kb = k.view(-1, 1, 1)
        kept = real & (pos < kb)
        after = pos - kb  # offset past the first k positions
        b = self.block_tokens
        for r in range(block_rounds(n, k, b)):
            cand = kept | (real & (after >= r * b) & (after < (r + 1) * b))
            kept = cand & (self._ranked(state, ctx, cand) < kb)
        first = self._ranked(state, ctx, kept)
        rest = _rank(torch.where(real, prio.double().nan_to_num(nan=FLOOR, neginf=FLOOR), -torch.inf), pos)
        m = float(pos.shape[-1])  # ranks are in [0, S): the kept in (m, 2m], the others in (0, m]
        return torch.where(kept, 2 * m - first.double(), m - rest.double())
