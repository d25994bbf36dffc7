"""Experiment 9's statistics: which of SmolLM2's findings hold on Gemma 3 270M, and across noise seeds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from keyformer.lab.analysis import Frames, PairedDiff, holm, load_experiment, paired_bootstrap, paired_frame


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


def _point_at(points: pd.DataFrame, policy: str, budget: float) -> str | None:
    """The unquantized point of ``policy`` at ``budget`` (``"full"``: its one point, at every budget)."""
    ev = points[points["kv_quant"].isna()] if "kv_quant" in points else points
    sel = ev[ev["policy"] == policy]
    if policy != "full":
        sel = sel[np.isclose(sel["budget"].astype(float), budget)]
    return str(sel["point"].iloc[0]) if len(sel) else None


def pooled_diffs(points: pd.DataFrame, samples: pd.DataFrame, a: str, b: str, budgets: Sequence[float],
                 metric: str) -> tuple[pd.Series, list[float]] | None:
    """``a - b`` per sample averaged over those of ``budgets`` where both points exist (``"full"``: the
    unquantized full point, at every budget), indexed by sample id (sorted), and the budgets used; None when
    no budget has both. Quantized points (``kv_quant`` set) are ignored."""
    diffs, used = [], []
    for budget in budgets:
        pa, pb = _point_at(points, a, budget), _point_at(points, b, budget)
        if pa and pb:
            j = paired_frame(samples, pa, pb, metric)
            if len(j):
                diffs.append(j.assign(d=j["a"].astype(float) - j["b"].astype(float))[["id", "d"]])
                used.append(float(budget))
    if not diffs:
        return None
    return pd.concat(diffs).groupby("id")["d"].mean(), used


def same_outputs(points: pd.DataFrame, samples: pd.DataFrame, a: str, b: str, c: str,
                 budgets: Sequence[float]) -> bool:
    """Whether ``a`` gave the same ``prediction`` as ``c`` on every sample it is paired with ``b`` at each of
    ``budgets`` (``c`` may be ``b`` itself; ``c`` missing a budget or a sample: not the same)."""
    if "prediction" not in samples or not budgets:
        return False
    for budget in budgets:
        pa, pb, pc = (_point_at(points, x, budget) for x in (a, b, c))
        if not (pa and pb and pc):
            return False
        ids = set(samples.loc[samples["point"] == pa, "id"]) & set(samples.loc[samples["point"] == pb, "id"])
        out = paired_frame(samples, pa, pc, "prediction")
        out = out[out["id"].isin(ids)]
        same = (out["a"].fillna("") == out["b"].fillna("")).all()
        if not ids or len(set(out["id"])) < len(ids) or not same:
            return False
    return True


def pooled_vs(points: pd.DataFrame, samples: pd.DataFrame, a: str, b: str, budgets: Sequence[float],
              metric: str, n_boot: int = 5000, seed: int = 0) -> tuple[PairedDiff, list[float]] | None:
    """:func:`pooled_diffs` then a paired bootstrap over samples; None when no budget has both."""
    r = pooled_diffs(points, samples, a, b, budgets, metric)
    if r is None:
        return None
    d = r[0].to_numpy()
    return paired_bootstrap(d, np.zeros_like(d), n_boot=n_boot, seed=seed), r[1]


def replication(load_smol, load_gemma, findings: Sequence[Finding] = EXP9_FINDINGS, n_boot: int = 5000,
                seed: int = 0, alpha: float = 0.05) -> pd.DataFrame:
    """Experiment 9's table: per finding, SmolLM2's and Gemma's pooled paired difference with its CI, how each
    reads (:func:`ci_reading`) and ``holds``: ``yes`` when Gemma's reading equals SmolLM2's, ``no`` when it
    differs, ``partial`` when it matches but Gemma ran fewer budgets, ``pending`` without Gemma's points, and
    ``n/a`` when on either model ``a`` gave the same predictions on every paired sample as ``b`` or as an arm
    already compared with ``b`` on that task (``<who>_same_as``; :func:`same_outputs`): on Gemma's one KV head
    Ada-KV is its base policy, so Ada-KV(SnapKV) - Keyformer repeats SnapKV - Keyformer. Rows without a
    ``prediction`` column fall back to Ada-KV over ``b`` scoring as ``b`` on every sample.
    With many comparisons some CIs exclude 0 by chance, so the same is done family-wise: ``<who>_p`` is the
    bootstrap two-sided p, ``<who>_p_holm`` Holm's adjustment over the testable findings (those not ``n/a`` or
    ``pending``), separately per model; ``<who>_reads_holm`` reads a direction only where that is below
    ``alpha``, and ``holds_holm`` compares those readings.
    ``load_smol(folder)`` / ``load_gemma(task)`` return ``(points, samples)`` (complete points only) or
    None."""
    rows = []
    cache: dict[tuple[str, str], tuple[pd.DataFrame, pd.DataFrame] | None] = {}
    compared: dict[tuple, list[str]] = {}  # (who, data, b, metric) -> the arms a compared with b so far
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
                before = compared.setdefault((who, key, f.b, f.metric), [])
                same = next((c for c in [f.b, *before] if c != f.a
                             and same_outputs(*data, f.a, f.b, c, used)), None)
                before.append(f.a)
                row.update({f"{who}_diff": d.mean, f"{who}_lo": d.lo, f"{who}_hi": d.hi, f"{who}_n": d.n,
                            f"{who}_budgets": ",".join(f"{b:g}" for b in used),
                            f"{who}_reads": ci_reading(d.lo, d.hi), f"{who}_p": d.p_two_sided,
                            f"{who}_same_as": same})
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
    if any(isinstance(row.get(f"{w}_same_as"), str) for w in ("smol", "gemma")):
        return "n/a"  # a's outputs are b's or an arm's already compared with b: no evidence of its own
    if same and row["gemma_diff"] == row["gemma_lo"] == row["gemma_hi"] == 0:
        return "n/a"  # rows without predictions: the same scores on every sample stand for the same outputs
    if gr != sr:
        return "no"
    return "yes" if row["gemma_budgets"] == row["smol_budgets"] else "partial"


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
