"""Your sweep, rendered like ours: ``keyformer-report --sweep multirun/x --out results/x``.

Any sweep of ``run.py`` (a raw ``hydra.sweep.dir`` or a ``keyformer-collect`` folder) becomes a page in
``--out``: ``points.csv`` and ``samples.csv`` (collected when the source is raw), ``figure.png`` (the main
metric against the budget, one line per policy, ``full`` as a band), ``findings.json`` and ``README.md`` (the
table and the findings). The main metric is the task's own (:data:`MAIN_METRICS`: ``string_match_all`` for
RULER, ``accuracy`` for ``sample`` and the needle, token F1 for L-Eval QA, ROUGE-2 for summaries).

Findings: every (policy, budget) point against ``full`` (family ``vs_full``) and against ``--reference`` at
the same budget (family ``vs_<reference>``), paired on the records both finished, stratified by RULER task
where the rows have one, with the engine of :mod:`keyformer.lab.findings`. The comparisons are the tool's
fixed rule, but nothing records that they were chosen before the data, so the families are labelled
exploratory.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from keyformer.lab import analysis
from keyformer.lab import findings as fnd

MAIN_METRICS = ("string_match_all", "accuracy", "token_f1", "exact_match", "rougeL_longbench", "rouge2",
                "rougeL")
LABELS = {"string_match_all": "string match (all) %", "accuracy": "accuracy %", "token_f1": "token F1",
          "exact_match": "exact match %", "rougeL_longbench": "ROUGE-L (LongBench)", "rouge2": "ROUGE-2",
          "rougeL": "ROUGE-L"}
FULL = "full"


class SweepError(ValueError):
    """The sweep cannot be rendered (the message names why)."""


def main_metric(samples: pd.DataFrame) -> str:
    """The task's own metric: the first of :data:`MAIN_METRICS` the rows carry."""
    for m in MAIN_METRICS:
        if m in samples and samples[m].notna().any():
            return m
    raise SweepError(f"no metric column among {', '.join(MAIN_METRICS)} in samples.csv")


def fmt_budget(b: Any) -> str:
    """A budget as recorded (0.25, not 0.2; 256 tokens as 256)."""
    return f"{float(b):g}"


