"""Per-layer budgets over any scorer; the mean over the layers the policy acts on stays at most ``k``.

* ``pyramid`` (PyramidKV, Cai et al. 2024, arXiv 2406.02069): every layer keeps the scorer's recent window
  ``w``; the budget outside it falls linearly from ``max`` at the first layer to ``min = (k - w) /
  pyramid_beta`` at the last, ``max = 2 (k - w) - min``, capped at ``n - w`` (KVCache-Factory's rule, as
  ``pyramidkv``: over SnapKV it is ``pyramidkv`` exactly, tested).
* ``layers`` (kvpress's ``PerLayerCompressionPress``, a budget curve): ``layer_curve`` gives relative budgets
  at evenly spaced depths, interpolated linearly over the layers; layer ``l`` keeps
  ``floor(k * c_l / mean(c))`` tokens (at least 1, at most ``n``). One value: uniform.

Depth counts the layers the policy acts on (a hybrid model's full-attention layers), as ``pyramidkv``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..base import Context
from ..compose import Wrapper
from ..pyramidkv import pyramid_budget


class _LayerWrapper(Wrapper):
    owns: ClassVar[tuple[str, ...]] = ("layer_budget",)
    family: ClassVar[str] = "layer budgets"


@dataclass
class Pyramid(_LayerWrapper):
    pyramid_beta: float = 20

    wrap_name: ClassVar[str] = "pyramid"
    paper: ClassVar[str] = "Cai et al. 2024, arXiv 2406.02069"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        b = self.pyramid_beta
        if isinstance(b, bool) or not isinstance(b, (int, float)) or b < 1:
            raise ValueError(f"pyramid_beta={b!r} must be a number >= 1 (the pyramid's max/min budget ratio)")

    def layer_budget(self, k: torch.Tensor, n: torch.Tensor, ctx: Context) -> torch.Tensor:
        layer, num_layers = ctx.policy_layer, ctx.policy_layers
        if num_layers == 1:
            return torch.minimum(k.clamp(min=1), n)
        w = torch.minimum(self.recent_tokens(k), k)  # type: ignore[attr-defined]
        out, _ = pyramid_budget(k, n, w, layer, num_layers, self.pyramid_beta)
        return torch.minimum(out.clamp(min=1), n)


def curve_at(curve: tuple[float, ...], layers: int) -> list[float]:
    """The curve's values interpolated linearly at ``layers`` evenly spaced depths."""
    if len(curve) == 1 or layers == 1:
        return [float(curve[0])] * layers if len(curve) == 1 else [float(curve[0])]
    out = []
    for li in range(layers):
        x = li * (len(curve) - 1) / (layers - 1)
        i = min(int(x), len(curve) - 2)
        out.append(curve[i] + (x - i) * (curve[i + 1] - curve[i]))
    return out


@dataclass
class Layers(_LayerWrapper):
    layer_curve: Any = (1.5, 0.5)

    wrap_name: ClassVar[str] = "layers"
    paper: ClassVar[str] = "kvpress PerLayerCompressionPress"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        c = self.layer_curve
        vals = [c] if isinstance(c, (int, float)) and not isinstance(c, bool) else c
        try:
            ok = len(vals) >= 1 and all(not isinstance(v, bool) and float(v) > 0 for v in vals)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"layer_curve={c!r} must be a list of numbers > 0 (relative budgets from the "
                             "first layer to the last)")
        self.layer_curve = tuple(float(v) for v in vals)

    def layer_budget(self, k: torch.Tensor, n: torch.Tensor, ctx: Context) -> torch.Tensor:
        c = curve_at(self.layer_curve, ctx.policy_layers)
        share = c[ctx.policy_layer] * len(c) / sum(c)
        return torch.minimum((k.double() * share).floor().long().clamp(min=1), n)
