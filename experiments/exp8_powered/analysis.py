"""Experiment 8's statistics: the powered Keyformer vs H2O study, its pre-registered decision, and the
authors'-setting subset."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from keyformer.lab.analysis import _point_series, looping_share, mean_ci, paired_bootstrap  # noqa: F401

# -- experiment 8: the powered, paired Keyformer vs H2O study ------------------------------------------------
PAPER_GAP = 0.3  # the smallest Keyformer - H2O ROUGE-2 gain the paper reports at 20-50 % budgets


def decide(lo: float, hi: float, gap: float = PAPER_GAP) -> str:
    """Experiment 8's pre-registered decision on the pooled Keyformer - H2O CI ``[lo, hi]``."""
    if hi < gap:
        return "does not transfer: the CI excludes +0.3" + ("; Keyformer is better by less" if lo > 0 else "")
    if lo >= gap:
        return "transfers: the CI lies above +0.3"
    if lo > 0:
        return "Keyformer beats H2O; whether by +0.3 is unresolved"
    return "inconclusive: the CI holds 0 and +0.3"


def powered_study(points: pd.DataFrame, samples: pd.DataFrame, budgets: Sequence[float] = (0.2, 0.3, 0.5),
                  metric: str = "rouge2", n_boot: int = 10000, seed: int = 0,
                  half_width: float = 0.25) -> dict:
    """Experiment 8's analysis (its ``README.md``): per article, d = mean(Keyformer seeds 0
    and 1) - H2O; per budget and pooled over budgets (per-article mean of d), with paired bootstrap CIs over
    the articles every core arm finished; the decision; the noise's own spread (seed 0 - seed 1); the extra
    arms at 0.3 against H2O; the n that the observed SD needs for a CI half-width of ``half_width``; and the
    n at which, with that SD and the observed mean, the CI would exclude 0 or +0.3 (``n_decisive``)."""
    arms = {(v, b): _point_series(points, samples, metric, variant=v, budget=float(b)) for b in budgets
            for v in ("h2o", "keyformer_s0", "keyformer_s1")}
    ids = (sorted(set.intersection(*[set(s.index) for s in arms.values()]))
           if all(len(s) for s in arms.values()) else [])
    out: dict = {"n": len(ids), "budgets": [], "extras": []}
    if not ids:
        return out
    ds = []
    for b in budgets:
        h, k0, k1 = (arms[(v, b)].loc[ids] for v in ("h2o", "keyformer_s0", "keyformer_s1"))
        kf = (k0 + k1) / 2
        d = paired_bootstrap(kf, h, n_boot=n_boot, seed=seed)
        sd_seeds = paired_bootstrap(k0, k1, n_boot=n_boot, seed=seed)
        out["budgets"].append({"budget": b, "h2o": float(h.mean()), "keyformer": float(kf.mean()),
                               "keyformer_s0": float(k0.mean()), "keyformer_s1": float(k1.mean()),
                               **d.as_dict(), "sd": float((kf - h).std(ddof=1)),
                               "s0_minus_s1": sd_seeds.as_dict()})
        ds.append((kf - h).rename(b))
    per_article = pd.concat(ds, axis=1).mean(axis=1)
    m, lo, hi = mean_ci(per_article.to_numpy(), n_boot=n_boot, seed=seed)
    sd = float(per_article.std(ddof=1))
    out["pooled"] = {"diff": m, "ci_lo": lo, "ci_hi": hi, "half_width": (hi - lo) / 2, "sd": sd,
                     "n_for_half_width": int(np.ceil((1.96 * sd / half_width) ** 2)),
                     # if the true gap is the observed one: the n whose CI would exclude 0 or +0.3 (rule 3)
                     "n_decisive": int(np.ceil((1.96 * sd / max(abs(m), abs(m - PAPER_GAP))) ** 2)),
                     "decision": decide(lo, hi)}
    ref = arms.get(("h2o", 0.3))
    for variant in ("keyformer_ns4", "h2o_recent05"):
        x = _point_series(points, samples, metric, variant=variant, budget=0.3)
        common = sorted(set(x.index) & set(ref.index)) if ref is not None and len(x) else []
        if common:
            d = paired_bootstrap(x.loc[common], ref.loc[common], n_boot=n_boot, seed=seed)
            kf = (arms[("keyformer_s0", 0.3)] + arms[("keyformer_s1", 0.3)]).reindex(common) / 2
            core = (paired_bootstrap(kf, ref.loc[common], n_boot=n_boot, seed=seed) if kf.notna().all()
                    else None)
            out["extras"].append({"variant": variant, "budget": 0.3, "mean": float(x.loc[common].mean()),
                                  "h2o": float(ref.loc[common].mean()), **d.as_dict(),
                                  "kf_minus_h2o_same_articles": core.as_dict() if core else None})
    return out


