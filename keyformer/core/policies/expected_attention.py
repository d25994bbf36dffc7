"""Expected Attention (Devoto et al. 2025, kvpress ``ExpectedAttentionPress``): score keys by the attention
that *future* queries are expected to pay them, from the statistics of the queries seen so far.

Per (sample, layer, query head), with position-free queries ``x`` (RoPE undone: ``x = R_p^T q`` at the query's
position ``p``) over every real query seen except the first ``n_sink`` positions:

    mu = mean(x),  Sigma = mean((x - mu)(x - mu)^T)                           (biased, as kvpress)
    R  = mean_{t = c+1 .. c+F} R_t                                           (RoPE averaged over the next F
                                                                               positions; c = newest position)
    z_j = k_j . (R mu) / sqrt(d) + k_j^T (R Sigma R^T) k_j / (2 d)     (log E[exp(q.k/sqrt d)], q Gaussian)
    a_j = softmax_j(z_j)                         over the held non-sink keys
    score_j = (mean over the query heads of a KV head of a_j + epsilon) * ||v_j||

The first ``n_sink`` positions are always kept (kvpress pads them with the maximum score). Defaults are
kvpress's (F = 512, 4 sinks, covariance and value-norm on, epsilon 0, no recent window).

**Prompt and decode.** At the prompt the statistics come from the prompt's queries (kvpress's rule) and the
prompt is cut by the score. At every decode step the new query is added to the running statistics, ``R`` moves
with the newest position, every held key is re-scored and the lowest-scored one is evicted (kvpress compresses
at decode through ``DecodingPress`` every ``compression_interval`` steps from a buffer of recent hidden
states; here the rule runs at every step on all queries seen, the closest one-eviction-per-step form).

**Positions.** RoPE (Llama family: rotate-half pairs ``(i, i + r/2)``; GPT-J: interleaved pairs ``(2i, 2i +
1)`` over its ``rotary_dim``) is undone exactly from the cached post-RoPE queries; GPT-2's learned positions
are in the hidden states (nothing to undo); MPT's ALiBi adds ``slope_h * pos_j`` to ``z_j`` (the future
query's own ``-slope_h * t`` is common to every key and cancels in the softmax). RoPE scaling types other than
those that only change the frequencies (llama3; not yarn/longrope attention scaling) are refused with one
line.

The attention weights are computed by the scoring path but not used: the rule needs the queries, which only
that path passes (a cost, not a semantic difference)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import Context, Policy, Prompt


def position_info(model: Any) -> dict[str, Any]:
    """How ``model`` encodes positions: ``{"kind": "rope", "pairs": "half"|"interleaved", "inv_freq":
    [r/2]}``, ``{"kind": "alibi", "slopes": [Hq]}`` or ``{"kind": "none"}``; raises ``ValueError`` where the
    rule is not implemented."""
    arch = model.config.model_type
    if arch == "gpt2":
        return {"kind": "none"}
    if arch == "mpt":
        return {"kind": "alibi", "slopes": model.transformer.blocks[0].attn._kf_slopes.double()}
    if arch == "gptj":
        rd = model.config.rotary_dim or model.config.n_embd // model.config.n_head
        inv = 1.0 / (10000 ** (torch.arange(0, rd, 2, dtype=torch.int64) / rd))
        return {"kind": "rope", "pairs": "interleaved", "inv_freq": inv.double()}
    inner = getattr(model, "model", None)
    rot = getattr(inner, "rotary_emb", None)
    if rot is None:  # multimodal wrappers (Gemma 3) keep it in the language model
        rot = getattr(getattr(inner, "language_model", None), "rotary_emb", None)
    # Gemma 3 keeps one RoPE per layer type; the policy acts on the full-attention layers only
    prefix = "full_attention_" if rot is not None and hasattr(rot, "full_attention_inv_freq") else ""
    if rot is None or not hasattr(rot, prefix + "inv_freq"):
        raise ValueError(f"expected_attention: model_type={arch!r} has no RoPE module the rule can read; "
                         "valid: llama-family (rotate-half RoPE), gptj, gpt2, mpt")
    scale = float(getattr(rot, prefix + "attention_scaling", 1.0))
    if scale != 1.0:
        raise ValueError(f"expected_attention: RoPE with attention scaling {scale} (yarn/longrope) "
                         "is not implemented; valid: default or frequency-only scaling (llama3, linear)")
    inv = getattr(rot, prefix + "inv_freq").detach().double().cpu()
    return {"kind": "rope", "pairs": "half", "inv_freq": inv}


def _pairs(info: dict[str, Any], D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (i, j) coordinates of each RoPE plane, [r/2] each."""
    half = info["inv_freq"].numel()
    m = torch.arange(half)
    if info["pairs"] == "half":
        return m, m + half
    return 2 * m, 2 * m + 1


