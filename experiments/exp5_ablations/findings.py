"""Experiment 5's report section: the ablations against the base configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keyformer.lab import analysis
from keyformer.lab.report import fmt_ci


def ablations(res: Path) -> None:
    if not (res / "exp5_ablations" / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, "exp5_ablations")
    print("\n### exp5_ablations (paired vs base on common articles)\n")
    print("| variant | n | ROUGE-2 | diff vs base [95 % CI] |\n|---|---|---|---|")
    for _, p in points.iterrows():
        ids = analysis.common_ids(samples, ["base", p["point"]])
        sub = samples[samples["id"].isin(ids)]
        m = sub.loc[sub["point"] == p["point"], "rouge2"].mean()
        if p["point"] == "base":
            print(f"| base | {len(ids)} | {m:.2f} | - |")
            continue
        d = analysis.compare_points(sub, p["point"], "base", "rouge2", n_boot=5000)
        print(f"| {p['point']} | {d.n} | {m:.2f} | {fmt_ci(d.mean, d.lo, d.hi)} |")


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'ablations': ablations,
}
