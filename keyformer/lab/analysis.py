"""Statistics over curated results: paired bootstrap of ROUGE differences, budget to reach a target.

Everything here works on plain pandas/numpy objects read from ``results/<experiment>/`` (see
``keyformer-collect`` (:mod:`keyformer.lab.collect`)):

* ``points.csv``: one row per run (config + aggregate metrics), keyed by ``point``;
* ``samples.csv``: one row per (point, sample id) with the per-sample ROUGE scores.

Comparisons between policies are *paired*: the same articles are used for every policy and budget, so the
bootstrap resamples article ids and recomputes both means on the same resample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

ROUGE = ("rouge1", "rouge2", "rougeL", "rougeLsum")


@dataclass(frozen=True)
class PairedDiff:
    """Mean of ``a - b`` over paired samples, with a percentile bootstrap CI."""

    mean: float
    lo: float
    hi: float
    n: int
    p_le_0: float  # bootstrap fraction of resamples with mean(a - b) <= 0 (one-sided)
    p_ge_0: float = float("nan")  # ... with mean(a - b) >= 0

    @property
    def p_two_sided(self) -> float:
        """Bootstrap two-sided p of ``mean(a - b) = 0``: ``min(1, 2 min(p_le_0, p_ge_0))`` (below 0.05 exactly
        when the 95 % percentile CI excludes 0, up to resamples that land on 0)."""
        return two_sided_p(self.p_le_0, self.p_ge_0)

    def as_dict(self) -> dict[str, float]:
        return {"diff": self.mean, "ci_lo": self.lo, "ci_hi": self.hi, "n": self.n, "p_le_0": self.p_le_0}


def bootstrap_indices(n: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """``[n_boot, n]`` indices of resamples with replacement (shared between statistics for pairing)."""
    if n < 1:
        raise ValueError("need at least one sample to bootstrap")
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = 10000, seed: int = 0,
                     ci: float = 0.95) -> PairedDiff:
    """Paired bootstrap of ``mean(a) - mean(b)``; ``a[i]`` and ``b[i]`` belong to the same sample."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be 1-D of equal length, got {a.shape} and {b.shape}")
    d = a - b
    idx = bootstrap_indices(len(d), n_boot, seed)
    means = d[idx].mean(axis=1)
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return PairedDiff(float(d.mean()), float(lo), float(hi), int(len(d)), float((means <= 0).mean()),
                      float((means >= 0).mean()))


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control) of ``p``, in the input order; NaN
    entries are not part of the family and stay NaN. ``adjusted < alpha`` rejects at family-wise ``alpha``."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def paired_frame(samples: pd.DataFrame, point_a: str, point_b: str, metric: str = "rouge2") -> pd.DataFrame:
    """Per-sample ``metric`` of two points, inner-joined on sample ``id`` (columns ``a``, ``b``)."""
    a = samples.loc[samples["point"] == point_a, ["id", metric]].rename(columns={metric: "a"})
    b = samples.loc[samples["point"] == point_b, ["id", metric]].rename(columns={metric: "b"})
    return a.merge(b, on="id", how="inner")


def compare_points(samples: pd.DataFrame, point_a: str, point_b: str, metric: str = "rouge2",
                   n_boot: int = 10000, seed: int = 0) -> PairedDiff:
    """Paired bootstrap of ``metric(point_a) - metric(point_b)`` over their common sample ids."""
    j = paired_frame(samples, point_a, point_b, metric)
    if j.empty:
        raise ValueError(f"points {point_a!r} and {point_b!r} share no sample ids")
    return paired_bootstrap(j["a"].to_numpy(), j["b"].to_numpy(), n_boot=n_boot, seed=seed)


def pairwise_table(samples: pd.DataFrame, points: pd.DataFrame, pairs: Sequence[tuple[str, str]],
                   metric: str = "rouge2", budgets: Sequence[float] | None = None, n_boot: int = 10000,
                   seed: int = 0) -> pd.DataFrame:
    """For each budget and each (policy_a, policy_b) pair: paired difference of ``metric`` with its CI.

    ``points`` needs columns ``point, policy, budget`` and must hold one point per (policy, budget).
    """
    rows = []
    bs = sorted(points["budget"].unique()) if budgets is None else budgets
    for budget in bs:
        at = points[np.isclose(points["budget"], budget)]
        by_policy = dict(zip(at["policy"], at["point"], strict=False))
        for pa, pb in pairs:
            if pa in by_policy and pb in by_policy:
                d = compare_points(samples, by_policy[pa], by_policy[pb], metric, n_boot, seed)
                rows.append({"budget": budget, "a": pa, "b": pb, "metric": metric, **d.as_dict()})
    return pd.DataFrame(rows)