def load(src: Path, out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(points, samples)`` of a collected folder, or of a raw sweep collected into ``out``."""
    from keyformer.lab.collect import TEXT_COLUMNS, collect
    from keyformer.run.results import atomic_write_text

    if (src / "points.csv").is_file() and (src / "samples.csv").is_file():
        return (pd.read_csv(src / "points.csv", dtype={"point": str}),
                pd.read_csv(src / "samples.csv", dtype=TEXT_COLUMNS))
    if not src.is_dir():
        raise SweepError(f"--sweep {src}: no such folder (a hydra.sweep.dir, or a keyformer-collect folder)")
    points, samples = collect(src)
    if points.empty:
        raise SweepError(f"--sweep {src}: no run folder with results (config.yaml + predictions.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "points.csv", points.to_csv(index=False))
    atomic_write_text(out / "samples.csv", samples.to_csv(index=False))
    return (pd.read_csv(out / "points.csv", dtype={"point": str}),
            pd.read_csv(out / "samples.csv", dtype=TEXT_COLUMNS))


def _stratum(samples: pd.DataFrame) -> pd.Series:
    if "ruler_task" in samples and samples["ruler_task"].notna().all():
        return samples["ruler_task"].astype(str)
    if samples["id"].astype(str).str.startswith("ruler-").all():
        return samples["id"].map(analysis.ruler_task_of)
    return pd.Series("all", index=samples.index)


def _rows(points: pd.DataFrame, samples: pd.DataFrame, point: str, metric: str) -> pd.DataFrame:
    s = samples[samples["point"] == point]
    return pd.DataFrame({"id": s["id"].astype(str), "stratum": _stratum(s), "y": s[metric].astype(float),
                         "pred": s["prediction"].astype(str) if "prediction" in s else None})


def paired(points: pd.DataFrame, samples: pd.DataFrame, a: str, b: str,
           metric: str) -> tuple[list, bool, int]:
    """Per-stratum arrays of ``a - b`` on the ids both points finished (strata in sorted order), whether both
    gave the same prediction on every one, and the number of pairs."""
    x, y = _rows(points, samples, a, metric), _rows(points, samples, b, metric)
    j = x.merge(y, on="id", suffixes=("_a", "_b"))
    if j.empty:
        return [], False, 0
    strata = [g["y_a"].to_numpy() - g["y_b"].to_numpy() for _, g in j.groupby("stratum_a", sort=True)]
    same = bool("pred_a" in j and (j["pred_a"] == j["pred_b"]).all())
    return strata, same, len(j)


def _full_point(points: pd.DataFrame) -> str | None:
    full = points[points["policy"] == FULL]
    return str(full["point"].iloc[0]) if len(full) else None


def comparisons(points: pd.DataFrame, samples: pd.DataFrame, metric: str,
                reference: str | None) -> list[fnd.Comparison]:
    """Every policy point against ``full`` and against ``reference`` at its budget (see the module's text)."""
    out = []
    full = _full_point(points)
    for _, p in points[points["policy"] != FULL].sort_values(["policy", "budget"]).iterrows():
        b = fmt_budget(p["budget"])
        others = [(FULL, full, "vs_full")] if full is not None else []
        if reference and p["policy"] != reference:
            ref = points[(points["policy"] == reference) & np.isclose(points["budget"].astype(float),
                                                                       float(p["budget"]))]
            if len(ref):
                others.append((reference, str(ref["point"].iloc[0]), f"vs_{reference}"))
        for name, point, family in others:
            strata, same, n = paired(points, samples, str(p["point"]), point, metric)
            if n == 0:
                continue
            out.append(fnd.Comparison(
                id=f"{p['policy']}@{b}-{name}", quantity=metric, a=f"{p['policy']}@{b}",
                b=name if name == FULL else f"{name}@{b}", strata=strata, family=family, identical=same,
                meta={"budget": float(p["budget"]), "policy": str(p["policy"]), "against": name}))
    return out


def table(points: pd.DataFrame, samples: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per point: records, the metric's mean with a 95 % CI (stratified where the rows have strata), the K/V
    held against full, decode latency."""
    rows = []
    for _, p in points.sort_values(["policy", "budget"]).iterrows():
        r = _rows(points, samples, str(p["point"]), metric)
        per = [g["y"].to_numpy() for _, g in r.groupby("stratum", sort=True)]
        m, lo, hi = analysis.stratified_mean_ci(per, n_boot=2000) if per else (np.nan,) * 3
        rows.append({"policy": p["policy"], "budget": float(p["budget"]), "n": len(r), "mean": m, "ci_lo": lo,
                     "ci_hi": hi, "kv_ratio": p.get("kv_ratio", np.nan),
                     "decode_ms_per_token": p.get("decode_ms_per_token", np.nan),
                     "complete": bool(p.get("complete", True))})
    return pd.DataFrame(rows)


def figure(t: pd.DataFrame, metric: str, path: Path) -> None:
    """The metric against the budget, one line per policy with its CI, full as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for pol, g in t[t["policy"] != FULL].groupby("policy", sort=True):
        g = g.sort_values("budget")
        ax.errorbar(g["budget"], g["mean"], yerr=[g["mean"] - g["ci_lo"], g["ci_hi"] - g["mean"]], marker="o",
                    capsize=3, label=str(pol))
    full = t[t["policy"] == FULL]
    if len(full):
        f = full.iloc[0]
        ax.axhspan(f["ci_lo"], f["ci_hi"], color="0.85", label=f"{FULL} (95 % CI)")
        ax.axhline(f["mean"], color="0.4", lw=1)
    ax.set_xlabel("KV budget")
    ax.set_ylabel(LABELS.get(metric, metric))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _ci(m: float, lo: float, hi: float, signed: bool = False) -> str:
    f = "+.2f" if signed else ".2f"
    return "n/a" if np.isnan(m) else f"{m:{f}} [{lo:{f}}, {hi:{f}}]"


def render(name: str, t: pd.DataFrame, found: list[fnd.Finding], metric: str, reference: str | None,
           points: pd.DataFrame) -> str:
    """The page: provenance, figure, table, findings."""
    prov = "; ".join(f"{k} {', '.join(sorted(map(str, points[k].dropna().unique())))}"
                     for k in ("model", "dataset", "device", "dtype", "git_commit") if k in points)
    lines = [f"# {name}: {LABELS.get(metric, metric)} against the KV budget", "",
             f"Rendered by `keyformer-report --sweep` from this folder's rows ({prov}).", "",
             "![metric vs budget](figure.png)", "",
             f"| policy | budget | n | {LABELS.get(metric, metric)} [95 % CI] | KV held / full "
             "| decode ms/token |",
             "|---|---|---|---|---|---|"]
    for r in t.itertuples():
        flag = "" if r.complete else " (partial)"
        lines.append(f"| {r.policy}{flag} | {fmt_budget(r.budget)} | {r.n} | "
                     f"{_ci(r.mean, r.ci_lo, r.ci_hi)} | {r.kv_ratio:.3f} | {r.decode_ms_per_token:.1f} |")
    lines += ["", "## Findings (exploratory; paired sign-flip test within strata, Holm within each family; "
              "`findings.json`)", "",
              "| comparison | n | difference [interval at Holm's level] | p (Holm) | verdict |",
              "|---|---|---|---|---|"]
    for f in map(asdict, found):
        lines.append(f"| {f['a']} - {f['b']} | {f['n']} | {fnd.fmt_ci(f, 2)} | {fnd.fmt_p(f)} | "
                     f"{fnd.fmt_verdict(f)} |")
    if not found:
        lines.append("| (no pair: the sweep needs `full` or the reference beside a policy) | | | | |")
    partial = t.loc[~t["complete"], "policy"].tolist()
    lines += ["", f"Reference: `{reference}`." if reference else "No reference named (`--reference`).",
              *(["Partial points (named above) enter on the records they finished."] if partial else [])]
    return "\n".join(lines) + "\n"


def analyse(points: pd.DataFrame, samples: pd.DataFrame, reference: str | None = "keyformer",
            seed: int = 0) -> tuple[str, pd.DataFrame, list[fnd.Finding], dict[str, Any]]:
    """``(metric, table, findings, definition)`` of a collected sweep."""
    metric = main_metric(samples)
    comps = comparisons(points, samples, metric, reference)
    found = fnd.evaluate(comps, seed=seed) if comps else []
    definition = {"metric": metric, "reference": reference, "families": sorted({c.family for c in comps}),
                  "registration": "exploratory", "seed": seed}
    return metric, table(points, samples, metric), found, definition


def build(src: Path, out: Path, reference: str | None = "keyformer", seed: int = 0) -> list[Path]:
    """Write the sweep's page into ``out``; the paths written."""
    points, samples = load(src, out)
    metric, t, found, definition = analyse(points, samples, reference, seed)
    out.mkdir(parents=True, exist_ok=True)
    figure(t, metric, out / "figure.png")
    (out / "findings.json").write_text(fnd.dumps(out.name, found, {**definition, "source": str(src)}),
                                       encoding="utf-8")
    (out / "README.md").write_text(render(out.name, t, found, metric, reference, points), encoding="utf-8")
    return [out / n for n in ("figure.png", "findings.json", "README.md")]


def text(folder: Path, reference: str | None = "keyformer", seed: int = 0) -> str:
    """A collected folder's table and findings as text (``keyformer-report --results FOLDER``); writes
    nothing."""
    points, samples = load(folder, folder)
    metric, t, found, _ = analyse(points, samples, reference, seed)
    page = render(folder.name, t, found, metric, reference, points)
    return "\n".join(ln for ln in page.splitlines() if not ln.startswith("![")).replace("\n\n\n", "\n\n")


def findings_rows(out: Path) -> list[dict[str, Any]]:
    """The findings of a rendered sweep as flat rows (for a W&B Table or a DataFrame)."""
    doc = json.loads((out / "findings.json").read_text(encoding="utf-8"))
    return [{k: v for k, v in f.items() if k != "meta"} for f in doc["findings"]]


