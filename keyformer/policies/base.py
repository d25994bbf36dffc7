"""The policy interface: score tokens, then select which to keep.

A policy decides, for every (sample, layer, KV head), which cached tokens survive. The cache calls it in
two places:

* ``score``: turns attention probabilities ``[..., q, kv]`` (softmax of the masked logits, position bias
  included; 0 where a query may not attend) into per-entry scores of the same shape. The cache sums them over query rows and over the query heads of a
  GQA group and *accumulates* them per token across steps. Policies that need no attention
  (``needs_scores = False``) are never asked.
* ``priority``: maps the accumulated scores to the keep-priority of candidate tokens (higher is kept).

Budget semantics (shared by all evicting policies): a prompt of ``n`` real tokens is processed with full
attention; the cache is then cut to ``k = budget_tokens(n)`` tokens: the ``w = recent_tokens(k)`` most
recent ones plus the ``k - w`` non-recent tokens of highest priority. At every decode step the new token is
appended (``k + 1`` entries, all attended), its scores are accumulated, and one entry is evicted so the
cache again holds exactly ``k`` tokens, the new one included. Evicted tokens never come back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass
class Policy:
    """Base policy: ``budget`` is a fraction of the prompt in (0, 1] (float) or an absolute token count
    (int >= 1); ``recent`` is the fraction of the budget reserved for the most recent tokens, in [0, 1]."""

    budget: float | int = 0.5
    recent: float = 0.3

    name: ClassVar[str] = "base"
    needs_scores: ClassVar[bool] = False
    evicts: ClassVar[bool] = True
    registry: ClassVar[dict[str, type[Policy]]] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a concrete policy: registered under its name
            Policy.registry[cls.name] = cls

    def __post_init__(self) -> None:
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise ValueError(f"budget={b!r} must be a float in (0, 1] or an int token count >= 1")
        if isinstance(b, float) and not 0.0 < b <= 1.0:
            raise ValueError(f"budget={b!r} is outside (0, 1]; pass a fraction of the prompt in (0, 1] or an int >= 1")
        if isinstance(b, int) and b < 1:
            raise ValueError(f"budget={b!r} is a token count < 1; absolute budgets must be >= 1")
        if not 0.0 <= float(self.recent) <= 1.0:
            raise ValueError(f"recent={self.recent!r} is outside [0, 1] (fraction of the budget kept as recent window)")

    # -- budget ---------------------------------------------------------------------------------
    def budget_tokens(self, n: torch.Tensor) -> torch.Tensor:
        """k per sample from real prompt lengths ``n`` [B]: ``int(n * budget)`` (at least 1), or the
        absolute budget."""
        if isinstance(self.budget, int):
            return torch.full_like(n, self.budget)
        return (n.double() * self.budget).floor().long().clamp(min=1)

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        """w per sample: ``int(k * recent)``."""
        return (k.double() * self.recent).floor().long()

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, probs: torch.Tensor, *, step: int, noise: torch.Tensor | None) -> torch.Tensor:
        """Per-entry scores from attention probabilities ``[..., q, kv]`` (fp32). ``noise`` is i.i.d.
        Exp(1) of the same shape when ``uses_noise`` (Gumbel = -log noise); ``step`` is 0 at the prompt,
        t at the t-th decode step. May work in place on ``probs`` (callers are done with them)."""
        raise NotImplementedError

    uses_noise: ClassVar[bool] = False

    def priority(
        self, score: torch.Tensor, pos: torch.Tensor, cur: torch.Tensor, w: torch.Tensor, *, step: int
    ) -> torch.Tensor:
        """Keep-priority of candidates. ``score``/``pos`` [B, H, S]; ``cur`` [B] newest position;
        ``w`` [B] recent window size; ``step`` 0 at the prompt, t at the t-th decode step.
        Default: the accumulated score."""
        return score
