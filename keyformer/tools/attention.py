"""Experiment 4: attention concentration and per-layer sparsity over real CNN/DailyMail prompts.

    KEYFORMER_DATA_DIR=../shared/data keyformer-attention-stats                  # conf/experiment/exp4_attention.yaml
    keyformer-attention-stats n_samples=200 max_prompt_tokens=1920 attention_stats.row_stride=1 \\
        attention_stats.out=results/exp4_attention_200

The arguments are Hydra overrides of ``run.py``'s config composed with ``+experiment=exp4_attention`` (the
number of prompts is ``n_samples``, their cap ``max_prompt_tokens``; the statistics' knobs and the output
folder are under ``attention_stats``), e.g. ``model=mpt device=cuda dtype=bfloat16`` on a GPU box.

Builds the prompts exactly as run.py does (same template, chat wrapping and truncation), runs each one
unpadded through the model with eager attention, and reduces each layer's attention probabilities on the
fly (see :mod:`keyformer.attention_stats`). Writes ``layers.csv`` (per layer), ``summary.csv`` (means over
layers) and ``meta.json`` into ``attention_stats.out``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

EXPERIMENT = "+experiment=exp4_attention"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    import pandas as pd
    import torch

    from keyformer.attention_stats import LayerStats, measure
    from keyformer.data import encode_prompt, load_records
    from keyformer.loading import load_model
    from keyformer.tools import compose

    overrides = [EXPERIMENT, *args]
    cfg = compose(overrides)
    st = cfg["attention_stats"]
    torch.manual_seed(0)
    model, tok = load_model(cfg)
    ds = cfg["dataset"]
    chat = bool(cfg["model"].get("chat_template")) and getattr(tok, "chat_template", None) is not None
    records = load_records(ds, int(cfg["n_samples"]), 0)
    limit = int(cfg["max_prompt_tokens"])
    prompts = [encode_prompt(tok, r, ds.get("template", "alpaca"), ds.get("instruction", ""), limit, chat)[0]
               for r in records]
    t0 = time.perf_counter()
    stats = measure(model, prompts, LayerStats(min_row=int(st["min_row"]), row_stride=int(st["row_stride"])),
                    progress=True)
    wall = time.perf_counter() - t0

    layers = pd.DataFrame(list(stats.rows()))
    layers.insert(0, "model", cfg["model"]["name"])
    summary = (layers.groupby(["stat", "x"], dropna=False)["value"]
               .agg(["mean", "min", "max"]).reset_index())
    summary.insert(0, "model", cfg["model"]["name"])
    out = Path(st["out"])
    out.mkdir(parents=True, exist_ok=True)
    layers.to_csv(out / "layers.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    lens = [len(p) for p in prompts]
    meta = {"model": cfg["model"]["name"], "dataset": ds["name"], "n_prompts": len(prompts),
            "max_prompt_tokens": limit, "prompt_tokens_mean": sum(lens) / len(lens),
            "prompt_tokens_min": min(lens), "prompt_tokens_max": max(lens), "min_row": st["min_row"],
            "row_stride": st["row_stride"], "sparsity_threshold": stats.threshold, "overrides": overrides,
            "wall_s": wall, "command": " ".join(["keyformer-attention-stats", *args])}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
