"""Why the long benchmark's peak-RSS column needed a trimmed heap: the same runs in one process, in order
(default: H2O, Keyformer, H2O, each a batch-64 prompt forward of 512 tokens at budget 256 plus one decode
step), each run's peak RSS increase over the RSS before it, measured twice in fresh processes: from the
untrimmed heap (what `keyformer-bench --long` did before) and after ``malloc_trim``
(:func:`keyformer.lab.bench.memory.start_peak`, what it does now). With an untrimmed heap a run's increase
depends on what the runs before it freed but glibc kept; a policy's own number must not.

    .venv/bin/python scripts/rss_history.py --out results/bench/rss_history.txt     # ~15 min on 2 cores
    .venv/bin/python scripts/rss_history.py --model tiny --batch 2 --prompt-len 32 --budget 8   # seconds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from keyformer.core.generate import make_cache
from keyformer.core.policies import make_policy
from keyformer.lab.bench.cpu import environment, load_bench_model
from keyformer.lab.bench.memory import reset_peak_rss, start_peak, status_mb


def child(args: argparse.Namespace) -> list[dict]:
    """The runs in this process, from a trimmed (``trim``) or untrimmed heap."""
    torch.set_num_threads(args.threads)
    model = load_bench_model({"model_name": args.model, "dtype": "float32", "prompt": "random",
                              "data_dir": None})[0]
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_len),
                        generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    rows = []
    for name in args.order.split(","):
        if args.trim:
            base = start_peak()
        else:
            base = status_mb("VmRSS")
            reset_peak_rss()
        t0 = time.perf_counter()
        with torch.inference_mode():
            cache = make_cache(model, make_policy(name, budget=args.budget), mask, max_new_tokens=2, seed=0)
            out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
            model(input_ids=out.logits[:, -1].argmax(-1, keepdim=True), cache=cache, logits_to_keep=1)
        rows.append({"policy": name, "seconds": time.perf_counter() - t0, "rss_before_mb": base,
                     "peak_rss_delta_mb": status_mb("VmHWM") - base})
        del cache, out
    return rows


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--order", default="h2o,keyformer,h2o")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--trim", action="store_true", help=argparse.SUPPRESS)  # the child's mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return ""
    opts = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
            if k not in ("out", "trim", "child")]
    env = environment()  # before the runs: the commit they ran at
    modes = {}
    for trim in (False, True):  # each mode in a fresh process: the first run starts from the same heap
        res = subprocess.run([sys.executable, __file__, "--child", *opts, *(["--trim"] if trim else [])],
                             capture_output=True, text=True, check=True)
        modes[trim] = json.loads(res.stdout.strip().splitlines()[-1])
    lines = [f"peak RSS increase of each run over the RSS before it, in one process, in order ({args.model}, "
             f"batch {args.batch}, {args.prompt_len}-token prompt + 1 decode step, budget {args.budget}, "
             f"{env['threads']} threads)",
             f"commit {env['git_commit']}; {env['cpu']}; torch {env['torch']}",
             f"{'run':<4} {'policy':<10} {'untrimmed: before':>18} {'increase':>9} {'trimmed: before':>16} "
             f"{'increase':>9}"]
    for i, (a, b) in enumerate(zip(modes[False], modes[True], strict=True)):
        lines.append(f"{i + 1:<4} {a['policy']:<10} {a['rss_before_mb']:>18.0f} "
                     f"{a['peak_rss_delta_mb']:>9.0f} {b['rss_before_mb']:>16.0f} "
                     f"{b['peak_rss_delta_mb']:>9.0f}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
