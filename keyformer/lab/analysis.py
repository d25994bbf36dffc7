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

from keyformer.lab.stats import holm  # noqa: F401 - one Holm for the studies that read it from here

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


Frames = tuple[pd.DataFrame, pd.DataFrame]


# -- experiment 10: RULER leaderboard ------------------------------------------------------------------------
RULER_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")


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
