"""Beam search without waste, measured (issue 23): ``generate(num_beams=4)`` at batch 1 on a real CNN/DM
prompt, prefill and decode seconds of full, H2O and Keyformer at budget 0.5, with the prompt run once per
sample (ours, the default) and once per beam (transformers' way, ``prompt_once=False``), the two
sequences compared.

It runs :func:`keyformer.lab.bench.long.beam_section`, the beam part of ``keyformer-bench --long``, on its own
(that tool runs it only after its whole long-generation grid). Rounds are medians with their IQR; the ratios
that matter are measured side by side in one process: per-beam prefill / once prefill, and each policy's
seconds / full's in the same mode. Run it on a quiet machine:

    KEYFORMER_DATA_DIR=../shared/data HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_beams.py \\
        --out results/bench/beams
    .venv/bin/python scripts/bench_beams.py --quick --out /tmp/beams   # tiny random model, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from keyformer.lab.bench.cpu import environment, load_bench_model, prompt_tokens
from keyformer.lab.bench.long import BENCH_CODE, beam_section
from keyformer.run.results import code_tree


def format_table(r: dict) -> str:
    """One line per policy: median [IQR] prefill and decode seconds in both modes and the ratios."""
    lines = [f"beam search, num_beams {r['num_beams']}, batch 1, prompt {r['prompt_len']} tokens, "
             f"{r['new_tokens']} new tokens; seconds: median [q1, q3] of rounds",
             f"{'policy':<14} {'prefill once':>22} {'prefill per beam':>22} {'x':>6} "
             f"{'decode once':>22} {'decode per beam':>22} {'pre/full':>8} {'dec/full':>8} same"]
    for row in r["rows"]:
        name = row["policy"] + ("" if row["budget"] is None else f"@{row['budget']:g}")
        once, per = row["prompt_once"], row["per_beam_prompt"]

        def cell(s: dict) -> str:
            return f"{s['median']:.3f} [{s['q1']:.3f}, {s['q3']:.3f}]"

        lines.append(f"{name:<14} {cell(once['prefill_s']):>22} {cell(per['prefill_s']):>22} "
                     f"{row['prefill_speedup']:>6.2f} {cell(once['decode_s']):>22} "
                     f"{cell(per['decode_s']):>22} {once['prefill_vs_full']:>8.2f} "
                     f"{once['decode_vs_full']:>8.2f} {row['same_sequences']}")
    lines.append("x = per-beam prefill / once prefill (the prompt forwards saved); pre/full, dec/full = the "
                 "policy's seconds over full's, prompt once; same = identical sequences in both modes")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for beams.json, beams.txt, command.txt")
    ap.add_argument("--quick", action="store_true", help="tiny random Llama, a 64-token prompt (seconds)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--policies", default="h2o,keyformer", help="besides full, at budget 0.5")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.prompt_len, args.new_tokens, args.rounds = 64, 8, 2
    cfg = {"model_name": "tiny" if args.quick else "smollm2", "dtype": "float32", "prompt": "cnn_dailymail",
           "data_dir": os.environ.get("KEYFORMER_DATA_DIR")}
    env = environment()
    t0 = time.perf_counter()
    model, tok = load_bench_model(cfg)
    text_ids = prompt_tokens(cfg, tok, args.prompt_len * 2)
    ns = argparse.Namespace(settings=f"{args.prompt_len}+{args.new_tokens}", beams=args.beams,
                            beam_new_tokens=args.new_tokens, rounds=args.rounds, seed=args.seed)
    policies = [p for p in args.policies.split(",") if p]
    with torch.inference_mode():  # warm-up: every mode once (Keyformer compiles its noise kernels here)
        warm = argparse.Namespace(**{**vars(ns), "beam_new_tokens": 2, "rounds": 1})
        beam_section(model, text_ids, model.config.vocab_size, policies, warm, lambda m: None)
        r = beam_section(model, text_ids, model.config.vocab_size, policies, ns,
                         lambda m: print(m, flush=True))
    report = {"command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
              "environment": env, "code": code_tree(paths=BENCH_CODE), "model": cfg["model_name"],
              "prompt": "cnn_dailymail" if text_ids is not None else "random", "loadavg_end": os.getloadavg(),
              "wall_s": time.perf_counter() - t0, **r}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "beams.json").write_text(json.dumps(report, indent=1) + "\n")
    text = format_table(r)
    (args.out / "beams.txt").write_text(
        f"{env['cpu']}, {torch.get_num_threads()} threads, torch {env['torch']}, git {env['git_commit']}, "
        f"model {cfg['model_name']} ({report['prompt']} prompt), load avg start {env['loadavg']} end "
        f"{list(report['loadavg_end'])}\n{text}\n")
    (args.out / "command.txt").write_text(report["command"] + "\n")
    print(text)
    return report


if __name__ == "__main__":
    main()
