"""Experiment 5's report section: the ablations against the base configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import findings_of, fmt_ci


def ablations(res: Path) -> None:
    if not (res / "exp5_ablations" / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, "exp5_ablations")
    found = findings_of(res, "exp5_ablations")
    print("\n### exp5_ablations (paired vs base on common articles)\n")
    print("| variant | n | ROUGE-2 | diff vs base [interval: findings.json] |\n|---|---|---|---|")
    for _, p in points.iterrows():
        ids = analysis.common_ids(samples, ["base", p["point"]])
        sub = samples[samples["id"].isin(ids)]
        m = sub.loc[sub["point"] == p["point"], "rouge2"].mean()
        if p["point"] == "base":
            print(f"| base | {len(ids)} | {m:.2f} | - |")
            continue
        f = found.get(f"exp5.{p['point']}")
        if f is not None:  # the finding's interval (at Holm's level): one draw per number
            print(f"| {p['point']} | {f['n']} | {m:.2f} | {fnd.fmt_ci(f, 2)} |")
            continue
        d = analysis.compare_points(sub, p["point"], "base", "rouge2", n_boot=5000)
        print(f"| {p['point']} | {d.n} | {m:.2f} | {fmt_ci(d.mean, d.lo, d.hi)} (bootstrap) |")


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'ablations': ablations,
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "5: ablations"
QUESTION = ("Which of Keyformer's knobs (temperature, noise, candidate rule, heads, recent window) matter "
            "at a 30 % budget?")
VARIANTS = ("no_noise", "tau_fixed1", "tau_1to4", "reference_candidates", "shared_heads", "recent0.1",
            "recent0.2", "recent0.5")  # pre-registered: the knobs; seed1/seed2 measure the noise alone
DEFINITION = {
    "metric": "rouge2",
    "comparison": "variant - base, paired over the articles both finished",
    "families": {"exp5.knobs": list(VARIANTS), "exp5.seeds": ["seed1", "seed2"]},
    "design": "paired sign-flip test over articles (one stratum); Holm within each family at alpha 0.05",
    "alpha": fnd.ALPHA,
    "margin": 0.5,  # ROUGE-2 points: a knob within +-0.5 of base is equivalent (declared after the data)
    # the families were first written as lists with the findings engine (2026-12-06), after the rows
    "roles": {"exp5.knobs": "exploratory", "exp5.seeds": "exploratory"},
}


def comparisons(res: Path) -> list[fnd.Comparison]:
    """Each variant against the base configuration, paired over common articles."""
    if not (res / "exp5_ablations" / "points.csv").exists():
        return []
    points, samples = analysis.load_experiment(res, "exp5_ablations")
    out = []
    for fam, names in DEFINITION["families"].items():
        for v in names:
            if v not in set(points["point"]):
                continue
            j = analysis.paired_frame(samples, v, "base", "rouge2")
            same = analysis.paired_frame(samples, v, "base", "prediction")
            out.append(fnd.Comparison(
                id=f"exp5.{v}", quantity="ROUGE-2, variant - base", a=v, b="base",
                strata=[(j["a"].astype(float) - j["b"].astype(float)).to_numpy()], family=fam,
                identical=bool(len(same) and (same["a"] == same["b"]).all())))
    return out


def _ci(f: dict) -> str:
    return fnd.fmt_ci(f, 2)


def bullets(doc: dict) -> list[str]:
    """One line per knob, ordered by |estimate|: its difference from base and whether it survives Holm."""
    fs = sorted((f for f in doc["findings"] if f["family"] == "exp5.knobs"),
                key=lambda f: -abs(f["estimate"]))
    return [f"`{f['a']}` - base: {_ci(f)} ROUGE-2 (n {f['n']}; Holm p {fnd.fmt_p(f)} "
            f"over {f['family_size']} knobs): **{fnd.fmt_verdict(f)}**." for f in fs][:8]


def answer(doc: dict) -> str:
    """How many knobs move ROUGE-2 after Holm."""
    fs = [f for f in doc["findings"] if f["family"] == "exp5.knobs"]
    moved = [f["a"] for f in fs if f["verdict"] in ("ahead", "behind")]
    seeds = [f for f in doc["findings"] if f["family"] == "exp5.seeds"]
    spread = max((abs(f["estimate"]) for f in seeds), default=float("nan"))
    return (f"{len(moved)} of {len(fs)} knobs move ROUGE-2 after Holm" + (f" ({', '.join(moved)})" if moved
            else "") + f"; another noise seed alone moves it by up to {spread:.2f}.")
