"""Key re-rotation (kvpress's ``KeyRerotationPress``; the position handling of Hugging Face's ``SinkCache``
and of FINCH): after the prompt cut, the kept keys are rotated as if they sat at positions ``0 .. m - 1``.

The scorer chooses what the prompt cut keeps, as it would alone; the cut is the only one (the schedule is the
prompt's: decode tokens are all kept, as kvpress's prefill presses). Then, per (sample, layer, KV head), the
kept token of ``r``-th smallest position ``p`` (``r`` from 0) has its key ``R_p k`` (RoPE at ``p``) replaced
by ``R_r k`` (RoPE at ``r``: a rotation by ``r - p`` of each RoPE plane), in place, in the cache's dtype. The
slot keeps its position ``p`` for the cache's bookkeeping; queries and generated tokens keep the model's
positions (``n, n + 1, ...``), so the first query sees the kept keys at distances ``n - r``, as in kvpress.
The values are the scorer's. With nothing evicted (``r = p`` for every token) the keys are unchanged.

RoPE models only (``position_info``: rotate-half and GPT-J's interleaved planes, partial rotary included);
ALiBi and learned positions are refused in one line, as is a quantized cache (its codes cannot hold the
rotated keys exactly) and a hybrid model's sliding layers (another RoPE; ``sliding='policy'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..base import PROMPT, Context, Schedule
from ..compose import PreparingWrapper, own
from ..expected_attention import _pairs, position_info
from .chunk import LONG_MAX


def ranks_among_kept(keep: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """[B, H, S]: each kept slot's rank by position among the kept slots (0 first); 0 elsewhere."""
    order = torch.where(keep, pos, LONG_MAX).argsort(dim=-1, stable=True)
    idx = torch.arange(pos.shape[-1], device=pos.device).expand_as(order)
    return torch.where(keep, torch.empty_like(order).scatter_(-1, order, idx), 0)


def rotate(keys: torch.Tensor, delta: torch.Tensor, info: dict[str, Any]) -> None:
    """Rotate each key's RoPE planes by ``delta`` positions ([B, H, S], int), in place."""
    i, j = _pairs(info, keys.shape[-1])
    ang = delta.double().unsqueeze(-1) * info["inv_freq"].to(keys.device)  # [B, H, S, r/2]
    c, s = ang.cos(), ang.sin()
    ki, kj = keys[..., i].double(), keys[..., j].double()
    keys[..., i] = (c * ki - s * kj).to(keys.dtype)
    keys[..., j] = (s * ki + c * kj).to(keys.dtype)


@dataclass
class Rerotate(PreparingWrapper):
    wrap_name: ClassVar[str] = "rerotate"
    owns: ClassVar[tuple[str, ...]] = ("schedule", "on_evict")
    adds_reads: ClassVar[frozenset[str]] = frozenset({"tensors"})  # the held keys, rewritten
    cuts: ClassVar[Schedule] = PROMPT
    paper: ClassVar[str] = "kvpress KeyRerotationPress (SinkCache's, FINCH's positions)"
    family: ClassVar[str] = "positions"

    @property
    def schedule(self) -> Schedule:
        return PROMPT

    def prepare_own(self, model: Any) -> dict[str, Any]:
        arch = model.config.model_type
        try:
            info = position_info(model)
        except ValueError as e:
            raise ValueError(f"wrap=[rerotate]: {str(e).split(': ', 1)[-1]}") from None
        if info["kind"] != "rope":
            raise ValueError(f"wrap=[rerotate]: model_type={arch!r} encodes positions by {info['kind']}, not "
                             "RoPE; valid: a RoPE model (llama family, qwen3, gemma3, gptj)")
        kinds = set(getattr(model.config, "layer_types", None) or ())
        if self.sliding == "policy" and len(kinds) > 1:  # type: ignore[attr-defined]
            raise ValueError(f"wrap=[rerotate] with sliding='policy': model_type={arch!r} rotates its "
                             "sliding layers with another RoPE; valid: sliding=auto or window")
        return info

    def on_evict(self, keep: torch.Tensor, prio: torch.Tensor, ctx: Context) -> torch.Tensor:
        delta = torch.where(keep, ranks_among_kept(keep, ctx.pos) - ctx.pos, 0)
        if bool(delta.any()):
            rotate(ctx.keys, delta, own(ctx))
        return keep