def pooled_difference(samples: pd.DataFrame, points: pd.DataFrame, policy_a: str, policy_b: str,
                      metric: str = "rouge2", n_boot: int = 10000,
                      seed: int = 0) -> tuple[PairedDiff, list[float]]:
    """``policy_a - policy_b`` averaged over every budget both policies were run at, paired by sample.

    Each sample contributes the mean of its per-budget differences (over the budgets where both points
    finished it); the bootstrap resamples samples, so budgets of one sample stay together. Returns the
    difference and the budgets used. One test across the whole curve, instead of one per budget.
    """
    per_budget = []
    used = []
    for budget in sorted(points["budget"].unique()):
        at = points[np.isclose(points["budget"], budget)]
        by_policy = dict(zip(at["policy"], at["point"], strict=False))
        if policy_a in by_policy and policy_b in by_policy:
            j = paired_frame(samples, by_policy[policy_a], by_policy[policy_b], metric)
            per_budget.append(j.assign(d=j["a"] - j["b"])[["id", "d"]])
            used.append(float(budget))
    if not per_budget:
        raise ValueError(f"no budget has both {policy_a!r} and {policy_b!r}")
    d = pd.concat(per_budget).groupby("id")["d"].mean().to_numpy()
    return paired_bootstrap(d, np.zeros_like(d), n_boot=n_boot, seed=seed), used


def crossing_budget(budgets: Sequence[float], scores: Sequence[float], target: float) -> float:
    """Smallest budget at which the piecewise-linear curve ``scores(budgets)`` reaches ``target``.

    Returns the first measured budget whose score is >= target, linearly interpolated from the previous
    point; ``nan`` when no measured point reaches the target.
    """
    b = np.asarray(budgets, dtype=float)
    s = np.asarray(scores, dtype=float)
    order = np.argsort(b)
    b, s = b[order], s[order]
    for i in range(len(b)):
        if s[i] >= target:
            if i == 0 or s[i] == s[i - 1]:
                return float(b[i])
            return float(b[i - 1] + (target - s[i - 1]) * (b[i] - b[i - 1]) / (s[i] - s[i - 1]))
    return float("nan")


def budget_to_reach(samples: pd.DataFrame, points: pd.DataFrame, policy: str, full_point: str,
                    frac: float = 0.99, metric: str = "rouge2", n_boot: int = 2000,
                    seed: int = 0) -> dict[str, float]:
    """Budget at which ``policy`` reaches ``frac`` x full-cache ``metric``, with a bootstrap CI.

    Articles are resampled jointly for the full point and every budget of ``policy`` (paired), and the
    crossing budget is recomputed on each resample. ``reached`` is the fraction of resamples in which the
    curve reaches the target inside the measured budgets; the CI covers only those resamples.
    """
    pts = points[points["policy"] == policy].sort_values("budget")
    names = [full_point, *pts["point"].tolist()]
    wide = samples[samples["point"].isin(names)].pivot_table(index="id", columns="point", values=metric)
    wide = wide.dropna()
    if wide.empty or full_point not in wide:
        raise ValueError(f"no paired samples for {policy!r} and {full_point!r}")
    budgets = pts["budget"].to_numpy(dtype=float)
    mat = wide[pts["point"].tolist()].to_numpy()
    full = wide[full_point].to_numpy()
    est = crossing_budget(budgets, mat.mean(axis=0), frac * full.mean())
    idx = bootstrap_indices(len(full), n_boot, seed)
    boots = np.array([crossing_budget(budgets, mat[i].mean(axis=0), frac * full[i].mean()) for i in idx])
    ok = boots[~np.isnan(boots)]
    lo, hi = (np.quantile(ok, [0.025, 0.975]) if len(ok) else (np.nan, np.nan))
    return {"policy": policy, "budget": est, "ci_lo": float(lo), "ci_hi": float(hi),
            "reached": float(len(ok) / len(boots)), "target": frac * float(full.mean()),
            "min_budget": float(budgets.min()) if len(budgets) else float("nan"),
            "max_budget": float(budgets.max()) if len(budgets) else float("nan"), "n": int(len(full))}


