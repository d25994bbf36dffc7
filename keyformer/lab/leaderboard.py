"""Rank a fresh sweep against the committed field: ``keyformer-report --leaderboard ruler --with FOLDER``.

``FOLDER`` is what ``keyformer-collect`` wrote for the sweep (``points.csv`` + ``samples.csv``). Each of its
(policy, budget) points is paired record by record with every committed policy at the same budget, on the
records both ran, and compared with the findings engine (:mod:`keyformer.lab.findings`): the mean over the
benchmark's strata (RULER: its tasks, in the study's order) and the difference from every committed policy by
the paired sign-flip test within strata, with Holm's correction over them (the user's point is a policy added
to the field, so it gets its own family and the committed findings do not move). A sweep whose settings differ
from the field's (model, prompt limit, chat template, decoding, the records themselves, a budget the field
never ran) is refused with one line that names the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import analysis, stats
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
    order: tuple[str, ...] = ()  # the strata's canonical order (the study's findings use it too)


BENCHMARKS = {"ruler": Benchmark("ruler", "string_match_all", analysis.ruler_task_of, ("aware", "agnostic"),
                                  analysis.RULER_TASKS)}
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


def _same_outputs(us: pd.DataFrame, fp: pd.DataFrame, fs: pd.DataFrame, user_points: pd.Series, policy: str,
                  budget: float, ids: set[str]) -> bool:
    """Whether the user's points (every stratum's) wrote the same answer as a committed policy on every one of
    ``ids``, the records the comparison pairs."""
    if "prediction" not in us or "prediction" not in fs or not ids:
        return False
    sel = fp[fp["policy"] == policy]
    if policy != "full":
        sel = sel[np.isclose(sel["budget"].astype(float), budget)]
    def answers(samples: pd.DataFrame, pts: pd.Series) -> pd.Series:
        rows = samples[samples["point"].isin(pts)].drop_duplicates("id")
        return rows.set_index("id")["prediction"].fillna("").astype(str)

    mine, theirs = answers(us, user_points), answers(fs, sel["point"])
    common = sorted(ids & set(mine.index) & set(theirs.index))
    return len(common) == len(ids) and bool((mine[common] == theirs[common]).all())


def _ordered(bench: Benchmark, strata: set[str]) -> list[str]:
    """The benchmark's canonical stratum order (then any other, sorted): the order the study's findings use,
    so a comparison gets the same numbers here and on the page."""
    return [t for t in bench.order if t in strata] + sorted(strata - set(bench.order))


def _arm(bench: Benchmark, per: list[pd.Series], seed: int, key: str) -> dict[str, float]:
    """An arm's mean over the strata, with a bootstrap CI only where the rule allows it
    (:func:`stats.bootstrap_valid`)."""
    xs = [x.to_numpy(float) for x in per]
    out = {"mean": float(np.mean([x.mean() for x in xs])), "ci_lo": np.nan, "ci_hi": np.nan,
           "n": sum(len(x) for x in xs)}
    if stats.bootstrap_valid(xs):
        _, out["ci_lo"], out["ci_hi"] = stats.bootstrap_mean(xs, fnd.N_PERM, stats.stream(seed, key))
    return out


def rank(bench: Benchmark, user: tuple[pd.DataFrame, pd.DataFrame], field: tuple[pd.DataFrame, pd.DataFrame],
         seed: int = 0) -> tuple[pd.DataFrame, list[fnd.Finding]]:
    """Per user (policy, budget): every committed policy at that budget and full, with its mean over the
    strata the user's records cover, its rank, and the user's difference from it, judged by the findings
    engine over every record of every stratum both ran (Holm over the committed policies: one family per
    user point; identical answers on all those records: n/a)."""
    up, us = user
    fp, fs = field
    rows, comps = [], []
    ok = set(same_prompts(bench, us, fs)[0])  # the strata whose records are the field's prompts
    for _, p in up.drop_duplicates(["policy", "budget"]).iterrows():
        budget = float(p["budget"])
        at = np.isclose(up["budget"].astype(float), budget)
        points = up.loc[(up["policy"] == p["policy"]) & at, "point"]
        mine = _series(up, us, bench.metric, p["policy"], budget, bench.stratum)
        mine = {k: v[v.index.isin(fs["id"])] for k, v in mine.items()}  # the records the field ran
        strata = _ordered(bench, {k for k, v in mine.items() if len(v) and k in ok})
        fam = f"leaderboard.{p['policy']}.b{budget:g}"
        group = []
        for pol in sorted(set(fp["policy"])):
            theirs = _series(fp, fs, bench.metric, pol, None if pol == "full" else budget, bench.stratum)
            if not strata or not all(t in theirs for t in strata):
                continue
            pairs = [mine[t].align(theirs[t], join="inner") for t in strata]
            if any(len(a) == 0 for a, _ in pairs):
                continue
            ids = {i for a, _ in pairs for i in a.index}
            group.append({"policy": pol, **_arm(bench, [b for _, b in pairs], seed, f"{fam}.{pol}")})
            comps.append(fnd.Comparison(
                id=f"{fam}.{pol}", quantity=f"{bench.metric}, {p['policy']} - {pol}", a=str(p["policy"]),
                b=pol, strata=[(a - b).to_numpy() for a, b in pairs], family=None if pol == "full" else fam,
                identical=_same_outputs(us, fp, fs, points, pol, budget, ids),
                meta={"user_policy": str(p["policy"]), "budget": budget}))
        if strata:
            group.append({"policy": f"{p['policy']} (yours)", **_arm(bench, [mine[t] for t in strata], seed,
                                                                        f"{fam}.yours")})
        left = sorted(set(mine) - set(strata))
        g = pd.DataFrame(group).assign(budget=budget, user_policy=str(p["policy"]), strata=len(strata),
                                       left_out=", ".join(left))
        if len(g):
            g["rank"] = g.loc[g["policy"] != "full", "mean"].rank(ascending=False, method="min")
        rows.append(g)
    found = fnd.evaluate(comps, seed=seed)
    table = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    return table, found


def render(table: pd.DataFrame, found: list[fnd.Finding], bench: Benchmark, setting: str) -> str:
    """The leaderboard as markdown: one table per user point."""
    by = {(f.meta["user_policy"], f.meta["budget"], f.b): asdict(f) for f in found}
    out = []
    for (pol, budget), g in table.groupby(["user_policy", "budget"], sort=False):
        fams = [f for k, f in by.items() if k[:2] == (pol, budget) and f["family_size"]]
        size = fams[0]["family_size"] if fams else 0
        out.append(f"\n### {pol} at budget {budget:g} against the committed field ({bench.dataset}, "
                   f"{setting}; {bench.metric} x 100, mean over {int(g['strata'].iloc[0])} strata)\n")
        if g["left_out"].iloc[0]:
            out.append(f"Left out (their prompts differ from the field's, e.g. another essay haystack): "
                       f"{g['left_out'].iloc[0]}.\n")
        out.append("| rank | policy | mean [95 % CI] | n | yours - policy [interval at Holm's level] | "
                   "p (Holm) | verdict | tasks as units |")
        out.append("|---|---|---|---|---|---|---|---|")
        for _, r in g.sort_values("mean", ascending=False).iterrows():
            f = by.get((pol, budget, r["policy"]))
            rk = "" if np.isnan(r["rank"]) else str(int(r["rank"]))
            name = f"**{r['policy']}**" if r["policy"].endswith("(yours)") else r["policy"]
            diff = (f"{fnd.fmt_ci(f)} | {fnd.fmt_p(f)} | {fnd.fmt_verdict(f)} | {f['verdict_alt'] or ''}"
                    if f else "| | |")
            ci = "" if np.isnan(r["ci_lo"]) else f" [{r['ci_lo']:.1f}, {r['ci_hi']:.1f}]"
            mean = f"{r['mean']:.1f}{ci}"
            out.append(f"| {rk} | {name} | {mean} | {int(r['n'])} | {diff} |")
    out.append(f"\nverdict: the paired sign-flip test within strata (exact up to {stats.EXACT_MAX} records, "
               f"else Monte Carlo with its error), Holm over the {size} committed policies at that budget: "
               "`ahead`/`behind` when the adjusted p is below 0.05, else `inconclusive` with the records a "
               "stratum that 80 % power would need; the interval is the same test inverted at the level Holm "
               "tested it at (it excludes 0 exactly when the verdict is ahead or behind; \"too few records\" "
               "where no p the records can give reaches it); `n/a`: the same answers on every paired record. "
               "`tasks as units`: the verdict with each task's mean difference as one unit. A mean's "
               "bootstrap CI is shown only with at least 20 records in every stratum.")
    return "\n".join(out).strip("\n")


def leaderboard(name: str, folder: Path, res: Path = Path("results"), setting: str | None = None,
                seed: int = 0) -> str:
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
    table, found = rank(bench, user, field, seed)
    return render(table, found, bench, setting)
