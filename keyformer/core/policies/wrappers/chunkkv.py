"""ChunkKV (arXiv 2502.00299, 2025): select whole chunks of consecutive tokens, not single tokens.

The prompt is divided into chunks of ``chunk_length`` consecutive positions (chunk ``pos // chunk_length``;
generated tokens continue the chunks). A chunk's priority is the mean of the wrapped scorer's priorities over
the tokens of the chunk that the layer holds, over all its KV heads (kvpress's ``ChunkKVPress``: the scores
summed over heads, averaged over the chunk), so every head of a layer keeps the same chunks; every token gets
its chunk's priority. The cut then keeps the recent window and whole chunks in order of priority; where the
budget ends inside a chunk, that chunk's most recent tokens are kept (ties keep the more recent). At a decode
step of a per-step scorer the oldest token of the lowest chunk goes. kvpress keeps ``int(chunks * budget)``
whole chunks (one fewer token count than ours where ``k`` is not a multiple of the chunk) and works on the
prompt only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context
from ..compose import Wrapper, check_int


def chunk_means(prio: torch.Tensor, pos: torch.Tensor, live: torch.Tensor, length: int) -> torch.Tensor:
    """[B, H, S]: each slot's chunk mean of ``prio`` over the live slots of all heads (float64)."""
    B, H, S = prio.shape
    use = live & (pos >= 0)
    cid = torch.where(use, pos // length, 0).reshape(B, H * S)
    nchunks = int(cid.max()) + 1 if cid.numel() else 1
    p = torch.where(use, prio.double(), 0.0).reshape(B, H * S)
    total = p.new_zeros(B, nchunks).scatter_add_(1, cid, p)
    count = p.new_zeros(B, nchunks).scatter_add_(1, cid, use.reshape(B, H * S).double())
    mean = total / count.clamp(min=1.0)
    return mean.gather(1, cid).view(B, H, S)


@dataclass
class ChunkKV(Wrapper):
    chunk_length: int = 20

    wrap_name: ClassVar[str] = "chunkkv"
    adds_reads: ClassVar[frozenset[str]] = frozenset({"tensors"})  # which slots are held (mask mode)
    paper: ClassVar[str] = "arXiv 2502.00299"
    family: ClassVar[str] = "chunked selection"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        check_int("chunk_length", self.chunk_length, 1, "tokens per chunk")

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        prio = super().priority(state, ctx)  # type: ignore[misc]
        return chunk_means(prio, ctx.pos, ctx.live, self.chunk_length)