def mean_ci(x: Sequence[float], n_boot: int = 10000, seed: int = 0,
            ci: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``x`` with a percentile bootstrap CI."""
    x = np.asarray(x, dtype=float)
    means = x[bootstrap_indices(len(x), n_boot, seed)].mean(axis=1)
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(x.mean()), float(lo), float(hi)


def curve_table(samples: pd.DataFrame, points: pd.DataFrame, metric: str = "rouge2", n_boot: int = 2000,
                seed: int = 0) -> pd.DataFrame:
    """Mean ``metric`` per point with a bootstrap CI of the mean (unpaired; for plotting)."""
    rows = []
    for _, p in points.iterrows():
        x = samples.loc[samples["point"] == p["point"], metric].to_numpy()
        if len(x):
            m, lo, hi = mean_ci(x, n_boot=n_boot, seed=seed)
            rows.append({"point": p["point"], "policy": p["policy"], "budget": p["budget"], "mean": m,
                         "ci_lo": lo, "ci_hi": hi, "n": len(x)})
    return pd.DataFrame(rows)


def load_experiment(results: str, name: str,
                    complete_only: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(points, samples)`` of ``results/<name>/`` as written by ``keyformer-collect``
    (:mod:`keyformer.lab.collect`). ``complete_only`` drops the points still running and their samples: for
    rankings and fronts, where a partial point would count on its first samples only."""
    from pathlib import Path

    d = Path(results) / name
    from keyformer.lab.collect import TEXT_COLUMNS  # ids, point names and answers stay text

    points = pd.read_csv(d / "points.csv", dtype={"point": str})
    samples = pd.read_csv(d / "samples.csv", dtype=TEXT_COLUMNS)
    if complete_only:
        points = points[points["complete"].astype(bool)].reset_index(drop=True)
        samples = samples[samples["point"].isin(points["point"])].reset_index(drop=True)
    return points, samples


def common_ids(samples: pd.DataFrame, points: Sequence[str]) -> list[str]:
    """Sample ids finished by every one of ``points`` (the paired set)."""
    sets = [set(samples.loc[samples["point"] == p, "id"]) for p in points]
    return sorted(set.intersection(*sets)) if sets else []


def _point_series(points: pd.DataFrame, samples: pd.DataFrame, metric: str, **match) -> pd.Series:
    """Per-sample ``metric`` of the one point whose columns equal ``match`` (floats compared with isclose)."""
    sel = points
    for k, v in match.items():
        col = sel[k]
        sel = sel[np.isclose(col.astype(float), float(v))] if isinstance(v, float) else sel[col == v]
    if sel.empty:
        return pd.Series(dtype=float)
    return samples[samples["point"] == sel["point"].iloc[0]].set_index("id")[metric].astype(float)


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
    """Experiment 8's analysis (``experiments/exp8_powered.md``): per article, d = mean(Keyformer seeds 0
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


# -- experiment 7: the policies of the field, ranked with paired CIs; accuracy against KV bytes --------------
def repeated_ngrams(text: str, n: int = 4) -> float:
    """Share of a text's word ``n``-grams that repeat an earlier one (0 for texts shorter than ``n`` + 1
    words): a looping output scores high."""
    words = str(text).split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if len(grams) > 1 else 0.0


def looping_share(samples: pd.DataFrame, points: Sequence[str], threshold: float = 0.2,
                  n: int = 4) -> dict[str, float]:
    """Per point, the share of outputs whose repeated ``n``-gram share exceeds ``threshold``."""
    out = {}
    for pt in points:
        texts = samples.loc[samples["point"] == pt, "prediction"]
        out[pt] = (float(np.mean([repeated_ngrams(t, n) > threshold for t in texts])) if len(texts)
                   else float("nan"))
    return out


#: experiment 7's tasks and the standard metric of each (per-sample columns of ``samples.csv``)
EXP7_METRIC = {"cnndm": "rouge2", "needle": "accuracy", "leval_sqa": "token_f1",
               "multi_news": "rougeL_longbench"}


def field_ranking(points: pd.DataFrame, samples: pd.DataFrame, metric: str, ref: str = "keyformer",
                  n_boot: int = 5000, seed: int = 0) -> pd.DataFrame:
    """Per budget, every eviction policy's mean ``metric`` with a CI, its paired difference from ``ref`` with
    a CI (over the samples both finished) and its rank among the policies at that budget (1 = best mean);
    a ``pooled`` row per policy averages each sample's difference from ``ref`` over the budgets both ran
    (:func:`pooled_difference`). Quantized points (``kv_quant`` set) and the full reference are left out."""
    ev = points[(points["policy"] != "full")]
    if "kv_quant" in ev:
        ev = ev[ev["kv_quant"].isna()]
    rows = []
    for budget in sorted(ev["budget"].unique()):
        at = ev[np.isclose(ev["budget"], budget)]
        ref_pt = at.loc[at["policy"] == ref, "point"]
        for _, p in at.iterrows():
            x = samples.loc[samples["point"] == p["point"], metric].astype(float).to_numpy()
            if not len(x):
                continue
            m, lo, hi = mean_ci(x, n_boot=n_boot, seed=seed)
            row = {"budget": float(budget), "policy": p["policy"], "n": len(x), "mean": m, "ci_lo": lo,
                   "ci_hi": hi}
            if len(ref_pt) and p["policy"] != ref:
                d = compare_points(samples, p["point"], ref_pt.iloc[0], metric, n_boot, seed)
                row.update({"diff_vs_ref": d.mean, "d_lo": d.lo, "d_hi": d.hi, "n_paired": d.n})
            rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["rank"] = out.groupby("budget")["mean"].rank(ascending=False, method="min").astype(int)
    pooled = []
    for pol in sorted(set(ev["policy"]) - {ref}):
        try:
            d, used = pooled_difference(samples, ev, pol, ref, metric, n_boot=n_boot, seed=seed)
        except ValueError:
            continue
        pooled.append({"budget": "pooled", "policy": pol, "n_paired": d.n, "diff_vs_ref": d.mean,
                       "d_lo": d.lo,
                       "d_hi": d.hi, "budgets_used": ",".join(f"{b:g}" for b in used)})
    return pd.concat([out, pd.DataFrame(pooled)], ignore_index=True)


def pareto_front(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """Boolean mask of the points no other point dominates (less or equal ``x`` = KV bytes, greater or equal
    ``y`` = accuracy, strictly better in one)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dominated = ((x[None, :] <= x[:, None]) & (y[None, :] >= y[:, None])
                 & ((x[None, :] < x[:, None]) | (y[None, :] > y[:, None]))).any(axis=1)
    return ~dominated


