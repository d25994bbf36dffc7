"""LeverageScore (Chari & Van Durme 2025, Compactor, arXiv 2507.08143; kvpress ``LeverageScorePress``): keep
the tokens whose pre-RoPE keys are statistical outliers, by their approximate leverage.

Per (sample, layer, KV head), over the held keys: the keys with RoPE undone (exactly, from the cached
post-RoPE keys and each token's position: the same rotation the model applied, see ``expected_attention``;
GPT-2 and MPT keys carry no rotation), centred over the held tokens, times a Gaussian sketch ``Phi``
[head_dim, sketch_dimension] / sqrt(sketch_dimension): ``X``. The leverage of token ``j`` is
``x_j^T (X^T X + 0.01 I)^-1 x_j`` (kvpress's Cholesky with its first jitter, in float64), and the priority is
its z-score over the sample's held tokens of every head of the layer. ``Phi`` is drawn from ``seed`` and the
layer (one per KV head, shared by the samples of a batch, so that a sample's result does not depend on its
batchmates; kvpress draws one per sample and call). kvpress scores the prompt only; here the rule is
re-applied to the held keys at every decode step and the lowest-leverage token (outside the recent window)
leaves. On Qwen3 and Gemma the keys are normalised before RoPE, so the undone keys are the normalised ones, as
kvpress's ``get_prerope_key_states`` computes them. No recent window by default (kvpress). When a head holds
no more than ``min(head_dim, sketch_dimension) + 1`` tokens, the centred sketch has full row rank and every
leverage is the same (``1 - 1/m``, less the jitter's share): the ranking is then decided by rounding (tiny
test models; real budgets are far above a head's dimension)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import Context, Policy, Prompt
from .expected_attention import _pairs, position_info

JITTER = 1e-2


def unrotate_keys(keys: torch.Tensor, pos: torch.Tensor, info: dict[str, Any]) -> torch.Tensor:
    """Pre-RoPE keys ``R_p^T k``: keys [B, H, S, D] (float64), slot positions [B, H, S]."""
    if info["kind"] != "rope":
        return keys
    i, j = _pairs(info, keys.shape[-1])
    ang = pos.clamp(min=0).double().unsqueeze(-1) * info["inv_freq"].to(keys.device)  # [B, H, S, r/2]
    c, s = ang.cos(), ang.sin()
    out = keys.clone()
    ki, kj = keys[..., i], keys[..., j]
    out[..., i] = c * ki + s * kj
    out[..., j] = -s * ki + c * kj
    return out


def sketch(seed: int, layer: int, heads: int, d: int, k: int) -> torch.Tensor:
    """[heads, d, k] Gaussian sketch / sqrt(k), drawn from (seed, layer) on the CPU (float64)."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(layer))
    return torch.randn(heads, d, k, generator=g, dtype=torch.float64) / k**0.5


def leverage(x: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """[m] approximate leverage of the rows of x [m, D] (one head's held keys, in position order) under the
    sketch phi [D, k]."""
    X = (x - x.mean(0, keepdim=True)) @ phi.to(x.device)  # [m, k]
    G = X.T @ X
    G = 0.5 * (G + G.T) + JITTER * torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    return (X * torch.linalg.solve(G, X.T).T).sum(-1).clamp(min=0)


def leverages(x: torch.Tensor, pos: torch.Tensor, live: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
    """[B, H, S] :func:`leverage` of every (sample, head)'s held rows of x [B, H, S, D] (0 elsewhere), each
    computed over exactly its held tokens in position order, so that the result depends on the held set
    alone (not on the slot layout, the batch or the mode)."""
    B, H, S, _ = x.shape
    out = torch.zeros(B, H, S, dtype=torch.float64, device=x.device)
    order = torch.where(live, pos, torch.iinfo(torch.long).max).argsort(dim=-1, stable=True)
    counts = live.sum(-1).tolist()
    for b in range(B):
        for h in range(H):
            idx = order[b, h, : counts[b][h]]
            if len(idx):
                out[b, h, idx] = leverage(x[b, h, idx], phi[h])
    return out


@dataclass
class LeveragePolicy(Policy):
    recent: float = 0.0
    sketch_dimension: int = 48
    seed: int = 0

    name: ClassVar[str] = "leverage"
    reads: ClassVar[frozenset[str]] = frozenset({"tensors"})
    paper: ClassVar[str] = "Chari & Van Durme 2025, arXiv 2507.08143"
    family: ClassVar[str] = "key geometry"

    def __post_init__(self) -> None:
        super().__post_init__()
        v = self.sketch_dimension
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"sketch_dimension={v!r} must be an int >= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")

    def prepare(self, model: Any, prompt: Prompt | None = None) -> dict[str, Any]:
        info = position_info(model)
        if info["kind"] == "alibi":  # ALiBi is a bias on the logits: the cached keys carry no position
            info = {"kind": "none"}
        return info

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        keys, pos = ctx.keys, ctx.pos
        live = ctx.live & (pos >= 0)
        B, H, S, D = keys.shape
        x = unrotate_keys(keys.double(), pos, ctx.prepared or {"kind": "none"})
        lev = leverages(x, pos, live, sketch(self.seed, ctx.layer, H, D, self.sketch_dimension))
        n = live.sum((1, 2), keepdim=True).clamp(min=1).double()
        mean = torch.where(live, lev, 0.0).sum((1, 2), keepdim=True) / n
        var = torch.where(live, (lev - mean) ** 2, 0.0).sum((1, 2), keepdim=True) / (n - 1).clamp(min=1.0)
        return (lev - mean) / var.sqrt().clamp(min=1e-6)
