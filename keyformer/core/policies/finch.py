"""Finch (Corallo & Papotti 2024, TACL, arXiv 2408.00167; kvpress ``FinchPress``): compress the prompt once,
guided by the question at its end.

The last ``window_size`` prompt queries (the question or instruction that ends the prompt) score every prompt
token before them: each query row's attention probabilities are multiplied by the number of keys that row
attends with a non-zero weight (the causal frontier, padding and a model's sliding window hide the others), so
that the early and late rows of the question weigh alike, then summed over the window's rows and the query
heads of a GQA group. No pooling. The cache keeps the window plus the top ``k - window`` other prompt tokens,
per (sample, layer, KV head), once after the prompt; every generated token is then kept (prompt only: the
question exists only at the prompt).

The window is a fixed knob, ``window_size`` (default 64 tokens): set it to the length of the question the
prompts end with. kvpress sizes it per prompt from a delimiter token it adds to the tokenizer (and to the
model's embeddings, which it resizes) and strips before the forward; here the prompts are token ids for an
unchanged model, and every sample of a batch scores the same last rows (the engine's observation rows), so a
fixed window is what a batch can share. The paper's chunk-by-chunk processing of long documents (and kvpress's
``chunk_length``, a uniform share per chunk) is not done: the prompt is one forward. Kept keys keep their
positions (kvpress re-rotates them: ``rerotate_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import PROMPT, Context, Policy, Schedule


@dataclass
class FinchPolicy(Policy):
    window_size: int = 64

    name: ClassVar[str] = "finch"
    paper: ClassVar[str] = "Corallo & Papotti 2024, arXiv 2408.00167"
    family: ClassVar[str] = "attention"
    reads: ClassVar[frozenset[str]] = frozenset({"attention"})
    cuts: ClassVar[Schedule] = PROMPT

    def __post_init__(self) -> None:
        super().__post_init__()
        v = self.window_size
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"window_size={v!r} must be an int >= 1 (the question's tokens at the prompt's "
                             "end)")

    @property
    def observe_rows(self) -> int:  # type: ignore[override]
        return self.window_size

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        """The question window is always kept (``recent`` is not used)."""
        return k.clamp(max=self.window_size)

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Each row of ``probs`` [B, Hkv, G, r, S] times its count of non-zero weights."""
        return probs.mul_((probs > 0).sum(-1, keepdim=True))