# -- experiment 8, the authors' setting on a subset (1920-token raw prompts, 128 tokens, greedy and beam 4)
def authors_setting(points: pd.DataFrame, samples: pd.DataFrame,
                    short: tuple[pd.DataFrame, pd.DataFrame] | None = None,
                    budgets: Sequence[float] = (0.5, 0.3), metric: str = "rouge2", n_boot: int = 10000,
                    seed: int = 0) -> dict:
    """Experiment 8's authors'-setting subset: per decoding (greedy, beam 4) and budget, full, H2O and
    Keyformer with paired CIs (Keyformer - H2O, each - full), Keyformer - H2O pooled over budgets per
    decoding; what the beam adds to the gap (per article: gap under beam - gap under greedy, pooled); and,
    with ``short`` (exp8's points, samples: 512-token chat prompts, 48 tokens), what the long prompt and
    generation add (authors' greedy gap - exp8's gap with Keyformer seed 0, the same single noise draw, on
    the same articles). Every comparison uses the articles all its points finished."""
    out: dict = {"rows": [], "pooled": [], "beam_minus_greedy": None, "long_minus_short": None}
    gaps: dict[int, pd.DataFrame] = {}
    for beams in (1, 4):
        full = _point_series(points, samples, metric, policy="full", num_beams=beams)
        per_budget = []
        for b in budgets:
            h = _point_series(points, samples, metric, policy="h2o", num_beams=beams, budget=float(b))
            k = _point_series(points, samples, metric, policy="keyformer", num_beams=beams, budget=float(b))
            ids = sorted(set(h.index) & set(k.index))
            if not ids:
                continue
            row = {"num_beams": beams, "budget": float(b), "n": len(ids), "h2o": float(h[ids].mean()),
                   "keyformer": float(k[ids].mean()),
                   "kf_minus_h2o": paired_bootstrap(k[ids], h[ids], n_boot, seed).as_dict()}
            f_ids = sorted(set(ids) & set(full.index))
            if f_ids:  # the comparisons with full over the articles all three finished
                row["n_full"] = len(f_ids)
                row["full"] = float(full[f_ids].mean())
                row["h2o_minus_full"] = paired_bootstrap(h[f_ids], full[f_ids], n_boot, seed).as_dict()
                row["kf_minus_full"] = paired_bootstrap(k[f_ids], full[f_ids], n_boot, seed).as_dict()
            out["rows"].append(row)
            per_budget.append((k[ids] - h[ids]).rename(float(b)))
        if len(per_budget) == len(budgets):
            g = pd.concat(per_budget, axis=1).dropna()
            gaps[beams] = g
            m, lo, hi = mean_ci(g.mean(axis=1).to_numpy(), n_boot=n_boot, seed=seed)
            out["pooled"].append({"num_beams": beams, "n": len(g), "diff": m, "ci_lo": lo, "ci_hi": hi,
                                  "decision": decide(lo, hi)})
    if 1 in gaps and 4 in gaps:
        ids = gaps[1].index.intersection(gaps[4].index)
        d = gaps[4].loc[ids].mean(axis=1) - gaps[1].loc[ids].mean(axis=1)
        m, lo, hi = mean_ci(d.to_numpy(), n_boot=n_boot, seed=seed)
        out["beam_minus_greedy"] = {"n": len(ids), "diff": m, "ci_lo": lo, "ci_hi": hi}
    if short is not None and 1 in gaps:
        sp, ss = short
        per_budget = []
        for b in budgets:
            h = _point_series(sp, ss, metric, variant="h2o", budget=float(b))
            k = _point_series(sp, ss, metric, variant="keyformer_s0", budget=float(b))
            if len(h) and len(k):
                per_budget.append((k - h).dropna().rename(float(b)))
        if len(per_budget) == len(budgets):
            g_short = pd.concat(per_budget, axis=1).dropna().mean(axis=1)
            ids = gaps[1].index.intersection(g_short.index)
            if len(ids):
                d = gaps[1].loc[ids].mean(axis=1) - g_short.loc[ids]
                m, lo, hi = mean_ci(d.to_numpy(), n_boot=n_boot, seed=seed)
                out["long_minus_short"] = {"n": len(ids), "diff": m, "ci_lo": lo, "ci_hi": hi,
                                           "short_gap": float(g_short.loc[ids].mean())}
    return out
