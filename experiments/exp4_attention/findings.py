"""Experiment 4's report section: attention concentration and sparsity."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
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


# -- page (keyformer.lab.pages): descriptive, no paired comparisons, so no findings.json ------------------
TITLE = "4: attention concentration"
QUESTION = ("How concentrated is SmolLM2's attention (share of mass on the top tokens) and how sparse is "
            "each layer, against the paper's models?")
MASS = 0.9  # the paper's claim: this share of the attention sits on a small share of the tokens


def _mass_at(curve: pd.Series, target: float = MASS) -> float:
    """The smallest share of tokens holding ``target`` of the mass (piecewise linear in the measured x)."""
    from keyformer.lab import analysis

    return analysis.crossing_budget(curve.index.to_numpy(), curve.to_numpy(), target)


def _pct(x: float) -> str:
    return "-" if np.isnan(x) else f"{100 * x:.0f} %"


def _at_most(x: float, xs: pd.Index) -> str:
    """A crossing share; at the smallest measured share it is an upper bound."""
    return f"at most {_pct(x)}" if np.isclose(x, xs.min()) else _pct(x)


def _paper_line(ours: pd.Series, curves: pd.DataFrame) -> str:
    """Our ``row_mass`` curve against each of the paper's: above at every share it reports, or by how much
    it falls short at worst."""
    parts = []
    for m, g in curves.groupby("model", sort=False):
        gap = min(float(ours[np.isclose(ours.index, x)].iloc[0]) - float(v)
                  for x, v in zip(g["x"], g["value"], strict=True) if np.isclose(ours.index, x).any())
        parts.append(f"{m}: at or above it everywhere" if gap >= 0 else f"{m}: at most {-gap:.3f} below it")
    return ("Against the paper's curves (read off its figure, about +-0.02), `row_mass` at each share the "
            "paper reports: " + "; ".join(parts) + ".")


def observations(res: Path, doc: dict | None = None) -> str:
    """The page's bullets, read from ``layers.csv``, ``meta.json`` and the paper's transcribed numbers."""
    d = res / "exp4_attention"
    if not (d / "layers.csv").exists():
        return "(no rows yet)"
    layers = pd.read_csv(d / "layers.csv")
    mass = layers[layers["stat"] != "sparsity"]
    mean = mass.groupby(["stat", "x"])["value"].mean()
    at = {s: _mass_at(mean[s]) for s in ("row_mass", "last_mass", "acc_mass")}
    xs = mean["row_mass"].index
    per_layer = mass[mass["stat"] == "row_mass"].groupby("layer").apply(
        lambda g: _mass_at(g.set_index("x")["value"].sort_index()), include_groups=False)
    out = [f"A query's {_pct(MASS)} attention mass sits on its top **{_pct(at['row_mass'])}** of keys "
           f"(`row_mass`, mean over layers, heads and prompts; per layer from "
           f"{_at_most(per_layer.min(), xs)} in layer {per_layer.idxmin()} to {_pct(per_layer.max())} in "
           f"layer {per_layer.idxmax()}), and on the top **{_pct(at['last_mass'])}** for the position that "
           f"starts generation (`last_mass`)."]
    paper = pd.DataFrame(columns=["metric"])
    if (res / "paper_numbers.csv").exists():
        pn = pd.read_csv(res / "paper_numbers.csv")
        paper = pn[pn["experiment"] == "exp4"]
    if (paper["metric"] == "attn_mass").any():
        out.append(_paper_line(mean["row_mass"], paper[paper["metric"] == "attn_mass"]))
    u = (0.1, 0.4)  # uniform causal attention: the earliest x of the tokens collect x(1 - ln x) of the sums
    out.append(f"For the accumulated score (`acc_mass`, what H2O and Keyformer rank by) the {_pct(MASS)} "
               f"point is at **{_pct(at['acc_mass'])}** of the tokens; part of that is causal structure, not "
               f"concentration: uniform causal attention already gives the earliest "
               + " / ".join(_pct(x) for x in u) + " of the tokens "
               + " / ".join(_pct(x * (1 - np.log(x))) for x in u) + " of the column sums (x(1 - ln x)).")
    sp = layers[layers["stat"] == "sparsity"].set_index("layer")["value"]
    line = (f"Per-layer sparsity (entries below {_pct(_threshold(d))} of their row maximum, H2O's "
            f"definition, causal entries only): mean **{_pct(sp.mean())}**, from {_pct(sp.min())} in layer "
            f"{sp.idxmin()} to {_pct(sp.max())} in layer {sp.idxmax()}.")
    rng = paper[paper["metric"] == "sparsity_pct"]
    if not rng.empty:
        r = rng.pivot_table(index="model", columns="method", values="value", sort=False)
        line += (" The paper's per-layer ranges (read off its figure): "
                 + "; ".join(f"{m} {lo:.0f}-{hi:.0f} %" for m, lo, hi in
                             zip(r.index, r["layer_sparsity_min"], r["layer_sparsity_max"], strict=True))
                 + "; the paper does not state its threshold, so levels compare only indicatively.")
    out.append(line)
    return "\n".join(f"- {b}" for b in out)


def _threshold(d: Path) -> float:
    return float(json.loads((d / "meta.json").read_text()).get("sparsity_threshold", float("nan")))


def prompts(res: Path, doc: dict | None = None) -> str:
    """The prompts measured: how many, their mean and largest length, the model."""
    f = res / "exp4_attention" / "meta.json"
    if not f.exists():
        return "(no rows yet)"
    m = json.loads(f.read_text())
    return (f"*Rows:* `exp4_attention/layers.csv` (per layer and statistic), `meta.json`; model "
            f"{m['model']}; dataset {m['dataset']}; {m['n_prompts']} prompts, mean "
            f"{m['prompt_tokens_mean']:.0f} tokens (from {m['prompt_tokens_min']} to "
            f"{m['prompt_tokens_max']}); `row_mass` every {m['row_stride']}th query row; core commit "
            f"{m.get('core_commit', 'not recorded')}.")


def answer_rows(res: Path) -> str:
    """The share of keys holding 90 % of a query's attention, and the mean per-layer sparsity."""
    d = res / "exp4_attention"
    if not (d / "layers.csv").is_file():
        return ""
    layers = pd.read_csv(d / "layers.csv")
    curve = layers[layers["stat"] == "row_mass"].groupby("x")["value"].mean()
    sp = layers.loc[layers["stat"] == "sparsity", "value"]
    return (f"Concentrated: {_pct(MASS)} of a query's attention sits on its top {_pct(_mass_at(curve))} of "
            f"keys; layers are {_pct(sp.mean())} sparse on average.")


PLACEHOLDERS = {"observations": observations, "prompts": prompts}