def unrotate(q: torch.Tensor, pos: torch.Tensor, info: dict[str, Any]) -> torch.Tensor:
    """Position-free queries ``R_p^T q``: q [B, H, r, D] (float64), pos [B, r] -> [B, H, r, D]."""
    if info["kind"] != "rope":
        return q
    i, j = _pairs(info, q.shape[-1])
    ang = pos.clamp(min=0).double().unsqueeze(-1) * info["inv_freq"].to(q.device)  # [B, r, r/2]
    c, s = ang.cos().unsqueeze(1), ang.sin().unsqueeze(1)
    out = q.clone()
    qi, qj = q[..., i], q[..., j]
    out[..., i] = c * qi + s * qj
    out[..., j] = -s * qi + c * qj
    return out


def mean_rotation(cur: torch.Tensor, F: int, D: int, info: dict[str, Any]) -> torch.Tensor:
    """``mean_{t = cur+1 .. cur+F} R_t`` as [B, D, D] (float64); the identity without RoPE."""
    B = cur.shape[0]
    R = torch.eye(D, dtype=torch.float64, device=cur.device).repeat(B, 1, 1)
    if info["kind"] != "rope":
        return R
    i, j = _pairs(info, D)
    t = (cur.view(-1, 1) + 1 + torch.arange(F, device=cur.device)).double()  # [B, F]
    ang = t.unsqueeze(-1) * info["inv_freq"].to(cur.device)  # [B, F, r/2]
    c, s = ang.cos().mean(1), ang.sin().mean(1)  # [B, r/2]
    b = torch.arange(B, device=cur.device).view(-1, 1)
    R[b, i, i], R[b, j, j], R[b, i, j], R[b, j, i] = c, c, -s, s
    return R


def fold_queries(ctx: Context, n_sink: int, second_moment: bool) -> None:
    """Fold the forward's real queries at positions ``>= n_sink``, RoPE undone (:func:`unrotate`), into
    ``ctx.layer_state``: their count ``n`` [B, 1, 1], sum ``s1`` [B, Hq, D] and, with ``second_moment``,
    ``s2 = sum x x^T`` [B, Hq, D, D] (float64); the sums restart at the prompt."""
    q = ctx.query
    B, Hq, r, D = q.shape
    qpos = ctx.pos[:, 0, -r:] if ctx.step == 0 else ctx.newest.view(-1, 1).expand(B, r)  # [B, r]
    x = unrotate(q.double(), qpos, ctx.prepared)
    use = (qpos >= n_sink).double().view(B, 1, r, 1)
    memo = ctx.layer_state
    if ctx.step == 0 or "n" not in memo:
        memo["n"] = torch.zeros(B, 1, 1, dtype=torch.float64, device=q.device)
        memo["s1"] = torch.zeros(B, Hq, D, dtype=torch.float64, device=q.device)
        if second_moment:
            memo["s2"] = torch.zeros(B, Hq, D, D, dtype=torch.float64, device=q.device)
    memo["n"] = memo["n"] + use.sum(2).view(B, 1, 1)
    memo["s1"] = memo["s1"] + (x * use).sum(2)
    if second_moment:
        memo["s2"] = memo["s2"] + torch.einsum("bhri,bhrj->bhij", x * use, x)


