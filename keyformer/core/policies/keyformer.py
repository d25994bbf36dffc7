"""Keyformer (Adnan et al., MLSys 2024): Gumbel-softmax key-token scores.

score_t = softmax((logits + g) / tau_t) over the cached tokens, with ``g`` Gumbel(0, 1) per
(query head, query, key) (:mod:`keyformer.core.noise`) and ``tau_t = tau_init + t * (tau_end - tau_init) / T``
(t = 0 at prefill, t at the t-th decode step; T = ``max_new_tokens``, by default the generation's own
length). Logits include the model's position bias (ALiBi for MPT). ``noise_samples = m`` averages the score
over m independent noise fields (a lower-variance estimate of the expected Gumbel-softmax score).
Scores accumulate per (sample, layer, KV head); the cache keeps w recent + top (k - w) key tokens.

Candidate rule:
* ``paper`` (default): at each decode step the token leaving the recent window competes for a key slot
  with the current key tokens (the paper's "k + 1 - w" candidates).
* ``reference``: as the authors' code, the token leaving the window is always dropped, so the key set is
  frozen after prefill and decode-time accumulation cannot change it.

``head_reduction``: ``per_head`` selects per KV head; ``shared`` sums scores over the KV heads of a layer
and keeps the same tokens in every head (an ablation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .. import noise as hashnoise
from .base import Context, Policy

CANDIDATE_RULES = ("paper", "reference")
DEFAULT_HORIZON = 128  # the authors' max_new_tokens
FUSE_MIN = 1 << 18  # entries from which the score runs as one compiled kernel (see gumbel_score)
HEAD_REDUCTIONS = ("per_head", "shared")


@dataclass
class KeyformerPolicy(Policy):
    tau_init: float = 1.0
    tau_end: float = 2.0
    noise: bool = True
    candidates: str = "paper"
    head_reduction: str = "per_head"
    noise_samples: int = 1  # average the score over this many independent noise fields
    max_new_tokens: int | None = None  # tau schedule length; None: the generation's max_new_tokens

    name: ClassVar[str] = "keyformer"
    paper: ClassVar[str] = "Adnan et al. 2024, arXiv 2403.09054"
    family: ClassVar[str] = "attention"
    reads: ClassVar[frozenset[str]] = frozenset({"attention"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tau_init > 0:
            raise ValueError(f"tau_init={self.tau_init!r} must be > 0")
        if self.tau_end < self.tau_init:
            raise ValueError(f"tau_end={self.tau_end!r} must be >= tau_init={self.tau_init!r}")
        if isinstance(self.noise_samples, bool) or not isinstance(self.noise_samples,
                                                                  int) or self.noise_samples < 1:
            raise ValueError(f"noise_samples={self.noise_samples!r} must be an int >= 1")
        if self.candidates not in CANDIDATE_RULES:
            raise ValueError(f"candidates={self.candidates!r} is unknown; valid: "
                             f"{', '.join(CANDIDATE_RULES)}")
        if self.head_reduction not in HEAD_REDUCTIONS:
            raise ValueError(f"head_reduction={self.head_reduction!r} is unknown; valid: "
                             f"{', '.join(HEAD_REDUCTIONS)}")
        if self.max_new_tokens is not None and (isinstance(self.max_new_tokens, bool) or self.max_new_tokens
                                                < 1):
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r} must be null (the generation's length) "
                             f"or >= 1")

    @property
    def uses_noise(self) -> bool:  # type: ignore[override]
        return self.noise

    def tau(self, step: int, horizon: int | None = None) -> float:
        """tau at decode step ``step``: the schedule spans ``max_new_tokens``, else the generation's length
        ``horizon``, else (scoring without a generation, as lm-eval's log-likelihoods) the paper's 128."""
        T = self.max_new_tokens or horizon or DEFAULT_HORIZON
        return self.tau_init + step * (self.tau_end - self.tau_init) / T

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """``softmax((x + g) / tau)`` with ``g = -log E`` Gumbel, computed as ``normalise((p / E)^(1/tau))``
        from the attention probabilities ``p = softmax(x)`` (``exp((x - log E) / tau) = (e^x / E)^(1/tau)``).
        Works in place on ``probs``; noise is evaluated only at the entries scored."""
        tau = self.tau(ctx.step, ctx.horizon)
        if not self.noise:
            return gumbel_score(probs, None, tau)
        if self.noise_samples == 1:
            return _one_draw(probs, ctx, 0, tau)
        total = _one_draw(probs.clone(), ctx, 0, tau)
        for draw in range(1, self.noise_samples):
            total += _one_draw(probs.clone() if draw + 1 < self.noise_samples else probs, ctx, draw, tau)
        return total.div_(self.noise_samples)

    def priority(self, score: torch.Tensor, ctx: Context) -> torch.Tensor:
        if self.candidates == "reference" and ctx.step > 0:
            leaving = ctx.pos == (ctx.newest - ctx.recent_window).view(-1, 1, 1)
            score = score.masked_fill(leaving, float("-inf"))
        if self.head_reduction == "shared":
            score = score.sum(dim=1, keepdim=True).expand_as(score)
        return score


def _one_draw(probs: torch.Tensor, ctx: Context, draw: int, tau: float) -> torch.Tensor:
    """The score under noise field ``draw``: fused with the noise where the forward offers it at this tau
    (``ctx.noised``: the prompt's native loop, tau = 1), else from the materialised noise."""
    if tau == 1.0 and ctx.noised is not None:
        out = ctx.noised(probs, draw)
        if out is not None:
            return out
    return gumbel_score(probs, ctx.noise(draw), tau)


def gumbel_score(probs: torch.Tensor, noise: torch.Tensor | None, tau: float) -> torch.Tensor:
    """``normalise((probs / noise) ** (1 / tau))`` over the last axis (in place when eager). On CPU, a large
    block (the prompt's) is one compiled kernel instead of four passes over memory; a decode row stays eager:
    profiled at a 1k prompt, a compiled call took 114 us per layer against about 30 us for the four small
    ops. The power is ``exp(log(w) / tau)`` on CPU (see below), ``pow`` elsewhere."""
    if noise is None and tau == 1.0:
        return probs
    if noise is not None and probs.numel() >= FUSE_MIN and hashnoise.use_compile(probs):
        if tau == 1.0:
            return hashnoise.compiled("gumbel1", _noised)(probs, noise)
        inv = torch.tensor(1.0 / tau, dtype=probs.dtype)  # a tensor: no recompilation as tau anneals
        return hashnoise.compiled("gumbel", _noised_tau)(probs, noise, inv)
    w = probs if noise is None else probs.div_(noise)
    if tau != 1.0:
        # on CPU torch's pow with a float exponent is a scalar loop (at batch 64 the largest Keyformer-only
        # cost of a decode step); exp(log(w) / tau) is three vectorised passes, faster, within a few ulp of
        # pow (tested; w = 0 gives exp(-inf) = 0, as pow)
        w = w.log_().mul_(1.0 / tau).exp_() if w.device.type == "cpu" else w.pow_(1.0 / tau)
    return w.div_(w.sum(dim=-1, keepdim=True))


def _noised(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    w = probs / noise
    return w / w.sum(dim=-1, keepdim=True)


def _noised_tau(probs: torch.Tensor, noise: torch.Tensor, inv_tau: torch.Tensor) -> torch.Tensor:
    w = (probs / noise) ** inv_tau
    return w / w.sum(dim=-1, keepdim=True)
