"""Seeded Keyformer noise, defined in *logical* coordinates.

Keyformer adds Gumbel(0, 1) noise ``g`` to the logits. We draw ``E ~ Exp(1)`` instead, with ``g = -log E``:
``softmax((x + g) / tau) = normalise((softmax(x) / E) ** (1 / tau))``, one logarithm per sample instead of
two (see :class:`keyformer.policies.KeyformerPolicy`).

The noise of (sample seed, layer, query position p, key position j, query head h) depends on those numbers
only: not on the batch, on padding, on the physical slot layout or on the simulation mode. So a prompt gets
the same noise alone or in a batch, and physical eviction sees exactly the noise of the mask simulation.

* prompt rows (p < n): blocks of ``ROWS`` query rows anchored at position 0; block ``c`` is one draw of
  shape [H, ROWS, (c + 1) * ROWS] from a generator seeded by (seed, layer, c);
* decode rows (p >= n): one draw of shape [layers, p + 1, H] per decode forward, seeded by (seed, p).

On CPU the generator is numpy's PCG64 (about twice torch's CPU generator); on accelerators it is torch's
device generator, so streams differ across device types (each is reproducible).
"""

from __future__ import annotations

import numpy as np
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


def exponential(shape: tuple[int, ...], seed: int, device: torch.device) -> torch.Tensor:
    """Exp(1) samples of ``shape`` (fp32) from a generator seeded by ``seed``."""
    if torch.device(device).type == "cpu":
        u = np.random.Generator(np.random.PCG64(seed)).random(shape, dtype=np.float32)
        t = torch.from_numpy(u)
    else:
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        t = torch.empty(shape, device=device).uniform_(generator=g)
    return t.clamp_(min=1e-30).log_().neg_()


def prompt_block(seed: int, layer: int, block: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise for prompt rows [block*ROWS, (block+1)*ROWS) over keys [0, (block+1)*ROWS): [H, ROWS, cols]."""
    return exponential((heads, ROWS, (block + 1) * ROWS), mix_seed(seed, layer, 0, block), device)


def prompt_noise(seed: int, layer: int, r0: int, r1: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise for prompt rows [r0, r1) over keys [0, r1): [H, r1 - r0, r1]. Values beyond the causal frontier
    are unspecified (callers mask them). A block-aligned request is a view of one draw, without copies."""
    if r0 % ROWS == 0 and r1 - r0 <= ROWS:
        return prompt_block(seed, layer, r0 // ROWS, heads, device)[:, : r1 - r0, :r1]
    out = torch.ones(heads, r1 - r0, r1, device=device)
    for b in range(r0 // ROWS, (r1 - 1) // ROWS + 1):
        blk = prompt_block(seed, layer, b, heads, device)
        lo, hi = max(r0, b * ROWS), min(r1, (b + 1) * ROWS)
        cols = min(r1, (b + 1) * ROWS)
        out[:, lo - r0 : hi - r0, :cols] = blk[:, lo - b * ROWS : hi - b * ROWS, :cols]
    return out


def decode_noise(seed: int, p: int, layers: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise of the decode row at position ``p`` over keys [0, p], for every layer: [layers, p + 1, H]."""
    return exponential((layers, p + 1, heads), mix_seed(seed, 1, p), device)
