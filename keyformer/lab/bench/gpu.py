"""GPU benchmark: random-initialised GPT-J-6B- and MPT-7B-shaped models in bf16, full vs Keyformer@0.5.

For each model and each ``L`` in 1k/2k/4k (prompt ``L`` + ``L`` generated tokens, the paper's setting):

* **latency** at batch 1: prefill, decode and end-to-end seconds of ``keyformer.core.generate``
  (CUDA-synchronised timers), full vs each policy, with the speedups;
* **throughput**: the largest batch that fits (doubling, a fit check = the real cache + prompt forward +
  2 decode steps with CUDA peak-memory accounting and ``--mem-fraction`` head-room), then generated tokens/s
  at that batch for full and for each policy, and the throughput gain.

Weights are random (speed does not depend on them); prompts are random token ids. Results are written
after every cell (``gpu_bench.json`` + ``gpu_bench.txt`` in ``--out``, default ``$OUT`` or
``results/bench/gpu``), so a run stopped by ``--time-budget-s`` or a time limit still leaves its numbers.

    keyformer-gpu-bench                        # CUDA, the paper's 1k+1k / 2k+2k / 4k+4k
    keyformer-gpu-bench --gen-cap 256          # generate at most 256 tokens per run (shorter)
    keyformer-gpu-bench --tiny                 # CPU smoke test with tiny shapes
    keyformer-gpu-bench --models gptj llama3 --graphs   # also decode eager vs CUDA-graph captured

``--graphs``: in every latency cell, each policy's decode is also timed step by step, eager and with the
steady step captured as a CUDA graph (:mod:`keyformer.core.graphs`; eager where it cannot be captured, with
the reason), and the two token streams are compared. ``scripts/gpu_bench.sh`` is the prepared H200 run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from keyformer.core.generate import generate, make_cache
from keyformer.core.models import prepare_model
from keyformer.core.policies import make_policy

# The Keyformer paper's reference numbers (A100): latency speedup per setting, throughput gain.
PAPER_LATENCY = {1024: 1.28, 2048: 1.62, 4096: 2.05}
PAPER_THROUGHPUT = 2.4


def model_config(name: str, tiny: bool, max_len: int) -> Any:
    from transformers import GPTJConfig, MptConfig

    if name == "gptj":
        if tiny:
            return GPTJConfig(vocab_size=512, n_positions=max_len, n_embd=64, n_layer=2, n_head=4,
                              rotary_dim=8,
                              bos_token_id=1, eos_token_id=2)
        return GPTJConfig(vocab_size=50400, n_positions=max(2048, max_len), n_embd=4096, n_layer=28,
                          n_head=16,
                          rotary_dim=64)  # GPT-J-6B
    if name == "llama3":
        from transformers import LlamaConfig

        if tiny:
            return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
                               bos_token_id=1, eos_token_id=2)
        return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8,
                           max_position_embeddings=max(8192, max_len),
                           rope_theta=500000.0)  # Llama-3-8B (GQA 32/8)
    if name == "mpt":
        if tiny:
            return MptConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, max_seq_len=max_len,
                             use_cache=True,
                             bos_token_id=1, eos_token_id=2)
        return MptConfig(vocab_size=50432, d_model=4096, n_layers=32, n_heads=32, expansion_ratio=4,
                         max_seq_len=max(2048, max_len), no_bias=True, use_cache=True)  # MPT-7B (ALiBi)
    raise ValueError(f"model {name!r} is unknown; valid: gptj, llama3, mpt")


def build_model(name: str, tiny: bool, max_len: int, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    cfg = model_config(name, tiny, max_len)
    torch.manual_seed(0)
    impl = "eager" if name == "mpt" else "sdpa"
    with device:
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=impl)
    with torch.no_grad():
        for p in model.parameters():  # fast and finite, whatever from_config did
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    model.config.use_cache = True
    return prepare_model(model.eval())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def policy(name: str, budget: float) -> Any:
    return make_policy("full") if name == "full" else make_policy(name, budget=budget)


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def fits(model: Any, L: int, gen: int, batch: int, pol: Any, device: torch.device, frac: float) -> bool:
    """Does a batch fit: the real cache (full preallocates L + gen), the prompt forward and 2 decode steps."""
    free(device)
    ids = torch.randint(10, model.config.vocab_size, (batch, L), device=device)
    mask = torch.ones_like(ids)
    try:
        with torch.inference_mode():
            cache = make_cache(model, pol, mask, max_new_tokens=gen)
            out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
            for _ in range(2):
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                out = model(input_ids=tok, cache=cache, logits_to_keep=1)
        sync(device)
        ok = True
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            ok = torch.cuda.max_memory_allocated(device) <= frac * total
    except RuntimeError as e:
        if not is_oom(e):
            raise
        ok = False
    finally:
        cache = out = None
        free(device)
    return ok


def timed_generate(model: Any, L: int, gen: int, batch: int, pol: Any,
                   device: torch.device) -> dict[str, Any]:
    free(device)
    g = torch.Generator(device="cpu").manual_seed(batch * 7919 + L)
    ids = torch.randint(10, model.config.vocab_size, (batch, L), generator=g).to(device)
    o = generate(model, ids, torch.ones_like(ids), pol, max_new_tokens=gen, min_new_tokens=gen)
    total = o.prefill_s + o.decode_s
    r = {"batch": batch, "prompt_len": L, "new_tokens": gen, "prefill_s": o.prefill_s, "decode_s": o.decode_s,
         "total_s": total, "decode_ms_per_step": 1000 * o.decode_s / max(1, o.n_decode_steps),
         "tokens_per_s": batch * gen / total, "kv_tensor_gib": o.kv_tensor_bytes / 2**30,
         "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    del o
    free(device)
    return r


def graph_decode(model: Any, L: int, gen: int, pol: Any, device: torch.device) -> dict[str, Any]:
    """Batch-1 decode of ``gen`` tokens after an ``L``-token prompt, eager and with the steady step captured
    as a CUDA graph (same prompt, same first token): ms per step of each and whether the tokens agree."""
    from keyformer.core.graphs import greedy_decode

    g = torch.Generator(device="cpu").manual_seed(L)
    ids = torch.randint(10, model.config.vocab_size, (1, L), generator=g).to(device)
    res: dict[str, Any] = {}
    toks = {}
    for mode in ("eager", "captured"):
        free(device)
        with torch.inference_mode():
            cache = make_cache(model, pol, torch.ones_like(ids), max_new_tokens=gen)
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            sync(device)
            t0 = time.perf_counter()
            try:
                toks[mode], info = greedy_decode(model, cache, tok, gen - 1, capture=mode == "captured")
            # a capture that fails is reported, not fatal: the other cells still run
            except RuntimeError as e:
                if mode == "eager":
                    raise
                toks[mode], info = None, {"captured_steps": 0, "reason": f"capture failed: {str(e)[:300]}"}
            sync(device)
            res[mode] = {"ms_per_step": 1000 * (time.perf_counter() - t0) / max(1, gen - 1), **info}
        del cache, out
    res["same_tokens"] = toks["captured"] is not None and bool(torch.equal(toks["eager"], toks["captured"]))
    res["speedup"] = res["eager"]["ms_per_step"] / res["captured"]["ms_per_step"]
    free(device)
    return res


class Report:
    """Accumulates cells and rewrites the JSON and text outputs after each one."""

    def __init__(self, out: Path, meta: dict[str, Any]):
        self.out, self.meta, self.cells = out, meta, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, cell: dict[str, Any]) -> None:
        self.cells.append(cell)
        (self.out / "gpu_bench.json").write_text(json.dumps({"meta": self.meta, "cells": self.cells},
                                                            indent=1) + "\n")
        (self.out / "gpu_bench.txt").write_text(self.text() + "\n")
        print(self.cells[-1].get("line", json.dumps(cell)), flush=True)

    def text(self) -> str:
        m = self.meta
        lines = [f"GPU benchmark on {m['device_name']} ({m['dtype']}, torch {m['torch']}, transformers "
                 f"{m['transformers']}), random weights and prompts, budget {m['budget']}, policies "
                 f"{m['policies']}.",
                 f"Paper reference: latency speedup {PAPER_LATENCY} at L+L, throughput {PAPER_THROUGHPUT}x.",
                 ""]
        lines += [c["line"] for c in self.cells if "line" in c]
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (smoke test)")
    ap.add_argument("--models", nargs="+", default=["gptj", "mpt"])
    ap.add_argument("--lengths", nargs="+", type=int, default=None, help="prompt lengths L (L + L each)")
    ap.add_argument("--gen-cap", type=int, default=None, help="generate min(L, cap) tokens per run")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--policies", nargs="+", default=["keyformer"], help="compared with full")
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="latency cells: decode eager vs CUDA-graph "
                                                          "captured")
    ap.add_argument("--mem-fraction", type=float, default=0.9, help="fit check: peak <= this x device memory")
    ap.add_argument("--time-budget-s", type=float, default=None, help="skip remaining cells after this")
    ap.add_argument("--out", default=os.environ.get("OUT") or "results/bench/gpu")
    args = ap.parse_args(argv)

    import transformers

    transformers.utils.logging.disable_progress_bar()
    if args.tiny:
        device, dtype = torch.device("cpu"), torch.bfloat16
        lengths, max_batch = args.lengths or [16, 32], args.max_batch or 2
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --tiny for a CPU smoke test")
        device, dtype = torch.device("cuda"), torch.bfloat16
        lengths, max_batch = args.lengths or [1024, 2048, 4096], args.max_batch or 256
    t0 = time.perf_counter()
    meta = {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (tiny)",
            "dtype": str(dtype), "torch": torch.__version__, "transformers": transformers.__version__,
            "budget": args.budget, "policies": args.policies, "argv": sys.argv[1:] if argv is None else argv,
            "tiny": args.tiny}
    report = Report(Path(args.out), meta)

    def out_of_time() -> bool:
        return args.time_budget_s is not None and time.perf_counter() - t0 > args.time_budget_s

    for name in args.models:
        if out_of_time():
            report.add({"model": name, "skipped": "time budget", "line": f"{name}: skipped (time budget)"})
            continue
        model = build_model(name, args.tiny, 2 * max(lengths), device, dtype)
        n_params = sum(p.numel() for p in model.parameters()) / 1e9
        # warm-up: kernels, allocator, our cache paths
        for pname in ["full", *args.policies]:
            timed_generate(model, min(lengths), 2 if args.tiny else 8, 1, policy(pname, args.budget), device)
        report.add({"model": name, "params_b": n_params, "line": f"{name}: {n_params:.2f} B parameters"})
        for L in lengths:
            gen = min(L, args.gen_cap) if args.gen_cap else L
            if out_of_time():
                report.add({"model": name, "L": L, "skipped": "time budget", "line": f"{name} L={L}: "
                                                                                     f"skipped"})
                continue
            lat = {p: timed_generate(model, L, gen, 1, policy(p, args.budget), device)
                   for p in ["full", *args.policies]}
            f = lat["full"]
            parts = [f"{name} {L}+{gen} batch 1: full {f['total_s']:.2f} s (prefill {f['prefill_s']:.2f}, "
                     f"{f['decode_ms_per_step']:.2f} ms/step)"]
            for p in args.policies:
                r = lat[p]
                r["speedup_total"] = f["total_s"] / r["total_s"]
                r["speedup_decode"] = f["decode_s"] / r["decode_s"]
                parts.append(f"{p} {r['total_s']:.2f} s ({r['decode_ms_per_step']:.2f} ms/step): latency "
                             f"speedup "
                             f"{r['speedup_total']:.2f}x, decode {r['speedup_decode']:.2f}x (paper "
                             f"{PAPER_LATENCY.get(L, '-')}x)")
            report.add({"model": name, "L": L, "gen": gen, "kind": "latency", "runs": lat,
                        "line": "; ".join(parts)})
            if args.graphs:
                gr = {p: graph_decode(model, L, gen, policy(p, args.budget), device)
                      for p in ["full", *args.policies]}
                line = f"{name} {L}+{gen} batch 1 decode, eager vs CUDA graph: " + "; ".join(
                    f"{p} {r['eager']['ms_per_step']:.2f} -> {r['captured']['ms_per_step']:.2f} ms/step "
                    f"(x{r['speedup']:.2f}, {r['captured']['captured_steps']} captured"
                    + (f", eager because {r['captured']['reason']}" if r["captured"]["reason"] else "")
                    + f", same tokens {r['same_tokens']})" for p, r in gr.items())
                report.add({"model": name, "L": L, "gen": gen, "kind": "graphs", "runs": gr, "line": line})
            if args.no_throughput or out_of_time():
                continue
            thr: dict[str, Any] = {}
            for p in ["full", *args.policies]:
                pol = policy(p, args.budget)
                best, b = 0, 1
                while b <= max_batch and fits(model, L, gen, b, pol, device, args.mem_fraction):
                    best, b = b, b * 2
                if best == 0:
                    thr[p] = {"max_batch": 0}
                    continue
                try:
                    thr[p] = {"max_batch": best, **timed_generate(model, L, gen, best, pol, device)}
                except RuntimeError as e:  # the fit check passed but generation did not: one step back
                    if not is_oom(e) or best == 1:
                        raise
                    free(device)
                    thr[p] = {"max_batch": best // 2, **timed_generate(model, L, gen, best // 2, pol, device)}
            parts = [f"{name} {L}+{gen} throughput: full batch {thr['full'].get('max_batch')} "
                     f"{thr['full'].get('tokens_per_s', float('nan')):.1f} tok/s"]
            for p in args.policies:
                r = thr[p]
                if r.get("max_batch") and thr["full"].get("max_batch"):
                    r["gain"] = r["tokens_per_s"] / thr["full"]["tokens_per_s"]
                    parts.append(f"{p} batch {r['max_batch']} {r['tokens_per_s']:.1f} tok/s: "
                                 f"{r['gain']:.2f}x "
                                 f"(paper {PAPER_THROUGHPUT}x)")
            report.add({"model": name, "L": L, "gen": gen, "kind": "throughput", "runs": thr,
                        "line": "; ".join(parts)})
        del model
        free(device)
    report.meta["elapsed_s"] = time.perf_counter() - t0
    report.add({"line": f"elapsed {report.meta['elapsed_s']:.0f} s"})


if __name__ == "__main__":
    main()
