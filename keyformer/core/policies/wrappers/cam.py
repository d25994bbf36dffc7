"""CaM (Zhang et al., ICML 2024, "CaM: Cache Merging for Memory-efficient LLMs Inference"): merge-on-evict
over any scorer. The scorer decides what is kept, as without the wrapper; the values of the tokens a cut
evicts are folded into survivors instead of dropped. Keys never change (positions and RoPE stay).

At every cut (the prompt's, and each decode cut of the scorer's schedule), per (sample, layer, KV head), for
each token ``i`` the cut evicts:

* its merge window ``W_i``: the ``merge_budget`` kept tokens of that head that come next after ``i`` in
  position order (fewer where fewer follow; none: ``i`` is dropped unmerged);
* its merge probability ``p_i = clamp(A_i / mean_{j in W_i} A_j, 0, 1)`` (0 where ``0 / 0``, 1 where
  ``x / 0``), ``A`` the cumulative attention a token has received: the attention probabilities of the scored
  query rows (at the prompt the rows the scorer observes, the last one for a scorer that reads no attention;
  then every decode query), averaged over the query heads of the KV head's group and summed over rows;
* a Bernoulli draw: ``i`` is merged when ``u_i < p_i``, ``u_i`` uniform in [0, 1) hashed from (``cam_seed``,
  layer, KV head, position of ``i``), the same in every mode, batch and slot layout;
* each survivor ``j`` of ``W_i`` then holds ``v_j + v_i / |W_i|``.

The merges of one cut all read the values from before it (simultaneous: an evicted value that another evicted
token's merge would have changed moves on unchanged). A prompt cut merges every evicted prompt token this way;
a per-step scorer's decode cut merges the one token it evicts per head. kvpress's ``CAMPress`` differs: it
cuts only while decoding (every ``compression_interval`` steps), keeps one set per layer (scores averaged over
heads), merges only as many of the evicted tokens as steps since its last cut (the highest-scored) and draws
with ``torch.bernoulli``. The cut rewrites values in place, so a quantized cache is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context, Policy
from ..compose import Wrapper
from ..random_scores import uniform_hash

LONG_MAX = torch.iinfo(torch.long).max
SALT = 0x5CA1AB1E  # the merge draws differ from a Random scorer's of the same seed


def merge_windows(keep: torch.Tensor, live: torch.Tensor, pos: torch.Tensor, m: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per slot, the slots of the ``m`` kept tokens that follow it in position order ([B, H, S, m]) and which
    of them exist ([B, H, S, m] bool)."""
    S = pos.shape[-1]
    order = torch.where(live, pos, LONG_MAX).argsort(dim=-1, stable=True)  # slots by position, dead last
    ks = keep.gather(-1, order).long()
    before = torch.empty_like(ks).scatter_(-1, order, ks.cumsum(-1) - ks)  # kept tokens before each slot
    kept_slots = torch.where(keep, pos, LONG_MAX).argsort(dim=-1, stable=True)  # kept first, by position
    rank = before.unsqueeze(-1) + torch.arange(m, device=pos.device)  # [B, H, S, m]
    valid = rank < keep.sum(-1).view(*keep.shape[:2], 1, 1)
    slots = kept_slots.gather(-1, rank.clamp(max=S - 1).flatten(2)).view(*rank.shape)
    return slots, valid


def cam_merge(values: torch.Tensor, keep: torch.Tensor, live: torch.Tensor, pos: torch.Tensor,
              attn: torch.Tensor, draw: torch.Tensor, m: int) -> None:
    """Fold the evicted values (``live & ~keep``) into their merge windows, in place (module docstring);
    ``attn`` [B, H, S] the tokens' cumulative attention, ``draw`` [B, H, S] their uniform draws."""
    gone = live & ~keep
    slots, valid = merge_windows(keep, live, pos, m)
    size = valid.sum(-1)  # |W_i|
    a = attn.double()
    mean = (a.gather(-1, slots.flatten(2)).view(*slots.shape) * valid).sum(-1) / size.clamp(min=1)
    p = (a / mean).nan_to_num(nan=0.0, posinf=1.0).clamp(0.0, 1.0)
    merged = gone & (size > 0) & (draw < p)
    if not bool(merged.any()):
        return
    part = values.float() * (merged / size.clamp(min=1)).unsqueeze(-1)  # [B, H, S, Dv]
    add = torch.zeros_like(part)
    for r in range(m):  # the r-th survivor after each evicted token
        idx = slots[..., r].unsqueeze(-1).expand_as(part)
        add.scatter_add_(2, idx, part * valid[..., r].unsqueeze(-1))
    sent = (merged.unsqueeze(-1) & valid).long().flatten(2)
    got = torch.zeros_like(pos).scatter_add_(-1, slots.flatten(2), sent) > 0  # survivors that receive
    values.copy_(torch.where(got.unsqueeze(-1), (values.float() + add).to(values.dtype), values))


@dataclass
class CaM(Wrapper):
    merge_budget: int = 32
    cam_seed: int = 0

    wrap_name: ClassVar[str] = "cam"
    owns: ClassVar[tuple[str, ...]] = ("on_evict",)
    adds_reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})
    paper: ClassVar[str] = "Zhang et al. 2024, ICML (CaM)"
    family: ClassVar[str] = "merge-on-evict"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        v = self.merge_budget
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"merge_budget={v!r} must be an int >= 1 (survivors an evicted value is spread "
                             "over)")
        if isinstance(self.cam_seed, bool) or not isinstance(self.cam_seed, int):
            raise ValueError(f"cam_seed={self.cam_seed!r} must be an int")

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        return "it scores the prompt in a forward of its own" if "prompt" in inner.reads else None

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Add this forward's attention to the tokens' cumulative attention (by position), then score."""
        st = ctx.layer_state
        c = probs.shape[-1]  # a prompt block sees the slots [0, c)
        pos = ctx.pos[..., :c]
        a = probs.sum(3).mean(2)  # [B, Hkv, c]: summed over query rows, averaged over the group
        buf = st.get("cam_attention")
        need = int(ctx.pos.max()) + 1  # every slot of the forward (a prompt's blocks: one allocation)
        if buf is None:
            buf = st["cam_attention"] = a.new_zeros(*a.shape[:2], need + max(ctx.horizon, 1))
        elif need > buf.shape[-1]:
            buf = st["cam_attention"] = torch.cat([buf, buf.new_zeros(*buf.shape[:2], need)], -1)
        buf.scatter_add_(-1, pos.clamp(min=0), torch.where(pos >= 0, a.float(), 0.0))
        return super().score(probs, ctx)  # type: ignore[misc]

    def on_evict(self, keep: torch.Tensor, prio: torch.Tensor, ctx: Context) -> torch.Tensor:
        pos = ctx.pos
        live = ctx.live & (pos >= 0)
        if bool((live & ~keep).any()):
            attn = ctx.layer_state["cam_attention"].gather(-1, pos.clamp(min=0))
            heads = torch.arange(pos.shape[1], device=pos.device).view(1, -1, 1)
            draw = uniform_hash(self.cam_seed ^ SALT, ctx.layer, heads, pos.clamp(min=0))
            cam_merge(ctx.values, keep, live, pos, attn, draw, self.merge_budget)
        return keep
