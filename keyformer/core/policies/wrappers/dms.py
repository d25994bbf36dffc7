"""DMS, training-free (kvpress's ``DMSPress``; Łańcucki et al. 2025, arXiv 2506.05345, without its trained
evictors): threshold eviction over any scorer, with a delayed window.

At every cut of the scorer's schedule, per (sample, layer, KV head), a held token leaves when it is older
than the ``dms_window`` newest positions (position ``<= newest - dms_window``) and its priority (the
scorer's, as the cut ranks it) is below ``dms_threshold``; the window's tokens are never judged (the delay).
The scorer's own cut still applies: ``budget`` is a cap, the cut first keeps at most the budget's tokens, then
the threshold evicts more. With ``budget=1.0`` the cache holds exactly what the threshold leaves.

What a run records is honest: the live KV bytes (``kv_bytes``, the contract's budget check) count the tokens
each head actually holds, at most the cap and usually fewer; heads hold different numbers of tokens (stored
physically up to the layer's fullest head, as Ada-KV's). The threshold is on the scorer's own scale (set it
per scorer: the default 0 evicts nothing of an attention-sum scorer and every old token of KnormPress, whose
priorities are negative norms). kvpress judges a token once, when it leaves the window, by the score the
scorer gave it on arrival, and by default only at the prefill (``decoding=False``: compose with
``wrap=[prompt]`` or set ``prefill_only``); here every cut judges every old token by its current priority,
which is the same for scorers whose priority of a token never changes (KnormPress, Random).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..base import Context, Policy
from ..compose import Wrapper


@dataclass
class DMS(Wrapper):
    dms_threshold: float = 0.0
    dms_window: int = 128

    wrap_name: ClassVar[str] = "dms"
    owns: ClassVar[tuple[str, ...]] = ("on_evict",)
    paper: ClassVar[str] = "Łańcucki et al. 2025, arXiv 2506.05345 (kvpress DMSPress)"
    family: ClassVar[str] = "threshold eviction"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        t = self.dms_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t != t:
            raise ValueError(f"dms_threshold={t!r} must be a number (priorities below it are evicted)")
        w = self.dms_window
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"dms_window={w!r} must be an int >= 1 (newest tokens never judged)")

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        if inner.uses_noise:  # its decode noise is drawn for every layer at once, each at its budget
            return "it draws noise for all layers at once, which needs every layer at its budget"
        return None

    def on_evict(self, keep: torch.Tensor, prio: torch.Tensor, ctx: Context) -> torch.Tensor:
        old = ctx.pos <= (ctx.newest.view(-1, 1, 1) - self.dms_window)
        return keep & ~(old & (prio < self.dms_threshold))
