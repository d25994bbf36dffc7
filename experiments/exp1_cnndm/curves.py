"""Findings of the ROUGE-vs-budget experiments (1, 2 and 3): pooled paired differences between policies.

A pooled difference averages, for each article, its differences over the budgets where both arms finished it
(as :func:`keyformer.lab.analysis.pooled_difference` does): one value per article, so the bootstrap
resamples articles and the budgets of one article stay together. Against full, the one full-cache point is
each budget's ``b`` arm.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import findings_of

POLICY_PAIRS = (("keyformer", "h2o"), ("keyformer", "window"), ("h2o", "window"))
EVICTING = ("keyformer", "h2o", "window")


def pooled_pairs(samples_a: pd.DataFrame, samples_b: pd.DataFrame, pairs: Sequence[tuple[str, str]],
                 metric: str = "rouge2") -> tuple[pd.DataFrame, bool]:
    """Per article over the ``(point_a, point_b)`` pairs (one per budget): the mean ``metric`` of each arm and
    the mean difference (columns ``a``, ``b``, ``d``, indexed by article id), and whether both arms gave the
    same prediction on every paired sample (False when a side records no predictions)."""
    frames, same = [], True
    for pa, pb in pairs:
        frames.append(_pair(samples_a, samples_b, pa, pb, metric))
        if "prediction" in samples_a and "prediction" in samples_b:
            p = _pair(samples_a, samples_b, pa, pb, "prediction")
            same = same and bool(len(p)) and bool((p["a"].astype(str) == p["b"].astype(str)).all())
        else:
            same = False
    if not frames:
        raise ValueError("no pairs of points")
    j = pd.concat(frames)
    j = j.assign(a=j["a"].astype(float), b=j["b"].astype(float))
    per = j.assign(d=j["a"] - j["b"]).groupby("id")[["a", "b", "d"]].mean()
    return per, same


def _pair(samples_a: pd.DataFrame, samples_b: pd.DataFrame, point_a: str, point_b: str,
          col: str) -> pd.DataFrame:
    a = samples_a.loc[samples_a["point"] == point_a, ["id", col]].rename(columns={col: "a"})
    b = samples_b.loc[samples_b["point"] == point_b, ["id", col]].rename(columns={col: "b"})
    return a.merge(b, on="id", how="inner")


def policy_pairs(points: pd.DataFrame, a: str, b: str) -> list[tuple[float, str, str]]:
    """``(budget, point of a, point of b)`` at every budget where both policies ran; ``b == "full"``: the
    full-cache point is every budget's ``b``."""
    pa = points[points["policy"] == a].sort_values("budget")
    if b == "full":
        full = points.loc[points["policy"] == "full", "point"]
        if full.empty:
            return []
        return [(float(r["budget"]), r["point"], full.iloc[0]) for _, r in pa.iterrows()]
    pb = points[points["policy"] == b]
    out = []
    for _, r in pa.iterrows():
        m = pb[np.isclose(pb["budget"], r["budget"])]
        if not m.empty:
            out.append((float(r["budget"]), r["point"], m["point"].iloc[0]))
    return out


def comparison(cid: str, quantity: str, a: str, b: str, samples_a: pd.DataFrame, samples_b: pd.DataFrame,
               pairs: Sequence[tuple[float, str, str]], family: str | None,
               metric: str = "rouge2") -> fnd.Comparison:
    """One pooled comparison ``a - b`` over ``pairs`` (``(budget, point_a, point_b)``); ``meta`` holds the
    budgets, each arm's pooled mean and the number of budgets."""
    per, same = pooled_pairs(samples_a, samples_b, [(x, y) for _, x, y in pairs], metric)
    return fnd.Comparison(
        id=cid, quantity=quantity, a=a, b=b, strata=[per["d"].to_numpy()], family=family, identical=same,
        meta={"budgets": [b_ for b_, _, _ in pairs], "mean_a": float(per["a"].mean()),
              "mean_b": float(per["b"].mean())})


