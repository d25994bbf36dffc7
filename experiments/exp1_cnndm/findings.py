"""Experiment 1's report sections: the CNN/DailyMail curves, and the same config across code versions,
devices and noise streams."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp1_cnndm import curves
from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import fmt_ci

_CONFIG = ("policy", "budget", "recent", "kv_quant", "num_beams", "beam_scores", "max_prompt_tokens",
           "max_new_tokens",
           "seed", "chat_template", "n_samples")


def _same(x: object, y: object) -> bool:
    if pd.isna(x) and pd.isna(y):
        return True
    if isinstance(x, float | int) and isinstance(y, float | int):
        return bool(np.isclose(x, y))
    return x == y


def matched_points(p_a: pd.DataFrame, p_b: pd.DataFrame) -> list[tuple[pd.Series, str]]:
    """Each point of ``p_b`` (by policy and budget) with the name of its twin in ``p_a``: the point with the
    same config (policy and its knobs, budget, quantization, prompt and generation settings)."""
    def config(p: pd.DataFrame) -> list[str]:
        return [c for c in p.columns if c in _CONFIG or c.startswith("policy.")]

    # compared: the config columns both sides record; a knob only ``a`` records (newer code) is matched by
    # preferring its unset or default-looking rows, e.g. the plain point over its quantized twin
    common, extra = [c for c in config(p_a) if c in p_b.columns], [c for c in config(p_a)
                                                                   if c not in p_b.columns]
    out = []
    for _, pb in p_b.sort_values(["policy", "budget"]).iterrows():
        pa = p_a[[all(_same(ra[c], pb[c]) for c in common) for _, ra in p_a.iterrows()]]
        if pa.empty:
            continue
        pa = pa.iloc[np.argsort(pa[extra].notna().sum(axis=1).to_numpy(), kind="stable")] if extra else pa
        out.append((pb, pa["point"].iloc[0]))
    return out


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
    for pb, name_a in matched_points(p_a, p_b):
        x = s_a[s_a["point"] == name_a].set_index("id")
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


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp1_cnndm': lambda res: curves.curve_experiment(res, "exp1_cnndm"),
    'realisations': realisations,
    'devices': devices,
    'new_stream': new_stream,
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "1: CNN/DailyMail"
QUESTION = ("On CNN/DailyMail, does Keyformer keep more ROUGE-2 than H2O and the sliding window as the KV "
            "budget shrinks?")
FAMILIES = {  # pre-registered: (a, b) pooled over the budgets both ran; "full": the full-cache point
    "exp1.policies": list(curves.POLICY_PAIRS),
    "exp1.vs_full": [(p, "full") for p in curves.EVICTING],
}
# the same config elsewhere: (id, policy, folder a, folder b); a - b pooled over the budgets both ran
STREAMS = [("exp1.stream.keyformer-7e9326a", "keyformer", "exp1_cnndm", "archive/exp1_cnndm_7e9326a"),
           ("exp1.stream.keyformer-oldstream", "keyformer", "exp1_cnndm", "archive/exp1_cnndm_oldstream"),
           ("exp1.stream.h2o-7e9326a", "h2o", "exp1_cnndm", "archive/exp1_cnndm_7e9326a")]
DEVICES = [(f"exp1.h200.{p}", p, "exp7_field/cnndm", "exp1_cnndm") for p in ("full", *curves.EVICTING)]
DEFINITION = {
    "metric": "rouge2",
    "comparison": ("a - b, paired over articles and pooled over the budgets both arms ran: each article's "
                   "mean difference over those budgets (against full: the one full-cache point at every "
                   "budget)"),
    "families": {**{fam: [f"exp1.{a}-{b}" for a, b in pairs] for fam, pairs in FAMILIES.items()},
                 "exp1.noise_streams": [s[0] for s in STREAMS], "exp1.devices": [d[0] for d in DEVICES]},
    "design": ("one stratum of per-article pooled differences (the budgets of one article stay together), "
               "paired sign-flip test over articles; Holm "
               "within each family at alpha 0.05; noise_streams: Keyformer now against the same config at "
               "core commit 7e9326a and on the previous noise stream (H2O at 7e9326a as the deterministic "
               "control); devices: experiment 7's H200 points against these CPU points (H200 - CPU)"),
    "alpha": fnd.ALPHA,
    "margin": 0.5,  # ROUGE-2 points (declared after the data)
    # the families were first written as Holm lists with the findings engine (2026-12-06), after the rows
    "roles": {"exp1.*": "exploratory"},
}


def _elsewhere(res: Path, cid: str, policy: str, a: str, b: str, family: str) -> fnd.Comparison | None:
    """``policy``'s points of folder ``a`` against their same-config twins in folder ``b``, pooled."""
    if not (res / a / "points.csv").exists() or not (res / b / "points.csv").exists():
        return None
    p_a, s_a = analysis.load_experiment(res, a)
    p_b, s_b = analysis.load_experiment(res, b)
    pairs = [(float(pb["budget"]), name_a, pb["point"]) for pb, name_a in matched_points(p_a, p_b)
             if pb["policy"] == policy]
    if not pairs:
        return None
    return curves.comparison(cid, f"ROUGE-2, {policy}: {a} - {b}, pooled over budgets", f"{policy} ({a})",
                             f"{policy} ({b})", s_a, s_b, pairs, family)


def comparisons(res: Path) -> list[fnd.Comparison]:
    """The pre-registered pooled comparisons between policies and against full, then Keyformer across noise
    streams and the points across devices."""
    out = curves.curve_comparisons(res, "exp1_cnndm", FAMILIES, "exp1")
    for fam, rows in (("exp1.noise_streams", STREAMS), ("exp1.devices", DEVICES)):
        for cid, policy, a, b in rows:
            c = _elsewhere(res, cid, policy, a, b, fam)
            if c is not None:
                out.append(c)
    return out


def bullets(doc: dict) -> list[str]:
    """The three policy pairs, the policies against full, Keyformer across noise streams, the H200."""
    out = curves.curve_bullets(doc, "exp1")
    streams = {f["id"]: f for f in curves.by_family(doc, "exp1.noise_streams")}
    parts = [f"{f['a'].split(' (')[0]} now - `{f['b'].split(' (')[1].rstrip(')')}` {curves.ci(f)} (budgets "
             f"{curves.budgets(f)}; {curves.holm(f)}): {curves.verdict(f)}" for f in streams.values()]
    if parts:
        out.append("The same config on another noise stream or core commit, pooled: "
                   + "; ".join(parts) + ".")
    dev = curves.by_family(doc, "exp1.devices")
    if dev:
        same = [f["a"].split(" (")[0] for f in dev if f["verdict"] == "n/a"]
        differ = [f"{f['a'].split(' (')[0]} {curves.ci(f)}: {curves.verdict(f)}" for f in dev
                  if f["verdict"] != "n/a"]
        out.append(f"Experiment 7's H200 points against these CPU points: identical outputs on every paired "
                   f"article ({', '.join(same) or 'none'}; verdict n/a)"
                   + (f"; differing: {'; '.join(differ)}" if differ else "") + ".")
    return out[:8]


def answer(doc: dict) -> str:
    return curves.answer_line(doc, "exp1.policies")


PLACEHOLDERS = {"recent": curves.recent_share("exp1_cnndm")}
