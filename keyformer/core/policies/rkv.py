"""R-KV (Cai et al. 2025, arXiv 2505.24133): decode-time eviction by importance and redundancy together.

The cache is cut to the budget ``k`` after the prompt, then grows by one token per decode step for ``buffer``
steps and is cut back to ``k`` at once at every step ``t`` with ``t % buffer == 0`` (``compress =
"interval"``; the authors' ``buffer``/``divide_length`` of 128). A cut keeps the observation window (the
``window_size`` most recent tokens) and the ``k - window_size`` other held tokens of highest

    score_j = mix_lambda * importance_j - (1 - mix_lambda) * redundancy_j

per (sample, layer, KV head), as the authors' ``R1KV._compute_scores``:

* importance: the logits ``q . k_j / sqrt(d)`` of the window's queries (the last ``window_size`` prompt rows
  at the prompt; the last ``window_size`` decode queries at a decode cut), max-pooled over the query heads of
  a KV head, softmax over the held tokens before the window, mean over the window's queries, then max-pooled
  over ``kernel_size`` neighbouring tokens;
* redundancy: cosine similarity between the held keys (diagonal zeroed); in each row the most recent other key
  with similarity above 0.5 (``retain_direction = "last"``; ``"first"``: the oldest) is exempted (its entry
  zeroed), then the mean over rows, softmax over keys.

Defaults: window 8, kernel 7, ``mix_lambda`` 0.1 (the authors' run scripts; their class default is 0.07),
buffer 128. Differences from the reference code, where its slot order is not the tokens' order: after its
first cut the reference stores the kept tokens in score order, so its pooling neighbours and its "last similar
key" follow that order; here both follow the tokens' positions (the paper's intent). A row with no similar key
zeroes its entry at the oldest held token, as the reference's ``max`` over an all-zero row (index 0) does.
MPT's ALiBi bias at the original distances is added to the logits (the reference is RoPE-only; RoPE and
learned positions are already in the cached keys and queries)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .base import PROMPT, Context, Policy, Prompt, Schedule, every
from .expected_attention import position_info

RETAIN = ("last", "first")
SIMILARITY_THRESHOLD = 0.5  # hard-coded in the authors' cal_similarity


def importance(q: torch.Tensor, qpos: torch.Tensor, keys: torch.Tensor, pos: torch.Tensor, past: torch.Tensor,
               kernel: int, slopes: torch.Tensor | None = None) -> torch.Tensor:
    """Pooled window attention: q [B, Hq, W, D] at positions qpos [B, W] (-1: not a query), keys
    [B, Hkv, S, D], slot positions ``pos`` and the slots before the window ``past`` [B, Hkv, S] -> [B, Hkv, S]
    (0 elsewhere)."""
    B, Hq, W, D = q.shape
    Hkv, S = keys.shape[1], keys.shape[2]
    G = Hq // Hkv
    x = q.float().view(B, Hkv, G, W, D) @ keys.float().unsqueeze(2).transpose(-1, -2) / math.sqrt(D)
    if slopes is not None:  # ALiBi at the original distances
        dist = (pos.unsqueeze(2) - qpos.view(B, 1, W, 1)).float().unsqueeze(2)  # [B, Hkv, 1, W, S]
        x = x + slopes.float().to(x.device).view(1, Hkv, G, 1, 1) * dist
    x = x.amax(dim=2)  # [B, Hkv, W, S]: max over the query group, before the softmax
    p = torch.softmax(x.masked_fill(~past.unsqueeze(2), float("-inf")), dim=-1).nan_to_num(0.0)
    real = (qpos >= 0).float().view(B, 1, W, 1)
    a = (p * real).sum(2) / real.sum(2).clamp(min=1.0)  # [B, Hkv, S]
    # max-pool over neighbouring tokens of the past, in position order (slot order is position order here)
    order = torch.where(past, torch.arange(S, device=a.device), S).argsort(dim=-1, stable=True)
    seq = a.gather(-1, order).masked_fill(~past.gather(-1, order), float("-inf"))
    pooled = F.max_pool1d(seq.view(B * Hkv, 1, S), kernel, stride=1, padding=kernel // 2).view(B, Hkv, S)
    out = torch.zeros_like(a).scatter_(-1, order, pooled)
    return out.masked_fill(~past, 0.0)


def redundancy(keys: torch.Tensor, live: torch.Tensor, direction: str = "last") -> torch.Tensor:
    """Key redundancy over the held slots: keys [B, H, S, D], live [B, H, S] -> [B, H, S] (a softmax over the
    live slots; 0 elsewhere). Slot order is the tokens' order."""
    B, H, S, _ = keys.shape
    k = keys.float()
    kn = k / (k.norm(dim=-1, keepdim=True) + 1e-8)
    cos = kn @ kn.transpose(-1, -2)  # [B, H, S, S]
    cos.diagonal(dim1=-2, dim2=-1).zero_()
    both = live.unsqueeze(-1) & live.unsqueeze(-2)
    cos = cos.masked_fill(~both, 0.0)
    similar = (cos > SIMILARITY_THRESHOLD) & both
    idx = torch.arange(S, device=keys.device).view(1, 1, 1, S)
    first_live = torch.where(live, idx.view(1, 1, S), S).amin(-1, keepdim=True)  # [B, H, 1]
    if direction == "last":
        pick = torch.where(similar, idx, -1).amax(-1)
    else:
        pick = torch.where(similar, idx, S).amin(-1)
    none = ~similar.any(-1)
    pick = torch.where(none, first_live.expand(-1, -1, S), pick).clamp(0, S - 1)  # the reference's index 0
    cos = cos.scatter(-1, pick.unsqueeze(-1), 0.0)
    rows = live.float().sum(-1, keepdim=True).clamp(min=1.0)  # [B, H, 1]
    m = cos.sum(-2) / rows  # mean over the live rows (dead rows are 0)
    return torch.softmax(m.masked_fill(~live, float("-inf")), dim=-1).nan_to_num(0.0)