def curve_comparisons(res: Path, name: str, families: dict[str, list[tuple[str, str]]],
                      prefix: str, metric: str = "rouge2") -> list[fnd.Comparison]:
    """The pre-registered pooled comparisons of a curve experiment: every ``(a, b)`` of each family whose
    policies both ran (``b == "full"``: against the full-cache point)."""
    if not (res / name / "points.csv").exists():
        return []
    points, samples = analysis.load_experiment(res, name)
    out = []
    for fam, pairs in families.items():
        for a, b in pairs:
            at = policy_pairs(points, a, b)
            if at:
                out.append(comparison(f"{prefix}.{a}-{b}", f"ROUGE-2, {a} - {b}, pooled over budgets", a, b,
                                      samples, samples, at, fam, metric))
    return out


# -- words, read from findings.json ----------------------------------------------------------------------
def ci(f: dict) -> str:
    return fnd.fmt_ci(f, 2)


def budgets(f: dict) -> str:
    return ", ".join(f"{b:g}" for b in f["meta"]["budgets"])


def verdict(f: dict) -> str:
    """The verdict, and the alternative design's where it differs."""
    v = f"**{fnd.fmt_verdict(f)}**"
    alt = f.get("verdict_alt")
    return v if alt is None or alt == f["verdict"] else f"{v} ({f['design_alt']} as units: {alt})"


def holm(f: dict) -> str:
    if f["p_adj"] is None:
        return "identical outputs"
    if f["family_size"] and f["family_size"] > 1:
        return f"Holm p {fnd.fmt_p(f)} over {f['family_size']}"
    return f"p {fnd.fmt_p(f)}"


def pair_bullet(f: dict) -> str:
    """One policy pair: its pooled difference, each arm's pooled mean, the budgets, the verdict."""
    return (f"{f['a']} - {f['b']}, pooled over budgets {budgets(f)}: {ci(f)} ROUGE-2 ({f['a']} "
            f"{f['meta']['mean_a']:.2f} vs {f['b']} {f['meta']['mean_b']:.2f}; n {f['n']}; {holm(f)}): "
            f"{verdict(f)}.")


def full_bullet(fs: list[dict]) -> str:
    """The evicting policies against full, in one line."""
    parts = [f"{f['a']} {ci(f)} ({verdict(f)})" for f in fs]
    if not fs:
        return ""
    f = fs[0]
    return (f"Against full ({f['meta']['mean_b']:.2f} ROUGE-2), pooled over each policy's budgets: "
            + "; ".join(parts) + f" (n {f['n']}; Holm over {f['family_size']}).")


def by_family(doc: dict, family: str) -> list[dict]:
    return [f for f in doc["findings"] if f["family"] == family]


def curve_bullets(doc: dict, prefix: str) -> list[str]:
    """A curve study's bullets: each pair of its ``<prefix>.policies`` family, then its ``<prefix>.vs_full``
    family in one line."""
    out = [pair_bullet(f) for f in by_family(doc, f"{prefix}.policies")]
    full = by_family(doc, f"{prefix}.vs_full")
    return out + ([full_bullet(full)] if full else [])


def answer_line(doc: dict, family: str) -> str:
    """Keyformer against H2O, and the window against both, pooled over budgets, with the verdicts."""
    fs = {f"{f['a']}-{f['b']}": f for f in by_family(doc, family)}
    parts = []
    if "keyformer-h2o" in fs:
        f = fs["keyformer-h2o"]
        parts.append(f"Keyformer - H2O pooled over budgets {ci(f)} ROUGE-2: **{f['verdict']}**")
    win = [fs[k] for k in ("keyformer-window", "h2o-window") if k in fs]
    if win:
        parts.append("against the window " + ", ".join(f"{f['a']} {f['estimate']:+.2f} (**{f['verdict']}**)"
                                                       for f in win))
    holm_ = any((f["family_size"] or 0) > 1 for f in fs.values())
    return "; ".join(parts) + (" (Holm)." if holm_ else ".") if parts else ""


def prompt_tokens(name: str):
    """A page placeholder: the mean prompt length of experiment ``name``'s points, in tokens."""
    def fill(res: Path, doc: dict | None) -> str:
        p = pd.read_csv(res / name / "points.csv")
        return f"{p['mean_prompt_tokens'].mean():.0f}" if "mean_prompt_tokens" in p else "-"
    return fill


