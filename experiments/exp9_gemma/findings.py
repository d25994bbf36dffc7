"""Experiment 9's report sections: SmolLM2's findings rerun on Gemma 3 270M, and Keyformer's noise seeds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from experiments.exp9_gemma import analysis as exp9
from keyformer.lab import analysis
from keyformer.lab.report import fmt_ci


def _gemma_table(res: Path, name: str = "exp9_gemma") -> pd.DataFrame:
    """:func:`keyformer.lab.exp9.replication` over the committed rows (complete points only)."""

    def load(folder: Path):
        return analysis.load_experiment(folder.parent, folder.name, complete_only=True) \
            if (folder / "points.csv").exists() else None

    return exp9.replication(lambda f: load(res / f), lambda task: load(res / name / task))


def gemma(res: Path, name: str = "exp9_gemma") -> None:
    """Experiment 9: each SmolLM2 finding (experiments 1 and 7, pooled paired differences over the budgets
    Gemma reruns), the same measurement on Gemma 3 270M and whether it holds; complete points only."""
    if not (res / name).is_dir():
        return
    t = _gemma_table(res, name)
    print(f"\n### {name}: SmolLM2's findings on Gemma 3 270M (pooled paired differences, complete points)\n")
    print("| source | task | metric | SmolLM2 finding | SmolLM2 [95 % CI] | Gemma 3 [95 % CI] | Gemma 3 "
          "reads | budgets (Gemma) | n (Gemma) | holds | holds (Holm) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for _, r in t.iterrows():
        a, b = r["comparison"].split(" - ")
        got = {w: (fmt_ci(r[f"{w}_diff"], r[f"{w}_lo"], r[f"{w}_hi"]), r[f"{w}_reads"], r[f"{w}_budgets"],
                   int(r[f"{w}_n"])) if pd.notna(r.get(f"{w}_diff")) else ("-", None, "-", "-")
               for w in ("smol", "gemma")}
        said = f"{a} {got['smol'][1]} {b}" if got["smol"][1] else "-"
        reads = f"{a} {got['gemma'][1]} {b}" if got["gemma"][1] else "-"
        print(f"| {r['source']} | {r['task']} | {r['metric']} | {said} | {got['smol'][0]} | "
              f"{got['gemma'][0]} | "
              f"{reads} | {got['gemma'][2]} | {got['gemma'][3]} | {r['holds']} | {_holm_cell(r)} |")
    testable = ~t["holds"].isin(["n/a", "pending"])
    print(f"\nholds (Holm): the same test family-wise. Each model's bootstrap two-sided p-values over the "
          f"{int(testable.sum())} testable comparisons are Holm-adjusted, a direction is read only where the "
          "adjusted p is below 0.05 (else tied), and the two readings are compared; the family-wise readings "
          "(SmolLM2, Gemma 3) are in parentheses where they differ from the per-comparison ones."
          f" {(t.loc[testable, 'holds_holm'] == 'yes').sum()} of the {int(testable.sum())} hold "
          f"family-wise, {(t.loc[testable, 'holds'] == 'yes').sum()} per comparison.")
    if (t["holds"] == "n/a").any():
        print("\nn/a: Ada-KV over a policy and that policy gave identical outputs on every sample. Gemma 3 "
              "270M has one KV head, so Ada-KV has no heads to share a layer's budget among and is its base "
              "policy; the finding cannot be tested on this model.")
    _gemma_seeds(res, name)


def _holm_cell(r: pd.Series) -> str:
    """``holds_holm``, with the family-wise readings where either differs from the per-comparison one."""
    if r["holds_holm"] in ("n/a", "pending"):
        return r["holds_holm"]
    fw, pc = (r["smol_reads_holm"], r["gemma_reads_holm"]), (r["smol_reads"], r["gemma_reads"])
    return r["holds_holm"] if fw == pc else f"{r['holds_holm']} ({fw[0]}, {fw[1]})"


def _gemma_seeds(res: Path, name: str) -> None:
    """Keyformer's comparisons of a task rerun with other Gumbel-noise seeds
    (:func:`keyformer.lab.exp9.seed_tables`): per seed and over the seeds' per-record mean."""
    t = exp9.seed_tables(res / name)
    for task, g in (t.groupby("task", sort=False) if len(t) else []):
        seeds = ", ".join(str(k) for k in g["seed"].unique() if k != "mean")
        print(f"\n### {name}: {task}, Keyformer at noise seeds {seeds} (Gemma 3; the other policies are "
              "deterministic)\n")
        print("| comparison | Keyformer's seed | difference [95 % CI] | reads | budgets | n |\n"
              "|---|---|---|---|---|---|")
        for _, r in g.iterrows():
            ci = fmt_ci(r["diff"], r["lo"], r["hi"])
            print(f"| {r['comparison']} | {r['seed']} | {ci} | {r['reads']} | {r['budgets']} | "
                  f"{int(r['n'])} |")


def brief(res: Path) -> list[str]:
    """The headline line: how many of SmolLM2's findings hold on Gemma 3."""
    if not (res / "exp9_gemma").is_dir():
        return []
    g = _gemma_table(res)
    holds = g["holds"].tolist()
    testable = [h for h in holds if h not in ("n/a", "pending")]
    if not testable:
        return []
    fw = int((g["holds_holm"] == "yes").sum())
    return [f"* Experiment 9 (SmolLM2's findings of experiments 1 and 7 rerun on Gemma 3 270M): "
            f"{testable.count('yes')} of the {len(testable)} testable comparisons hold"
            f" ({fw} with Holm's family-wise correction)"
            + (f" ({holds.count('partial')} on fewer budgets)" if "partial" in holds else "")
            + (f"; {holds.count('pending')} not run yet" if "pending" in holds else "") + "."]


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp9_gemma': gemma,
}
