"""Long generation at a fixed KV memory budget on a GPU (issue 23's GPU target), random-weight model shapes.

The measurement of ``keyformer-bench --long`` (:mod:`.bench.long`) on CUDA, bf16, with a GPT-J-6B- or
Llama-3-8B-shaped model (random weights and prompt ids: speed does not depend on them):

* **Memory budget** ``M``: the K/V bytes of the full cache at batch ``--full-batch`` (preallocated prompt +
  generation), measured. **Largest batch** per policy: the largest ``b <= --max-batch`` whose measured peak
  K/V bytes fit in ``M`` (:func:`.bench.long.largest_batch`, every probe recorded).
* **Timed runs**: prompt forward, then ``new - 1`` greedy decode steps (:func:`keyformer.core.graphs.
  greedy_decode`), CUDA-synchronised. ``--capture`` (default on): the steady step of an evicting policy
  replays a CUDA graph; full cannot be captured (its attended length grows each step) and runs eager, as
  does any policy whose capture is refused (the reason is recorded). Token agreement with full on the rows
  both batches hold; peak GPU memory allocated.
* **Bytes model** beside every gain (:func:`.bench.long.summarize`): a step reads the weights once plus every
  sample's attended K/V at the read bandwidth measured here (``torch.sum`` over a large buffer); the
  predicted equal-memory gain is ``(B_p / t_p) / (B_f / t_f)``. **Floor**: a decode step at the same batch
  over an almost empty cache, in the same mode as the run it bounds (full: eager over an 8-token prompt;
  a captured policy: window@8 tokens, captured); ``share_of_bound`` is the measured gain over the gain the
  larger of (bytes model, floor) allows.
* **Captured full baseline** (``--static-full``, default on): full at its batch over a preallocated, masked
  cache whose step is captured too (``static_full.py``); each policy's decode tok/s over its
  own (``gain_vs_captured_full``) separates eviction's gain from the capture's.

Outputs (``--out``): ``gpu_long.json`` and ``gpu_long.txt``, rewritten after every run, so a run stopped by
``--time-budget-s`` or a time limit keeps what it measured. ``--tiny``: CPU, tiny shapes (the dry run).

    python -m experiments.gpu_studies.gpu_long --model gptj --settings 512+1024 --budgets 256

It lives outside ``keyformer/lab/bench`` so that GPU-only code does not change the CPU long benchmark's code
identity (``BENCH_CODE``), which decides whether its committed journals resume.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from experiments.gpu_studies.gpu_decode import pick_device, run_env, timed_run
from keyformer.lab.bench.cpu import median, spread, weight_bytes
from keyformer.lab.bench.gpu import build_model, sync
from keyformer.lab.bench.long import (
    agreement,
    budget_label,
    largest_batch,
    parse_budgets,
    parse_settings,
    peak_kv_bytes,
    summarize,
)


def read_gbs(device: torch.device, mb: int, repeats: int = 10) -> dict[str, float]:
    """Read bandwidth (GB/s): median time of ``sum`` over an ``mb`` MiB fp32 buffer, synchronised."""
    a = torch.ones(mb * 2**20 // 4, device=device)
    a.sum()
    ts = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a.sum()
        sync(device)
        ts.append(time.perf_counter() - t0)
    del a
    return {"buffer_mb": mb, "read_gbs": mb * 2**20 / median(ts) / 1e9}


def floor_ms(model: Any, batch: int, vocab: int, device: torch.device, captured: bool,
             steps: int = 32) -> float:
    """ms per decode step at ``batch`` over an almost empty cache: full over an 8-token prompt (eager), or
    window@8 tokens over a 16-token prompt with the steady step captured (the mode of a captured run). The
    marginal cost: (decode time of ``8 + steps`` steps - that of 8) / ``steps``, so the first eager steps and
    the capture itself cancel."""
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(10, vocab, (batch, 16 if captured else 8), generator=g).to(device)
    name, budget = ("window", 8) if captured else ("full", None)
    short, long_ = (timed_run(model, ids, name, budget, n + 1, captured)["decode_s"] for n in (8, 8 + steps))
    return 1000 * max(long_ - short, 0.0) / steps


def static_full_row(model: Any, ids: torch.Tensor, n_new: int, rounds: int, capture: bool,
                    full_tokens: torch.Tensor) -> dict[str, Any]:
    """The captured full baseline at full's batch (``static_full.static_decode``: the same
    K/V bytes, preallocated, the step captured on CUDA): decode tok/s over ``rounds``, token agreement with
    our full's run."""
    from .static_full import static_decode

    B = ids.shape[0]
    rs = [static_decode(model, ids, n_new, capture=capture) for _ in range(rounds)]
    r = rs[0]
    return {"batch": B, "decode_tok_s": spread([B * (n_new - 1) / x["decode_s"] for x in rs]),
            "step_ms": median([1000 * x["decode_s"] / (n_new - 1) for x in rs]),
            "e2e_tok_s": spread([B * n_new / (x["prefill_s"] + x["decode_s"]) for x in rs]),
            "mode": "captured" if r["captured_steps"] else "eager", "reason": r["reason"],
            "captured_steps": r["captured_steps"], "kv_tensor_bytes": r["kv_tensor_bytes"],
            "peak_gpu_mib": max((x["peak_gpu_mib"] or 0.0) for x in rs) or None,
            "agreement": agreement(r["tokens"], full_tokens)}


