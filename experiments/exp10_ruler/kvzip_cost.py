"""KVzip's extra cost, measured side by side: the prefill seconds (the prompt forward + KVzip's
reconstruction, as ``generate`` reports them in ``prefill_s``) of full, SnapKV and KVzip at one prompt length,
KVzip both ways: ``kvzip`` reads the real prompt forward's keys and values (its cut deferred; the default) and
``kvzip_again`` runs each sample's prompt once more before it (the pre-hook path, which MPT and quantized
caches still take). Rounds are interleaved (full, snapkv, kvzip, kvzip_again, ...); each ratio is a
config's seconds over full's in the same round, reported as the median [min, max] over rounds. The two
KVzip paths' kept sets are compared. Run it on a quiet machine:

    KEYFORMER_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 \\
      .venv/bin/python -m experiments.exp10_ruler.kvzip_cost --n 4000 \\
        --out results/bench/kvzip_cost
    .venv/bin/python -m experiments.exp10_ruler.kvzip_cost --model tiny --n 256 --out /tmp/kvzip_cost  # secs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from keyformer import generate, make_policy
from keyformer.core import generate as gen
from keyformer.lab.bench.cpu import environment, load_bench_model, prompt_tokens
from keyformer.run.results import code_tree

CONFIGS = ("full", "snapkv", "kvzip", "kvzip_again")
CODE = ["keyformer/core", "experiments/exp10_ruler/kvzip_cost.py"]


@contextlib.contextmanager
def prompt_again(on: bool):
    """While ``on``: make_cache takes the pre-hook path (each sample's prompt runs once more first)."""
    if not on:
        yield
        return
    saved = gen._prepare_after_prompt
    gen._prepare_after_prompt = gen._prepare_at_prompt
    try:
        yield
    finally:
        gen._prepare_after_prompt = saved


def run(model, ids: torch.Tensor, name: str, budget: float) -> tuple[float, list]:
    """One prefill of config ``name``: (seconds, the kept positions of every layer)."""
    pol = make_policy("full") if name == "full" else make_policy(name.removesuffix("_again"), budget=budget)
    with prompt_again(name == "kvzip_again"):
        out = generate(model, ids, None, pol, max_new_tokens=1)
    kept = [out.cache.kept_positions(li) for li in range(len(out.cache.layers))] if "kvzip" in name else []
    return out.prefill_s, kept


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=512, help="prompt tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3_270m", "tiny", "tiny_gemma3"])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="folder for cost.json and cost.txt")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = {"model_name": args.model, "dtype": "float32", "prompt": "cnn_dailymail",
           "data_dir": os.environ.get("KEYFORMER_DATA_DIR")}
    env = environment()
    t0 = time.perf_counter()
    model, tok = load_bench_model(cfg)
    text = prompt_tokens(cfg, tok, args.n)
    ids = (torch.tensor([text[: args.n]]) if text is not None else
           torch.randint(3, model.config.vocab_size, (1, args.n), generator=torch.Generator().manual_seed(0)))
    with torch.inference_mode():
        for name in CONFIGS:  # warm-up
            run(model, ids[:, : min(args.n, 128)], name, args.budget)
        secs: dict[str, list[float]] = {c: [] for c in CONFIGS}
        same = []
        for r in range(args.rounds):
            kept = {}
            for name in CONFIGS:
                s, kept[name] = run(model, ids, name, args.budget)
                secs[name].append(s)
                print(f"round {r + 1}: {name} {s:.2f} s", flush=True)
            same.append(kept["kvzip"] == kept["kvzip_again"])
    rows = []
    for name in CONFIGS:
        ratios = [a / b for a, b in zip(secs[name], secs["full"], strict=True)]
        rows.append({"config": name, "prefill_s": secs[name], "median_s": statistics.median(secs[name]),
                     "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                     "ratio_max": max(ratios)})
    saved = [a / b for a, b in zip(secs["kvzip_again"], secs["kvzip"], strict=True)]
    what = "CNN/DM text" if text is not None else "random ids"
    lines = [f"KVzip prefill cost: prompt {args.n} tokens ({what}), "
             f"model {args.model} fp32, budget {args.budget}, {torch.get_num_threads()} thread(s), "
             f"{args.rounds} interleaved rounds",
             f"{env['cpu']}, torch {env['torch']}, git {env['git_commit']}, load avg start {env['loadavg']} "
             f"end {[round(x, 2) for x in os.getloadavg()]}",
             f"{'config':<12} {'prefill s (median)':>18} {'x full: median [min, max]':>28}"]
    for r in rows:
        lines.append(f"{r['config']:<12} {r['median_s']:>18.2f} "
                     f"{r['ratio_median']:>10.2f} [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]")
    lines.append(f"kvzip_again / kvzip: median {statistics.median(saved):.2f} [{min(saved):.2f}, "
                 f"{max(saved):.2f}]; same kept sets in {sum(same)} of {len(same)} rounds")
    report = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "environment": env, "code": code_tree(paths=CODE), "model": args.model, "n": args.n,
              "budget": args.budget, "rounds": args.rounds, "prompt": "cnn_dailymail" if text is not None
              else "random", "rows": rows, "again_over_once": saved, "same_kept_sets": same,
              "loadavg_end": list(os.getloadavg()), "wall_s": time.perf_counter() - t0}
    out = "\n".join(lines)
    print(out)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cost.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "cost.txt").write_text(out + "\n")
    return report


if __name__ == "__main__":
    main()
