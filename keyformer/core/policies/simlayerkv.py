"""SimLayerKV (Zhang et al. 2024, arXiv 2410.13846; kvpress ``SimLayerKVPress``): "lazy" layers, whose
last queries attend almost only to the first and the most recent tokens, keep only those.

Per (sample, layer), from the prompt's attention: the last ``n_last`` prompt queries' probabilities, averaged
over those rows and every query head of the layer, summed over the first ``n_initial`` tokens and the
``n_recent`` most recent ones (the last query's own token included: the set a lazy layer keeps). Above
``lazy_threshold`` the layer is lazy. Every layer then keeps a StreamingLLM cache (the ``n_initial`` first
tokens, then the most recent): a lazy layer ``min(k, n_initial + n_recent)`` tokens, any other layer its
budget ``k`` (everything at budget 1.0: the paper's full layers). Per sample: a sample's lazy layers do not
depend on its batchmates (kvpress averages the statistic over the batch). kvpress's statistic leaves out the
last ``n_last`` keys and takes the ``n_recent`` before them, and a lazy layer keeps the last ``n_recent -
n_last``: one window, shifted by ``n_last`` tokens.

Budget in live bytes: the declared ``budget`` bounds every layer (the run records it, as for every policy);
lazy layers hold less, so the effective ratio is data-dependent: ``(lazy * min(k, n_initial + n_recent) +
(L - lazy) * k) / (L * n)`` for a prompt of ``n`` tokens over ``L`` layers, of which ``lazy`` are. The run
reports it as ``kv_ratio`` (measured live KV bytes over a full cache's, per sample; kvpress reports its mean
over layers as the press's ``compression_ratio`` after the forward).

The budgets are fixed at the prompt cut and held at every decode step: each step the oldest non-initial token
of every layer leaves (the paper's lazy layers stream through decoding). ``prefill_only=true`` cuts once after
the prompt and keeps every generated token (kvpress's schedule). Where the budget is at or above a prompt's
length (budget 1.0), the engine holds a per-head budget only below the prompt: a lazy layer is then cut to its
window at the prompt and grows by one token a step afterwards (as with ``prefill_only``).

The statistic reads the prompt's attention through the shared prompt pass (its last ``n_last`` rows); the
decision reaches the prompt cut through the layer state, so the policy reads ``"tensors"`` too. Thresholds
the paper recommends (kvpress's docstring): Llama 3 0.9, Llama 2 0.65, Mistral 0.8, Qwen 0.85.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy

SINK = 2.0**52  # the initial tokens rank above every position


def lazy_mass(state: torch.Tensor, pos: torch.Tensor, newest: torch.Tensor, heads: int,
              rows: torch.Tensor, n_initial: int, n_recent: int) -> torch.Tensor:
    """[B] mean attention of the scored rows over the initial and recent tokens: ``state`` [B, Hkv, n], the
    prompt scores summed over ``rows`` [B] rows and the query heads (``heads`` in all); ``pos`` [B, Hkv,
    n]."""
    real = pos >= 0
    near = real & ((pos < n_initial) | (pos > (newest - n_recent).view(-1, 1, 1)))
    return torch.where(near, state.double(), 0.0).sum((1, 2)) / (heads * rows.clamp(min=1)).double()


@dataclass
class SimLayerKVPolicy(Policy):
    recent: float = 0.0
    lazy_threshold: float = 0.9
    n_last: int = 1
    n_recent: int = 1024
    n_initial: int = 4

    name: ClassVar[str] = "simlayerkv"
    paper: ClassVar[str] = "Zhang et al. 2024, arXiv 2410.13846"
    family: ClassVar[str] = "layer allocation"
    reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})  # the lazy flag: the layer state
    head_comparable: ClassVar[bool] = False  # every head ranks the same positions: nothing to share

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, lo in (("n_last", 1), ("n_recent", 1), ("n_initial", 0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{key}={v!r} must be an int >= {lo}")
        t = self.lazy_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= t <= 1.0:
            raise ValueError(f"lazy_threshold={t!r} must be a number in [0, 1] (1.0: no layer is lazy)")

    @property
    def observe_rows(self) -> int:  # type: ignore[override]
        return self.n_last

    def after_prompt(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Decide, per sample, whether this layer is lazy (``ctx.layer_state["lazy"]`` [B] bool)."""
        B, Hkv, n = state.shape
        pos = ctx.pos[..., :n]
        rows = ((pos[:, 0] >= 0).sum(-1)).clamp(max=self.n_last)  # the real rows scored
        mass = lazy_mass(state, pos, ctx.newest, Hkv * ctx.group, rows, self.n_initial, self.n_recent)
        ctx.layer_state["lazy"] = mass > self.lazy_threshold
        return state

    def head_budgets(self, prio: torch.Tensor, keep_n: torch.Tensor, ctx: Context) -> torch.Tensor:
        """A lazy layer's heads keep at most ``n_initial + n_recent`` tokens; the others their budget."""
        lazy = ctx.layer_state["lazy"].view(-1, 1)
        return torch.where(lazy, keep_n.clamp(max=self.n_initial + self.n_recent), keep_n)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """StreamingLLM's order: the initial tokens, then by recency."""
        pos = ctx.pos
        return torch.where((pos >= 0) & (pos < self.n_initial), pos + SINK, pos.to(torch.float64))
