"""Compactor (Chari & Van Durme 2025, arXiv 2507.08143; kvpress ``CompactorPress`` over
``NonCausalAttnPress`` and ``LeverageScorePress``): blend the approximate leverage of the keys with a
non-causal, chunked attention score; compress the prompt once.

Per (sample, layer), over the prompt's real tokens: the first ``sink_size_start`` and the last
``sink_size_end`` are kept; the others (the segment) are scored per KV head by

* the leverage of their pre-RoPE keys (:mod:`.leverage`: RoPE undone exactly, centred over the segment,
  Gaussian sketch ``sketch_dimension`` drawn from ``seed`` and the layer, ``x^T (X^T X + 0.01 I)^-1 x``);
* non-causal chunked attention: the segment cut into chunks of ``chunk_size`` tokens from its start; in
  each, every query attends every key of the chunk (no causal mask), ``softmax(q . k)`` over the chunk's
  keys, with the model's post-RoPE queries and keys and without the ``1/sqrt(d)`` scale (the authors' code,
  kvpress's ``NonCausalAttnPress``); summed over the chunk's queries and the query heads of a GQA group,
  times the value's norm, average-pooled over 3 neighbours (zero padding);

each z-scored over the sample's segment in every head of the layer (kvpress: over the whole batch), and
blended ``blending * leverage + attention`` (``blending`` None: the compression ratio, ``1 - budget``,
kvpress's default). The cut keeps the sinks and the top ``k - sinks``; every generated token is then kept
(prompt only, as kvpress: the chunked attention is a property of the whole prompt).

The chunk attention is not the model's (causal) attention, so the shared prompt pass cannot give it: the
policy reads the forward's queries, keys and values on the scoring path (one observed row, whose
probabilities it does not use) and computes each chunk's ``[Hq, c, c]`` block itself, one chunk at a time
(never ``[N, N]``). kvpress pads the last chunk with zero queries and keys that take part in its softmax and
its sums; here a chunk holds only real tokens. ALiBi models (MPT) get no position bias in the chunk attention
(their queries and keys carry none); GPT-2's keys carry no rotation to undo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from .base import PROMPT, Context, Policy, Prompt, Schedule
from .expected_attention import position_info
from .leverage import leverage, sketch, unrotate_keys

SINK = 1e30  # the sinks' score: above every blended z-score


def zscore(x: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over all of x (unbiased std, at least 1e-6)."""
    if x.numel() < 2:
        return torch.zeros_like(x)
    return (x - x.mean()) / x.std().clamp(min=1e-6)


def chunk_attention(q: torch.Tensor, k: torch.Tensor, chunk: int) -> torch.Tensor:
    """[Hkv, L]: non-causal attention within chunks of ``chunk`` tokens, summed over each chunk's queries and
    the query heads of a group; q [Hq, L, D], k [Hkv, L, D] (float64), no scale."""
    Hq, L, _ = q.shape
    Hkv = k.shape[0]
    G = Hq // Hkv
    out = q.new_zeros(Hkv, L)
    for c0 in range(0, L, chunk):
        qc, kc = q[:, c0 : c0 + chunk], k[:, c0 : c0 + chunk].repeat_interleave(G, dim=0)
        p = torch.softmax(qc @ kc.transpose(-1, -2), dim=-1)  # [Hq, c, c]
        out[:, c0 : c0 + chunk] = p.sum(-2).view(Hkv, G, -1).sum(1)
    return out


