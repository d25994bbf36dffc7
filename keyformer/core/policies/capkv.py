"""CapKV (arXiv 2604.25975; kvpress ``CapPress``): keep the tokens whose values add the most to the capacity
of the cache, weighted by their alignment with the queries.

Per (sample, layer, query head), over the held tokens except the first ``n_sink`` positions (the
candidates), with position-free queries ``x`` (RoPE undone, as in :mod:`.expected_attention`) of every real
query seen except the first ``n_sink`` positions:

    a   = R mean(x)                          (the query anchor; R: RoPE averaged over the next F positions)
    w_j = exp(tau cos(a, k_j) - max_j tau cos(a, k_j))         (k_j the cached post-RoPE key)
    A   = I + sum_j (w_j + epsilon) v_j v_j^T                  (the values as output directions)
    s_j = w_j v_j^T A^-1 v_j

and the score of a KV head's token is the mean of ``s_j`` over the query heads of its group. The first
``n_sink`` positions are always kept (kvpress pads them above every score). Defaults are kvpress's (tau 5,
F = 512, 4 sinks, epsilon 1e-6, no recent window); kvpress's ``A`` is ``I + sum (sqrt(w + eps) v)(sqrt(w +
eps) v)^T``, the same matrix.

**Prompt and decode.** At the prompt the anchor is the mean of the prompt's queries (kvpress's rule) and the
prompt is cut by the score. At every decode step the new query joins the mean, ``R`` moves with the newest
position, every held token is re-scored (``w`` and ``A`` over the held candidates) and the lowest-scored one
is evicted (kvpress's press scores the prompt; at decode it compresses only through ``DecodingPress``, every
``compression_interval`` steps from a buffer of recent hidden states; here the rule runs at every step on all
queries seen, as ``expected_attention`` does). ``prefill_only`` gives kvpress's prompt-only use. Each forward
costs one ``Dv x Dv`` solve per (sample, layer, query head) over the held tokens (float64).

**Positions.** The running query sums, the averaged RoPE and the sinks are :class:`.QueryStatsPolicy`'s
(:mod:`.expected_attention`: its GPT-2, GPT-J and RoPE-scaling rules); ALiBi (MPT) adds no bias here: the
cosine compares directions, and the keys carry no position. The attention weights are computed by the scoring
path but not used (the rule needs the queries and values)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .base import Context
from .expected_attention import QueryStatsPolicy


def alignment_weights(keys: torch.Tensor, anchor: torch.Tensor, cand: torch.Tensor,
                      tau: float) -> torch.Tensor:
    """[B, Hkv, G, S] ``exp(tau cos - max)`` of keys [B, Hkv, S, D] against the anchors [B, Hkv, G, D] over
    the candidates ``cand`` [B, Hkv, S] (0 elsewhere)."""
    cos = torch.einsum("bhsd,bhgd->bhgs", F.normalize(keys, dim=-1), F.normalize(anchor, dim=-1)).clamp(-1, 1)
    logits = (tau * cos).masked_fill(~cand.unsqueeze(2), -math.inf)
    top = logits.amax(-1, keepdim=True).clamp(min=-1e30)  # a head without candidates: every weight 0
    return torch.exp(logits - top)


def capacity_scores(values: torch.Tensor, w: torch.Tensor, cand: torch.Tensor,
                    epsilon: float) -> torch.Tensor:
    """[B, Hkv, G, S] ``w_j v_j^T A^-1 v_j`` with ``A = I + sum_j (w_j + epsilon) v_j v_j^T`` over the
    candidates; values [B, Hkv, S, Dv], weights [B, Hkv, G, S]."""
    v = values * cand.unsqueeze(-1)
    eye = torch.eye(v.shape[-1], dtype=v.dtype, device=v.device)
    A = eye + torch.einsum("bhgs,bhsd,bhse->bhgde", (w + epsilon) * cand.unsqueeze(2), v, v)
    sol = torch.linalg.solve(A, v.transpose(-1, -2).unsqueeze(2))  # [B, Hkv, G, Dv, S]
    return w * (v.transpose(-1, -2).unsqueeze(2) * sol).sum(-2)


@dataclass
class CapKVPolicy(QueryStatsPolicy):
    tau: float = 5.0
    epsilon: float = 1e-6

    name: ClassVar[str] = "capkv"
    paper: ClassVar[str] = "arXiv 2604.25975 (kvpress CapPress)"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, lo in (("tau", "> 0"), ("epsilon", ">= 0")):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not (
                    v > 0 if key == "tau" else v >= 0):
                raise ValueError(f"{key}={v!r} must be a finite number {lo}")

    def slot_scores(self, ctx: Context) -> torch.Tensor:
        keys = ctx.keys.double()
        B, Hkv, S, D = keys.shape
        R, mu = self.future_mean(ctx)  # [B, D, D], [B, Hq, D]
        anchor = torch.einsum("bij,bhj->bhi", R, mu).view(B, Hkv, -1, D)
        cand = ctx.live & (ctx.pos >= self.n_sink)
        w = alignment_weights(keys, anchor, cand, self.tau)
        s = capacity_scores(ctx.values.double(), w, cand, self.epsilon).mean(2)
        return s.masked_fill(~cand, 0.0).float()
