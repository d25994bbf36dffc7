"""The policy interface: what a policy sees, how it scores, and how it selects.

A policy decides, for every (sample, layer, KV head), which cached tokens survive. The attention path builds a
:class:`Context` and calls, in order, for every forward of every layer:

1. ``score(probs, ctx)`` (only when ``reads`` has ``"attention"``): per-entry scores from the attention
   probabilities ``probs`` [B, Hkv, G, q, S] (softmax of the masked logits, position bias included; 0 where
   a query may not attend). ``ctx.noise()`` gives Exp(1) noise of the same shape, computed only for the
   entries scored. At the prompt only the last ``observe_rows`` query rows are scored (all when None).
2. The attention path sums the scores over those query rows and over the query heads of a GQA group, then
   ``accumulate(state, s, ctx)`` folds them into the per-slot state [B, Hkv, S] (default: add; TOVA-like
   policies replace). After the prompt ``after_prompt(state, ctx)`` may transform it (pooling).
3. ``priority(state, ctx)``: keep-priority of the slots (higher is kept); ``ctx.pos``, ``ctx.newest``,
   ``ctx.recent_window`` and ``ctx.step`` say where they are. The cache keeps the recent window, then the
   highest-priority tokens, evicting ties oldest first.

Every hook takes the :class:`Context` (``layer_budget(k, n, ctx)`` and ``head_budgets(prio, keep_n, ctx)``
too). A scorer-only policy subclasses :class:`ScorePolicy` and writes ``score``; the other hooks are opt-in
overrides.

A policy declares its lifecycle in two class attributes, and the engine reads nothing else about its kind
(:mod:`keyformer.core.scheduler` is the one place that branches on them):

* ``cuts``, a :class:`Schedule`: when the cache is cut. ``NEVER`` (full), ``PROMPT`` (once after the
  prompt; decode tokens are then all kept), ``STEP`` (after the prompt and at every decode step) or
  ``every(n)`` (after the prompt, then at decode steps ``t`` with ``t % n == 0``: the new tokens are appended
  in between, a buffer, and a cut evicts back down to the budget at once; R-KV). An instance may answer
  differently through the ``schedule`` property (``prefill_only`` turns any schedule into ``PROMPT``).
* ``reads``: what the policy's hooks read besides slot positions. ``"attention"``: ``score`` gets the
  attention probabilities. ``"tensors"``: the :class:`Context` carries the held keys (and the forward's
  queries and values when it runs the scoring path), which slots are held, and a per-layer state dict kept for
  one generation. ``"prompt"``: ``prepare`` runs over the prompt (an extra reconstruction forward, KVzip)
  rather than once per model.

``prepare(model, prompt)`` returns what the policy needs from the model (RoPE or ALiBi data) or from the
prompt (``reads`` has ``"prompt"``); it reaches the hooks as ``ctx.prepared``.

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

SCHEDULES = ("never", "prompt", "step", "every")
READS = ("attention", "tensors", "prompt")
SLIDING = ("auto", "window", "policy")  # what an evicting policy does on a model's sliding-window layers


@dataclass(frozen=True)
class Schedule:
    """When a policy cuts the cache: ``when`` is ``"never"``, ``"prompt"`` (once, after the prompt),
    ``"step"`` (after the prompt and every decode step) or ``"every"`` (after the prompt, then at decode steps
    ``t`` with ``t % n == 0``)."""

    when: str = "step"
    n: int = 1

    def __post_init__(self) -> None:
        if self.when not in SCHEDULES:
            raise ValueError(f"schedule {self.when!r} is unknown; valid: {', '.join(SCHEDULES)}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"schedule every n={self.n!r} must be an int >= 1")

    @property
    def evicts(self) -> bool:
        return self.when != "never"

    def cuts_at(self, step: int, prompt: bool | None = None) -> bool:
        """Whether a forward ends with a cut: the prompt's (``prompt``; by default ``step == 0``) or that of
        decode step ``step``."""
        if self.when == "never":
            return False
        if (step == 0 if prompt is None else prompt) or self.when == "step":
            return True
        return self.when == "every" and step % self.n == 0

    def room(self, max_new_tokens: int) -> int:
        """Slots decode tokens may take above the budget: all of them where the cache grows after the prompt
        (``never``, ``prompt``), the buffer between cuts (``every``: n - 1), none when every step cuts."""
        if self.when in ("never", "prompt"):
            return max_new_tokens
        return self.n - 1 if self.when == "every" else 0


NEVER, PROMPT, STEP = Schedule("never"), Schedule("prompt"), Schedule("step")


def budget_problem(budget: Any) -> str | None:
    """The budget rule, the only place it is written: a float in (0, 1] (a fraction of the prompt) or an int
    >= 1 (tokens). Returns None for a valid budget, else what is wrong: ``"type"``, ``"float range"`` or
    ``"int range"``."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        return "type"
    if isinstance(budget, float):
        return None if 0.0 < budget <= 1.0 else "float range"
    return None if budget >= 1 else "int range"


