"""KV quantization for the evicting cache: per-token groups, as KIVI-style caches store values.

Every held token's key and value rows are stored as ``bits``-bit codes (int8: one byte per value; int4: two
values per byte, packed along the head dimension of that token) plus an fp16 scale and zero per group of
``group_size`` values of that token. Because every group lies inside one token's row, a token can be written,
moved into an evicted slot or dropped without touching any other token: quantization composes with every
eviction policy. The codes come from HQQ's quantizer (``hqq.core.quantize.Quantizer``, what transformers'
``HQQQuantizedCache`` uses) in its plain min-max mode (``optimize=False``: asymmetric, no zero rounding), with
bit-packing left to us because HQQ packs across rows and rows here must stay independent. Reading
back is ``(code - zero) * scale``.

The prompt forward attends over the full-precision keys and values (as transformers' quantized caches do); the
cache keeps only the quantized rows, and every later forward reads them back dequantized. ``kv_bytes``
counts codes + scales + zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BITS = (8, 4)


@dataclass(frozen=True)
class KVQuant:
    """``bits`` (8 or 4) per value and ``group_size`` values (dividing the head dim) per scale/zero pair."""

    bits: int = 8
    group_size: int = 32

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or self.bits not in BITS:
            raise ValueError(f"kv_quant.bits={self.bits!r} is not supported; valid: "
                             f"{', '.join(map(str, BITS))}")
        g = self.group_size
        if isinstance(g, bool) or not isinstance(g, int) or g < 2 or g % 2:
            raise ValueError(f"kv_quant.group_size={g!r} must be an even int >= 2")

    def check_dim(self, d: int) -> None:
        if d % self.group_size:
            raise ValueError(f"kv_quant.group_size={self.group_size} does not divide this model's head dim "
                             f"{d}; "
                             f"valid: a divisor of {d}")

    def code_width(self, d: int) -> int:
        """Bytes of codes per row of ``d`` values."""
        return d * self.bits // 8

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` [..., D] -> (codes uint8 [..., D * bits / 8], scale fp16 [..., D / g], zero fp16 [..., D /
        g])."""
        try:
            from hqq.core.quantize import Quantizer
        except ImportError as e:  # pragma: no cover - the [quant] extra is installed in CI
            raise ImportError("KV quantization uses HQQ: pip install -e '.[quant]'") from e
        *lead, d = x.shape
        self.check_dim(d)
        rows = x.reshape(-1, d).float()
        q, meta = Quantizer.quantize(rows, nbits=self.bits, channel_wise=True, group_size=self.group_size,
                                     optimize=False, round_zero=False, axis=1, bitpack=False,
                                     compute_dtype=torch.float32, device=str(x.device))
        ng = d // self.group_size
        codes = q.reshape(*lead, d).to(torch.uint8)
        if self.bits == 4:
            codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
        scale = meta["scale"].reshape(*lead, ng).to(torch.float16)
        zero = meta["zero"].reshape(*lead, ng).to(torch.float16)
        return codes, scale, zero

    def dequantize(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
        """Inverse of :meth:`quantize`: [..., D] in ``dtype``."""
        if self.bits == 4:
            codes = torch.stack((codes & 0xF, codes >> 4), dim=-1).flatten(-2)
        *lead, d = codes.shape
        g = self.group_size
        q = codes.view(*lead, d // g, g).float()
        out = (q - zero.float().unsqueeze(-1)) * scale.float().unsqueeze(-1)
        return out.view(*lead, d).to(dtype)


def kv_quant_from(node: object) -> KVQuant | None:
    """A :class:`KVQuant` from a config node (``null`` / ``{bits, group_size}``), or None."""
    if node is None or node is False:
        return None
    if isinstance(node, KVQuant):
        return node
    if not hasattr(node, "items"):
        raise ValueError(f"kv_quant={node!r} must be null or a mapping {{bits, group_size}}")
    kw = dict(node.items())  # type: ignore[attr-defined]
    bad = sorted(set(kw) - {"bits", "group_size"})
    if bad:
        raise ValueError(f"kv_quant has no option(s) {bad}; valid: ['bits', 'group_size']")
    return KVQuant(**kw)