def fmt_static(s: str, r: dict[str, Any]) -> str:
    return (f"{s} full (static cache, the captured baseline): batch {r['batch']}, "
            f"{r['decode_tok_s']['median']:.1f} decode tok/s ({r['step_ms']:.2f} ms/step, {r['mode']}), "
            f"token match with full {100 * r['agreement']['match']:.0f} %"
            + (f" [eager: {r['reason']}]" if r.get("reason") else ""))


def fmt_row(r: dict[str, Any]) -> str:
    b = budget_label(r["budget"])
    s = (f"{r['setting']} {r['policy']}{'@' + b if b else ''}: batch {r['batch']}, "
         f"{r['decode_tok_s']['median']:.1f} decode tok/s ({r['step_ms']:.2f} ms/step, {r['mode']}), "
         f"{r['e2e_tok_s']['median']:.1f} tok/s end to end, peak GPU "
         f"{r['peak_gpu_mib'] or 0:.0f} MiB")
    if "decode_gain" in r and r["policy"] != "full":
        s += (f"; gain x{r['batch_gain']:.1f} batch, {r['decode_gain']:.2f}x decode, "
              f"{r['e2e_gain']:.2f}x end to end; bytes model {r['bytes_model_gain']:.2f}x "
              f"(share {100 * r['share_of_bytes_model']:.0f} %), "
              f"bound {r['bound_gain']:.2f}x (share {100 * r['share_of_bound']:.0f} %)")
        if r.get("agreement"):
            s += f"; token match with full {100 * r['agreement']['match']:.0f} %"
    if "gain_vs_captured_full" in r:
        s += f"; {r['gain_vs_captured_full']:.2f}x the captured full's decode tok/s"
    if r.get("reason"):
        s += f" [eager: {r['reason']}]"
    return s


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny shapes (the script's dry run)")
    ap.add_argument("--model", default="gptj", choices=("gptj", "llama3"))
    ap.add_argument("--settings", default="512+1024", help="PROMPT+NEW list")
    ap.add_argument("--budgets", default="256", help="token counts or fractions")
    ap.add_argument("--policies", default="keyformer,h2o,window", help="besides full, in this order")
    ap.add_argument("--full-batch", type=int, default=4, help="the memory budget: full's K/V at this batch")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--capture", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--static-full", action=argparse.BooleanOptionalAction, default=True,
                    help="also time full over a static cache at full's batch (the captured full baseline)")
    ap.add_argument("--bandwidth-mb", type=int, default=4096)
    ap.add_argument("--time-budget-s", type=float, default=None, help="start no run after this")
    ap.add_argument("--out", default="outputs/gpu_long")
    args = ap.parse_args(argv)
    settings, budgets = parse_settings(args.settings), parse_budgets(args.budgets)
    policies = [p for p in args.policies.split(",") if p]
    import transformers

    transformers.utils.logging.disable_progress_bar()
    device = pick_device(args.tiny)
    t0 = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    longest = max(s.prompt_len + s.new_tokens for s in settings)
    model = build_model(args.model, args.tiny, longest + 16, device, torch.bfloat16)
    vocab = model.config.vocab_size
    env = {**run_env(device, argv), "model": args.model,
           "params_b": sum(p.numel() for p in model.parameters()) / 1e9}
    bw = read_gbs(device, 64 if args.tiny else args.bandwidth_mb)
    w_bytes = weight_bytes(model)
    report: dict[str, Any] = {"env": env, "bandwidth": bw, "weight_bytes": w_bytes, "settings": []}
    lines = [f"Fixed-memory long generation, {env['model']} shape ({env['params_b']:.2f} B parameters, "
             f"random weights, bf16) on {env['device']}, torch {env['torch']}, "
             f"transformers {env['transformers']}; read bandwidth {bw['read_gbs']:.0f} GB/s; "
             f"argv {' '.join(env['argv'])}"]

    def text() -> list[str]:
        return [x for sec in report["settings"] for x in
                ([fmt_static(sec["setting"], sec["static_full"])] if "static_full" in sec else [])
                + [fmt_row(r) for r in sec["rows"]]]

    def write(extra: list[str]) -> None:
        (out / "gpu_long.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (out / "gpu_long.txt").write_text("\n".join(lines + extra) + "\n")

    for pname in ["full", *policies]:  # warm-up: kernels, allocator, our cache paths (and a capture)
        wids = torch.randint(10, vocab, (1, 32), generator=torch.Generator().manual_seed(1)).to(device)
        timed_run(model, wids, pname, 16 if pname != "full" else None, 12, args.capture)
    for s in settings:
        g = torch.Generator().manual_seed(s.prompt_len)
        pool = torch.randint(10, vocab, (args.max_batch + 1, s.prompt_len), generator=g).to(device)
        mem = peak_kv_bytes(model, pool[:args.full_batch], "full", None, s.new_tokens)
        per_token = mem // (args.full_batch * (s.prompt_len + s.new_tokens))
        sec: dict[str, Any] = {"setting": s.label, "memory_budget_bytes": mem,
                               "kv_bytes_per_token": per_token, "rows": [], "skipped": []}
        report["settings"].append(sec)
        runs: dict[tuple[str, Any], list[dict[str, Any]]] = {}
        batch: dict[tuple[str, Any], int] = {}
        probes: dict[tuple[str, Any], list[list[int]]] = {}
        floors: dict[int, float] = {}
        modes: dict[tuple[str, Any], dict[str, Any]] = {}
        configs = [("full", None)] + [(p, b) for b in budgets for p in policies]
        for c in configs:
            if args.time_budget_s is not None and time.perf_counter() - t0 > args.time_budget_s:
                sec["skipped"].append(f"{c[0]}@{budget_label(c[1])}")
                continue
            if c[0] == "full":
                batch[c], probes[c] = args.full_batch, [[args.full_batch, mem]]
            else:
                batch[c], probes[c] = largest_batch(
                    lambda b, c=c, pool=pool, n=s.new_tokens: peak_kv_bytes(model, pool[:b], c[0], c[1], n),
                    mem, args.max_batch)
            if batch[c] == 0:
                sec["skipped"].append(f"{c[0]}@{budget_label(c[1])}: not even batch 1 fits")
                continue
            rs = []
            for _ in range(args.rounds):
                r = timed_run(model, pool[:batch[c]], c[0], c[1], s.new_tokens, args.capture)
                if c != ("full", None) and ("full", None) in runs:
                    r["agreement"] = agreement(r["tokens"], runs[("full", None)][0]["tokens"])
                rs.append(r)
            runs[c] = rs
            captured = rs[0]["captured_steps"] > 0
            modes[c] = {"mode": "captured" if captured else "eager", "reason": rs[0]["reason"],
                        "captured_steps": rs[0]["captured_steps"], "eager_steps": rs[0]["eager_steps"],
                        "peak_gpu_mib": max((r["peak_gpu_mib"] or 0.0) for r in rs) or None}
            if batch[c] not in floors:  # one floor per batch (the policies share theirs)
                floors[batch[c]] = floor_ms(model, batch[c], vocab, device, captured)
            if c == ("full", None) and args.static_full:
                sec["static_full"] = static_full_row(model, pool[:batch[c]], s.new_tokens, args.rounds,
                                                     args.capture, rs[0]["tokens"])
            rows = summarize(s, runs, batch, probes, floors, w_bytes, per_token,
                             bw["read_gbs"])
            for row in rows:
                row.pop("peak_rss_delta_mb", None)
                row.update(modes[(row["policy"], row["budget"])])
                if "static_full" in sec:
                    row["gain_vs_captured_full"] = (row["decode_tok_s"]["median"]
                                                    / sec["static_full"]["decode_tok_s"]["median"])
            sec["rows"] = rows
            write(text())
        for r in (x for rs in runs.values() for x in rs):
            r.pop("tokens", None)
    report["elapsed_s"] = time.perf_counter() - t0
    tail = [f"skipped (time budget): {', '.join(x['skipped'])}" for x in report["settings"] if x["skipped"]]
    write(text() + tail + [f"elapsed {report['elapsed_s']:.0f} s"])
    print("\n".join((out / "gpu_long.txt").read_text().splitlines()[1:]), flush=True)


if __name__ == "__main__":
    main()
