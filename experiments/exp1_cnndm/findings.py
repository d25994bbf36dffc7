"""Experiment 1's report sections: the CNN/DailyMail curves, and the same config across code versions,
devices and noise streams."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import analysis
from keyformer.lab.report import PAIRS, curve_experiment, fmt_ci

_CONFIG = ("policy", "budget", "recent", "kv_quant", "num_beams", "beam_scores", "max_prompt_tokens",
           "max_new_tokens",
           "seed", "chat_template", "n_samples")


def _same(x: object, y: object) -> bool:
    if pd.isna(x) and pd.isna(y):
        return True
    if isinstance(x, float | int) and isinstance(y, float | int):
        return bool(np.isclose(x, y))
    return x == y


def same_config(res: Path, a: str, b: str, title: str) -> None:
    """Points of two result folders with the same config (policy and its knobs, budget, quantization, prompt
    and generation settings): identical outputs per point and the paired ROUGE-2 difference (``a`` -
    ``b``)."""
    if not (res / a / "points.csv").exists() or not (res / b / "points.csv").exists():
        return
    p_a, s_a = analysis.load_experiment(res, a)
    p_b, s_b = analysis.load_experiment(res, b)
    print(f"\n### {title} (same config; ROUGE-2)\n")
    print(f"| policy | budget | identical outputs | {b} | {a} | difference [95 % CI] "
          f"|\n|---|---|---|---|---|---|")
    def config(p: pd.DataFrame) -> list[str]:
        return [c for c in p.columns if c in _CONFIG or c.startswith("policy.")]

    # compared: the config columns both sides record; a knob only ``a`` records (newer code) is matched by
    # preferring its unset or default-looking rows, e.g. the plain point over its quantized twin
    common, extra = [c for c in config(p_a) if c in p_b.columns], [c for c in config(p_a)
                                                                   if c not in p_b.columns]
    for _, pb in p_b.sort_values(["policy", "budget"]).iterrows():
        pa = p_a[[all(_same(ra[c], pb[c]) for c in common) for _, ra in p_a.iterrows()]]
        if pa.empty:
            continue
        pa = pa.iloc[np.argsort(pa[extra].notna().sum(axis=1).to_numpy(), kind="stable")] if extra else pa
        x = s_a[s_a["point"] == pa["point"].iloc[0]].set_index("id")
        y = s_b[s_b["point"] == pb["point"]].set_index("id")
        ids = x.index.intersection(y.index)
        same = int((x.loc[ids, "prediction"] == y.loc[ids, "prediction"]).sum())
        d = analysis.paired_bootstrap(x.loc[ids, "rouge2"], y.loc[ids, "rouge2"], n_boot=5000)
        print(f"| {pb['policy']} | {pb['budget']:.1f} | {same}/{len(ids)} | "
              f"{y.loc[ids, 'rouge2'].mean():.2f} | "
              f"{x.loc[ids, 'rouge2'].mean():.2f} | {fmt_ci(d.mean, d.lo, d.hi)} |")


def realisations(res: Path) -> None:
    """Same config, two code versions: H2O must match exactly; Keyformer's noise stream changed in between."""
    same_config(res, "exp1_cnndm", "archive/exp1_cnndm_7e9326a", "exp1 at core commit 7e9326a vs now")


def devices(res: Path) -> None:
    """Same config on two devices: experiment 1 (CPU) against experiment 7's CNN/DM points (the H200,
    fp32)."""
    same_config(res, "exp7_field/cnndm", "exp1_cnndm", "exp1 on the CPU vs exp7's CNN/DM points on the H200")


def new_stream(res: Path, old: str = "archive/exp1_cnndm_oldstream") -> None:
    """Experiment 1's Keyformer points (the fast core's noise stream: hash noise, per-sample seeds) against
    the same points on the previous stream (kept in ``old``) and against H2O, paired over the same
    articles."""
    if not (res / old / "points.csv").exists() or not (res / "exp1_cnndm" / "points.csv").exists():
        return
    p_old, s_old = analysis.load_experiment(res, old)
    p_ref, s_ref = analysis.load_experiment(res, "exp1_cnndm")
    print(f"\n### exp1: Keyformer on the current noise stream vs the previous stream ({old}) and H2O "
          f"(ROUGE-2)\n")
    print("| budget | n | Keyformer now | Keyformer old | H2O | now - H2O [95 % CI] | now - old [95 % CI] |\n"
          "|---|---|---|---|---|---|---|")
    diffs = []
    for _, pk in p_ref[p_ref["policy"] == "keyformer"].sort_values("budget").iterrows():
        ph = p_ref[(p_ref["policy"] == "h2o") & np.isclose(p_ref["budget"], pk["budget"])]
        po = p_old[(p_old["policy"] == "keyformer") & np.isclose(p_old["budget"], pk["budget"])]
        if ph.empty or po.empty:
            continue
        a = s_ref[s_ref["point"] == pk["point"]].set_index("id")
        h = s_ref[s_ref["point"] == ph["point"].iloc[0]].set_index("id")
        o = s_old[s_old["point"] == po["point"].iloc[0]].set_index("id")
        ids = a.index.intersection(h.index).intersection(o.index)
        dh = analysis.paired_bootstrap(a.loc[ids, "rouge2"], h.loc[ids, "rouge2"], n_boot=5000)
        do = analysis.paired_bootstrap(a.loc[ids, "rouge2"], o.loc[ids, "rouge2"], n_boot=5000)
        diffs.append((a.loc[ids, "rouge2"] - o.loc[ids, "rouge2"]).rename(pk["budget"]))
        print(f"| {pk['budget']:.1f} | {len(ids)} | {a.loc[ids, 'rouge2'].mean():.2f} | "
              f"{o.loc[ids, 'rouge2'].mean():.2f} | "
              f"{h.loc[ids, 'rouge2'].mean():.2f} | {fmt_ci(dh.mean, dh.lo, dh.hi)} | "
              f"{fmt_ci(do.mean, do.lo, do.hi)} |")
    if len(diffs) > 1:  # pooled over budgets: per-article mean difference, bootstrapped over articles
        per_article = pd.concat(diffs, axis=1).dropna().mean(axis=1)
        m, lo, hi = analysis.mean_ci(per_article.to_numpy(), n_boot=5000)
        print(f"\nPooled over {len(diffs)} budgets ({len(per_article)} articles): now - old "
              f"{fmt_ci(m, lo, hi)}")


def brief(res: Path) -> list[str]:
    """The headline line: experiment 1's pooled Keyformer - H2O."""
    if not (res / "exp1_cnndm" / "points.csv").exists():
        return []
    points, samples = analysis.load_experiment(res, "exp1_cnndm")
    evict = points[points["policy"] != "full"]
    d, used = analysis.pooled_difference(samples, evict, "keyformer", "h2o", "rouge2", n_boot=5000)
    return [f"* Experiment 1 (CNN/DM, {d.n} articles, budgets {', '.join(f'{b:g}' for b in used)}): "
            f"Keyformer - H2O pooled {fmt_ci(d.mean, d.lo, d.hi)} ROUGE-2."]


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp1_cnndm': lambda res: curve_experiment(res, "exp1_cnndm", PAIRS),
    'realisations': realisations,
    'devices': devices,
    'new_stream': new_stream,
}