# -- experiment 9: do the SmolLM2 findings hold on Gemma 3 270M? ---------------------------------------------
@dataclass(frozen=True)
class Finding:
    """One SmolLM2 comparison that experiment 9 repeats on Gemma 3: ``a - b`` on ``task`` (``metric``), pooled
    over ``budgets`` (each sample's mean difference over the budgets both points ran); ``b`` (or ``a``) may be
    ``"full"``, whose one point counts at every budget. ``smol`` is SmolLM2's results folder for the task.
    What the finding says is computed, not written here: how SmolLM2's CI reads (:func:`ci_reading`)."""

    source: str  # the SmolLM2 experiment whose finding this is ("exp1", "exp7")
    task: str
    metric: str
    a: str
    b: str
    budgets: tuple[float, ...]
    smol: str


_E1 = (0.2, 0.3, 0.5)  # experiment 1's core budgets that experiment 9 reruns
_E7 = (0.2, 0.5)  # experiment 7's budgets that experiment 9 reruns
EXP9_FINDINGS: tuple[Finding, ...] = (
    *(Finding("exp1", "cnndm", "rouge2", a, b, _E1, "exp1_cnndm")
      for a, b in (("h2o", "window"), ("keyformer", "window"), ("keyformer", "h2o"), ("keyformer", "full"),
                   ("h2o", "full"))),
    *(Finding("exp7", task, metric, a, "keyformer", _E7, f"exp7_field/{task}")
      for task, metric in (("cnndm", "rouge2"), ("leval_sqa", "token_f1"), ("multi_news", "rougeL_longbench"))
      for a in ("h2o", "snapkv", "pyramidkv", "adakv_snapkv", "tova", "adakv_keyformer", "window")),
    *(Finding("exp7", "needle", "accuracy", a, "keyformer", _E7, "exp7_field/needle")
      for a in ("window", "h2o")),
)


def ci_reading(lo: float, hi: float) -> str:
    """How a difference's CI reads: ``">"`` (excludes 0 above), ``"<"`` (below) or ``"≈"`` (holds 0: tied)."""
    return ">" if lo > 0 else "<" if hi < 0 else "≈"