@dataclass
class RKVPolicy(Policy):
    window_size: int = 8
    kernel_size: int = 7
    mix_lambda: float = 0.1
    buffer: int = 128
    retain_direction: str = "last"

    name: ClassVar[str] = "rkv"
    paper: ClassVar[str] = "Cai et al. 2025, arXiv 2505.24133"
    family: ClassVar[str] = "attention + key redundancy"
    cuts: ClassVar[Schedule] = every(128)  # the class default; an instance cuts every ``buffer`` steps
    # the scoring path passes the decode queries the window needs; the rule reads them and the held keys
    reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})
    observe_rows: ClassVar[int | None] = 1  # the prompt's score is computed from the queries in after_prompt

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("window_size", "kernel_size", "buffer"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key}={v!r} must be an int >= 1")
        if self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size={self.kernel_size!r} must be odd (centred pooling)")
        if self.buffer < self.window_size:
            raise ValueError(f"buffer={self.buffer!r} must be >= window_size={self.window_size!r} "
                             "(the authors' check)")
        if not 0.0 <= float(self.mix_lambda) <= 1.0:
            raise ValueError(f"mix_lambda={self.mix_lambda!r} must be in [0, 1]")
        if self.retain_direction not in RETAIN:
            raise ValueError(f"retain_direction={self.retain_direction!r} is unknown; "
                             f"valid: {', '.join(RETAIN)}")

    @property
    def schedule(self) -> Schedule:
        """A cut every ``buffer`` decode steps (the cache holds k to k + buffer - 1 tokens between them)."""
        return PROMPT if self.prefill_only else every(self.buffer)

    def prepare(self, model: Any, prompt: Prompt | None = None) -> dict[str, Any]:
        arch = model.config.model_type
        return position_info(model) if arch == "mpt" else {"kind": "none"}

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        """The observation window is always kept (``recent`` is not used)."""
        return k.clamp(max=self.window_size)

    def joint_score(self, q: torch.Tensor, qpos: torch.Tensor, ctx: Context) -> torch.Tensor:
        """[B, Hkv, S] ``mix_lambda * importance - (1 - mix_lambda) * redundancy`` of the held slots."""
        info = ctx.prepared or {"kind": "none"}
        past = ctx.live & (ctx.pos <= (ctx.newest - self.window_size).view(-1, 1, 1))
        imp = importance(q, qpos, ctx.keys, ctx.pos, past, self.kernel_size,
                         info["slopes"] if info["kind"] == "alibi" else None)
        red = redundancy(ctx.keys, ctx.live, self.retain_direction)
        return imp * self.mix_lambda - red * (1 - self.mix_lambda)

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """No per-step score: a decode step only remembers its query for the next cut's window."""
        if ctx.step > 0:
            q, st, W = ctx.query, ctx.layer_state, self.window_size  # q [B, Hq, 1, D]
            prev = st.get("q")
            st["q"] = q if prev is None else torch.cat([prev, q], dim=2)[:, :, -W:]
            prevp = st.get("qpos")
            cur = ctx.newest.view(-1, 1)
            st["qpos"] = cur if prevp is None else torch.cat([prevp, cur], dim=1)[:, -W:]
        return probs.zero_()

    def after_prompt(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        W = min(self.window_size, ctx.query.shape[2])
        qpos = ctx.pos[:, 0, -W:]  # the prompt's rows are its slots; pads (left) are -1
        return self.joint_score(ctx.query[:, :, -W:], qpos, ctx)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        if ctx.step == 0:
            return state
        return self.joint_score(ctx.layer_state["q"], ctx.layer_state["qpos"], ctx)
