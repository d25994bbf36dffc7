"""Experiment 10's tables over RULER's collected rows: the leaderboard per policy, budget and task, and the
question-aware vs query-agnostic gap (the statistics are the library's: :mod:`keyformer.lab.analysis`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from keyformer.lab.analysis import (
    RULER_TASKS,
    Frames,
    _kv_held,
    _ruler_series,
    holm,
    ruler_task_of,
    stratified_diff,
    stratified_mean_ci,
)

RULER_RATIO = {0.75: 0.25, 0.5: 0.5, 0.25: 0.75, 0.125: 0.875}  # budget -> kvpress's compression ratio
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