def pooled_vs(points: pd.DataFrame, samples: pd.DataFrame, a: str, b: str, budgets: Sequence[float],
              metric: str, n_boot: int = 5000, seed: int = 0) -> tuple[PairedDiff, list[float]] | None:
    """``a - b`` per sample averaged over those of ``budgets`` where both points exist (``"full"``: the
    unquantized full point, at every budget), then a paired bootstrap over samples; None when no budget has
    both. Quantized points (``kv_quant`` set) are ignored."""
    ev = points[points["kv_quant"].isna()] if "kv_quant" in points else points

    def at(policy: str, budget: float) -> str | None:
        sel = ev[ev["policy"] == policy]
        if policy != "full":
            sel = sel[np.isclose(sel["budget"].astype(float), budget)]
        return str(sel["point"].iloc[0]) if len(sel) else None

    diffs, used = [], []
    for budget in budgets:
        pa, pb = at(a, budget), at(b, budget)
        if pa and pb:
            j = paired_frame(samples, pa, pb, metric)
            if len(j):
                diffs.append(j.assign(d=j["a"].astype(float) - j["b"].astype(float))[["id", "d"]])
                used.append(float(budget))
    if not diffs:
        return None
    d = pd.concat(diffs).groupby("id")["d"].mean().to_numpy()
    return paired_bootstrap(d, np.zeros_like(d), n_boot=n_boot, seed=seed), used