@dataclass
class QueryStatsPolicy(Policy):
    """A scorer of the queries seen so far: at every forward the real queries at positions ``>= n_sink`` join
    the running sums (:func:`fold_queries`), every slot is re-scored by :meth:`slot_scores` (the rule) and the
    first ``n_sink`` positions are always kept. Subclasses set ``name`` and write ``slot_scores``."""

    recent: float = 0.0
    n_future_positions: int = 512
    n_sink: int = 4

    family: ClassVar[str] = "query statistics"
    nonnegative: ClassVar[bool] = True  # the scores are; the sinks +inf
    # the scoring path is the one that passes the queries; the rule reads them and the held keys and values
    reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})
    observe_rows: ClassVar[int | None] = 1  # one score call at the prompt (the rule reads every query itself)

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, lo in (("n_future_positions", 1), ("n_sink", 0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{key}={v!r} must be an int >= {lo}")

    def prepare(self, model: Any, prompt: Prompt | None = None) -> dict[str, Any]:
        return position_info(model)

    @property
    def second_moment(self) -> bool:
        """Whether the running sums keep ``sum x x^T`` too."""
        return False

    def future_mean(self, ctx: Context) -> tuple[torch.Tensor, torch.Tensor]:
        """(``R`` [B, D, D], the mean position-free query ``mu`` [B, Hq, D]) from the layer state: ``R`` the
        RoPE matrices averaged over the ``n_future_positions`` positions after the newest."""
        memo = ctx.layer_state
        mu = memo["s1"] / memo["n"].clamp(min=1.0)
        return mean_rotation(ctx.newest, self.n_future_positions, mu.shape[-1], ctx.prepared), mu

    def slot_scores(self, ctx: Context) -> torch.Tensor:
        """[B, Hkv, S] the rule's score of every slot (non-held and sink slots: 0) from the layer state."""
        raise NotImplementedError(f"{type(self).__name__} must define slot_scores(ctx)")

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The attention weights are ignored: fold in the queries, score every slot, spread the score over the
        group and row axes of ``probs`` [B, Hkv, G, r, S] so that the path's sum gives it back."""
        fold_queries(ctx, self.n_sink, self.second_moment)
        s = self.slot_scores(ctx)
        B, Hkv, G, r, S = probs.shape
        return (s / (G * r)).view(B, Hkv, 1, 1, S).expand(B, Hkv, G, r, S)

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        state.copy_(s)  # the score of now, not a sum over steps

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        return state.masked_fill(ctx.pos < self.n_sink, torch.inf)  # sinks are always kept


@dataclass
class ExpectedAttentionPolicy(QueryStatsPolicy):
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    name: ClassVar[str] = "expected_attention"
    paper: ClassVar[str] = "Devoto et al. 2025 (kvpress ExpectedAttentionPress)"

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("use_covariance", "use_vnorm"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}={getattr(self, key)!r} must be true or false")
        if not self.epsilon >= 0:
            raise ValueError(f"epsilon={self.epsilon!r} must be >= 0")

    @property
    def second_moment(self) -> bool:
        return self.use_covariance

    def slot_scores(self, ctx: Context) -> torch.Tensor:
        memo, keys, values = ctx.layer_state, ctx.keys, ctx.values
        B, Hkv, S, D = keys.shape
        R, m = self.future_mean(ctx)  # [B, D, D], [B, Hq, D]
        G = m.shape[1] // Hkv
        mu = torch.einsum("bij,bhj->bhi", R, m).view(B, Hkv, G, D)
        k = keys.double()
        z = torch.einsum("bhsd,bhgd->bhgs", k, mu) / math.sqrt(D)
        if self.use_covariance:
            n = memo["n"].clamp(min=1.0)
            cov = memo["s2"] / n.unsqueeze(-1) - torch.einsum("bhi,bhj->bhij", m, m)  # E[x x^T] - mu mu^T
            cov = R.unsqueeze(1) @ cov @ R.transpose(-1, -2).unsqueeze(1)  # [B, Hq, D, D]
            kc = torch.einsum("bhsd,bhgde->bhgse", k, cov.view(B, Hkv, G, D, D))
            z = z + (kc * k.unsqueeze(2)).sum(-1) / (2 * D)
        info = ctx.prepared
        if info["kind"] == "alibi":
            z = z + info["slopes"].to(z.device).view(1, Hkv, G, 1) * ctx.pos.double().unsqueeze(2)
        cand = ctx.live & (ctx.pos >= self.n_sink)  # [B, Hkv, S]
        a = torch.softmax(z.masked_fill(~cand.unsqueeze(2), float("-inf")), dim=-1).nan_to_num(0.0).mean(2)
        if self.use_vnorm:
            a = (a + self.epsilon) * values.double().norm(dim=-1)
        return a.masked_fill(~cand, 0.0).float()
