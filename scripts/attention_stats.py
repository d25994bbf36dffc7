"""Experiment 4: attention concentration and per-layer sparsity over real CNN/DailyMail prompts.

    KEYFORMER_DATA_DIR=../shared/data python scripts/attention_stats.py --n 20 --max-prompt-tokens 1024 \
        --out results/exp4_attention

Builds the prompts exactly as run.py does (same template, chat wrapping and truncation), runs each one
unpadded through the model with eager attention, and reduces each layer's attention probabilities on the
fly (see keyformer.attention_stats). Extra Hydra overrides select another model, e.g.
``model=mpt device=cuda dtype=bfloat16`` on a GPU box. Writes ``layers.csv`` (per layer), ``summary.csv``
(means over layers) and ``meta.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd


def compose(overrides: list[str]):
    from hydra import compose as hcompose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = hcompose("config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="number of prompts (first n records)")
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--min-row", type=int, default=16, help="skip the first query rows (too few keys)")
    ap.add_argument("--row-stride", type=int, default=16, help="row_mass over every k-th query row")
    ap.add_argument("--out", type=Path, default=Path("results/exp4_attention"))
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of run.py's config (default dataset=cnn_dailymail)")
    args = ap.parse_args(argv)

    import torch

    from keyformer.attention_stats import LayerStats, measure
    from keyformer.data import encode_prompt, load_records
    from keyformer.loading import load_model

    overrides = ["dataset=cnn_dailymail", "device=cpu", *args.overrides]
    cfg = compose(overrides)
    cfg["device"] = cfg["device"] if cfg["device"] != "auto" else "cpu"
    torch.manual_seed(0)
    model, tok = load_model(cfg)
    ds = cfg["dataset"]
    chat = bool(cfg["model"].get("chat_template")) and getattr(tok, "chat_template", None) is not None
    records = load_records(ds, args.n, 0)
    prompts = [encode_prompt(tok, r, ds.get("template", "alpaca"), ds.get("instruction", ""),
                             args.max_prompt_tokens, chat)[0] for r in records]
    t0 = time.perf_counter()
    stats = measure(model, prompts, LayerStats(min_row=args.min_row, row_stride=args.row_stride), progress=True)
    wall = time.perf_counter() - t0

    layers = pd.DataFrame(list(stats.rows()))
    layers.insert(0, "model", cfg["model"]["name"])
    summary = (layers.groupby(["stat", "x"], dropna=False)["value"]
               .agg(["mean", "min", "max"]).reset_index())
    summary.insert(0, "model", cfg["model"]["name"])
    args.out.mkdir(parents=True, exist_ok=True)
    layers.to_csv(args.out / "layers.csv", index=False)
    summary.to_csv(args.out / "summary.csv", index=False)
    lens = [len(p) for p in prompts]
    meta = {"model": cfg["model"]["name"], "dataset": ds["name"], "n_prompts": len(prompts),
            "max_prompt_tokens": args.max_prompt_tokens, "prompt_tokens_mean": sum(lens) / len(lens),
            "prompt_tokens_min": min(lens), "prompt_tokens_max": max(lens), "min_row": args.min_row, "row_stride": args.row_stride,
            "sparsity_threshold": stats.threshold, "overrides": overrides, "wall_s": wall,
            "command": "python scripts/attention_stats.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
