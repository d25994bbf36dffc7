"""Experiment 10's report sections: the RULER leaderboards, equal bytes and Gemma's prompt change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp10_ruler import analysis as exp10
from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import _p_cell, findings_of, fmt_ci

RULER_SETTINGS = (("aware", "question-aware"), ("agnostic", "query-agnostic"))


def ruler(res: Path, name: str = "exp10_ruler") -> None:
    """Experiment 10: the RULER 4k leaderboard (string_match_all, mean over tasks) per setting, from complete
    points only: policy x compression ratio with CIs, differences from Keyformer and from full, the ranking,
    and the question-aware and query-agnostic averages side by side (``exp10.ruler_leaderboard``)."""
    tables, frames = {}, {}
    for folder, label in RULER_SETTINGS:
        if (res / name / folder / "points.csv").is_file():
            pts, smp = analysis.load_experiment(str(res / name), folder, complete_only=True)
            tables[label], frames[label] = exp10.ruler_leaderboard(pts, smp), (pts, smp)
    if not any(len(t) for t in tables.values()):
        print(f"(no complete points of {name} yet)")
        return
    found = findings_of(res, "exp10_ruler")  # the findings of both models
    setting_of = {lab: folder for folder, lab in RULER_SETTINGS}
    for label, t in tables.items():
        avg = t[t["task"] == "average"] if len(t) else t
        model = _ruler_model(name)
        print(f"\n**{label}**{model} (RULER 4k, string_match_all x 100, mean over "
              f"{int(avg['n_tasks'].max()) if len(avg) else 0} tasks)\n")
        if avg.empty:
            print("(no policy has every task yet)")
            continue
        print("| policy | ratio | budget | average | vs Keyformer [findings] | p (Holm) | verdict | vs full "
              "| rank | n | K/V held |\n|---|---|---|---|---|---|---|---|---|---|---|")
        for _, r in avg.sort_values(["ratio", "rank", "policy"]).iterrows():
            f = found.get(f"exp10.{name}.{setting_of[label]}.r{r['ratio']:g}.{r['policy']}")
            vs = (f"{fnd.fmt_ci(f)} | {fnd.fmt_p(f)} | {fnd.fmt_verdict(f)}" if f is not None else
                  f"{_diff(r, 'vs_keyformer')} | |")
            print(f"| {r['policy']} | {r['ratio']:g} | {r['budget']:g} | {r['mean']:.1f} | {vs} | "
                  f"{_diff(r, 'vs_full')} | "
                  f"{'' if np.isnan(r.get('rank', np.nan)) else int(r['rank'])} | {int(r['n'])} | "
                  f"{'' if np.isnan(r.get('kv_held', np.nan)) else format(r['kv_held'], '.3f')} |")
        print("\nvs Keyformer, p (Holm), verdict: the finding (results/exp10_ruler/findings.json): a paired "
              "sign-flip test within each task, Holm over the policies at that ratio, the interval at Holm's "
              "level (docs/results-contract.md). Means and the difference from full carry no interval: 5 "
              "records a task are too few for a bootstrap (the rule: 20 a stratum). K/V held: the mean over "
              "the samples of `kv_bytes / kv_bytes_full`, the K/V bytes held at the end of each answer over "
              "what the full cache holds for the same tokens (prompt-only policies keep every generated "
              "token, decode-time evictors hold the budget; on a hybrid model the sliding layers' windows "
              "count too: docs/models.md).")
        tasks = [x for x in analysis.RULER_TASKS if x in set(t["task"])]
        print("\nPer task (mean):\n")
        print("| policy | ratio | " + " | ".join(tasks) + " |")
        print("|---|---|" + "---|" * len(tasks))
        per = t[t["task"] != "average"].pivot_table(index=["ratio", "policy"], columns="task", values="mean")
        for (ratio, pol), r in per.iterrows():
            cells = " | ".join("" if np.isnan(r.get(x, np.nan)) else f"{r[x]:.0f}" for x in tasks)
            print(f"| {pol} | {ratio:g} | {cells} |")
    _prompt_sharing(frames)
    if len(frames) == 2 and all(len(t) for t in tables.values()):
        gap = exp10.ruler_setting_gap(*frames.values())
        if len(gap):
            print("\nQuestion-aware vs query-agnostic (average over tasks; paired: the same records in both "
                  "settings, agnostic - aware with a 95 % CI resampling within each task):\n")
            print("| policy | ratio | question-aware | query-agnostic | agnostic - aware [CI] | n |")
            print("|---|---|---|---|---|---|")
            for _, r in gap.sort_values(["ratio", "gap"], ascending=[True, False]).iterrows():
                print(f"| {r['policy']} | {r['ratio']:g} | {r['aware']:.1f} | {r['agnostic']:.1f} | "
                      f"{fmt_ci(r['gap'], r['gap_lo'], r['gap_hi'])} | {int(r['n'])} |")


def ruler_equal_bytes(res: Path, name: str = "exp10_ruler") -> None:
    """Experiment 10 at equal-or-more bytes for Keyformer (``results/<name>/equal_bytes.csv``, written by
    ``ruler_equal_bytes.py`` from the committed rows): each (setting, policy, ratio) that ends an
    answer holding more K/V than Keyformer, its difference from Keyformer at the same budget, at Keyformer's
    next larger budget, and at a budget run to match its bytes, with CIs."""
    f = res / name / "equal_bytes.csv"
    if not f.is_file():
        print(f"(no {name}/equal_bytes.csv yet)")
        return
    eb = pd.read_csv(f, comment="#")
    print("| setting | policy | ratio | K/V held | vs Keyformer, same budget [CI] (its K/V held) | "
          "vs Keyformer, next larger budget [CI] (its ratio, K/V held) | "
          "vs Keyformer, equal bytes [CI] (its budget, K/V held) | p (Holm) |\n"
          "|---|---|---|---|---|---|---|---|")
    for _, r in eb.iterrows():
        same = f"{fmt_ci(r['same_diff'], r['same_lo'], r['same_hi'])} ({r['keyformer_kv_held']:.3f})"
        nxt = "" if pd.isna(r.get("diff")) else (
            f"{fmt_ci(r['diff'], r['lo'], r['hi'])} ({r['keyformer_ratio']:g}, "
            f"{r['keyformer_more_kv_held']:.3f})")
        eq = "" if pd.isna(r.get("equal_diff", np.nan)) else (
            f"{fmt_ci(r['equal_diff'], r['equal_lo'], r['equal_hi'])} ({r['equal_budget']:g}, "
            f"{r['equal_kv_held']:.3f})")
        print(f"| {r['setting']} | {r['policy']} | {r['ratio']:g} | {r['kv_held']:.3f} | {same} | {nxt} | "
              f"{eq} | {_p_cell(r.get('equal_p_holm', np.nan), exp10.RULER_N_BOOT)} |")
    print("\nRows: every policy and ratio whose `K/V held` exceeds Keyformer's by more than 0.005; "
          "differences are the policy minus Keyformer over the same records. p (Holm): the equal-bytes "
          "difference's two-sided bootstrap p, Holm-adjusted over the equal-bytes rows.")


def ruler_prompt_change(res: Path, name: str = "exp10_ruler_gemma",
                        old: str = "archive/exp10_ruler_gemma_nobos", change: str = "`<bos>`") -> None:
    """Experiment 10 on the same records with two prompt assemblies: ``name`` (now) against ``old`` (before a
    fix, e.g. Gemma 3's prompts without ``<bos>``), per policy and setting with every task complete in both,
    paired over the records (now - before, resampling within each task: ``exp10.ruler_setting_gap``)."""
    printed = False
    for folder, label in RULER_SETTINGS:
        if not all((res / d / folder / "points.csv").is_file() for d in (name, old)):
            continue
        before = analysis.load_experiment(str(res / old), folder, complete_only=True)
        now = analysis.load_experiment(str(res / name), folder, complete_only=True)
        diff = exp10.ruler_setting_gap(before, now)  # "agnostic" - "aware" = now - before
        if diff.empty:
            continue
        if not printed:
            print(f"\n{name} with {change} vs without ({old}): the same records, string_match_all x 100, "
                  "mean over tasks, now - before paired with a 95 % CI resampling within each task\n")
            printed = True
        print(f"**{label}**\n\n| policy | ratio | without {change} | with {change} | with - without [CI] "
              "| n |\n|---|---|---|---|---|---|")
        for _, r in diff.sort_values(["ratio", "agnostic"], ascending=[True, False]).iterrows():
            print(f"| {r['policy']} | {r['ratio']:g} | {r['aware']:.1f} | {r['agnostic']:.1f} | "
                  f"{fmt_ci(r['gap'], r['gap_lo'], r['gap_hi'])} | {int(r['n'])} |")
        print()
    if not printed:
        print(f"(no policy complete in both {name} and {old} yet)")


def _prompt_sharing(frames: dict[str, tuple[pd.DataFrame, pd.DataFrame]]) -> None:
    """What ``share_prompt`` saved, from the points that ran with it: a point's ``wall_s`` when it ran its
    own prompt forwards vs when every record cut a copy of another budget's (``n_prompt_reused``)."""
    pts = pd.concat([p for p, _ in frames.values()], ignore_index=True)
    if "n_prompt_reused" not in pts:
        return
    pts = pts[pts["n_prompt_reused"].notna() & pts["wall_s"].notna()]
    own, reused = pts[pts["n_prompt_reused"] == 0], pts[pts["n_prompt_reused"] == pts["n_done"]]
    if own.empty or reused.empty:
        return

    o, r = own["wall_s"].median(), reused["wall_s"].median()

    def spread(w: pd.Series) -> str:
        return f"median {w.median():.0f} s a point [{w.min():.0f}-{w.max():.0f}]"

    print(f"\nPrompt sharing (`share_prompt=true`): {len(own)} points ran their own prompt forwards, "
          f"{spread(own['wall_s'])}; {len(reused)} points reused them, {spread(reused['wall_s'])} (wall "
          "time, two 1-thread workers on 2 cores; the outputs are the same either way, tested). By the "
          f"medians a group of three budgets takes {o + 2 * r:.0f} s instead of {3 * o:.0f} s: "
          f"{3 * o / (o + 2 * r):.1f}x less.")


def _diff(r: pd.Series, key: str) -> str:
    v = r.get(key)
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{float(v):+.1f}"


def _ruler_model(name: str) -> str:
    """The model an experiment 10 section names (SmolLM2's, the default, is not named)."""
    return " on Gemma 3 270M" if name.endswith("_gemma") else ""


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp10_ruler': ruler,
    'exp10_ruler_gemma': lambda res: ruler(res, "exp10_ruler_gemma"),
    'exp10_gemma_bos': ruler_prompt_change,
    'exp10_equal_bytes': ruler_equal_bytes,
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "10: RULER 4k"
QUESTION = ("Which policy keeps RULER's answers at a given cache ratio, with and without the question in the "
            "prompt, and where does Keyformer rank?")
MODELS = {"exp10_ruler": "SmolLM2-135M", "exp10_ruler_gemma": "Gemma 3 270M"}
SETTINGS = dict(RULER_SETTINGS)
REFERENCE = "keyformer"
# pre-registered: every compressed policy registered when the grid was defined, each against Keyformer; a
# policy added later is compared in its own family beside these (family "<family>+added")
POLICIES = ("h2o", "window", "streaming", "snapkv", "pyramidkv", "tova", "adakv_snapkv", "adakv_keyformer",
            "keydiff", "expected_attention", "kvzip", "rkv")
HEADLINE_RATIO = 0.5
TOPUP = "exp10_ruler/topup"  # the top-up's rows: results/exp10_ruler/topup/<setting>/
DEFINITION = {
    "metric": "string_match_all x 100, mean over RULER's 11 tasks",
    "comparison": "policy - keyformer at the same budget, paired over the same records",
    "families": {"exp10.<model>.<setting>.r<ratio>": list(POLICIES)},
    "reference": REFERENCE,
    "design": "paired sign-flip test within each task (the estimand is the mean over the fixed 11 tasks); "
              "alternative (verdict_alt): the same test with each task's mean difference as one unit",
    "alpha": fnd.ALPHA,
    "margin": 5.0,  # string_match_all points: within +-5 of Keyformer is equivalent (declared after the data)
    "identical": "a policy whose answers equal Keyformer's on every record is n/a, outside its family",
    # the family of twelve was first committed (2a577ce, 2026-12-06) after its rows (2026-12-01): exploratory;
    # the top-up at ratio 0.5 (queues/exp10_topup.txt, topup.py) is declared before any of its rows
    "roles": {f"exp10.{TOPUP}.*": "confirmatory", "exp10.*": "exploratory"},
    "registered": {f"exp10.{TOPUP}.*": {"commit": "aab03b56589a",
                                        "file": "experiments/exp10_ruler/queues/exp10_topup.txt",
                                        "contains": "n_samples=18",
                                        "rows": [f"{TOPUP}/aware", f"{TOPUP}/agnostic"]}},
    "topup": ("SmolLM2 at ratio 0.5, both settings: the policies whose verdict against Keyformer was "
              "inconclusive with at most 20 records a task needed for 80 % power, and Keyformer, at 18 "
              f"records a task (results/{TOPUP}/<setting>/), tested as these families at alpha 0.05"),
}


def _family(model: str, setting: str, ratio: float) -> str:
    return f"exp10.{model}.{setting}.r{ratio:g}"


def comparisons(res: Path) -> list[fnd.Comparison]:
    """Every policy's task-stratified paired difference from Keyformer, per model, setting and ratio."""
    out = []
    for model in [*MODELS, TOPUP]:
        for setting in SETTINGS:
            if not (res / model / setting / "points.csv").is_file():
                continue
            pts, smp = analysis.load_experiment(str(res / model), setting, complete_only=True)
            tasks = [t for t in analysis.RULER_TASKS if t in set(smp["id"].map(analysis.ruler_task_of))]
            full = analysis._ruler_series(pts, smp, "string_match_all", "full", None)
            for budget in sorted(pts.loc[pts["policy"] == REFERENCE, "budget"].astype(float).unique()):
                ratio = exp10.RULER_RATIO.get(budget)
                if ratio is None:
                    continue
                ref = analysis._ruler_series(pts, smp, "string_match_all", REFERENCE, budget)
                ref_pred = _predictions(pts, smp, REFERENCE, budget)
                if not all(t in ref for t in tasks):
                    continue
                ref_mean = float(np.mean([ref[t].mean() for t in tasks]))
                full_mean = float(np.mean([full[t].mean() for t in tasks])) if all(t in full for t in tasks) \
                    else None
                others = sorted(set(pts["policy"]) - {"full", REFERENCE})
                for pol in sorted(others, key=lambda p: (p not in POLICIES, p)):
                    mine = analysis._ruler_series(pts, smp, "string_match_all", pol, budget)
                    if not all(t in mine for t in tasks):
                        continue
                    pairs = [mine[t].align(ref[t], join="inner") for t in tasks]
                    pred = _predictions(pts, smp, pol, budget)
                    common = pred.index.intersection(ref_pred.index)
                    fam = _family(model, setting, ratio)
                    out.append(fnd.Comparison(
                        id=f"exp10.{model}.{setting}.r{ratio:g}.{pol}", quantity="string_match_all x 100, "
                        "policy - keyformer, mean over tasks", a=pol, b=REFERENCE,
                        strata=[(a - b).to_numpy() for a, b in pairs],
                        family=fam if pol in POLICIES else f"{fam}+added",
                        identical=bool(len(common) and (pred[common] == ref_pred[common]).all()),
                        meta={"model": model, "setting": setting, "ratio": ratio, "budget": budget,
                              "mean": float(np.mean([a.mean() for a, _ in pairs])),
                              "keyformer_mean": ref_mean,
                              "full_mean": full_mean, "kv_held": analysis._kv_held(pts, smp, pol, budget),
                              "per_task": {t: float(a.mean() - b.mean()) for t, (a, b) in zip(tasks, pairs,
                                                                                                strict=True)}}))
    return out


def _predictions(pts: pd.DataFrame, smp: pd.DataFrame, policy: str, budget: float) -> pd.Series:
    rows = analysis._policy_samples(pts, smp, policy, budget)
    return rows.set_index("id")["prediction"].fillna("").astype(str)


def _group(doc: dict, model: str, setting: str, ratio: float) -> list[dict]:
    return [f for f in doc["findings"] if f["meta"]["model"] == model and f["meta"]["setting"] == setting
            and f["meta"]["ratio"] == ratio]


def _rank(group: list[dict]) -> tuple[int, int]:
    """Keyformer's rank among the compressed policies by mean (1 = best), and how many there are."""
    if not group:
        return 0, 0
    kf = group[0]["meta"]["keyformer_mean"]
    return 1 + sum(f["meta"]["mean"] > kf for f in group), len(group) + 1


def _named(fs: list[dict]) -> str:
    fs = sorted(fs, key=lambda f: -f["estimate"])
    return ", ".join(f"{f['a']} ({fnd.fmt_ci(f)})" for f in fs) or "none"


def _open(fs: list[dict]) -> str:
    """The inconclusive ones with the records a task that 80 % power would need (up to 20: the top-up)."""
    fs = sorted((f for f in fs if f["verdict"] == "inconclusive" and f.get("records_needed")),
                key=lambda f: f["records_needed"])
    return ", ".join(f"{f['a']} {f['estimate']:+.1f} (~{f['records_needed']:.0f})" for f in fs
                     if f["records_needed"] <= 20) or "none"


def _sensitive(fs: list[dict]) -> list[dict]:
    return [f for f in fs if f["verdict"] in ("ahead", "behind") and f["verdict"] != f["verdict_alt"]]


def bullets(doc: dict) -> list[str]:
    """At the headline ratio, per model and setting: Keyformer's rank, who is ahead or behind after Holm, and
    which of those verdicts the pooled design does not share; then the other ratios in one line."""
    out = []
    for model, name in MODELS.items():
        for setting, label in SETTINGS.items():
            g = [f for f in _group(doc, model, setting, HEADLINE_RATIO) if "+added" not in f["family"]]
            if not g:
                continue
            rank, n = _rank(g)
            ahead = [f for f in g if f["verdict"] == "ahead"]
            behind = [f for f in g if f["verdict"] == "behind"]
            sens = _sensitive(g)
            out.append(
                f"**{name}, {label}, ratio {HEADLINE_RATIO:g}:** Keyformer ranks {rank} of {n} by mean "
                f"({g[0]['meta']['keyformer_mean']:.1f}, full {g[0]['meta']['full_mean']:.1f}); ahead of it "
                f"after Holm over {g[0]['family_size']}: {_named(ahead)}; behind: {_named(behind)}"
                + (f"; not with the tasks as units: {', '.join(f['a'] for f in sens)}" if sens else "")
                + f"; inconclusive that 20 records a task could resolve (records needed): {_open(g)}.")
    for model, name in MODELS.items():
        parts = []
        for ratio in sorted({f["meta"]["ratio"] for f in doc["findings"] if f["meta"]["model"] == model}):
            if ratio == HEADLINE_RATIO:
                continue
            for setting, label in SETTINGS.items():
                g = [f for f in _group(doc, model, setting, ratio) if "+added" not in f["family"]]
                if g:
                    a = sum(f["verdict"] == "ahead" for f in g)
                    b = sum(f["verdict"] == "behind" for f in g)
                    rank, n = _rank(g)
                    parts.append(f"{ratio:g} {label}: rank {rank} of {n}, {a} ahead, {b} behind")
        if parts:
            out.append(f"**{name}, the other ratios** (Keyformer's rank; policies ahead/behind it after "
                       "Holm): "
                       + "; ".join(parts) + ".")
    sens = _sensitive(doc["findings"])
    if sens:
        out.append(f"**{len(sens)} of {sum(f['verdict'] in ('ahead', 'behind') for f in doc['findings'])} "
                   "decisive verdicts hold for these 11 tasks but not with the tasks as units** (a claim "
                   "about other tasks of the kind would need more tasks, not more records): "
                   + ", ".join(f"{MODELS[f['meta']['model']]} {f['meta']['setting']} {f['meta']['ratio']:g} "
                               f"{f['a']}" for f in sens) + ".")
    return out[:8]


def answer(doc: dict) -> str:
    """At the headline ratio on SmolLM2, question-aware: the best policy and Keyformer's rank."""
    g = [f for f in _group(doc, "exp10_ruler", "aware", HEADLINE_RATIO) if "+added" not in f["family"]]
    if not g:
        return ""
    best = max(g, key=lambda f: f["meta"]["mean"])
    rank, n = _rank(g)
    return (f"At half the cache (SmolLM2, question-aware) {best['a']} leads ({best['meta']['mean']:.1f} of "
            f"full's {best['meta']['full_mean']:.1f}); Keyformer ranks {rank} of {n}, "
            f"{sum(f['verdict'] == 'ahead' for f in g)} policies ahead of it after Holm.")


def headline_table(res: Path, doc: dict) -> str:
    """Policy x (model, setting) at the headline ratio: mean (verdict against Keyformer)."""
    cols = [(m, s) for m in MODELS for s in SETTINGS if _group(doc, m, s, HEADLINE_RATIO)]
    mark = {"ahead": " ▲", "behind": " ▼", "inconclusive": "", "equivalent": " ≈", "n/a": " (=)"}
    rows = {}
    for m, s in cols:
        g = _group(doc, m, s, HEADLINE_RATIO)
        rows.setdefault(REFERENCE, {})[(m, s)] = f"**{g[0]['meta']['keyformer_mean']:.1f}**"
        rows.setdefault("full", {})[(m, s)] = f"{g[0]['meta']['full_mean']:.1f}"
        for f in g:
            rows.setdefault(f["a"], {})[(m, s)] = f"{f['meta']['mean']:.1f}{mark[f['verdict']]}"
    head = "| policy | " + " | ".join(f"{MODELS[m]} {SETTINGS[s]}" for m, s in cols) + " |"
    order = sorted(rows, key=lambda p: (p != "full", p != REFERENCE, p))
    lines = [head, "|---|" + "---|" * len(cols)]
    lines += [f"| {p} | " + " | ".join(rows[p].get(c, "") for c in cols) + " |" for p in order]
    return "\n".join(lines)


def ratio_table(res: Path, doc: dict) -> str:
    """SmolLM2: policy x ratio, question-aware and query-agnostic: mean (verdict against Keyformer)."""
    mark = {"ahead": " ▲", "behind": " ▼", "inconclusive": "", "equivalent": " ≈", "n/a": " (=)"}
    model = "exp10_ruler"
    ratios = sorted({f["meta"]["ratio"] for f in doc["findings"] if f["meta"]["model"] == model})
    cols = [(s, r) for s in SETTINGS for r in ratios]
    rows: dict[str, dict] = {}
    for s, r in cols:
        g = _group(doc, model, s, r)
        if g:
            rows.setdefault(REFERENCE, {})[(s, r)] = f"**{g[0]['meta']['keyformer_mean']:.1f}**"
        for f in g:
            rows.setdefault(f["a"], {})[(s, r)] = f"{f['meta']['mean']:.1f}{mark[f['verdict']]}"
    head = "| policy | " + " | ".join(f"{s} {r:g}" for s, r in cols) + " |"
    lines = [head, "|---|" + "---|" * len(cols)]
    lines += [f"| {p} | " + " | ".join(rows[p].get(c, "") for c in cols) + " |"
              for p in sorted(rows, key=lambda p: (p != REFERENCE, p))]
    return "\n".join(lines)


PLACEHOLDERS = {"headline_table": headline_table, "ratio_table": ratio_table}