def every(n: int) -> Schedule:
    """Cut after the prompt, then every ``n`` decode steps."""
    return Schedule("every", n)


@dataclass
class Prompt:
    """The prompt a ``prepare`` that reads it sees: ``input_ids`` [B, N] (left-padded), ``attention_mask``
    [B, N], and ``kv(b)``: sample ``b``'s prompt keys and values per layer from the real prompt forward, or
    None where the prompt has not run yet (the policy then runs what it needs itself)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    kv: Callable[[int], Any] | None = None


@dataclass
class Context:
    """What one forward of one layer shows a policy. Shapes: B samples, Hkv KV heads, G query heads per KV
    head, S slots (the held tokens plus this forward's new ones)."""

    layer: int = 0
    num_layers: int = 1
    # The layer's rank among the layers a policy acts on, and their count: the full-attention layers where
    # the sliding ones keep the model's window (hybrid models, by default), else every layer (PyramidKV's
    # depth).
    policy_layer: int = 0
    policy_layers: int = 1
    step: int = 0  # 0 at the prompt, t at the t-th decode step
    horizon: int = 0  # tokens this generation may produce (schedules such as Keyformer's tau span it)
    pos: torch.Tensor | None = None  # [B, Hkv, S] absolute position of each slot (-1: empty or pad)
    newest: torch.Tensor | None = None  # [B] position of the newest token
    recent_window: torch.Tensor | None = None  # [B] tokens of the recent window (always kept)
    group: int = 1  # query heads per KV head
    keys: torch.Tensor | None = None  # [B, Hkv, S, D]
    values: torch.Tensor | None = None  # [B, Hkv, S, Dv]
    query: torch.Tensor | None = None  # [B, Hq, q, D]
    noise: Callable[..., torch.Tensor] | None = None  # noise(draw=0): Exp(1) at the entries being scored
    # noised(probs, draw=0): ``normalise(probs / noise(draw))`` in place in one pass that never writes the
    # noise (the prompt's native loop), or None where unavailable for this call (then use ``noise``)
    noised: Callable[..., torch.Tensor | None] | None = None
    # Only for policies that read ``"tensors"``: which of the S slots are held ([B, Hkv, S] bool; mask mode:
    # not yet evicted) and the layer's state dict (kept for one generation; batch-major tensors in it follow
    # their rows when beams reorder)
    live: torch.Tensor | None = None
    layer_state: dict | None = None
    prepared: Any = None  # what the policy's ``prepare`` returned


@dataclass
class Policy:
    """Base policy: ``budget`` is a fraction of the prompt in (0, 1] (float) or an absolute token count
    (int >= 1); ``recent`` is the fraction of the budget reserved for the most recent tokens, in [0, 1].
    ``prefill_only`` turns any step policy into a prompt compressor (cut once after the prompt, decode tokens
    all kept), the setting kvpress and SnapKV-style methods use. ``sliding`` (of :data:`SLIDING`): whether
    the policy also compresses a model's sliding-window layers, within their window: ``window`` never (they
    keep the model's window), ``policy`` always, ``auto`` where every layer of the model slides
    (``docs/models.md``)."""

    budget: float | int = 0.5
    recent: float = 0.3
    prefill_only: bool = False
    sliding: str = "auto"

    name: ClassVar[str] = "base"
    cuts: ClassVar[Schedule] = STEP  # the class's schedule (an instance's: ``schedule``)
    reads: ClassVar[frozenset[str]] = frozenset()  # of READS
    registry: ClassVar[dict[str, type[Policy]]] = {}
    # derived from the declaration above, for readers that only ask these two questions
    evicts: ClassVar[bool] = True
    needs_attention: ClassVar[bool] = False
    # the methods table (docs/methods.md): the paper (authors year, arXiv id) and the family of the method
    paper: ClassVar[str] = ""
    family: ClassVar[str] = ""
    # whether priorities of different KV heads can be ranked together (Ada-KV's head allocation needs it), and
    # whether they are never negative (a rescaling such as CriticalKV's needs it; attention-probability
    # scorers are: a policy that reads attention and no tensors is taken to be)
    head_comparable: ClassVar[bool] = True
    nonnegative: ClassVar[bool] = False
    # a composition (keyformer.core.policies.compose): its wrappers, scorer outwards, and its scorer's class
    wrapped: ClassVar[tuple[str, ...]] = ()
    scorer: ClassVar[type[Policy] | None] = None
    # the eviction hook, None unless a wrapper writes it (merge-on-evict, threshold eviction):
    # ``on_evict(keep, prio, ctx) -> keep`` at every cut, after the kept set is known and before the evicted
    # slots are dropped; see :meth:`keyformer.core.cache.EvictingLayer.evict` and docs/add-a-policy.md
    on_evict: ClassVar[Callable[..., torch.Tensor] | None] = None

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.cuts, Schedule):
            raise TypeError(f"{cls.__name__}.cuts={cls.cuts!r} must be a Schedule (NEVER, PROMPT, STEP, "
                            f"every(n))")
        cls.reads = frozenset(cls.reads)
        bad = sorted(cls.reads - set(READS))
        if bad:
            raise TypeError(f"{cls.__name__}.reads has {bad}; valid: {', '.join(READS)}")
        cls.evicts = cls.cuts.evicts
        cls.needs_attention = "attention" in cls.reads
        if "name" in cls.__dict__:  # a concrete policy: registered under its name
            taken = Policy.registry.get(cls.name)
            where = lambda c: f"{c.__module__}.{c.__qualname__}"  # noqa: E731
            if taken is not None and where(taken) != where(cls):  # a reloaded module may re-register
                raise TypeError(f"{where(cls)}: policy name {cls.name!r} is taken by {where(taken)}; choose "
                                f"another name")
            Policy.registry[cls.name] = cls

    def __post_init__(self) -> None:
        b = self.budget
        problem = budget_problem(b)
        if problem == "type":
            raise ValueError(f"budget={b!r} must be a float in (0, 1] or an int token count >= 1")
        if problem == "float range":
            raise ValueError(f"budget={b!r} is outside (0, 1]; pass a fraction of the prompt in (0, 1] or an "
                             f"int >= 1")
        if problem == "int range":
            raise ValueError(f"budget={b!r} is a token count < 1; absolute budgets must be >= 1")
        if not 0.0 <= float(self.recent) <= 1.0:
            raise ValueError(f"recent={self.recent!r} is outside [0, 1] (fraction of the budget kept as "
                             f"recent window)")
        if not isinstance(self.prefill_only, bool):
            raise ValueError(f"prefill_only={self.prefill_only!r} must be true or false")
        if self.sliding not in SLIDING:
            raise ValueError(f"sliding={self.sliding!r} is unknown; valid: {', '.join(SLIDING)}")

    # -- lifecycle ------------------------------------------------------------------------------------
    @property
    def schedule(self) -> Schedule:
        """This instance's schedule: the class's ``cuts``, or ``PROMPT`` with ``prefill_only``."""
        return PROMPT if self.prefill_only and self.cuts.evicts else self.cuts

    def prepare(self, model: Any, prompt: Prompt | None = None) -> Any:
        """What the hooks need from the model (``prompt`` None: called once, when the cache is made) or, for
        a policy that reads ``"prompt"``, from the prompt; it reaches them as ``ctx.prepared``. May refuse an
        architecture with ``ValueError`` in one line. Default: nothing."""
        return None

    def compresses_sliding(self, windows: list[int | None]) -> bool:
        """Whether this policy acts on the model's sliding-window layers (``windows[i]`` the window W of layer
        i, None for a full-attention layer), within their window, as ``sliding`` says. A policy that never
        cuts leaves them as the model keeps them. ``sliding='window'`` on a model whose every layer slides
        is refused (the policy would act on no layer)."""
        every = all(w is not None for w in windows)
        if not self.schedule.evicts:
            return False
        if self.sliding == "window" and every:
            raise ValueError(f"policy={self.name!r} with sliding='window': every layer of this model slides "
                             f"(window {windows[0]}), so the policy would act on no layer; use sliding=auto "
                             "(it compresses them within their window) or policy=full")
        return self.sliding == "policy" or (self.sliding == "auto" and every)

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

    def head_budgets(self, prio: torch.Tensor, keep_n: torch.Tensor, ctx: Context) -> torch.Tensor | None:
        """Tokens kept per (sample, KV head) at the prompt cut, [B, H], from keep-priorities ``prio`` [B, H,
        S] (recent window +inf, dead slots -inf), positions ``ctx.pos`` [B, H, S] and the uniform counts
        ``keep_n`` [B, H]; these budgets then hold at every decode step. Default None: every head keeps the
        layer's budget (Ada-KV shares it among the heads)."""
        return None

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
        slot positions, ``ctx.newest`` [B] newest position, ``ctx.recent_window`` [B] recent-window size,
        ``ctx.step`` 0 at the prompt. The recent window is kept regardless."""
        return state


@dataclass
class ScorePolicy(Policy):
    """The common case: a policy defined by its per-entry ``score`` alone (summed over queries and steps,
    ranked as is). Subclasses set ``name`` and write ``score``; nothing else is needed."""

    reads: ClassVar[frozenset[str]] = frozenset({"attention"})

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must define score(probs, ctx)")
