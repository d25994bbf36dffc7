"""Experiment 10 at equal-or-more bytes for Keyformer: is a policy's lead a matter of the K/V it holds?

At one budget, prompt-only policies (SnapKV, PyramidKV, Ada-KV over SnapKV, KVzip) keep every generated token
and R-KV holds a decode buffer beyond the budget, so they end an answer holding more K/V than Keyformer
(results/exp10_ruler/README.md). This script pairs each such (policy, ratio) with
Keyformer at its smallest larger budget whose K/V held is at least the policy's, on the same records
(both from the committed ``samples.csv``), and writes the difference over tasks with its stratified bootstrap
CI and two-sided p (the leaderboard's: :func:`keyformer.lab.analysis.stratified_diff`, 2000 replicates, seed
0), next to the same-budget difference. A lead that survives Keyformer holding at least as many bytes is not
a bytes artifact; one that does not is not settled either (Keyformer then holds more). Where
``results/exp10_ruler/equal_bytes/`` holds Keyformer at an off-grid budget whose K/V held is within 0.005 of a
policy's (``queues/exp10_equal_bytes.txt`` here: budget 0.14, question-aware, for ratio 0.875), the
``equal_*`` columns give that equal-bytes difference.

    python -m experiments.exp10_ruler.ruler_equal_bytes results/exp10_ruler/equal_bytes.csv
"""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pandas as pd

from experiments.exp10_ruler.analysis import RULER_N_BOOT
from keyformer.lab.analysis import (
    RULER_TASKS,
    _kv_held,
    _ruler_series,
    holm,
    load_experiment,
    stratified_diff,
)
from keyformer.run.paths import ROOT

MARGIN = 0.005  # "holds more than Keyformer": past the rounding of the report's K/V held column
EQUAL = "equal_bytes"  # results/exp10_ruler/equal_bytes: Keyformer at off-grid budgets
EQUAL_TOL = 0.005  # "equal bytes": K/V held within this of the policy's


def _diff(points: pd.DataFrame, samples: pd.DataFrame, a: tuple[str, float],
          b: tuple[str, float]) -> tuple[float, float, float, float]:
    """Mean over tasks of a - b paired on records, with its stratified CI and p, as the leaderboard pairs
    them (:func:`experiments.exp10_ruler.analysis.ruler_leaderboard`: RULER's task order, the same seed)."""
    x = _ruler_series(points, samples, "string_match_all", *a)
    y = _ruler_series(points, samples, "string_match_all", *b)
    if set(x) != set(RULER_TASKS) or set(y) != set(RULER_TASKS):
        raise ValueError(f"{a} or {b} lacks a task")
    pairs = [x[t].align(y[t], join="inner") for t in RULER_TASKS]
    if any(len(u) != len(x[t]) or len(u) != len(y[t]) for (u, _), t in zip(pairs, RULER_TASKS, strict=True)):
        raise ValueError(f"{a} and {b} ran different records")
    return stratified_diff([(u - v).to_numpy() for u, v in pairs], RULER_N_BOOT, 0)


def rows(setting: str) -> list[dict]:
    """The (policy, ratio) pairs of ``setting`` (aware or agnostic) that hold more K/V than Keyformer, each
    also against Keyformer at its smallest larger budget holding at least as much (complete points)."""
    res = ROOT / "results" / "exp10_ruler"
    points, samples = load_experiment(str(res), setting, complete_only=True)
    points = points[points["policy"] != "full"]
    matched: list[float] = []  # Keyformer's budgets in results/exp10_ruler/equal_bytes (question-aware)
    if setting == "aware" and (res / EQUAL / "points.csv").is_file():
        p2, s2 = load_experiment(str(res), EQUAL, complete_only=True)
        matched = sorted(set(p2["budget"].astype(float)))
        points = pd.concat([points, p2], ignore_index=True)
        samples = pd.concat([samples, s2], ignore_index=True)
    full = points.groupby(["policy", "budget"]).size().index  # every (policy, budget) with a point
    have = [(p, float(b)) for p, b in full
            if len(_ruler_series(points, samples, "string_match_all", p, float(b))) == len(RULER_TASKS)]
    held = {k: _kv_held(points, samples, *k) for k in have}
    kf = {b: h for (p, b), h in held.items() if p == "keyformer" and b not in matched}
    out = []
    for (policy, budget), h in sorted(held.items()):
        if policy == "keyformer" or budget not in kf or h <= kf[budget] + MARGIN:
            continue
        same = _diff(points, samples, (policy, budget), ("keyformer", budget))
        row = {"setting": setting, "policy": policy, "ratio": round(1 - budget, 3), "kv_held": round(h, 4),
               "keyformer_kv_held": round(kf[budget], 4), "same_diff": same[0], "same_lo": same[1],
               "same_hi": same[2], "same_p": same[3]}
        larger = [b for b in kf if b > budget and kf[b] >= h]
        if larger:
            b2 = min(larger)
            eq = _diff(points, samples, (policy, budget), ("keyformer", b2))
            row |= {"keyformer_ratio": round(1 - b2, 3), "keyformer_more_kv_held": round(kf[b2], 4),
                    "diff": eq[0], "lo": eq[1], "hi": eq[2], "p": eq[3]}
        near = [b for b in matched
                if ("keyformer", b) in held and abs(held[("keyformer", b)] - h) <= EQUAL_TOL]
        if near:  # Keyformer run at a budget whose K/V held matches this policy's
            b3 = min(near, key=lambda b: abs(held[("keyformer", b)] - h))
            eq = _diff(points, samples, (policy, budget), ("keyformer", b3))
            row |= {"equal_budget": b3, "equal_kv_held": round(held[("keyformer", b3)], 4),
                    "equal_diff": eq[0], "equal_lo": eq[1], "equal_hi": eq[2], "equal_p": eq[3]}
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    table = pd.DataFrame([r for s in ("aware", "agnostic") for r in rows(s)])
    if "equal_p" in table:  # Holm over the equal-bytes comparisons: one family
        has = table["equal_p"].notna()
        table.loc[has, "equal_p_holm"] = holm(table.loc[has, "equal_p"].to_numpy(float))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write(f"# experiments/exp10_ruler/ruler_equal_bytes.py at {commit}; "
                f"from results/exp10_ruler/{{aware,agnostic,"
                f"{EQUAL}}}/samples.csv (SmolLM2-135M-Instruct, cpu, float32, batch 1); {RULER_N_BOOT} "
                "bootstrap replicates, seed 0; p 0.000: no replicate crossed 0; equal_p_holm: Holm over the "
                "equal_p\n")
        table.to_csv(f, index=False, lineterminator="\n")  # full precision: CIs round as the table
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
