"""The captured full baseline (issue 23's GPU side): full attention over a preallocated, masked cache.

Our ``full`` policy grows its cache every step, so its decode step is never captured
(:func:`keyformer.core.graphs.capture_reason`), and a policy's captured step compared with full's eager one
mixes two gains: eviction's and the capture's. This module gives full the same capture. The cache is
transformers' ``StaticCache`` (``prompt + new`` slots allocated at the prompt forward; a step writes its
slot at ``cache_position`` and attends over every slot, the unwritten ones masked), the attention is the
model's plain ``sdpa`` (our attention function reads our cache only; :func:`plain_attention` swaps it for the
call), and the steady step is recorded once as a CUDA graph and replayed (eager on CPU, with the reason).

* :func:`static_decode`: prompt forward + ``n_new - 1`` greedy steps, eager or captured; seconds, tokens.
* ``python -m experiments.gpu_studies.static_full``:
  batch-1 decode at ``L + gen``, ``--rounds`` interleaved rounds of
  static full (eager, captured), our full (eager) and each policy (captured where it can be): ms per step
  (median [q1, q3]) and each policy's speed against the captured full, measured side by side in one process.
  Outputs ``static_full.json`` and ``static_full.txt`` in ``--out``, rewritten after every cell.

Tokens: the static full's greedy tokens equal our full's (the same weights and attention, masked slots
aside; tests pin it on CPU, and on a GPU the captured ones equal the eager ones). Like
``gpu_long.py`` it lives outside ``keyformer/lab/bench``, so the CPU long benchmark's code
identity is unchanged.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from experiments.gpu_studies.gpu_decode import pick_device, run_env, timed_run
from keyformer.lab.bench.cpu import median, spread
from keyformer.lab.bench.gpu import build_model, free, sync


@contextmanager
def plain_attention(model: Any, impl: str = "sdpa") -> Iterator[Any]:
    """``model`` with transformers' own ``impl`` attention inside the block, its own restored after."""
    old = model.config._attn_implementation
    model.set_attn_implementation(impl)
    try:
        yield model
    finally:
        model.set_attn_implementation(old)


def capture_reason(device: torch.device) -> str | None:
    """Why the static full step cannot be captured here, or None."""
    return None if device.type == "cuda" else f"CUDA graphs need a CUDA device (cache on {device.type})"


def static_decode(model: Any, ids: torch.Tensor, n_new: int, capture: bool = True) -> dict[str, Any]:
    """Full attention over a ``StaticCache`` of ``L + n_new`` slots: the prompt forward of ``ids`` [B, L]
    (no pads), then ``n_new - 1`` greedy steps, the first eager (a warm-up, on a side stream when capturing)
    and, with ``capture`` on CUDA, the rest replaying one CUDA graph. Returns prefill/decode seconds, the
    tokens [B, n_new], how the steps ran (``captured_steps``, ``eager_steps``, ``reason``), the cache's
    K/V bytes and the peak GPU MiB. The decode seconds include the capture itself, as
    :func:`keyformer.lab.bench.gpu.graph_decode`'s do for the policies: the two compare like for like."""
    from transformers import StaticCache

    device = ids.device
    B, L = ids.shape
    reason = capture_reason(device) if capture else "capture off"
    free(device)
    with plain_attention(model), torch.inference_mode():
        cache = StaticCache(config=model.config, max_cache_len=L + n_new)
        sync(device)
        t0 = time.perf_counter()
        out = model(input_ids=ids, cache=cache, cache_position=torch.arange(L, device=device),
                    use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        t1 = time.perf_counter()
        pos = torch.tensor([L], device=device)  # the step's slot; position_ids are a view of it
        tok_in = tok.clone()

        def step() -> torch.Tensor:
            o = model(input_ids=tok_in, position_ids=pos.view(1, 1).expand(B, 1), cache_position=pos,
                      cache=cache, use_cache=True, logits_to_keep=1)
            return o.logits[:, -1].argmax(-1, keepdim=True)

        toks, n_eager, n_captured, graph, nxt = [tok], 0, 0, None, tok
        for i in range(n_new - 1):
            if graph is not None:
                graph.replay()
                n_captured += 1
            elif reason is None and i == 0:  # the warm-up step runs on a side stream, then the capture
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    nxt = step()
                torch.cuda.current_stream().wait_stream(side)
                n_eager += 1
            else:
                nxt = step()
                n_eager += 1
            toks.append(nxt.clone())
            pos += 1
            tok_in.copy_(nxt)
            if reason is None and graph is None and i < n_new - 2:
                try:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        nxt = step()
                except RuntimeError as e:  # reported, not fatal: the rest runs eager
                    graph, reason = None, f"capture failed: {str(e)[:300]}"
        sync(device)
        t2 = time.perf_counter()
        kv = sum(t.numel() * t.element_size() for lay in cache.layers
                 for t in (getattr(lay, "keys", None), getattr(lay, "values", None)) if t is not None)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    cache = out = graph = None  # free the cache before emptying the allocator
    free(device)
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": torch.cat(toks, dim=1),
            "captured_steps": n_captured, "eager_steps": n_eager, "reason": reason,
            "kv_tensor_bytes": int(kv), "peak_gpu_mib": peak}


