"""CriticalKV (Feng et al. 2025, arXiv 2502.03805): rescale any scorer's priorities by how much each value
moves the attention output, ``||W_o^h v_j||_1`` (kvpress's ``CriticalKVPress``).

Per (layer, KV head ``h``), token ``j``: ``a_j = mean over the query heads g of the group of
||v_j W_o^g||_1``, with ``W_o^g`` the rows of the layer's output projection that head ``g``'s output meets
(``[head_dim, hidden]``). Two stages, as the paper: the ``floor(first_stage_ratio * k_l)`` tokens of highest
wrapped priority are kept first (ranked by it among themselves), the others ranked by
``(priority + critical_epsilon) * a_j`` (``k_l`` the layer's budget). The output projection is read once per
model in ``prepare``; ``a_j`` is computed once per token, when it enters the cache (the values reach a policy
on the scoring path, so the wrapper reads attention for one prompt row when its scorer does not), and kept by
position in the layer's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..base import Context, Policy
from ..compose import PreparingWrapper, own

OUT_PROJ = ("o_proj", "out_proj", "c_proj")
ROWS = 512  # value rows projected at once


def output_projections(model: Any) -> dict[int, torch.Tensor]:
    """Per layer index, the attention's output projection as ``[in = heads * head_dim, hidden]`` (``x @ W``);
    ValueError in one line where the model has none the rule can read."""
    out: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        idx = getattr(mod, "layer_idx", None)
        proj = next((getattr(mod, n) for n in OUT_PROJ if hasattr(mod, n)), None)
        if idx is None or proj is None or not hasattr(proj, "weight"):
            continue
        w = proj.weight.detach()
        out[int(idx)] = w if type(proj).__name__ == "Conv1D" else w.t()  # GPT-2's Conv1D computes x @ W
    if not out:
        raise ValueError(f"criticalkv: model_type={model.config.model_type!r} has no attention output "
                         f"projection it can read ({', '.join(OUT_PROJ)} on a module with layer_idx)")
    return out


def projected_norms(values: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    """[B, Hkv, S]: ``mean_g ||v_j W_o^g||_1`` of values [B, Hkv, S, D] and W_o [Hq * D, hidden]."""
    B, Hkv, S, D = values.shape
    Hq = wo.shape[0] // D
    G = Hq // Hkv
    w = wo.to(values.device, torch.float32).view(Hkv, G, D, -1)
    out = values.new_zeros(B, Hkv, S, dtype=torch.float32)
    for s0 in range(0, S, ROWS):
        v = values[:, :, s0 : s0 + ROWS].float().unsqueeze(2)  # [B, Hkv, 1, r, D]
        out[:, :, s0 : s0 + ROWS] = (v @ w).abs().sum(-1).mean(2)
    return out


@dataclass
class CriticalKV(PreparingWrapper):
    critical_epsilon: float = 1e-4
    first_stage_ratio: float = 0.5

    wrap_name: ClassVar[str] = "criticalkv"
    adds_reads: ClassVar[frozenset[str]] = frozenset({"attention", "tensors"})
    paper: ClassVar[str] = "Feng et al. 2025, arXiv 2502.03805"
    family: ClassVar[str] = "rescaling"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        if not isinstance(self.critical_epsilon, (int, float)) or not self.critical_epsilon >= 0:
            raise ValueError(f"critical_epsilon={self.critical_epsilon!r} must be a number >= 0")
        r = self.first_stage_ratio
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 <= r <= 1.0:
            raise ValueError(f"first_stage_ratio={r!r} must be in [0, 1] (share of the budget kept by the "
                             "wrapped priority alone)")
        hr = getattr(self, "head_reduction", "per_head")
        if hr != "per_head":  # one set per layer would mix the heads' rescaled slots
            raise ValueError(f"head_reduction={hr!r}: CriticalKV rescales per head; valid: per_head")

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        if "prompt" in inner.reads:
            return "it scores the prompt in a forward of its own"
        if not (inner.nonnegative or (inner.needs_attention and "tensors" not in inner.reads)):
            return "its priorities may be negative (the rescaling multiplies them by value norms)"
        return None

    def prepare_own(self, model: Any) -> dict[int, torch.Tensor]:
        return output_projections(model)

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Record ``a_j`` of the tokens this forward adds (by position), then the scorer's own score."""
        st, pos = ctx.layer_state, ctx.pos
        if ctx.step == 0 and "critical" not in st:  # the prompt (its blocks share one computation)
            a = projected_norms(ctx.values, own(ctx)[ctx.layer])
            size = int(pos.max()) + 1 + max(ctx.horizon, 1)
            buf = a.new_zeros(*a.shape[:2], size)
            st["critical"] = buf.scatter_(-1, pos.clamp(min=0), torch.where(pos >= 0, a, 0.0))
        elif ctx.step > 0:
            buf = st["critical"]
            new = pos[..., -1:]  # a decode forward's token is its last slot
            a = projected_norms(ctx.values[:, :, -1:], own(ctx)[ctx.layer])
            if int(new.max()) >= buf.shape[-1]:
                buf = st["critical"] = torch.cat([buf, buf.new_zeros(*buf.shape[:2], buf.shape[-1])], -1)
            buf.scatter_(-1, new, a)
        return super().score(probs, ctx)

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        p = super().priority(state, ctx).double()
        pos, live = ctx.pos, ctx.live & (ctx.pos >= 0)
        a = ctx.layer_state["critical"].gather(-1, pos.clamp(min=0)).double()
        scaled = (p + self.critical_epsilon) * a
        n = ctx.layer_state.get("critical_n")
        if ctx.step == 0 or n is None:
            n = ctx.layer_state["critical_n"] = live[:, 0].sum(-1)  # [B] prompt tokens
        k = self.layer_budget(self.budget_tokens(n), n, ctx)  # type: ignore[attr-defined]
        m = (k.double() * self.first_stage_ratio).floor().long().view(-1, 1, 1)  # [B, 1, 1]
        if not bool((m > 0).any()):
            return scaled
        ranked = torch.where(live, p, -torch.inf)
        by_pos = pos.argsort(dim=-1, descending=True, stable=True)  # ties: the more recent first
        order = by_pos.gather(-1, ranked.gather(-1, by_pos).argsort(dim=-1, descending=True, stable=True))
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=p.device)
                                                .expand_as(order))
        first = live & (rank < m)
        top = torch.where(live, scaled, -torch.inf).amax(-1, keepdim=True)
        low = torch.where(live, p, torch.inf).amin(-1, keepdim=True)
        lift = (top - low).clamp(min=0) + 1.0  # first-stage tokens rank above every rescaled one, by p
        return torch.where(first, p + lift, scaled)
