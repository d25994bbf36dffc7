"""LagKV (arXiv 2504.04704, 2025; kvpress ``LagKVPress``): score each token against the
statistics of the partition that follows it, with no attention weights.

Per (sample, layer, KV head), over the ``m`` held tokens in position order: the first ``n_sink`` are sinks
(kept); the rest is cut into partitions of ``lag_size`` tokens, and the last full partition with whatever
follows it (the tail) is kept. A token ``x`` of any earlier partition is scored against the next partition
``ref``: per channel, ``(x - min(ref)) / (max(ref) - min(ref))``; the standard deviation of that over the
channels, softmax over the partition's tokens, for keys and for values, averaged; then (``cross_scoring``
false, kvpress's default) replaced by its rank within the partition divided by ``lag_size``. When
``m < n_sink + 2 * lag_size`` there is nothing to compare with: the sinks are kept and the others ranked by
recency (kvpress's fallback). At the prompt this is kvpress's rule; at every decode step it is re-applied to
the held tokens and the lowest one (outside the recent window) leaves, the paper's lag-wise compression run at
the granularity of one token. The values reach a policy on the scoring path, so the policy reads attention for
one prompt row (the weights are not used). No recent window by default (kvpress)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Context, Policy


def _states_score(x: torch.Tensor, lag: int) -> torch.Tensor:
    """[P - 1, lag]: the lag-relative score of partitions 0..P-2 of x [P, lag, D] against their successors."""
    ref, v = x[1:], x[:-1]
    lo = ref.amin(dim=-2, keepdim=True)
    hi = ref.amax(dim=-2, keepdim=True)
    return ((v - lo) / (hi - lo)).std(dim=-1).nan_to_num(0.0).softmax(dim=-1)  # a flat channel: 0


def lagkv_row(k: torch.Tensor, v: torch.Tensor, sink: int, lag: int, cross: bool) -> torch.Tensor:
    """[m] LagKV's scores of one head's held tokens in position order: keys and values [m, D]."""
    m = k.shape[0]
    if m < sink + 2 * lag:
        s = torch.ones(m, dtype=torch.float64)
        if m > sink:
            s[sink:] = torch.arange(m - sink, dtype=torch.float64) / (m - sink)
        return s
    end = sink + ((m - sink) // lag) * lag
    P = (end - sink) // lag
    ks = _states_score(k[sink:end].double().view(P, lag, -1), lag)
    vs = _states_score(v[sink:end].double().view(P, lag, -1), lag)
    s = (ks + vs) / 2
    if not cross:
        s = s.argsort(dim=-1).argsort(dim=-1).double() / lag
    out = torch.ones(m, dtype=torch.float64)
    out[sink : end - lag] = s.reshape(-1)
    return out


@dataclass
class LagKVPolicy(Policy):
    recent: float = 0.0
    n_sink: int = 4
    lag_size: int = 128
    cross_scoring: bool = False

    name: ClassVar[str] = "lagkv"
    reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})  # the scoring path passes values
    observe_rows: ClassVar[int | None] = 1
    paper: ClassVar[str] = "arXiv 2504.04704"
    family: ClassVar[str] = "key/value statistics"
    nonnegative: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, lo in (("n_sink", 0), ("lag_size", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{key}={v!r} must be an int >= {lo}")
        if not isinstance(self.cross_scoring, bool):
            raise ValueError(f"cross_scoring={self.cross_scoring!r} must be true or false")

    def lag_scores(self, ctx: Context) -> torch.Tensor:
        """[B, H, S] the rule's scores of the held slots (0 elsewhere)."""
        keys, values, pos = ctx.keys, ctx.values, ctx.pos
        live = ctx.live & (pos >= 0)
        B, H, S, _ = keys.shape
        out = torch.zeros(B, H, S, dtype=torch.float64, device=keys.device)
        order = torch.where(live, pos, torch.iinfo(torch.long).max).argsort(dim=-1, stable=True)
        counts = live.sum(-1).tolist()
        for b in range(B):
            for h in range(H):
                idx = order[b, h, : counts[b][h]]
                row = lagkv_row(keys[b, h, idx].cpu(), values[b, h, idx].cpu(), self.n_sink, self.lag_size,
                                self.cross_scoring)
                out[b, h, idx] = row.to(out.device)
        return out

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The attention weights are ignored: score every held slot, spread over the group and row axes of
        ``probs`` [B, Hkv, G, r, S] so that the path's sum gives it back."""
        s = self.lag_scores(ctx)
        B, Hkv, G, r, S = probs.shape
        return (s[..., :S].float() / (G * r)).view(B, Hkv, 1, 1, S).expand(B, Hkv, G, r, S)

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        state.copy_(s)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        return state