@dataclass
class CompactorPolicy(Policy):
    sink_size_start: int = 8
    sink_size_end: int = 4
    chunk_size: int = 256
    sketch_dimension: int = 48
    blending: float | None = None
    seed: int = 0

    name: ClassVar[str] = "compactor"
    paper: ClassVar[str] = "Chari & Van Durme 2025, arXiv 2507.08143"
    family: ClassVar[str] = "key geometry + attention"
    reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})  # queries and values: scoring path
    observe_rows: ClassVar[int | None] = 1
    cuts: ClassVar[Schedule] = PROMPT

    def __post_init__(self) -> None:
        super().__post_init__()
        for key, lo in (("sink_size_start", 0), ("sink_size_end", 0), ("chunk_size", 1),
                        ("sketch_dimension", 1)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{key}={v!r} must be an int >= {lo}")
        b = self.blending
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or b < 0):
            raise ValueError(f"blending={b!r} must be a number >= 0 or null (the compression ratio)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r} must be an int")

    def prepare(self, model: Any, prompt: Prompt | None = None) -> dict[str, Any]:
        info = position_info(model)
        return {"kind": "none"} if info["kind"] == "alibi" else info  # ALiBi keys carry no position

    def recent_tokens(self, k: torch.Tensor) -> torch.Tensor:
        """The last ``sink_size_end`` tokens are always kept (``recent`` is not used)."""
        return k.clamp(max=self.sink_size_end)

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The causal probabilities are not used (the prompt's scores are written by ``after_prompt``)."""
        return probs.zero_()

    def blend(self, n: torch.Tensor) -> torch.Tensor:
        """[B] the leverage's weight for prompts of ``n`` [B] tokens: ``blending``, else the compression ratio
        (for an int budget, ``1 - k / n``)."""
        if self.blending is not None:
            return torch.full(n.shape, float(self.blending), dtype=torch.float64, device=n.device)
        if isinstance(self.budget, float):
            return torch.full(n.shape, 1.0 - self.budget, dtype=torch.float64, device=n.device)
        return (1.0 - self.budget / n.clamp(min=1).double()).clamp(min=0.0)

    def after_prompt(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """The state: the attention z-scores of the prompt's slots, the first ``sink_size_start`` real tokens
        above all; the leverage z-scores go to the layer state by position (the blend depends on the budget,
        which a prompt shared between budgets does not fix: ``priority`` blends them at the cut)."""
        B, H, n = state.shape
        pos = ctx.pos[..., :n]
        keys = unrotate_keys(ctx.keys[..., :n, :].double(), pos, ctx.prepared or {"kind": "none"})
        phi = sketch(self.seed, ctx.layer, H, keys.shape[-1], self.sketch_dimension)
        att_z = torch.zeros(B, H, n, dtype=torch.float64, device=state.device)
        lev_z = torch.zeros(B, H, n, dtype=torch.float64, device=state.device)  # by position
        lengths = (pos[:, 0] >= 0).sum(-1)
        for b in range(B):
            m = int(lengths[b])
            slots = torch.arange(n - m, n, device=state.device)  # left-padded: the real tokens, in order
            att_z[b, :, slots[: self.sink_size_start]] = SINK
            seg = slots[self.sink_size_start : max(self.sink_size_start, m - self.sink_size_end)]
            if len(seg) == 0:
                continue
            lev = torch.stack([leverage(keys[b, h, seg], phi[h]) for h in range(H)])  # [H, L]
            q, k = ctx.query[b, :, seg].double(), ctx.keys[b, :, seg].double()
            att = chunk_attention(q, k, self.chunk_size)
            att = att * torch.linalg.vector_norm(ctx.values[b, :, seg].double(), dim=-1)
            att = F.avg_pool1d(att.unsqueeze(1), 3, stride=1, padding=1).squeeze(1)
            att_z[b, :, seg] = zscore(att)
            lev_z[b, :, seg - (n - m)] = zscore(lev)
        ctx.layer_state["leverage_z"], ctx.layer_state["prompt_len"] = lev_z, lengths
        return att_z.to(state.dtype)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        """``blend * leverage z + attention z`` of the prompt's tokens (a generated token: its state)."""
        lev, n = ctx.layer_state["leverage_z"], ctx.layer_state["prompt_len"]
        pos = ctx.pos
        held = (pos >= 0) & (pos < n.view(-1, 1, 1))
        g = lev.gather(-1, pos.clamp(min=0, max=lev.shape[-1] - 1))
        return state.double() + self.blend(n).view(-1, 1, 1) * torch.where(held, g, 0.0)