def replication(load_smol, load_gemma, findings: Sequence[Finding] = EXP9_FINDINGS, n_boot: int = 5000,
                seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Experiment 9's table: per finding, SmolLM2's and Gemma's pooled paired difference with its CI, how each
    reads (:func:`ci_reading`) and ``holds``: ``yes`` when Gemma's reading equals SmolLM2's, ``no`` when it
    differs, ``partial`` when it matches but Gemma ran fewer budgets, ``pending`` without Gemma's points, and
    ``n/a`` when the finding compares Ada-KV over a policy with that policy and Gemma's outputs are identical
    on every sample (with one KV head there are no heads to share a layer's budget among).
    With many comparisons some CIs exclude 0 by chance, so the same is done family-wise: ``<who>_p`` is the
    bootstrap two-sided p, ``<who>_p_holm`` Holm's adjustment over the testable findings (those not ``n/a`` or
    ``pending``), separately per model; ``<who>_reads_holm`` reads a direction only where that is below
    ``alpha``, and ``holds_holm`` compares those readings.
    ``load_smol(folder)`` / ``load_gemma(task)`` return ``(points, samples)`` (complete points only) or
    None."""
    rows = []
    cache: dict[tuple[str, str], tuple[pd.DataFrame, pd.DataFrame] | None] = {}
    for f in findings:
        row: dict = {"source": f.source, "task": f.task, "metric": f.metric, "comparison": f"{f.a} - {f.b}",
                     "budgets": ",".join(f"{b:g}" for b in f.budgets)}
        for who, load, key in (("smol", load_smol, f.smol), ("gemma", load_gemma, f.task)):
            if (who, key) not in cache:
                cache[(who, key)] = load(key)
            data = cache[(who, key)]
            r = pooled_vs(*data, f.a, f.b, f.budgets, f.metric, n_boot, seed) if data is not None else None
            if r is not None:
                d, used = r
                row.update({f"{who}_diff": d.mean, f"{who}_lo": d.lo, f"{who}_hi": d.hi, f"{who}_n": d.n,
                            f"{who}_budgets": ",".join(f"{b:g}" for b in used),
                            f"{who}_reads": ci_reading(d.lo, d.hi), f"{who}_p": d.p_two_sided})
        row["holds"] = _holds(row, f, "reads")
        rows.append(row)
    t = pd.DataFrame(rows)
    testable = ~t["holds"].isin(["n/a", "pending"])  # the family: the comparisons the replication tests
    for who in ("smol", "gemma"):
        p = t[f"{who}_p"] if f"{who}_p" in t else pd.Series(np.nan, t.index)
        t[f"{who}_p_holm"] = holm(p.where(testable).to_numpy(float))
        diff = t[f"{who}_diff"] if f"{who}_diff" in t else pd.Series(np.nan, t.index)
        t[f"{who}_reads_holm"] = [None if np.isnan(q) else "≈" if q >= alpha else ">" if d > 0 else "<"
                                  for q, d in zip(t[f"{who}_p_holm"], diff, strict=True)]
    rows = zip(t.to_dict("records"), findings, testable, t["holds"], strict=True)
    t["holds_holm"] = [_holds(r, f, "reads_holm") if ok else h for r, f, ok, h in rows]
    return t


def _holds(row: dict, f: Finding, reads: str) -> str:
    """``holds`` of :func:`replication` from the ``smol_<reads>`` / ``gemma_<reads>`` readings of one row."""
    same = {f.a, f.b} in ({f.a, f"adakv_{f.a}"}, {f.b, f"adakv_{f.b}"})  # Ada-KV over the other policy
    sr, gr = row.get(f"smol_{reads}"), row.get(f"gemma_{reads}")
    if not isinstance(sr, str) or not isinstance(gr, str):
        return "pending"
    if same and row["gemma_diff"] == row["gemma_lo"] == row["gemma_hi"] == 0:
        return "n/a"  # identical outputs on every sample: the comparison does not exist here
    if gr != sr:
        return "no"
    return "yes" if row["gemma_budgets"] == row["smol_budgets"] else "partial"



Frames = tuple[pd.DataFrame, pd.DataFrame]


def seed_replicates(base: Frames, others: dict[int, Frames], a: str, b: str, budgets: Sequence[float],
                    metric: str, n_boot: int = 5000, seed: int = 0) -> pd.DataFrame:
    """Is ``a - b`` robust to ``b``'s noise seed? ``base``: a task's ``(points, samples)`` (``b`` at seed 0,
    ``a`` deterministic); ``others[k]``: ``b``'s points at seed ``k``. One row per seed (``a`` from ``base``,
    ``b`` at that seed; :func:`pooled_vs` over ``budgets``), then ``mean``: ``a`` minus ``b``'s per-record
    mean over every seed, on the records all seeds ran. Columns: seed, diff, lo, hi, n, budgets, reads."""
    bp, bs = base
    sets = {0: (bp[bp["policy"] == b], bs)}
    for k, (p, s) in sorted(others.items()):
        p = p[p["policy"] == b].assign(point=lambda f, k=k: f"seed{k}/" + f["point"].astype(str))
        sets[k] = (p, s.assign(point=f"seed{k}/" + s["point"].astype(str)))
    rest = bp[bp["policy"] != b]

    def row(label, pts: pd.DataFrame, smp: pd.DataFrame) -> dict | None:
        r = pooled_vs(pd.concat([rest, pts]), pd.concat([bs[bs["point"].isin(rest["point"])], smp]), a, b,
                      budgets, metric, n_boot, seed)
        if r is None:
            return None
        d, used = r
        return {"seed": label, "diff": d.mean, "lo": d.lo, "hi": d.hi, "n": d.n,
                "budgets": ",".join(f"{x:g}" for x in used), "reads": ci_reading(d.lo, d.hi)}

    rows = [row(k, p, s[s["point"].isin(p["point"])]) for k, (p, s) in sets.items()]
    if len(sets) > 1:  # b's per-record mean over the seeds, one synthetic point per budget
        mean_pts, mean_smp = [], []
        for budget in budgets:
            per = []
            for p, s in sets.values():
                sel = p[np.isclose(p["budget"].astype(float), budget)]
                if not len(sel):
                    break
                per.append(s[s["point"] == sel["point"].iloc[0]].set_index("id")[metric].astype(float))
            else:
                m = pd.concat(per, axis=1, join="inner").mean(axis=1)
                name = f"mean/{b}@{budget:g}"
                mean_pts.append({"point": name, "policy": b, "budget": budget})
                mean_smp.append(pd.DataFrame({"point": name, "id": m.index, metric: m.to_numpy()}))
        if mean_pts:
            rows.append(row("mean", pd.DataFrame(mean_pts), pd.concat(mean_smp)))
    return pd.DataFrame([r for r in rows if r is not None])



def seed_tables(folder, findings: Sequence[Finding] = EXP9_FINDINGS) -> pd.DataFrame:
    """Every task of ``folder`` (``results/exp9_gemma``) rerun with other Keyformer seeds (``<task>_seed<k>/``
    beside ``<task>/``; complete points): :func:`seed_replicates` of each finding ``a - keyformer`` with a
    deterministic ``a``, as rows with ``task`` and ``comparison``; empty without such folders."""
    from pathlib import Path

    folder = Path(folder)
    extra: dict[str, dict[int, Frames]] = {}
    for d in sorted(folder.glob("*_seed*")):
        task, _, k = d.name.rpartition("_seed")
        if k.isdigit() and (d / "points.csv").exists() and (folder / task / "points.csv").exists():
            extra.setdefault(task, {})[int(k)] = load_experiment(folder, d.name, complete_only=True)
    rows = []
    for task, others in extra.items():
        base = load_experiment(folder, task, complete_only=True)
        for f in findings:
            if f.task == task and f.b == "keyformer" and "keyformer" not in f.a:
                t = seed_replicates(base, others, f.a, f.b, f.budgets, f.metric)
                rows.append(t.assign(task=task, comparison=f"{f.a} - {f.b}"))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()


# -- experiment 10: RULER leaderboard ------------------------------------------------------------------------
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
RULER_RATIO = {0.75: 0.25, 0.5: 0.5, 0.25: 0.75, 0.125: 0.875}  # budget -> kvpress's compression ratio


def ruler_task_of(sample_id: str) -> str:
    """The task of a ``ruler`` sample id (``ruler-<task>-L<length>-<index>``)."""
    return str(sample_id).split("-")[1]


def _ruler_series(points: pd.DataFrame, samples: pd.DataFrame, metric: str, policy: str,
                  budget: float | None) -> dict[str, pd.Series]:
    """``{task: per-sample metric indexed by id}`` of one policy (at ``budget``; any budget when None)."""
    rows = _policy_samples(points, samples, policy, budget)
    out: dict[str, pd.Series] = {}
    for task, g in rows.groupby(rows["id"].map(ruler_task_of)):
        out[str(task)] = g.set_index("id")[metric].astype(float)
    return out


def _policy_samples(points: pd.DataFrame, samples: pd.DataFrame, policy: str,
                    budget: float | None) -> pd.DataFrame:
    """The sample rows of one policy's points (at ``budget``; any budget when None)."""
    sel = points[points["policy"] == policy]
    if budget is not None:
        sel = sel[np.isclose(sel["budget"].astype(float), budget)]
    return samples[samples["point"].isin(sel["point"])]


