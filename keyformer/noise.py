"""Seeded Gumbel noise defined in *logical* coordinates.

Noise for (sample seed, layer, query position p, key position j, query head h) is a deterministic function
of those numbers only: not of the batch, of padding, of the physical slot layout or of the simulation mode.
So a prompt gets the same noise alone or in a batch, and physical eviction sees exactly the noise that the
mask simulation sees.

* prompt rows (p < n): drawn in blocks of ``ROWS`` query rows anchored at position 0; block ``c`` is one
  draw of shape [H, ROWS, (c + 1) * ROWS] from a generator seeded by (seed, layer, c);
* decode rows (p >= n): one draw of shape [p + 1, H] from a generator seeded by (seed, layer, p).
"""

from __future__ import annotations

import torch

ROWS = 64
_MASK64 = (1 << 64) - 1


def mix_seed(*parts: int) -> int:
    """SplitMix64-style combination of integers into a 63-bit seed."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & _MASK64)) * 0xBF58476D1CE4E5B9 & _MASK64
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & _MASK64
        x ^= x >> 29
    return x & ((1 << 63) - 1)


def _gumbel_(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill ``t`` in place with Gumbel(0, 1) = -log(-log(U))."""
    t.uniform_(generator=gen)
    return t.clamp_(min=1e-20).log_().neg_().log_().neg_()


def _generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def prompt_block(seed: int, layer: int, block: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise for prompt rows [block*ROWS, (block+1)*ROWS) over keys [0, (block+1)*ROWS): [H, ROWS, cols]."""
    out = torch.empty(heads, ROWS, (block + 1) * ROWS, device=device)
    return _gumbel_(out, _generator(device, mix_seed(seed, layer, 0, block)))


def prompt_noise(seed: int, layer: int, r0: int, r1: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise for prompt rows [r0, r1) over keys [0, r1): [H, r1 - r0, r1]."""
    out = torch.empty(heads, r1 - r0, r1, device=device)
    b0, b1 = r0 // ROWS, (r1 - 1) // ROWS
    for b in range(b0, b1 + 1):
        blk = prompt_block(seed, layer, b, heads, device)
        lo, hi = max(r0, b * ROWS), min(r1, (b + 1) * ROWS)
        cols = min(r1, (b + 1) * ROWS)
        out[:, lo - r0 : hi - r0, :cols] = blk[:, lo - b * ROWS : hi - b * ROWS, :cols]
        out[:, lo - r0 : hi - r0, cols:] = 0.0  # beyond the causal frontier: masked by the caller
    return out


def decode_noise(seed: int, layer: int, p: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise for the decode row at position ``p`` over keys [0, p]: [p + 1, H]."""
    out = torch.empty(p + 1, heads, device=device)
    return _gumbel_(out, _generator(device, mix_seed(seed, layer, 1, p)))
