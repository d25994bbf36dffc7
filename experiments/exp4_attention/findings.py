"""Experiment 4's report section: attention concentration and sparsity."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd


def attention(res: Path) -> None:
    d = res / "exp4_attention"
    if not (d / "layers.csv").exists():
        return
    layers = pd.read_csv(d / "layers.csv")
    meta = json.loads((d / "meta.json").read_text())
    print(f"\n### exp4_attention: {meta['n_prompts']} prompts, mean {meta['prompt_tokens_mean']:.0f} "
          f"tokens\n")
    c = layers[layers["stat"] != "sparsity"].groupby(["stat", "x"])["value"].mean().unstack("stat")
    paper = {}  # the paper's curves as transcribed in paper_numbers.csv (strings: as read off its figure)
    if (res / "paper_numbers.csv").exists():
        pn = pd.read_csv(res / "paper_numbers.csv", dtype={"value": str})
        pn = pn[(pn["experiment"] == "exp4") & (pn["metric"] == "attn_mass")]
        paper = {m: dict(zip(g["x"].round(3), g["value"], strict=True)) for m,
                 g in pn.groupby("model", sort=False)}
    print("| top x % of tokens | " + " | ".join(c.columns) + "".join(f" | paper {m}" for m in paper)
          + " |\n|---|"
          + "---|" * (len(c.columns) + len(paper)))
    for x, r in c.iterrows():
        print(f"| {100 * x:.0f} | " + " | ".join(f"{v:.3f}" for v in r)
              + "".join(f" | {v.get(round(x, 3), '-')}" for v in paper.values()) + " |")
    sp = layers[layers["stat"] == "sparsity"].set_index("layer")["value"]
    print(f"\nsparsity per layer: mean {100 * sp.mean():.1f} %, min {100 * sp.min():.1f} % (layer "
          f"{sp.idxmin()}), "
          f"max {100 * sp.max():.1f} % (layer {sp.idxmax()})")
    print("per layer: " + ", ".join(f"{int(i)}: {100 * v:.0f}" for i, v in sp.items()))


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'attention': attention,
}
