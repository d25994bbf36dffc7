"""Does ``torch.compile`` help the steady decode step on this CPU? One layer's eviction step (priority,
victim, scatter of the new token) at SmolLM2's shape (3 KV heads, head dim 64) and a 1025-slot cache, eager vs
compiled, single thread, 2000 calls each after a warm-up. ``python -m keyformer.lab.bench.compile_probe``."""

from __future__ import annotations

import time

import torch

LONG_MAX = torch.iinfo(torch.long).max


def step(score, pos, floor, keys, values, k, v, cur):
    """Same ops as ``EvictingLayer._evict_steady`` for H2O."""
    L = score.shape[-1] - 1
    prio = score.masked_fill(pos > floor, torch.inf)
    lowest = prio == prio.amin(dim=-1, keepdim=True)
    victim = pos.masked_fill(~lowest, LONG_MAX).argmin(dim=-1, keepdim=True)
    kv_idx = victim.unsqueeze(-1).expand(-1, -1, 1, keys.shape[-1])
    keys.scatter_(2, kv_idx, k)
    values.scatter_(2, kv_idx, v)
    pos.scatter_(2, victim, cur.view(-1, 1, 1).expand_as(victim))
    score.scatter_(2, victim, score[:, :, L : L + 1].clone())


def select(score, pos, floor):
    prio = score.masked_fill(pos > floor, torch.inf)
    lowest = prio == prio.amin(dim=-1, keepdim=True)
    return pos.masked_fill(~lowest, LONG_MAX).argmin(dim=-1, keepdim=True)


def _time(f, *args, n: int = 2000) -> float:
    for _ in range(20):
        f(*args)
    t0 = time.perf_counter()
    for _ in range(n):
        f(*args)
    return (time.perf_counter() - t0) / n * 1e6


def main(B: int = 1, H: int = 3, S: int = 1025, D: int = 64) -> dict[str, float]:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    score = torch.rand(B, H, S, generator=g)
    pos = torch.randperm(5000, generator=g)[:S].view(1, 1, S).expand(B, H, S).contiguous()
    keys, values = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)
    k, v = torch.randn(B, H, 1, D, generator=g), torch.randn(B, H, 1, D, generator=g)
    floor, cur = torch.tensor([4000]).view(-1, 1, 1), torch.tensor([4999])
    args = (score, pos, floor, keys, values, k, v, cur)
    out = {"eager_step_us": _time(step, *args),
           "compiled_step_us": _time(torch.compile(step, dynamic=True), *args),
           "eager_select_us": _time(select, score, pos, floor),
           "compiled_select_us": _time(torch.compile(select, dynamic=True), score, pos, floor)}
    for key, val in out.items():
        print(f"{key:20s} {val:8.1f} us per layer per step", flush=True)
    return out


if __name__ == "__main__":
    main()
