"""``per_row`` log-likelihood semantics: the authors' / H2O lm-eval harness, as one masked forward.

The text (context + continuation, length ``L``) goes through the model in ONE forward without a cache.
Every attention layer builds a per-row mask (``FMInference/H2O`` ``local_heavy_hitter_mask``, Keyformer's
``*_lm_eval_harness`` variant with the softmax replaced by the policy's score):

* ``k = budget_tokens(L)`` (the WHOLE sequence), ``w = recent_tokens(k)``, ``key = k - w``;
* rows ``i < key`` attend causally to everything;
* the running score starts as the column sum of the scores of rows ``[0, key)``;
* each later row ``i`` attends to the top ``key - 1`` tokens by running score, to itself and to its window
  ``j >= i - w``; then its score row (computed over the full causal row, not the masked one) is added and
  the running score is zeroed outside the selected set (``top key-1`` and ``i``).

Scores are the policy's: H2O softmax, Keyformer Gumbel softmax at ``tau_init`` with the core's seeded
noise (``keyformer.core.noise``, the same hash as the cache's; ``noise_samples = m`` averages m independent
fields, draw ``d`` from the core's ``draw_seeds``). With GQA, scores are summed over the query heads of a
KV-head group and selection is per KV head, as in the core cache. Window / streaming policies keep the ``k``
most recent tokens per row (plus sinks); full attends causally.

**Which policies.** This rule uses a policy's ``score`` and its budget split only; it ignores
``accumulate``, ``after_prompt``, ``priority``, ``layer_budget``, ``head_budgets`` and ``compress``. So it
implements exactly :data:`PER_ROW_POLICIES` (full, window, streaming, H2O, and Keyformer with its default
``candidates=paper`` and ``head_reduction=per_head``), none with ``prefill_only``; :func:`check_policy`
refuses every other policy or setting in one line (config validation calls it before a model loads),
rather than silently giving it H2O-style selection. ``prefill_then_decode`` runs every policy's full contract.

Installed as the attention implementation ``keyformer_per_row`` (Llama family, GPT-J, GPT-2); outside a
:func:`per_row_scoring` block it delegates to the core's attention, so the model behaves as before.
MPT (ALiBi, own attention forward) is not supported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from keyformer.core import noise as hashnoise
from keyformer.core.attention import keyformer_attention
from keyformer.core.policies import (
    FullPolicy,
    H2OPolicy,
    KeyformerPolicy,
    Policy,
    StreamingPolicy,
    WindowPolicy,
)
from keyformer.core.policies.base import Context

ATTN_IMPL = "keyformer_per_row"


@dataclass
class _Active:
    policy: Policy
    seed: int


_ACTIVE: _Active | None = None

#: The policy classes whose whole rule this module implements (exact classes: a subclass such as Ada-KV's
#: Keyformer adds hooks per_row would ignore).
PER_ROW_POLICIES: tuple[type[Policy], ...] = (FullPolicy, WindowPolicy, StreamingPolicy, H2OPolicy,
                                              KeyformerPolicy)
FALLBACK = "use task.loglikelihood=prefill_then_decode (the physical cache, every policy)"


def unsupported(policy: Policy) -> str | None:
    """Why ``per_row`` does not implement ``policy`` (one line), or None when it implements its whole rule."""
    implemented = ", ".join(c.name for c in PER_ROW_POLICIES)
    if type(policy) not in PER_ROW_POLICIES:
        return (f"per_row does not implement policy={policy.name!r} (it reads only score() and the budget "
                f"split); implemented: {implemented}; {FALLBACK}")
    if policy.evicts and policy.prefill_only:
        return (f"per_row has no prompt/decode split: prefill_only=true of policy={policy.name!r} is not "
                f"implemented; {FALLBACK}")
    if isinstance(policy, KeyformerPolicy):
        if policy.candidates != "paper":
            return (f"per_row does not implement keyformer candidates={policy.candidates!r} (a decode-time "
                    f"rule); valid: paper; {FALLBACK}")
        if policy.head_reduction != "per_head":
            return (f"per_row does not implement keyformer head_reduction={policy.head_reduction!r}; valid: "
                    f"per_head; {FALLBACK}")
    return None


def check_policy(policy: Policy) -> None:
    """Raise ``ValueError`` (one line) unless ``per_row`` implements the whole rule of ``policy``."""
    reason = unsupported(policy)
    if reason is not None:
        raise ValueError(reason)


def row_noise(seed: int, layer: int, L: int, heads: int, device: torch.device | str,
              draw: int = 0) -> torch.Tensor:
    """Exp(1) noise of rows [0, L) over keys [0, L), [heads, L, L]: the core's prompt noise of field ``draw``
    (draw 0 equals :func:`keyformer.core.noise.prompt_noise`)."""
    seeds = hashnoise.draw_seeds(hashnoise.seeds_tensor([seed], torch.device(device)), draw)
    rows = torch.arange(L, device=device)
    rk = hashnoise.row_keys(seeds, layer, torch.arange(heads, device=device), rows.view(1, -1))[0]
    return hashnoise.exp_noise(rk.unsqueeze(-1), hashnoise.col_keys(rows).view(1, 1, -1))


def budget_split(policy: Policy, L: int) -> tuple[int, int]:
    """``(k, w)`` for a sequence of ``L`` tokens: ``k = budget_tokens(L)`` capped at L, ``w = recent(k)``."""
    n = torch.tensor([L])
    k = min(int(policy.budget_tokens(n)[0]), L)
    w = min(int(policy.recent_tokens(torch.tensor([k]))[0]), k)
    return k, w


def policy_score(policy: Policy, logits: torch.Tensor,
                 noise: Callable[[int], torch.Tensor] | None) -> torch.Tensor:
    """The policy's prompt-time (step 0) score [B, Hkv, G, L, L] of causal-masked ``logits`` (same shape);
    ``noise(draw)`` gives the Exp(1) field ``draw`` of that shape (:func:`row_noise`)."""
    return policy.score(torch.softmax(logits, dim=-1), Context(step=0, noise=noise))


def row_mask(policy: Policy, logits: torch.Tensor, *, seed: int, layer: int) -> torch.Tensor:
    """Bool attention mask [B, Hkv, L, L] (True = attend) from causal-masked logits [B, Hkv, G, L, L]."""
    B, Hkv, G, L, _ = logits.shape
    dev = logits.device
    i = torch.arange(L, device=dev).view(L, 1)
    j = torch.arange(L, device=dev).view(1, L)
    causal = (j <= i).expand(B, Hkv, L, L)
    if not policy.evicts:
        return causal
    k, w = budget_split(policy, L)
    if k >= L:
        return causal
    if isinstance(policy, WindowPolicy):
        sinks = min(policy.sinks, k)
        return causal & ((j > i - (k - sinks)) | (j < sinks))
    check_policy(policy)
    noise = None
    if policy.uses_noise:
        def noise(draw: int = 0) -> torch.Tensor:
            return row_noise(seed, layer, L, Hkv * G, dev, draw).reshape(1, Hkv, G, L, L)
    s = policy_score(policy, logits, noise).sum(2)  # [B, Hkv, L, L]
    key = k - w
    heavy = torch.zeros(B, Hkv, L, L, dtype=torch.bool, device=dev)
    if key > 0:
        heavy[..., :key, :key] = True
        acc = s[..., :key, :].sum(-2)  # [B, Hkv, L]
        for r in range(key, L):
            sel = torch.zeros(B, Hkv, L, dtype=torch.bool, device=dev)
            if key > 1:
                sel.scatter_(-1, acc[..., :r].topk(key - 1, dim=-1).indices, True)
            sel[..., r] = True
            heavy[..., r, :] = sel
            acc = (acc + s[..., r, :]) * sel
    return causal & (heavy | (j >= i - w))


def per_row_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` entry: per-row masked attention inside :func:`per_row_scoring`, else the
    core's."""
    active = _ACTIVE
    if active is None or getattr(key, "_kf_layer", None) is not None:
        return keyformer_attention(module, query, key, value, attention_mask, scaling=scaling,
                                   dropout=dropout, **kwargs)
    B, Hq, L, D = query.shape
    Hkv = key.shape[1]
    G = Hq // Hkv
    if key.shape[2] != L:
        raise ValueError("per_row scoring needs one forward over the whole text without a cache")
    scale = scaling if scaling is not None else D**-0.5
    logits = torch.matmul(query.reshape(B, Hkv, G * L, D), key.transpose(-1, -2)).float() * scale
    logits = logits.view(B, Hkv, G, L, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=query.device).tril()
    logits = logits.masked_fill(~causal, float("-inf"))
    mask = row_mask(active.policy, logits, seed=active.seed, layer=int(getattr(module, "layer_idx", 0) or 0))
    probs = torch.softmax(logits.masked_fill(~mask.unsqueeze(2), float("-inf")), dim=-1).to(value.dtype)
    out = torch.matmul(probs.reshape(B, Hkv, G * L, L), value).reshape(B, Hq, L, -1)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPL, per_row_attention)
AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


@contextmanager
def per_row_scoring(model: Any, policy: Policy, seed: int = 0) -> Iterator[None]:
    """Within the block, cache-less forwards of ``model`` use the per-row masks of ``policy``."""
    global _ACTIVE
    check_policy(policy)
    if model.config.model_type == "mpt":
        raise NotImplementedError("per_row semantics are not implemented for MPT (ALiBi attention); "
                                  "use loglikelihood=prefill_then_decode")
    prev = model.config._attn_implementation
    model.set_attn_implementation(ATTN_IMPL)
    _ACTIVE = _Active(policy, seed)
    try:
        yield
    finally:
        _ACTIVE = None
        model.set_attn_implementation(prev)