def recent_share(name: str):
    """A page placeholder: the recent window of experiment ``name``'s evicting points, as a share of the
    budget."""
    def fill(res: Path, doc: dict | None) -> str:
        p = pd.read_csv(res / name / "points.csv")
        v = sorted({f"{100 * x:.0f} %" for x in p.get("recent", pd.Series(dtype=float)).dropna()})
        return ", ".join(v) if v else "-"
    return fill


def _fmt_ci(m: float, lo: float, hi: float) -> str:
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def curve_experiment(res: Path, name: str, pairs: Sequence[tuple[str, str]] = POLICY_PAIRS) -> None:
    """The ROUGE curve tables of experiments 1-3: per point, paired differences, budget to reach full."""
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    ids = analysis.common_ids(samples, points["point"].tolist())
    paired = samples[samples["id"].isin(ids)]
    print(f"\n### {name}: {len(ids)} samples common to {len(points)} points "
          f"({int(points['complete'].sum())} complete)\n")
    rows = []
    for _, p in points.sort_values(["policy", "budget"]).iterrows():
        s = paired[paired["point"] == p["point"]]
        cis = {k: analysis.mean_ci(s[k].to_numpy(), n_boot=2000) for k in ("rouge1", "rouge2", "rougeL")}
        rows.append(f"| {p['policy']} | {p['budget']:g} | {int(p['n_done'])} | "
                    + " | ".join(f"{m:.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in cis.values()) + " |")
    print("| policy | budget | n done | ROUGE-1 | ROUGE-2 | ROUGE-L |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    evict = points[points["policy"] != "full"]
    full = points.loc[points["policy"] == "full", "point"]
    print("\nPaired ROUGE-2 differences (95 % bootstrap CI; each pair over the articles both points "
          "finished):\n")
    print("| budget | comparison | n | diff [95 % CI] | P(diff <= 0) |\n|---|---|---|---|---|")
    t = analysis.pairwise_table(samples, evict, pairs, "rouge2", n_boot=5000)
    for r in t.itertuples():
        print(f"| {r.budget:.1f} | {r.a} - {r.b} | {r.n} | {_fmt_ci(r.diff, r.ci_lo, r.ci_hi)} | "
              f"{r.p_le_0:.3f} |")
    found = findings_of(res, name)
    for a, b in pairs:
        if {a, b} <= set(evict["policy"]):
            f = found.get(f"{name.split('_')[0]}.{a}-{b}")
            if f is not None:  # the finding itself (its interval at Holm's level): one draw per number
                print(f"| pooled over {budgets(f)} | {a} - {b} | {f['n']} | {ci(f)} (findings) | - |")
                continue
            d, used = analysis.pooled_difference(samples, evict, a, b, "rouge2", n_boot=5000)
            print(f"| pooled over {', '.join(f'{x:g}' for x in used)} | {a} - {b} | {d.n} | "
                  f"{_fmt_ci(d.mean, d.lo, d.hi)} | {d.p_le_0:.3f} |")
    if len(full):
        for _, p in evict.sort_values(["policy", "budget"]).iterrows():
            d = analysis.compare_points(samples, p["point"], full.iloc[0], "rouge2", n_boot=5000)
            print(f"| {p['budget']:.1f} | {p['policy']} - full | {d.n} | {_fmt_ci(d.mean, d.lo, d.hi)} | "
                  f"{d.p_le_0:.3f} |")
        print("\nBudget to reach 99 % of full ROUGE-2:\n")
        print("| policy | budget | 95 % CI | share of resamples reaching it | measured budgets | n |\n"
              "|---|---|---|---|---|---|")
        for pol in sorted(evict["policy"].unique()):
            r = analysis.budget_to_reach(samples, evict, pol, full.iloc[0], 0.99, "rouge2", n_boot=2000)
            b = ("not reached" if np.isnan(r["budget"]) else
                 (f"<= {r['budget']:.2f}" if r["budget"] == r["min_budget"] else f"{r['budget']:.2f}"))
            print(f"| {pol} | {b} | [{r['ci_lo']:.2f}, {r['ci_hi']:.2f}] | {r['reached']:.2f} | "
                  f"{r['min_budget']:.1f}-{r['max_budget']:.1f} | {r['n']} |")
