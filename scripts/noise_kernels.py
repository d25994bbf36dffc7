"""Keyformer's noise kernels, int32 lanes (what runs) against the same hash in int64 lanes (before
2026-12-01): interleaved pairs on one thread, compiled as the runner compiles them, equal outputs checked
first.

* ``decode``: :func:`keyformer.core.noise.noise_at`, one layer's step noise over ``S`` held slots
  ([B, Hkv, G, S], SmolLM2's heads: Hkv 3, G 3), shapes of the batch-1 and long-generation benchmarks;
* ``block``: :func:`keyformer.core.noise.exp_noise_fast` on a prompt block (9 heads x r rows x c columns).

Prints, per shape, the int64/int32 time ratio (median of ``--pairs`` interleaved pairs, min-max) and the load
average: indicative only when the machine is not quiet.

    .venv/bin/python scripts/noise_kernels.py [--pairs 9] [--out results/bench/noise_kernels.txt] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import time

import torch

from keyformer.core import noise as nz

DECODE = [(1, 1024), (1, 4096), (7, 2560), (64, 256)]  # (batch, held slots)
BLOCK = [(512, 1024), (1024, 2048)]  # (rows, columns)


def _decode_int64(seeds, layer_t, qpos, kpos, group: int):
    """The decode kernel as it was: keys and hash in int64 lanes, masked to 32 bits."""
    B, Hkv, S = kpos.shape
    rk = nz.row_keys(seeds, layer_t, torch.arange(Hkv * group), qpos.view(-1, 1))
    ck = nz.col_keys(kpos.clamp(min=0))
    return nz.exp_of_hash(nz.mix32(rk.view(B, Hkv, group, 1) ^ ck.unsqueeze(2)))


def _block_int64(rkey, ckey):
    return nz.exp_of_hash(nz.mix32(rkey ^ ckey))


def _time(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _pairs(new, old, pairs: int, n: int) -> tuple[list[float], float]:
    for _ in range(2):  # warm-up (compilation)
        new(), old()
    ratios, t_new = [], []
    for _ in range(pairs):
        a, b = _time(new, n), _time(old, n)
        ratios.append(b / a)
        t_new.append(a)
    return ratios, statistics.median(t_new)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--quick", action="store_true", help="one small shape of each kernel (a smoke test)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not nz.use_compile(torch.zeros(1)):
        raise SystemExit("the noise kernels run eager here (KEYFORMER_COMPILE=0?); this script times the "
                         "compiled ones that runs use on CPU: unset KEYFORMER_COMPILE or set it to 1")
    old_decode = torch.compile(_decode_int64, dynamic=True)
    old_block = torch.compile(_block_int64, dynamic=True)
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()

    dirty = " (dirty tree)" if git("status", "--porcelain", "--untracked-files=no") else ""
    commit = git("rev-parse", "--short", "HEAD")
    lines = [f"# scripts/noise_kernels.py --pairs {args.pairs}: commit {commit}{dirty},"
             f" torch {torch.__version__}, 1 thread, CPU; load average at start {os.getloadavg()[0]:.2f}",
             "# ratio = int64-lanes time / int32-lanes time: median [min, max] of interleaved pairs",
             f"{'kernel':8} {'shape':28} {'int32 us':>10} {'ratio':>6}  spread"]
    print("\n".join(lines), flush=True)
    g = torch.Generator().manual_seed(0)
    cases = []  # (kernel, shape label, int32 call, int64 call, calls per timing)
    for B, S in DECODE[:1] if args.quick else DECODE:
        seeds = nz.seeds_tensor(list(range(B)), "cpu")
        qpos = torch.full((B,), 2 * S, dtype=torch.long)
        kpos = torch.stack([torch.randperm(2 * S, generator=g)[:S] for _ in range(B * 3)]).view(B, 3, S)
        layer = torch.full((1,), 5, dtype=torch.long)
        new = functools.partial(nz.noise_at, seeds, 5, qpos, kpos, 3)
        cases.append(("decode", f"B={B} Hkv=3 G=3 S={S}", new,
                      functools.partial(old_decode, seeds, layer, qpos, kpos, 3), 100))
    for r, c in [(32, 64)] if args.quick else BLOCK:
        rk = nz.row_keys(nz.seeds_tensor([1], "cpu"), 2, torch.arange(9), torch.arange(c - r, c).view(1, -1))
        rk = rk.unsqueeze(-1)  # [1, 9, r, 1]
        ck = nz.col_keys(torch.arange(c)).view(1, 1, 1, c)
        cases.append(("block", f"9 x {r} x {c}", functools.partial(nz.exp_noise_fast, rk, ck),
                      functools.partial(old_block, rk, ck), 3))
    for kernel, shape, new, old, n in cases:
        if not torch.equal(new(), old()):
            raise SystemExit(f"{kernel} {shape}: int32 and int64 lanes differ")
        ratios, t = _pairs(new, old, args.pairs, n)
        lines.append(f"{kernel:8} {shape:28} {t * 1e6:10.0f} {statistics.median(ratios):6.2f}"
                     f"  [{min(ratios):.2f}, {max(ratios):.2f}]")
        print(lines[-1], flush=True)
    lines.append(f"# load average at end {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