def latency_cell(model: Any, L: int, gen: int, policies: Sequence[str], budget: float, rounds: int,
                 capture: bool) -> dict[str, Any]:
    """Batch-1 decode after one random ``L``-token prompt, ``rounds`` interleaved rounds of: static full
    eager and captured, our full eager, each policy at ``budget`` (captured where it can be). ms per step
    per config, and each config's speed against the captured static full (its median over ours)."""
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(L)
    ids = torch.randint(10, model.config.vocab_size, (1, L), generator=g).to(device)
    configs = ["static_full_eager", "static_full_captured", "full", *policies]
    ms: dict[str, list[float]] = {c: [] for c in configs}
    how: dict[str, dict[str, Any]] = {}
    tokens: dict[str, torch.Tensor] = {}
    for _ in range(rounds):
        for c in configs:
            if c.startswith("static_full"):
                r = static_decode(model, ids, gen, capture=capture and c.endswith("captured"))
            else:
                r = timed_run(model, ids, c, None if c == "full" else budget, gen,
                              capture=capture and device.type == "cuda")
            ms[c].append(1000 * r["decode_s"] / max(1, gen - 1))
            how.setdefault(c, {k: r.get(k) for k in ("captured_steps", "eager_steps", "reason")})
            tokens.setdefault(c, r["tokens"])
    base = median(ms["static_full_captured"])
    runs = {c: {"ms_per_step": spread(ms[c]), **how[c],
                "same_tokens_as_full": bool(torch.equal(tokens[c], tokens["full"])),
                "speed_vs_captured_full": base / median(ms[c])} for c in configs}
    return {"L": L, "gen": gen, "budget": budget, "rounds": rounds, "runs": runs}


def cell_line(model: str, c: dict[str, Any]) -> str:
    parts = []
    for name, r in c["runs"].items():
        m = r["ms_per_step"]
        mode = "captured" if r["captured_steps"] else "eager"
        parts.append(f"{name} {m['median']:.2f} [{m['q1']:.2f}, {m['q3']:.2f}] ms/step ({mode}; "
                     f"x{r['speed_vs_captured_full']:.2f} of captured full; "
                     f"same tokens {r['same_tokens_as_full']})")
    return f"{model} {c['L']}+{c['gen']} batch 1, budget {c['budget']:g}: " + "; ".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shapes (the script's dry run)")
    ap.add_argument("--models", nargs="+", default=["gptj", "llama3"], choices=("gptj", "llama3"))
    ap.add_argument("--lengths", nargs="+", type=int, default=[4096], help="prompt lengths L")
    ap.add_argument("--gen-cap", type=int, default=64, help="generate min(L, cap) tokens")
    ap.add_argument("--policies", nargs="+", default=["keyformer"], help="besides full")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--capture", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--time-budget-s", type=float, default=None, help="start no cell after this")
    ap.add_argument("--out", default="outputs/static_full")
    args = ap.parse_args(argv)
    import transformers

    transformers.utils.logging.disable_progress_bar()
    device = pick_device(args.tiny)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = run_env(device, argv)
    report: dict[str, Any] = {"env": env, "cells": []}
    lines = [f"Captured full baseline (StaticCache + CUDA graph) vs our full and policies, batch 1, "
             f"random weights and prompt ids, bf16, on {env['device']}, torch {env['torch']}, transformers "
             f"{env['transformers']}; argv {' '.join(env['argv'])}"]

    def write() -> None:
        (out / "static_full.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "static_full.txt").write_text("\n".join(lines) + "\n")

    for name in args.models:
        if args.time_budget_s is not None and time.perf_counter() - t0 > args.time_budget_s:
            report["cells"].append({"model": name, "skipped": "time budget"})
            lines.append(f"{name}: skipped (time budget)")
            write()
            continue
        gens = [min(L, args.gen_cap) for L in args.lengths]
        longest = max([32 + 8] + [L + n for L, n in zip(args.lengths, gens, strict=True)])  # warm-up: 32+8
        model = build_model(name, args.tiny, longest + 16, device, torch.bfloat16)
        # warm-up: kernels, allocator, our cache paths and a capture of each
        latency_cell(model, 32, 8, args.policies, args.budget, 1, args.capture)
        for L, gen in zip(args.lengths, gens, strict=True):
            if args.time_budget_s is not None and time.perf_counter() - t0 > args.time_budget_s:
                report["cells"].append({"model": name, "L": L, "skipped": "time budget"})
                lines.append(f"{name} L={L}: skipped (time budget)")
                continue
            cell = {"model": name, **latency_cell(model, L, gen, args.policies, args.budget, args.rounds,
                                                  args.capture)}
            report["cells"].append(cell)
            lines.append(cell_line(name, cell))
            print(lines[-1], flush=True)
            write()
        del model
        free(device)
    report["elapsed_s"] = time.perf_counter() - t0
    lines.append(f"elapsed {report['elapsed_s']:.0f} s")
    write()


if __name__ == "__main__":
    main()
