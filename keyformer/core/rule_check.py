"""Check a policy class against its rule written naively: ``check_policy(MyPolicy, rule=my_rule)``.

A tiny model generates under the policy with the physical cache. The queries, keys and values of every
layer are captured as the model computes them, and after every forward (the prompt's, then each decode
step's) the positions the cache holds are recorded. Then, for every step and layer, ``rule`` receives a
:class:`RuleView` (the full history: every query, key and value so far, their unmasked logits, the step, the
budget) and returns the positions it keeps; they must equal the class's for every KV head. The rule never
calls the class: it derives the kept set from the captured tensors alone, as ``tests/test_policy_rules.py``
does for the built-in policies.

The tiny model's queries and keys are scaled up (:data:`SHARP`): a random model attends almost uniformly, so
its heads would agree and rules that differ in a detail would keep the same positions. Architectures whose
logits are not ``q . k * scale`` (ALiBi, soft-capping) or that have sliding-window layers are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from keyformer.core.policies.base import Policy

SHARP = 15.0  # query and key scale of the checked model (see the module docstring)
KeptSets = list[set[int]]  # per KV head: the positions held


@dataclasses.dataclass
class RuleView:
    """What a naive rule sees after one forward of one layer, for one sample (no batch axis, no padding).

    Positions ``0 .. T-1`` have been fed: the ``n`` prompt tokens, then one token per decode step
    (``T = n + step``). Tensors are float64 and cover every position so far, whatever the cache evicted.
    """

    step: int  # 0 after the prompt forward, t after decode step t
    layer: int
    num_layers: int
    n: int  # prompt tokens
    k: int  # the budget in tokens: floor(n * budget) (at least 1), or the int budget
    w: int  # the recent window in tokens: floor(k * policy.recent)
    policy: Policy  # the instance under test: read its knobs (budget, recent, ...), never its hooks
    queries: torch.Tensor  # [Hq, T, D]
    keys: torch.Tensor  # [Hkv, T, D] (after the model's position encoding, as the cache holds them)
    values: torch.Tensor  # [Hkv, T, D]
    logits: torch.Tensor  # [Hq, T, T] q_i . k_j * scale for every pair, unmasked (not causal)
    kept: list[set[int]] | None  # what this rule returned at the previous step (per KV head); None at step 0
    state: dict  # the rule's own scratch for this layer, kept across the steps of the generation
    seed: int  # the noise seed of the generation

    @property
    def T(self) -> int:
        """Positions fed so far."""
        return self.keys.shape[1]

    @property
    def newest(self) -> int:
        """The newest position (``T - 1``)."""
        return self.T - 1

    @property
    def hkv(self) -> int:
        """KV heads."""
        return self.keys.shape[0]

    @property
    def group(self) -> int:
        """Query heads per KV head (query head ``h * group + g`` reads KV head ``h``)."""
        return self.queries.shape[0] // self.keys.shape[0]

    def visible(self, head: int) -> list[int]:
        """The positions the newest query attended: the whole prompt at step 0, else the previous step's kept
        set of ``head`` plus the newest token."""
        if self.kept is None:
            return list(range(self.T))
        return sorted(self.kept[head] | {self.newest})

    def attention(self, row: int, cols: Iterable[int]) -> torch.Tensor:
        """softmax of the logits of query position ``row`` over the positions ``cols``: [Hq, len(cols)]."""
        return torch.softmax(self.logits[:, row, list(cols)], dim=-1)

    def noise(self, row: int) -> torch.Tensor:
        """The Exp(1) noise the cache draws for query position ``row`` over keys [0, row]: [Hq, row + 1]
        (Keyformer's Gumbel draw is ``-log`` of it)."""
        from keyformer.core.noise import prompt_noise

        return prompt_noise(self.seed, self.layer, row, row + 1, self.queries.shape[0], "cpu")[:, 0]


Rule = Callable[[RuleView], "Iterable[int] | list[Iterable[int]]"]


def top(scores: dict[int, float], m: int) -> set[int]:
    """The ``m`` highest-scored positions of ``scores``; ties keep the more recent (the cache's order)."""
    return set(sorted(scores, key=lambda j: (-scores[j], -j))[: max(m, 0)])


@contextlib.contextmanager
def _capture(rec: dict[int, list[tuple[torch.Tensor, ...]]]) -> Iterator[None]:
    """Record, at every layer's forward, its queries [Hq, q, D], new keys and values [Hkv, q, D] and
    scaling."""
    from keyformer.core import attention as core_attention

    orig = core_attention.attend

    def attend(module, layer, query, key, value, **kw):
        q = query.shape[2]
        rec.setdefault(layer.layer_idx, []).append(
            (query[0].double(), key[0, :, -q:].double(), value[0, :, -q:].double(), kw["scaling"]))
        return orig(module, layer, query, key, value, **kw)

    core_attention.attend = attend
    try:
        yield
    finally:
        core_attention.attend = orig


def rule_skip(model: Any) -> str | None:
    """Why the rule check cannot run on ``model``, or None."""
    from keyformer.core.models import layer_windows

    c = model.config
    if c.model_type == "mpt" or getattr(c, "alibi", False):
        return "its logits carry an ALiBi bias (the rule view holds q . k only)"
    if getattr(c, "attn_logit_softcapping", None) or getattr(c, "final_logit_softcapping", None):
        return "its logits are soft-capped (the rule view holds q . k only)"
    if any(w is not None for w in layer_windows(c)):
        return "it has sliding-window layers"
    return None


def sharpened(model: Any, scale: float = SHARP) -> Any:
    """``model`` with its query and key projections scaled by ``scale`` (in place; returned)."""
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.endswith(("q_proj", "k_proj")) and hasattr(mod, "weight"):
                mod.weight.mul_(scale)
                if getattr(mod, "bias", None) is not None:
                    mod.bias.mul_(scale)
    return model


def _as_heads(answer: Any, hkv: int, T: int, where: str) -> KeptSets:
    """The rule's answer as one set per KV head: a list of ``hkv`` collections, or one for every head."""
    if not isinstance(answer, Iterable):
        raise TypeError(f"rule returned {answer!r} at {where}; valid: the kept positions (a set/list of "
                        f"ints, the same for every KV head) or a list of {hkv} such collections (one per KV "
                        f"head)")
    items = list(answer)
    per_head = bool(items) and all(isinstance(x, Iterable) and not isinstance(x, str | bytes) for x in items)
    sets = [set(map(int, x)) for x in items] if per_head else [set(map(int, items))] * hkv
    if len(sets) != hkv:
        raise ValueError(f"rule returned {len(sets)} sets at {where}; valid: one per KV head ({hkv})")
    bad = sorted({j for s in sets for j in s if not 0 <= j < T})
    if bad:
        raise ValueError(f"rule returned positions {bad[:8]} at {where}; valid: 0 .. {T - 1} (fed so far)")
    return sets


def _difference(policy_kept: set[int], rule_kept: set[int]) -> str:
    only_p, only_r = sorted(policy_kept - rule_kept), sorted(rule_kept - policy_kept)
    return (f"the policy keeps {only_p or 'nothing more'} where the rule keeps {only_r or 'nothing more'} "
            f"({len(policy_kept & rule_kept)} positions kept by both)")


def check_rule(model: Any, policy: Policy, rule: Rule, n: int, new: int, seed: int = 11,
               prompt_seed: int = 4) -> str | None:
    """Generate ``new`` tokens from a random prompt of ``n`` tokens under ``policy`` and compare the kept
    positions with ``rule``'s at every step, layer and KV head; None when equal, else the first difference
    in words (step, layer, KV head, positions)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    from keyformer.core.generate import make_cache

    ids = torch.randint(3, 256, (1, n), generator=torch.Generator().manual_seed(prompt_seed))
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=new, seed=seed)
    held: list[list[KeptSets]] = []  # [step][layer][KV head]

    class Snap(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            held.append([cache.kept_positions(li)[0] for li in range(len(cache.layers))])
            return scores

    rec: dict[int, list[tuple[torch.Tensor, ...]]] = {}
    with torch.inference_mode(), _capture(rec):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=new,
                       min_new_tokens=new, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([Snap()]))
    layers = sorted(rec)
    qkv = {li: [torch.cat([r[i] for r in rec[li]], dim=1) for i in range(3)] for li in layers}
    scale = {li: rec[li][0][3] for li in layers}
    k = int(Policy.budget_tokens(policy, torch.tensor([n]))[0]) if policy.evicts else n + new
    w = min(math.floor(k * policy.recent), k)
    states: dict[int, dict] = {li: {} for li in layers}
    prev: dict[int, KeptSets | None] = dict.fromkeys(layers)
    for t, kept in enumerate(held):
        T = n + t
        for li in layers:
            q, key, val = (x[:, :T] for x in qkv[li])
            g = q.shape[0] // key.shape[0]
            logits = q @ key.repeat_interleave(g, dim=0).transpose(-1, -2) * scale[li]
            view = RuleView(step=t, layer=li, num_layers=len(layers), n=n, k=k, w=w, policy=policy,
                            queries=q, keys=key, values=val, logits=logits, kept=prev[li], state=states[li],
                            seed=seed)
            where = f"step {t}, layer {li}"
            want = _as_heads(rule(view), key.shape[0], T, where)
            for h, (have, rule_h) in enumerate(zip(kept[li], want, strict=True)):
                if have != rule_h:
                    return f"{where}, KV head {h}: {_difference(have, rule_h)}"
            prev[li] = want
    return None
