"""The policy interface: what a policy sees, how it scores, and how it selects.

A policy decides, for every (sample, layer, KV head), which cached tokens survive. The attention path builds a
:class:`Context` and calls, in order, for every forward of every layer:

1. ``score(probs, ctx)`` (only when ``needs_attention``): per-entry scores from the attention probabilities
   ``probs`` [B, Hkv, G, q, S] (softmax of the masked logits, position bias included; 0 where a query may not
   attend). ``ctx.noise()`` gives Exp(1) noise of the same shape, computed only for the entries scored. At the
   prompt only the last ``observe_rows`` query rows are scored (all when None).
2. The attention path sums the scores over those query rows and over the query heads of a GQA group, then
   ``accumulate(state, s, ctx)`` folds them into the per-slot state [B, Hkv, S] (default: add; TOVA-like
   policies replace). After the prompt ``after_prompt(state, ctx)`` may transform it (pooling).
3. ``priority(state, ctx)``: keep-priority of the slots (higher is kept); ``ctx.pos``, ``ctx.cur``, ``ctx.w``
   and ``ctx.step`` say where they are. The cache keeps the recent window, then the highest-priority tokens,
   evicting ties oldest first.

Every hook takes the :class:`Context` (``layer_budget(k, n, ctx)`` and ``head_budgets(prio, keep_n, ctx)``
too). A scorer-only policy subclasses :class:`ScorePolicy` and writes ``score``; the other hooks are opt-in
overrides.

``compress`` says when the cache is cut: ``"step"`` (after the prompt and at every decode step) or
``"prompt"`` (once after the prompt; decode tokens are then all kept) or ``"interval"`` (after the prompt,
then only at decode steps ``t`` where ``policy.cuts_at(t)``: the new tokens are appended in between, a
buffer, and a cut evicts back down to the budget at once; R-KV).

Budget semantics (shared by all evicting policies): a prompt of ``n`` real tokens is processed with full
attention; the cache is then cut to ``k = budget_tokens(n)`` tokens: the ``w = recent_tokens(k)`` most
recent ones plus the ``k - w`` non-recent tokens of highest priority. At every decode step the new token is
appended (``k + 1`` entries, all attended), its scores are accumulated, and one entry is evicted so the
cache again holds exactly ``k`` tokens, the new one included. Evicted tokens never come back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch


@dataclass
class Context:
    """What one forward of one layer shows a policy. Shapes: B samples, Hkv KV heads, G query heads per KV
    head, S slots (the held tokens plus this forward's new ones)."""

    layer: int = 0
    num_layers: int = 1
    # The layer's rank among the layers a policy acts on, and their count: on hybrid models the
    # full-attention layers (sliding ones keep the model's window), else every layer (PyramidKV's depth).
    policy_layer: int = 0
    policy_layers: int = 1
    step: int = 0  # 0 at the prompt, t at the t-th decode step
    horizon: int = 0  # tokens this generation may produce (schedules such as Keyformer's tau span it)
    pos: torch.Tensor | None = None  # [B, Hkv, S] absolute position of each slot (-1: empty or pad)
    cur: torch.Tensor | None = None  # [B] position of the newest token
    w: torch.Tensor | None = None  # [B] recent-window size
    group: int = 1
    keys: torch.Tensor | None = None  # [B, Hkv, S, D]
    values: torch.Tensor | None = None
    query: torch.Tensor | None = None  # [B, Hq, q, D]
    noise: Callable[..., torch.Tensor] | None = None  # noise(draw=0): Exp(1) at the entries being scored
    # noised(probs, draw=0): ``normalise(probs / noise(draw))`` in place in one pass that never writes the
    # noise (the prompt's native loop), or None where unavailable for this call (then use ``noise``)
    noised: Callable[..., torch.Tensor | None] | None = None
    # Only for policies with ``needs_context`` (rules on keys/queries, not attention weights): which of the S
    # slots are held ([B, Hkv, S] bool; mask mode: not yet evicted), the layer's scratch dict (kept for one
    # generation, reordered with beams) and what the policy's ``model_info(model)`` returned.
    live: torch.Tensor | None = None
    memo: dict | None = None
    model_info: Any = None


@dataclass
class Policy:
    """Base policy: ``budget`` is a fraction of the prompt in (0, 1] (float) or an absolute token count
    (int >= 1); ``recent`` is the fraction of the budget reserved for the most recent tokens, in [0, 1].
    ``prefill_only`` turns any step policy into a prompt compressor (cut once after the prompt, decode tokens
    all kept), the setting kvpress and SnapKV-style methods use."""

    budget: float | int = 0.5
    recent: float = 0.3
    prefill_only: bool = False

    name: ClassVar[str] = "base"
    evicts: ClassVar[bool] = True
    needs_attention: ClassVar[bool] = False
    compress: ClassVar[str] = "step"  # "step" | "prompt" | "interval"
    needs_context: ClassVar[bool] = False  # priority/score get keys, live slots, memo, model_info (Context)
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
            raise ValueError(f"budget={b!r} is outside (0, 1]; pass a fraction of the prompt in (0, 1] or an "
                             f"int >= 1")
        if isinstance(b, int) and b < 1:
            raise ValueError(f"budget={b!r} is a token count < 1; absolute budgets must be >= 1")
        if not 0.0 <= float(self.recent) <= 1.0:
            raise ValueError(f"recent={self.recent!r} is outside [0, 1] (fraction of the budget kept as "
                             f"recent window)")
        if not isinstance(self.prefill_only, bool):
            raise ValueError(f"prefill_only={self.prefill_only!r} must be true or false")
        if self.prefill_only:
            self.compress = "prompt"  # type: ignore[misc]  # shadows the class's "step" for this instance

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

    def layer_budget(self, k: torch.Tensor, n: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Budget [B] of layer ``ctx.layer`` (of ``ctx.num_layers``) from the per-sample budget ``k`` [B] and
        prompt lengths ``n`` [B]. Default: ``k`` in every layer; per-layer policies (PyramidKV) keep the mean
        at ``k``."""
        return k

    adaptive_heads: ClassVar[bool] = False  # head_budgets() shares a layer's budget among its heads (Ada-KV)

    def head_budgets(self, prio: torch.Tensor, keep_n: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Tokens kept per (sample, KV head) at the prompt cut, [B, H], from keep-priorities ``prio`` [B, H,
        S] (recent window +inf, dead slots -inf), positions ``ctx.pos`` [B, H, S] and the uniform counts
        ``keep_n`` [B, H]; called only when ``adaptive_heads``. These budgets then hold at every decode
        step."""
        return keep_n

    # -- scoring ----------------------------------------------------------------------------------
    uses_noise: ClassVar[bool] = False
    observe_rows: ClassVar[int | None] = None  # prompt query rows scored (the last ones); None = all

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Per-entry scores from attention probabilities [B, Hkv, G, q, S] (fp32). May work in place."""
        return probs

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        """Fold this forward's scores ``s`` [B, Hkv, S] into the slot state (in place). Default: sum."""
        state += s

    def after_prompt(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The state [B, Hkv, n] after the prompt's scores are in, before the first cut."""
        return state

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Keep-priority of the slots (higher is kept) from the state [B, Hkv, S]; ``ctx.pos`` [B, Hkv, S]
        slot positions, ``ctx.cur`` [B] newest position, ``ctx.w`` [B] recent-window size, ``ctx.step`` 0 at
        the prompt. The recent window is kept regardless."""
        return state


@dataclass
class ScorePolicy(Policy):
    """The common case: a policy defined by its per-entry ``score`` alone (summed over queries and steps,
    ranked as is). Subclasses set ``name`` and write ``score``; nothing else is needed."""

    needs_attention: ClassVar[bool] = True

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define score(probs, ctx)")
