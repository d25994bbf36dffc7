"""CurDKV (arXiv 2509.15038, 2025; kvpress ``CURPress``): keep the tokens whose keys and
values carry the most leverage, approximated by their squared norms.

Per (sample, layer, KV head), over the held tokens in position order: ``k2_j = ||k_j||^2`` and
``v2_j = ||v_j||^2``, each normalised within local windows of ``local_window_size`` consecutive held tokens
(``k2_j / sum of k2 over its window``; the local approximation, on by default in kvpress), combined as
``leverage_type`` says (``kv_product``: ``k2 * v2``, the default; ``key``, ``value``, ``kv_avg``) and
normalised to sum 1 over the head's held tokens; the first ``num_sinks`` held tokens get 1 (always kept). At
the prompt this is kvpress's rule; at every decode step it is re-applied to the held tokens and the lowest one
(outside the recent window) leaves. kvpress's ``use_random_leverage`` (a random projection first) is not
offered. The values reach a policy on the scoring path, so the policy reads attention for one prompt row (the
weights are not used). No recent window by default (kvpress)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy

LEVERAGE_TYPES = ("kv_product", "key", "value", "kv_avg")


def held_rank(pos: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """[B, H, S]: each live slot's index among the live slots in position order (dead slots: S and above)."""
    S = pos.shape[-1]
    key = torch.where(live, pos, torch.iinfo(torch.long).max)
    order = key.argsort(dim=-1, stable=True)
    return torch.empty_like(order).scatter_(-1, order, torch.arange(S, device=pos.device).expand_as(order))


def group_normalise(x: torch.Tensor, group: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """``x / (sum of x over its group)`` over the live entries, per (sample, head); group ids in [0, S]."""
    B, H, S = x.shape
    xs = torch.where(live, x, 0.0)
    g = torch.where(live, group, S)
    total = xs.new_zeros(B, H, S + 1).scatter_add_(-1, g, xs)
    return xs / total.gather(-1, g).clamp(min=torch.finfo(x.dtype).tiny)


def curdkv_scores(keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor, live: torch.Tensor,
                  window: int, kind: str, sinks: int) -> torch.Tensor:
    """[B, H, S] CurDKV's scores of the live slots (float64; 0 elsewhere)."""
    rank = held_rank(pos, live)
    k2 = keys.double().pow(2).sum(-1)
    v2 = values.double().pow(2).sum(-1)
    if window:
        k2 = group_normalise(k2, rank // window, live)
        v2 = group_normalise(v2, rank // window, live)
    s = {"kv_product": lambda: k2 * v2, "key": lambda: k2, "value": lambda: v2,
         "kv_avg": lambda: (k2 + v2) / 2}[kind]()
    s = torch.where(live, s, 0.0)
    s = s / s.sum(-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
    return torch.where(live & (rank < sinks), 1.0, s)


@dataclass
class CurDKVPolicy(Policy):
    recent: float = 0.0
    num_sinks: int = 4
    leverage_type: str = "kv_product"
    local_window_size: int = 16  # 0: no local approximation

    name: ClassVar[str] = "curdkv"
    reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})  # the scoring path passes values
    observe_rows: ClassVar[int | None] = 1
    paper: ClassVar[str] = "arXiv 2509.15038"
    family: ClassVar[str] = "key/value geometry"
    nonnegative: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("num_sinks", "local_window_size"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{key}={v!r} must be an int >= 0")
        if self.leverage_type not in LEVERAGE_TYPES:
            raise ValueError(f"leverage_type={self.leverage_type!r} is unknown; valid: "
                             f"{', '.join(LEVERAGE_TYPES)}")

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The attention weights are ignored: score every held slot from its key and value, spread over the
        group and row axes of ``probs`` [B, Hkv, G, r, S] so that the path's sum gives it back."""
        s = curdkv_scores(ctx.keys, ctx.values, ctx.pos, ctx.live & (ctx.pos >= 0), self.local_window_size,
                          self.leverage_type, self.num_sinks)
        B, Hkv, G, r, S = probs.shape
        return (s[..., :S].float() / (G * r)).view(B, Hkv, 1, 1, S).expand(B, Hkv, G, r, S)

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        state.copy_(s)  # the score of now, not a sum over steps
