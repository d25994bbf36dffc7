"""Rank a fresh sweep against the committed field: ``keyformer-report --leaderboard ruler --with FOLDER``.

``FOLDER`` is what ``keyformer-collect`` wrote for the sweep (``points.csv`` + ``samples.csv``). Each of its
(policy, budget) points is paired record by record with every committed policy at the same budget, on the
records both ran, and compared with the findings engine (:mod:`keyformer.lab.findings`): the mean over the
benchmark's strata (RULER: its tasks), a bootstrap CI resampling within each stratum, and the difference from
every committed policy with Holm's correction over them (the user's point is a policy added to the field, so
it gets its own family and the committed findings do not move). A sweep whose settings differ from the
field's (model, prompt limit, chat template, decoding, the records themselves, a budget the field never ran)
is refused with one line that names the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import analysis
from keyformer.lab import findings as fnd


class LeaderboardError(ValueError):
    """The sweep cannot be ranked against the field (the message names why)."""


@dataclass(frozen=True)
class Benchmark:
    """A benchmark with a committed field: its metric, how a record id maps to its stratum, and its
    settings (the committed field of a model and setting is ``results/<folder>/<setting>/``, found by
    :func:`field_folder` from the rows themselves)."""

    dataset: str
    metric: str
    stratum: Callable[[str], str]
    settings: tuple[str, ...]


BENCHMARKS = {"ruler": Benchmark("ruler", "string_match_all", analysis.ruler_task_of, ("aware", "agnostic"))}
SETTINGS = ("chat_template", "num_beams", "dtype")  # must equal the field's


def _one(points: pd.DataFrame, col: str, where: str) -> object:
    vals = points[col].dropna().unique() if col in points else []
    if len(vals) > 1:
        raise LeaderboardError(f"{where} mixes {col} values {sorted(map(str, vals))}; rank one setting at a "
                               "time")
    return vals[0] if len(vals) else None


def _models(folder: Path, dataset: str) -> set[str]:
    pts = pd.read_csv(folder / "points.csv", usecols=lambda c: c in ("model", "dataset"))
    if "dataset" in pts:
        pts = pts[pts["dataset"] == dataset]
    return set(pts["model"].dropna().astype(str)) if "model" in pts else set()


def field_folder(bench: Benchmark, points: pd.DataFrame, res: Path, setting: str,
                 exclude: Path | None = None) -> Path:
    """The committed field for the sweep's model and setting: the one ``res/<folder>/<setting>/`` whose rows
    ran this benchmark on that model (``exclude``: the sweep's own folder)."""
    model = str(_one(points, "model", "the sweep"))
    found, models = [], set()
    for f in sorted(p.parent for p in res.glob(f"*/{setting}/points.csv")):
        if exclude is not None and f.resolve() == exclude.resolve():
            continue
        have = _models(f, bench.dataset)
        models |= have
        if model in have:
            found.append(f)
    if not found:
        raise LeaderboardError(f"model {model!r} has no committed {bench.dataset} field under "
                               f"{res}/*/{setting}; valid: {', '.join(sorted(models)) or 'none'}")
    if len(found) > 1:
        raise LeaderboardError(f"model {model!r} has {len(found)} committed {bench.dataset} fields "
                               f"({', '.join(map(str, found))}); keep one under {res}")
    return found[0]


def check(bench: Benchmark, user: tuple[pd.DataFrame, pd.DataFrame], field: tuple[pd.DataFrame, pd.DataFrame],
          setting: str) -> None:
    """Refuse a sweep the field cannot be paired with (raises :class:`LeaderboardError`)."""
    up, us = user
    fp, fs = field
    datasets = set(up["dataset"].dropna()) if "dataset" in up else set()
    if datasets != {bench.dataset}:
        raise LeaderboardError(f"dataset {sorted(datasets)} is not {bench.dataset!r}")
    if "query_agnostic" in up and up["query_agnostic"].notna().any():
        got = "agnostic" if bool(_one(up, "query_agnostic", "the sweep")) else "aware"
        if got != setting:
            raise LeaderboardError(f"the sweep is {got} (dataset.query_agnostic), the field asked for is "
                                   f"{setting}: pass --setting {got}")
    for col in SETTINGS:
        mine, theirs = _one(up, col, "the sweep"), _one(fp, col, "the field")
        if mine is not None and theirs is not None and str(mine) != str(theirs):
            raise LeaderboardError(f"{col} {mine} differs from the field's {theirs}")
    if "truncated_tokens" in us and (us["truncated_tokens"] > 0).any():
        n = int((us.groupby("id")["truncated_tokens"].max() > 0).sum())
        raise LeaderboardError(f"{n} records of the sweep were cut to fit max_prompt_tokens; the field's "
                               "were not: raise max_prompt_tokens (the ruler benchmark preset sets it)")
    if not set(us["id"]) & set(fs["id"]):
        raise LeaderboardError(f"none of the sweep's {us['id'].nunique()} records is one the field ran "
                               "(another length, seed or task set)")
    ok, differ = same_prompts(bench, us, fs)
    if not ok:
        rid = differ[0]
        raise LeaderboardError(f"no record is the same prompt as the field's (e.g. {rid!r} has "
                               f"{_tokens(us, rid)} prompt tokens against the field's {_tokens(fs, rid)}): "
                               "model, template, generator or haystack differ")
    budgets = set(fp.loc[fp["policy"] != "full", "budget"].astype(float))
    for b in sorted(set(up["budget"].astype(float))):
        if b not in budgets:
            raise LeaderboardError(f"budget {b:g} was never run by the field; valid: "
                                   f"{', '.join(f'{x:g}' for x in sorted(budgets))}")


def _tokens(samples: pd.DataFrame, rid: str) -> int:
    return int(samples.loc[samples["id"] == rid, "prompt_tokens"].iloc[0])


def same_prompts(bench: Benchmark, us: pd.DataFrame, fs: pd.DataFrame) -> tuple[list[str], list[str]]:
    """``(strata, differing records)``: the strata whose every record the sweep shares with the field is the
    same prompt (the same prompt token count; RULER's essay tasks differ when the haystack does), and the
    shared records that are not."""
    common = sorted(set(us["id"]) & set(fs["id"]))
    if "prompt_tokens" not in us or "prompt_tokens" not in fs:
        return sorted({bench.stratum(r) for r in common}), []
    a = us.groupby("id")["prompt_tokens"].first().reindex(common)
    b = fs.groupby("id")["prompt_tokens"].first().reindex(common)
    differ = [r for r in common if a[r] != b[r]]
    bad = {bench.stratum(r) for r in differ}
    return sorted({bench.stratum(r) for r in common} - bad), differ


def _series(points: pd.DataFrame, samples: pd.DataFrame, metric: str, policy: str, budget: float | None,
            stratum: Callable[[str], str]) -> dict[str, pd.Series]:
    sel = points[points["policy"] == policy]
    if budget is not None:
        sel = sel[np.isclose(sel["budget"].astype(float), budget)]
    rows = samples[samples["point"].isin(sel["point"])]
    return {str(k): g.set_index("id")[metric].astype(float) for k, g in rows.groupby(rows["id"].map(stratum))}


def _same_outputs(up: pd.DataFrame, us: pd.DataFrame, fp: pd.DataFrame, fs: pd.DataFrame, p: pd.Series,
                  policy: str) -> bool:
    """Whether the user's point wrote the same answer as a committed policy on every record both ran."""
    if "prediction" not in us or "prediction" not in fs:
        return False
    sel = fp[fp["policy"] == policy]
    if policy != "full":
        sel = sel[np.isclose(sel["budget"].astype(float), float(p["budget"]))]
    mine = us[us["point"] == p["point"]].set_index("id")["prediction"].astype(str)
    theirs = fs[fs["point"].isin(sel["point"])].set_index("id")["prediction"].astype(str)
    common = mine.index.intersection(theirs.index)
    return bool(len(common)) and bool((mine[common] == theirs[common]).all())


def rank(bench: Benchmark, user: tuple[pd.DataFrame, pd.DataFrame], field: tuple[pd.DataFrame, pd.DataFrame],
         seed: int = 0) -> tuple[pd.DataFrame, list[fnd.Finding]]:
    """Per user (policy, budget): every committed policy at that budget and full, with its mean over the
    strata the user's records cover, a stratified CI, its rank, and the user's difference from it (Holm over
    the committed policies: one family per user point)."""
    up, us = user
    fp, fs = field
    rows, comps = [], []
    ok = set(same_prompts(bench, us, fs)[0])  # the strata whose records are the field's prompts
    for _, p in up.drop_duplicates(["policy", "budget"]).iterrows():  # one point per (policy, budget)
        mine = _series(up, us, bench.metric, p["policy"], float(p["budget"]), bench.stratum)
        mine = {k: v[v.index.isin(fs["id"])] for k, v in mine.items()}  # the records the field ran
        strata = sorted(k for k, v in mine.items() if len(v) and k in ok)
        fam = f"leaderboard.{p['policy']}.b{float(p['budget']):g}"
        others = sorted(set(fp["policy"]))
        group = []
        for pol in others:
            theirs = _series(fp, fs, bench.metric, pol, None if pol == "full" else float(p["budget"]),
                             bench.stratum)
            if not all(t in theirs for t in strata):
                continue
            pairs = [mine[t].align(theirs[t], join="inner") for t in strata]
            same = _same_outputs(up, us, fp, fs, p, pol)
            m, lo, hi = analysis.stratified_mean_ci([b.to_numpy() for _, b in pairs], n_boot=fnd.N_BOOT,
                                                    seed=seed)
            group.append({"policy": pol, "mean": m, "ci_lo": lo, "ci_hi": hi,
                          "n": sum(len(b) for _, b in pairs)})
            comps.append(fnd.Comparison(
                id=f"{fam}.{pol}", quantity=f"{bench.metric}, {p['policy']} - {pol}", a=str(p["policy"]),
                b=pol,
                strata=[(a - b).to_numpy() for a, b in pairs], family=None if pol == "full" else fam,
                identical=same,
                meta={"user_policy": str(p["policy"]), "budget": float(p["budget"])}))
        m, lo, hi = analysis.stratified_mean_ci([mine[t].to_numpy() for t in strata], n_boot=fnd.N_BOOT,
                                                seed=seed)
        group.append({"policy": f"{p['policy']} (yours)", "mean": m, "ci_lo": lo, "ci_hi": hi,
                      "n": sum(len(mine[t]) for t in strata)})
        left = sorted(set(mine) - set(strata))
        g = pd.DataFrame(group).assign(budget=float(p["budget"]), user_policy=str(p["policy"]),
                                       strata=len(strata), left_out=", ".join(left))
        g["rank"] = g.loc[g["policy"] != "full", "mean"].rank(ascending=False, method="min")
        rows.append(g)
    found = fnd.evaluate(comps, seed=seed)
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    return table, found


def render(table: pd.DataFrame, found: list[fnd.Finding], bench: Benchmark, setting: str) -> str:
    """The leaderboard as markdown: one table per user point."""
    by = {(f.meta["user_policy"], f.meta["budget"], f.b): f for f in found}
    out = []
    for (pol, budget), g in table.groupby(["user_policy", "budget"], sort=False):
        out.append(f"\n### {pol} at budget {budget:g} against the committed field ({bench.dataset}, "
                   f"{setting}; "
                   f"{bench.metric} x 100, mean over {int(g['strata'].iloc[0])} strata, 95 % CIs)\n")
        if g["left_out"].iloc[0]:
            out.append(f"Left out (their prompts differ from the field's, e.g. another essay haystack): "
                       f"{g['left_out'].iloc[0]}.\n")
        out.append("| rank | policy | mean [CI] | n | yours - policy [CI] | p (Holm) | verdict | "
                   "pooled design |")
        out.append("|---|---|---|---|---|---|---|---|")
        for _, r in g.sort_values("mean", ascending=False).iterrows():
            f = by.get((pol, budget, r["policy"]))
            rk = "" if np.isnan(r["rank"]) else str(int(r["rank"]))
            name = f"**{r['policy']}**" if r["policy"].endswith("(yours)") else r["policy"]
            diff = (f"{f.estimate:+.1f} [{f.ci_lo:+.1f}, {f.ci_hi:+.1f}] | {fnd.fmt_p(f.p_adj, f.n_boot)} | "
                    f"{f.verdict} | {f.verdict_alt}") if f else "| | |"
            mean = f"{r['mean']:.1f} [{r['ci_lo']:.1f}, {r['ci_hi']:.1f}]"
            out.append(f"| {rk} | {name} | {mean} | {int(r['n'])} | {diff} |")
    out.append("\nverdict: `ahead`/`behind` when the Holm-adjusted p (over the committed policies at that "
               "budget) is below 0.05, else `tied`; `pooled design`: the verdict when all records are "
               "resampled as one pool "
               "instead of within each stratum.")
    return "\n".join(out).strip("\n")


def leaderboard(name: str, folder: Path, res: Path = Path("results"), setting: str | None = None) -> str:
    """``keyformer-report --leaderboard NAME --with FOLDER``: the user's points ranked in the committed
    field."""
    if name not in BENCHMARKS:
        raise LeaderboardError(f"--leaderboard {name!r}: unknown; valid: {', '.join(BENCHMARKS)}")
    bench = BENCHMARKS[name]
    if not (folder / "points.csv").is_file() or not (folder / "samples.csv").is_file():
        raise LeaderboardError(f"--with {folder}: no points.csv and samples.csv (run keyformer-collect on "
                               "the sweep first)")
    user = analysis.load_experiment(str(folder.parent), folder.name, complete_only=True)
    if user[0].empty:
        raise LeaderboardError(f"--with {folder}: no complete point")
    if setting is None:
        qa = user[0]["query_agnostic"].dropna() if "query_agnostic" in user[0] else pd.Series(dtype=bool)
        setting = "agnostic" if len(qa) and bool(qa.iloc[0]) else "aware"
    if setting not in bench.settings:
        raise LeaderboardError(f"--setting {setting!r}; valid: {', '.join(bench.settings)}")
    ff = field_folder(bench, user[0], res, setting, exclude=folder)
    field = analysis.load_experiment(str(ff.parent), ff.name, complete_only=True)
    check(bench, user, field, setting)
    table, found = rank(bench, user, field)
    return render(table, found, bench, setting)
