"""Keyformer's noise kernels: the native C loop (what runs on CPU since 2026-12-02) against inductor's fused
kernels (what ran before, and what runs where no C compiler is available), interleaved on one thread.

* ``decode``: :func:`keyformer.core.noise.noise_at`, one step's noise over ``S`` held slots ([B, Hkv, G, S],
  SmolLM2's heads: Hkv 3, G 3), shapes of the batch-1 and long-generation benchmarks (B = 240: SmolLM2's 30
  layers x batch 8 in the one call a steady step makes);
* ``block``: :func:`keyformer.core.noise.exp_noise_fast` on a prompt block (9 heads x r rows x c columns).

Two baselines, both compiled as the runner compiles them: ``inductor`` evaluates today's formula (its output
must equal the native one bit for bit: checked before timing); ``ind-log`` is the kernel as it was before,
with ``torch.log`` for ``-log u`` (within one ulp of the native output: checked). Prints per shape the native
time and each baseline's time ratio to it (median of ``--pairs`` interleaved rounds, min-max) and the load
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
from keyformer.core import noise_native

DECODE = [(1, 1024), (1, 4096), (7, 2560), (64, 256), (240, 1024)]  # (rows = layers x batch, held slots)
BLOCK = [(512, 1024), (1024, 2048)]  # (rows, columns)


def _exp_of_hash_log(h: torch.Tensor) -> torch.Tensor:
    """The draw as it was before 2026-12-02: ``torch.log`` (Sleef in inductor's kernels)."""
    u = (((h >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    return -torch.log(u.clamp_(max=nz.U_MAX))


def _decode_log(seeds, layer_t, qpos, kpos, group: int):
    """:func:`keyformer.core.noise._noise_at` with ``torch.log``."""
    B, Hkv, S = kpos.shape
    rk = nz.row_keys(seeds, layer_t, torch.arange(Hkv * group), qpos.view(-1, 1))
    ck = nz.col_keys(kpos.clamp(min=0).to(torch.int32)).unsqueeze(2)
    return _exp_of_hash_log(nz.mix32(nz.lanes32(rk.view(B, Hkv, group, 1)) ^ ck))


def _block_log(rkey, ckey):
    """:func:`keyformer.core.noise.exp_noise` with ``torch.log``."""
    return _exp_of_hash_log(nz.mix32(nz.lanes32(rkey) ^ nz.lanes32(ckey)))


def _time(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _rounds(fns, rounds: int, n: int) -> list[list[float]]:
    for _ in range(2):  # warm-up (compilation)
        for f in fns:
            f()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for i, f in enumerate(fns):
            times[i].append(_time(f, n))
    return times


def _within_one_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    ulp = (torch.nextafter(a, torch.tensor(float("inf"))) - a).abs()
    return bool(((a - b).abs() <= ulp).all())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=9, help="interleaved rounds")
    ap.add_argument("--out", default=None, help="also write the table here")
    ap.add_argument("--quick", action="store_true", help="one small shape of each kernel (a smoke test)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    os.environ["KEYFORMER_NATIVE"] = "1"
    if not nz.use_compile(torch.zeros(1)):
        raise SystemExit("the noise kernels run eager here (KEYFORMER_COMPILE=0?); this script times the "
                         "kernels that runs use on CPU: unset KEYFORMER_COMPILE or set it to 1")
    if noise_native.load(nz.HASH_CONSTANTS) is None:
        raise SystemExit(f"the native noise loop cannot be built here: {noise_native.failure()}")
    # inductor: the functions noise.py compiles where no C compiler is available
    ind_decode, ind_decode_log = (torch.compile(f, dynamic=True) for f in (nz._noise_at, _decode_log))
    ind_block, ind_block_log = (torch.compile(f, dynamic=True) for f in (nz.exp_noise, _block_log))

    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()

    from keyformer.lab.bench.cpu import cpu_name

    dirty = " (dirty tree)" if git("status", "--porcelain", "--untracked-files=no") else ""
    commit = git("rev-parse", "--short", "HEAD")
    lines = [f"# scripts/noise_kernels.py --pairs {args.pairs}: commit {commit}{dirty}, "
             f"torch {torch.__version__}, {cpu_name()}, 1 thread; "
             f"load average at start {os.getloadavg()[0]:.2f}",
             "# ratio = baseline time / native time: median [min, max] of interleaved rounds; "
             "inductor = today's formula (equal bits), ind-log = with torch.log (before 2026-12-02)",
             f"{'kernel':8} {'shape':28} {'native us':>10} {'inductor':>9} {'spread':>14} {'ind-log':>8}"
             f" {'spread':>14}"]
    print("\n".join(lines), flush=True)
    g = torch.Generator().manual_seed(0)
    cases = []  # (kernel, shape label, native call, inductor call, inductor-log call, calls per timing)
    for B, S in DECODE[:1] if args.quick else DECODE:
        seeds = nz.seeds_tensor(list(range(B)), "cpu")
        qpos = torch.full((B,), 2 * S, dtype=torch.long)
        kpos = torch.stack([torch.randperm(2 * S, generator=g)[:S] for _ in range(B * 3)]).view(B, 3, S)
        layer = torch.full((1,), 5, dtype=torch.long)
        cases.append(("decode", f"B={B} Hkv=3 G=3 S={S}",
                      functools.partial(nz.noise_at, seeds, 5, qpos, kpos, 3),
                      functools.partial(ind_decode, seeds, layer, qpos, kpos, 3),
                      functools.partial(ind_decode_log, seeds, layer, qpos, kpos, 3), 20))
    for r, c in [(32, 64)] if args.quick else BLOCK:
        rk = nz.row_keys(nz.seeds_tensor([1], "cpu"), 2, torch.arange(9), torch.arange(c - r, c).view(1, -1))
        rk = rk.unsqueeze(-1)  # [1, 9, r, 1]
        ck = nz.col_keys(torch.arange(c)).view(1, 1, 1, c)
        cases.append(("block", f"9 x {r} x {c}", functools.partial(nz.exp_noise_fast, rk, ck),
                      functools.partial(ind_block, nz.lanes32(rk), nz.lanes32(ck)),
                      functools.partial(ind_block_log, rk, ck), 3))
    for kernel, shape, native, ind, ind_log, n in cases:
        out = native()
        if not torch.equal(out, ind()):
            raise SystemExit(f"{kernel} {shape}: the native and inductor kernels differ")
        if not _within_one_ulp(out, ind_log()):
            raise SystemExit(f"{kernel} {shape}: the native kernel is not within one ulp of torch.log's")
        t_nat, t_ind, t_log = _rounds([native, ind, ind_log], args.pairs, n)
        r1 = [b / a for a, b in zip(t_nat, t_ind, strict=True)]
        r2 = [b / a for a, b in zip(t_nat, t_log, strict=True)]
        lines.append(f"{kernel:8} {shape:28} {statistics.median(t_nat) * 1e6:10.0f}"
                     f" {statistics.median(r1):9.2f}"
                     f" {f'[{min(r1):.2f}, {max(r1):.2f}]':>14} {statistics.median(r2):8.2f}"
                     f" {f'[{min(r2):.2f}, {max(r2):.2f}]':>14}")
        print(lines[-1], flush=True)
    lines.append(f"# load average at end {os.getloadavg()[0]:.2f}")
    print(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