def _kv_held(points: pd.DataFrame, samples: pd.DataFrame, policy: str, budget: float | None) -> float:
    """Mean over one policy's samples (at ``budget``; any when None) of ``kv_bytes / kv_bytes_full``: the K/V
    held at the end of generation against what the full cache holds for the same tokens; NaN without those
    columns."""
    if not {"kv_bytes", "kv_bytes_full"} <= set(samples):
        return float("nan")
    rows = _policy_samples(points, samples, policy, budget)
    return float((rows["kv_bytes"].astype(float) / rows["kv_bytes_full"].astype(float)).mean())


def stratified_boots(per_task: Sequence[np.ndarray], n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """[n_boot] bootstrap replicates of the mean over tasks of each task's mean, resampling samples within
    each task (task ``t`` draws with seed ``seed + t``)."""
    if not per_task:
        raise ValueError("need at least one task")
    boots = np.zeros(n_boot)
    for t, x in enumerate(per_task):
        x = np.asarray(x, dtype=float)
        boots += x[bootstrap_indices(len(x), n_boot, seed + t)].mean(axis=1)
    return boots / len(per_task)


def stratified_mean_ci(per_task: Sequence[np.ndarray], n_boot: int = 2000, seed: int = 0,
                       ci: float = 0.95) -> tuple[float, float, float]:
    """Mean over tasks of each task's mean, with a bootstrap CI that resamples samples within each task."""
    m, lo, hi, _ = stratified_diff(per_task, n_boot, seed, ci)
    return m, lo, hi


def stratified_diff(per_task: Sequence[np.ndarray], n_boot: int = 2000, seed: int = 0,
                    ci: float = 0.95) -> tuple[float, float, float, float]:
    """:func:`stratified_mean_ci` plus the two-sided bootstrap p of the mean being 0, from one set of
    replicates (for per-task paired differences)."""
    boots = stratified_boots(per_task, n_boot, seed)
    alpha = (1.0 - ci) / 2.0
    lo, hi = np.quantile(boots, [alpha, 1.0 - alpha])
    p = two_sided_p(float((boots <= 0).mean()), float((boots >= 0).mean()))
    return float(np.mean([np.mean(x) for x in per_task])), float(lo), float(hi), p


def two_sided_p(p_le_0: float, p_ge_0: float) -> float:
    """Two-sided bootstrap p of a difference being 0 from the shares of replicates <= 0 and >= 0."""
    return min(1.0, 2.0 * min(p_le_0, p_ge_0))


RULER_N_BOOT = 2000  # experiment 10's bootstrap replicates: its two-sided p moves in steps of 2 / 2000


def ruler_leaderboard(points: pd.DataFrame, samples: pd.DataFrame, metric: str = "string_match_all",
                      refs: Sequence[str] = ("keyformer", "full"), n_boot: int = RULER_N_BOOT,
                      seed: int = 0) -> pd.DataFrame:
    """Experiment 10's table: per (policy, budget) and per task (plus ``average``, the mean over tasks), the
    mean ``metric`` with a bootstrap CI and the paired difference from each of ``refs`` with its CI
    (``vs_<ref>``, ``vs_<ref>_lo``, ``vs_<ref>_hi``; ``full`` is compared at its only budget, the others at
    the same budget; ``full``'s own rows have no differences; the average's CI resamples within each task:
    :func:`stratified_mean_ci`; ``vs_<ref>_p`` its two-sided bootstrap p and, on the averages,
    ``vs_<ref>_p_holm`` Holm's adjustment over the policies at that budget; ``kv_held``, on the averages, the
    mean over the samples of ``kv_bytes / kv_bytes_full``: prompt-only policies keep their generated tokens,
    decode-time evictors hold the budget). ``n_tasks`` counts the tasks a point has; the ``average`` of a
    policy is given only when it has every task of the experiment, and ``rank`` (1 = best average at that
    budget) ranks those. Pass complete points only (:func:`load_experiment` with ``complete_only=True``)."""
    if points.empty:
        return pd.DataFrame()
    tasks = [t for t in RULER_TASKS if t in set(samples["id"].map(ruler_task_of))]
    rows = []
    for (policy, budget), _ in points.groupby(["policy", "budget"]):
        b = None if policy == "full" else float(budget)
        mine = _ruler_series(points, samples, metric, policy, b)
        ref_series = {} if policy == "full" else {
            r: _ruler_series(points, samples, metric, r, None if r == "full" else b) for r in refs}
        for task in [*tasks, "average"]:
            use = [t for t in tasks if t in mine] if task == "average" else [task] if task in mine else []
            if not use:
                continue
            if task == "average" and len(use) < len(tasks):
                continue
            m, lo, hi = stratified_mean_ci([mine[t].to_numpy() for t in use], n_boot, seed)
            row = {"policy": policy, "budget": float(budget), "ratio": RULER_RATIO.get(float(budget), 0.0)
                   if policy != "full" else 0.0, "task": task, "n": sum(len(mine[t]) for t in use),
                   "n_tasks": len(use), "mean": m, "ci_lo": lo, "ci_hi": hi}
            if task == "average":
                row["kv_held"] = _kv_held(points, samples, policy, b)
            for r, other in ref_series.items():
                if r == policy or not all(t in other for t in use):
                    continue
                pairs = [(mine[t].align(other[t], join="inner")) for t in use]
                if any(len(a) == 0 for a, _ in pairs):
                    continue
                d, dlo, dhi, dp = stratified_diff([(a - o).to_numpy() for a, o in pairs], n_boot, seed)
                row.update({f"vs_{r}": d, f"vs_{r}_lo": dlo, f"vs_{r}_hi": dhi, f"vs_{r}_p": dp})
            rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    avg = out["task"] == "average"
    out.loc[avg, "rank"] = out[avg].groupby("budget")["mean"].rank(ascending=False, method="min")
    for r in refs:  # family: every policy's average against ``r`` at one budget
        if f"vs_{r}_p" in out:
            out[f"vs_{r}_p_holm"] = np.nan
            for _, g in out[avg].groupby("budget"):
                out.loc[g.index, f"vs_{r}_p_holm"] = holm(g[f"vs_{r}_p"].to_numpy(float))
    return out


def ruler_setting_gap(aware: Frames, agnostic: Frames, metric: str = "string_match_all", n_boot: int = 2000,
                      seed: int = 0) -> pd.DataFrame:
    """Query-agnostic minus question-aware, paired: per (policy, budget) with every task in both settings,
    each sample's agnostic score minus its question-aware score (the same generated records), averaged per
    task and over tasks, with the stratified bootstrap CI and two-sided p (:func:`stratified_diff`).
    Columns: policy, budget, ratio, aware, agnostic, gap, gap_lo, gap_hi, gap_p, n."""
    rows = []
    for (policy, budget), _ in aware[0].groupby(["policy", "budget"]):
        b = None if policy == "full" else float(budget)
        a = _ruler_series(*aware, metric, policy, b)
        g = _ruler_series(*agnostic, metric, policy, b)
        tasks = [t for t in RULER_TASKS if t in a or t in g]
        if not tasks or not all(t in a and t in g for t in tasks):
            continue
        pairs = [g[t].align(a[t], join="inner") for t in tasks]
        if any(len(x) == 0 for x, _ in pairs):
            continue
        d, lo, hi, p = stratified_diff([(x - y).to_numpy() for x, y in pairs], n_boot, seed)
        rows.append({"policy": policy, "budget": float(budget),
                     "ratio": 0.0 if policy == "full" else RULER_RATIO.get(float(budget), 0.0),
                     "aware": float(np.mean([y.mean() for _, y in pairs])),
                     "agnostic": float(np.mean([x.mean() for x, _ in pairs])), "gap": d, "gap_lo": lo,
                     "gap_hi": hi, "gap_p": p,
                     "n": sum(len(x) for x, _ in pairs)})
    return pd.DataFrame(rows)
