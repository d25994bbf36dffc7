"""Print the markdown tables of results/README.md from the curated results (paired bootstrap CIs).

    keyformer-report                    # all experiments whose results exist under ./results
    keyformer-report --results DIR      # another curated results folder
    keyformer-report --list             # the section names
    keyformer-report --section exp1_cnndm --section provenance
    keyformer-report --update-readme    # rewrite the marked tables of the READMEs and docs/
    keyformer-report --check-readme     # exit 1 naming each marked table that differs from the data

Every table a README quotes sits between ``<!-- keyformer-report:NAME -->`` and ``<!-- /keyformer-report:NAME
-->``, where NAME is a section of :data:`SECTIONS`; the text between is that section's output, verbatim
(``tests/test_results_tables.py`` regenerates each from the committed data and fails when one differs).
Superseded runs live in ``results/archive/`` (``archive/MANIFEST.md`` says why each was superseded).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import analysis


def fmt_ci(m: float, lo: float, hi: float) -> str:
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def curve_experiment(res: Path, name: str, pairs: list[tuple[str, str]]) -> None:
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    ids = analysis.common_ids(samples, points["point"].tolist())
    paired = samples[samples["id"].isin(ids)]
    print(f"\n### {name}: {len(ids)} samples common to {len(points)} points "
          f"({int(points['complete'].sum())} complete)\n")
    rows = []
    for _, p in points.sort_values(["policy", "budget"]).iterrows():
        s = paired[paired["point"] == p["point"]]
        cis = {k: analysis.mean_ci(s[k].to_numpy(), n_boot=2000) for k in ("rouge1", "rouge2", "rougeL")}
        rows.append(f"| {p['policy']} | {p['budget']:.1f} | {int(p['n_done'])} | "
                    + " | ".join(f"{m:.2f} [{lo:.2f}, {hi:.2f}]" for m, lo, hi in cis.values()) + " |")
    print("| policy | budget | n done | ROUGE-1 | ROUGE-2 | ROUGE-L |\n|---|---|---|---|---|---|")
    print("\n".join(rows))
    evict = points[points["policy"] != "full"]
    full = points.loc[points["policy"] == "full", "point"]
    print("\nPaired ROUGE-2 differences (95 % bootstrap CI; each pair over the articles both points "
          "finished):\n")
    print("| budget | comparison | n | diff [95 % CI] | P(diff <= 0) |\n|---|---|---|---|---|")
    t = analysis.pairwise_table(samples, evict, pairs, "rouge2", n_boot=5000)
    for r in t.itertuples():
        print(f"| {r.budget:.1f} | {r.a} - {r.b} | {r.n} | {fmt_ci(r.diff, r.ci_lo, r.ci_hi)} | "
              f"{r.p_le_0:.3f} |")
    for a, b in pairs:
        if {a, b} <= set(evict["policy"]):
            d, used = analysis.pooled_difference(samples, evict, a, b, "rouge2", n_boot=5000)
            print(f"| pooled over {', '.join(f'{x:g}' for x in used)} | {a} - {b} | {d.n} | "
                  f"{fmt_ci(d.mean, d.lo, d.hi)} | {d.p_le_0:.3f} |")
    if len(full):
        for _, p in evict.sort_values(["policy", "budget"]).iterrows():
            d = analysis.compare_points(samples, p["point"], full.iloc[0], "rouge2", n_boot=5000)
            print(f"| {p['budget']:.1f} | {p['policy']} - full | {d.n} | {fmt_ci(d.mean, d.lo, d.hi)} | "
                  f"{d.p_le_0:.3f} |")
        print("\nBudget to reach 99 % of full ROUGE-2:\n")
        print("| policy | budget | 95 % CI | share of resamples reaching it | measured budgets | n |\n"
              "|---|---|---|---|---|---|")
        for pol in sorted(evict["policy"].unique()):
            r = analysis.budget_to_reach(samples, evict, pol, full.iloc[0], 0.99, "rouge2", n_boot=2000)
            b = ("not reached" if np.isnan(r["budget"]) else
                 (f"<= {r['budget']:.2f}" if r["budget"] == r["min_budget"] else f"{r['budget']:.2f}"))
            print(f"| {pol} | {b} | [{r['ci_lo']:.2f}, {r['ci_hi']:.2f}] | {r['reached']:.2f} | "
                  f"{r['min_budget']:.1f}-{r['max_budget']:.1f} | {r['n']} |")


def attention(res: Path) -> None:
    d = res / "exp4_attention"
    if not (d / "layers.csv").exists():
        return
    layers = pd.read_csv(d / "layers.csv")
    meta = json.loads((d / "meta.json").read_text())
    print(f"\n### exp4_attention: {meta['n_prompts']} prompts, mean {meta['prompt_tokens_mean']:.0f} "
          f"tokens\n")
    c = layers[layers["stat"] != "sparsity"].groupby(["stat", "x"])["value"].mean().unstack("stat")
    paper = {}  # the paper's curves as transcribed in paper_numbers.csv (strings: as read off its figure)
    if (res / "paper_numbers.csv").exists():
        pn = pd.read_csv(res / "paper_numbers.csv", dtype={"value": str})
        pn = pn[(pn["experiment"] == "exp4") & (pn["metric"] == "attn_mass")]
        paper = {m: dict(zip(g["x"].round(3), g["value"], strict=True)) for m,
                 g in pn.groupby("model", sort=False)}
    print("| top x % of tokens | " + " | ".join(c.columns) + "".join(f" | paper {m}" for m in paper)
          + " |\n|---|"
          + "---|" * (len(c.columns) + len(paper)))
    for x, r in c.iterrows():
        print(f"| {100 * x:.0f} | " + " | ".join(f"{v:.3f}" for v in r)
              + "".join(f" | {v.get(round(x, 3), '-')}" for v in paper.values()) + " |")
    sp = layers[layers["stat"] == "sparsity"].set_index("layer")["value"]
    print(f"\nsparsity per layer: mean {100 * sp.mean():.1f} %, min {100 * sp.min():.1f} % (layer "
          f"{sp.idxmin()}), "
          f"max {100 * sp.max():.1f} % (layer {sp.idxmax()})")
    print("per layer: " + ", ".join(f"{int(i)}: {100 * v:.0f}" for i, v in sp.items()))


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


_CONFIG = ("policy", "budget", "recent", "kv_quant", "num_beams", "beam_scores", "max_prompt_tokens",
           "max_new_tokens",
           "seed", "chat_template", "n_samples")


def _same(x: object, y: object) -> bool:
    if pd.isna(x) and pd.isna(y):
        return True
    if isinstance(x, float | int) and isinstance(y, float | int):
        return bool(np.isclose(x, y))
    return x == y


def same_config(res: Path, a: str, b: str, title: str) -> None:
    """Points of two result folders with the same config (policy and its knobs, budget, quantization, prompt
    and generation settings): identical outputs per point and the paired ROUGE-2 difference (``a`` -
    ``b``)."""
    if not (res / a / "points.csv").exists() or not (res / b / "points.csv").exists():
        return
    p_a, s_a = analysis.load_experiment(res, a)
    p_b, s_b = analysis.load_experiment(res, b)
    print(f"\n### {title} (same config; ROUGE-2)\n")
    print(f"| policy | budget | identical outputs | {b} | {a} | difference [95 % CI] "
          f"|\n|---|---|---|---|---|---|")
    def config(p: pd.DataFrame) -> list[str]:
        return [c for c in p.columns if c in _CONFIG or c.startswith("policy.")]

    # compared: the config columns both sides record; a knob only ``a`` records (newer code) is matched by
    # preferring its unset or default-looking rows, e.g. the plain point over its quantized twin
    common, extra = [c for c in config(p_a) if c in p_b.columns], [c for c in config(p_a)
                                                                   if c not in p_b.columns]
    for _, pb in p_b.sort_values(["policy", "budget"]).iterrows():
        pa = p_a[[all(_same(ra[c], pb[c]) for c in common) for _, ra in p_a.iterrows()]]
        if pa.empty:
            continue
        pa = pa.iloc[np.argsort(pa[extra].notna().sum(axis=1).to_numpy(), kind="stable")] if extra else pa
        x = s_a[s_a["point"] == pa["point"].iloc[0]].set_index("id")
        y = s_b[s_b["point"] == pb["point"]].set_index("id")
        ids = x.index.intersection(y.index)
        same = int((x.loc[ids, "prediction"] == y.loc[ids, "prediction"]).sum())
        d = analysis.paired_bootstrap(x.loc[ids, "rouge2"], y.loc[ids, "rouge2"], n_boot=5000)
        print(f"| {pb['policy']} | {pb['budget']:.1f} | {same}/{len(ids)} | "
              f"{y.loc[ids, 'rouge2'].mean():.2f} | "
              f"{x.loc[ids, 'rouge2'].mean():.2f} | {fmt_ci(d.mean, d.lo, d.hi)} |")


def realisations(res: Path) -> None:
    """Same config, two code versions: H2O must match exactly; Keyformer's noise stream changed in between."""
    same_config(res, "exp1_cnndm", "archive/exp1_cnndm_7e9326a", "exp1 at core commit 7e9326a vs now")


def devices(res: Path) -> None:
    """Same config on two devices: experiment 1 (CPU) against experiment 7's CNN/DM points (the H200,
    fp32)."""
    same_config(res, "exp7_field/cnndm", "exp1_cnndm", "exp1 on the CPU vs exp7's CNN/DM points on the H200")


def new_stream(res: Path, old: str = "archive/exp1_cnndm_oldstream") -> None:
    """Experiment 1's Keyformer points (the fast core's noise stream: hash noise, per-sample seeds) against
    the same points on the previous stream (kept in ``old``) and against H2O, paired over the same
    articles."""
    if not (res / old / "points.csv").exists() or not (res / "exp1_cnndm" / "points.csv").exists():
        return
    p_old, s_old = analysis.load_experiment(res, old)
    p_ref, s_ref = analysis.load_experiment(res, "exp1_cnndm")
    print(f"\n### exp1: Keyformer on the current noise stream vs the previous stream ({old}) and H2O "
          f"(ROUGE-2)\n")
    print("| budget | n | Keyformer now | Keyformer old | H2O | now - H2O [95 % CI] | now - old [95 % CI] |\n"
          "|---|---|---|---|---|---|---|")
    diffs = []
    for _, pk in p_ref[p_ref["policy"] == "keyformer"].sort_values("budget").iterrows():
        ph = p_ref[(p_ref["policy"] == "h2o") & np.isclose(p_ref["budget"], pk["budget"])]
        po = p_old[(p_old["policy"] == "keyformer") & np.isclose(p_old["budget"], pk["budget"])]
        if ph.empty or po.empty:
            continue
        a = s_ref[s_ref["point"] == pk["point"]].set_index("id")
        h = s_ref[s_ref["point"] == ph["point"].iloc[0]].set_index("id")
        o = s_old[s_old["point"] == po["point"].iloc[0]].set_index("id")
        ids = a.index.intersection(h.index).intersection(o.index)
        dh = analysis.paired_bootstrap(a.loc[ids, "rouge2"], h.loc[ids, "rouge2"], n_boot=5000)
        do = analysis.paired_bootstrap(a.loc[ids, "rouge2"], o.loc[ids, "rouge2"], n_boot=5000)
        diffs.append((a.loc[ids, "rouge2"] - o.loc[ids, "rouge2"]).rename(pk["budget"]))
        print(f"| {pk['budget']:.1f} | {len(ids)} | {a.loc[ids, 'rouge2'].mean():.2f} | "
              f"{o.loc[ids, 'rouge2'].mean():.2f} | "
              f"{h.loc[ids, 'rouge2'].mean():.2f} | {fmt_ci(dh.mean, dh.lo, dh.hi)} | "
              f"{fmt_ci(do.mean, do.lo, do.hi)} |")
    if len(diffs) > 1:  # pooled over budgets: per-article mean difference, bootstrapped over articles
        per_article = pd.concat(diffs, axis=1).dropna().mean(axis=1)
        m, lo, hi = analysis.mean_ci(per_article.to_numpy(), n_boot=5000)
        print(f"\nPooled over {len(diffs)} budgets ({len(per_article)} articles): now - old "
              f"{fmt_ci(m, lo, hi)}")


def powered(res: Path, name: str = "exp8_powered") -> None:
    """Experiment 8: the powered, paired Keyformer vs H2O study and its pre-registered decision."""
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    r = analysis.powered_study(points, samples)
    print(f"\n### {name}: Keyformer (mean of 2 noise seeds) - H2O, ROUGE-2, {r['n']} articles every core arm "
          "finished\n")
    if not r["n"]:
        return
    print("| budget | H2O | Keyformer | KF - H2O [95 % CI] | SD of d | seed 0 - seed 1 [95 % CI] "
          "|\n|---|---|---|---|---|---|")
    for b in r["budgets"]:
        s = b["s0_minus_s1"]
        print(f"| {b['budget']:.1f} | {b['h2o']:.2f} | {b['keyformer']:.2f} | "
              f"{fmt_ci(b['diff'], b['ci_lo'], b['ci_hi'])} | "
              f"{b['sd']:.2f} | {fmt_ci(s['diff'], s['ci_lo'], s['ci_hi'])} |")
    p = r["pooled"]
    print(f"\nPooled over {len(r['budgets'])} budgets: {fmt_ci(p['diff'], p['ci_lo'], p['ci_hi'])} "
          f"(half-width "
          f"{p['half_width']:.3f}, per-article SD {p['sd']:.2f}; half-width 0.25 needs n = "
          f"{p['n_for_half_width']}). "
          f"Decision: **{p['decision']}**. If the true gap is the observed one, a CI excluding 0 or +0.3 "
          f"needs "
          f"n = {p['n_decisive']}.")
    for e in r["extras"]:
        k = e.get("kf_minus_h2o_same_articles")
        print(f"\nAt 0.3, {e['variant']} - H2O over {e['n']} articles: "
              f"{fmt_ci(e['diff'], e['ci_lo'], e['ci_hi'])} "
              f"({e['mean']:.2f} vs {e['h2o']:.2f})"
              + (f"; on the same articles Keyformer (2 seeds) - H2O is "
                 f"{fmt_ci(k['diff'], k['ci_lo'], k['ci_hi'])}"
                 if k else ""))


def nanfix(res: Path, name: str = "exp8_powered", old: str = "archive/exp8_powered_buggy") -> None:
    """Experiment 8's Keyformer arms after the zero-noise fix (``name``), against the buggy run (``old``) on
    the same articles."""
    if not (res / name / "points.csv").exists() or not (res / old / "points.csv").exists():
        return
    p_new, s_new = analysis.load_experiment(res, name)
    p_old, s_old = analysis.load_experiment(res, old)
    r = analysis.powered_study(p_new, s_new)
    if not r["n"]:
        return
    ids = set(s_new.loc[s_new["point"].isin(p_new.loc[p_new["variant"] != "h2o", "point"]), "id"])
    r_old = analysis.powered_study(p_old, s_old[s_old["id"].isin(ids)])
    print(f"\n### {name} vs {old}: Keyformer after the zero-noise fix vs before, {r['n']} articles every arm "
          "finished\n")
    print("| point | identical outputs (fixed vs buggy) |\n|---|---|")
    for pt in sorted(p_new.loc[p_new["variant"] != "h2o", "point"]):
        a = s_new[s_new["point"] == pt].set_index("id")["prediction"]
        b = s_old[s_old["point"] == pt].set_index("id")["prediction"]
        common = a.index.intersection(b.index)
        print(f"| {pt} | {int((a[common] == b[common]).sum())}/{len(common)} |")
    p, q = r["pooled"], r_old["pooled"]
    print(f"\nPooled Keyformer - H2O, fixed: {fmt_ci(p['diff'], p['ci_lo'], p['ci_hi'])}; buggy, same "
          f"articles: "
          f"{fmt_ci(q['diff'], q['ci_lo'], q['ci_hi'])}")


def authors(res: Path, name: str = "exp8_authors", short: str = "exp8_powered") -> None:
    """Experiment 8's authors'-setting subset: does the long prompt, the long generation or the beam bring
    the gap?"""
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    ref = analysis.load_experiment(res, short) if (res / short / "points.csv").exists() else None
    r = analysis.authors_setting(points, samples, short=ref)
    chat = "raw Alpaca prompts" if points["chat_template"].eq(False).all() else "chat template"
    print(f"\n### {name}: 1920-token prompts ({chat}), 128 new tokens, greedy and beam 4 (shared scores); "
          f"ROUGE-2\n")
    print("| decoding | budget | n | H2O | Keyformer | KF - H2O [95 % CI] | n with full | full | H2O - full "
          "[95 % CI] | "
          "KF - full [95 % CI] |\n|---|---|---|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        ci = {k: fmt_ci(v["diff"], v["ci_lo"], v["ci_hi"]) if k in row else "-"
              for k, v in ((k, row.get(k, {})) for k in ("kf_minus_h2o", "h2o_minus_full", "kf_minus_full"))}
        print(f"| {'greedy' if row['num_beams'] == 1 else 'beam ' + str(row['num_beams'])} | "
              f"{row['budget']:.1f} | "
              f"{row['n']} | {row['h2o']:.2f} | {row['keyformer']:.2f} | {ci['kf_minus_h2o']} | "
              f"{row.get('n_full', 0)} | "
              f"{row.get('full', float('nan')):.2f} | {ci['h2o_minus_full']} | {ci['kf_minus_full']} |")
    for p in r["pooled"]:
        print(f"\nPooled KF - H2O, {'greedy' if p['num_beams'] == 1 else 'beam 4'} ({p['n']} articles): "
              f"{fmt_ci(p['diff'], p['ci_lo'], p['ci_hi'])} ({p['decision']})")
    if "prediction" in samples:
        loops = analysis.looping_share(samples, sorted(points["point"]))
        print("\nOutputs that loop (over 20 % of their word 4-grams repeat an earlier one): "
              + "; ".join(f"{pt} {v:.0%}" for pt, v in loops.items()))
    for key, what in (("beam_minus_greedy", "gap under beam 4 - gap under greedy"),
                      ("long_minus_short", "authors' greedy gap - exp8's gap (512-token chat prompt, 48 "
                                           "tokens, seed 0)")):
        d = r[key]
        if d:
            short = f"; exp8's gap on these articles {d['short_gap']:+.2f}" if "short_gap" in d else ""
            print(f"\n{what} ({d['n']} articles): {fmt_ci(d['diff'], d['ci_lo'], d['ci_hi'])}{short}")


def field(res: Path, name: str = "exp7_field", tasks: tuple[str, ...] | None = None) -> None:
    """Experiment 7 per task (all, or ``tasks``), complete points only: every policy's mean (rank) per
    budget, its pooled paired difference from Keyformer, and the quantized points against full."""
    for task, metric in analysis.EXP7_METRIC.items():
        if (tasks is not None and task not in tasks) or not (res / name / task / "points.csv").exists():
            continue
        points, samples = analysis.load_experiment(res / name, task, complete_only=True)
        r = analysis.field_ranking(points, samples, metric, n_boot=5000)
        if r.empty:
            continue
        per, pooled = r[r["budget"] != "pooled"], r[r["budget"] == "pooled"].set_index("policy")
        budgets = sorted(per["budget"].unique())
        full = points[(points["policy"] == "full") & points.get("kv_quant",
                                                                pd.Series(np.nan, points.index)).isna()]
        print(f"\n### {name}/{task}: {metric}, mean (rank among the policies at that budget) and n\n")
        if not full.empty:
            x = samples.loc[samples["point"] == full["point"].iloc[0], metric].astype(float)
            m, lo, hi = analysis.mean_ci(x.to_numpy(), n_boot=5000)
            print(f"Full cache: {m:.2f} [{lo:.2f}, {hi:.2f}] (n = {len(x)}).\n")
        print("| policy | " + " | ".join(f"{b:g}" for b in budgets) + " | n | pooled - Keyformer [95 % CI] | "
                                                                      "budgets |")
        print("|---|" + "---|" * len(budgets) + "---|---|---|")
        for pol in sorted(per["policy"].unique(), key=lambda p: (p != "keyformer", p)):
            cells, ns = [], set()
            for b in budgets:
                c = per[(per["policy"] == pol) & (per["budget"] == b)]
                cells.append(f"{c['mean'].iloc[0]:.2f} ({int(c['rank'].iloc[0])})" if len(c) else "-")
                ns |= {int(v) for v in c["n"]}
            n = "-".join(str(v) for v in sorted({min(ns), max(ns)}))
            d = pooled.loc[pol] if pol in pooled.index else None
            diff = fmt_ci(d["diff_vs_ref"], d["d_lo"], d["d_hi"]) if d is not None else "-"
            print(f"| {pol} | " + " | ".join(cells) + f" | {n} | {diff} | "
                                                      f"{d['budgets_used'] if d is not None else '-'} |")
        quant = points[points.get("kv_quant", pd.Series(np.nan, points.index)).notna()]
        if len(quant) and not full.empty:
            print("\n| quantized point | " + metric + " | KV held / full | - full [95 % CI] "
                                                      "|\n|---|---|---|---|")
            for _, q in quant.sort_values("point").iterrows():
                d = analysis.compare_points(samples, q["point"], full["point"].iloc[0], metric, n_boot=5000)
                print(f"| {q['point']} | {q[metric]:.2f} | {q['kv_ratio']:.3f} | "
                      f"{fmt_ci(d.mean, d.lo, d.hi)} |")


def kvpress(res: Path, name: str = "crosscheck_kvpress") -> None:
    """The kvpress cross-check's table as committed by ``keyformer-crosscheck-kvpress`` (``table.md``)."""
    f = res / name / "table.md"
    if not f.exists():
        return
    rows = [line for line in f.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    print(f"\n### {name}: ours vs kvpress, kept sets after the prompt and greedy outputs ({name}/table.md)\n")
    print("\n".join(rows))


def demo(res: Path, name: str = "demo") -> None:
    """The default run (``python run.py``: SmolLM2, the ``sample`` retrieval task) under each policy, from
    ``results/demo/`` (collected from ``python run.py -m policy=full,keyformer,h2o,window``); nothing if
    absent."""
    f = res / name / "points.csv"
    if not f.exists():
        return
    p = pd.read_csv(f)
    order = {"full": 0, "keyformer": 1, "h2o": 2, "window": 3}
    p = p.sort_values("policy", key=lambda c: c.map(lambda x: order.get(x, 9)))
    unknown = ["?"] * len(p)
    where = ", ".join(sorted({f"{d} {t}" for d, t in zip(p.get("device", unknown), p.get("dtype", unknown),
                                                           strict=True)}))
    commits = sorted({str(c)[:7] for c in p.get("git_commit", pd.Series(dtype=object)).dropna()})
    print(f"\n### {name}: the default run per policy ({int(p['n_done'].max())} samples; {where}"
          + (f"; git {', '.join(commits)}" if commits else "") + ")\n")
    print("| command | accuracy % | ROUGE-2 | ROUGE-L |\n|---|---|---|---|")
    for _, r in p.iterrows():
        cmd = "python run.py" + ("" if r["policy"] == "keyformer" else f" policy={r['policy']}")
        what = f" (Keyformer, budget {r['budget']:g})" if r["policy"] == "keyformer" else ""
        print(f"| `{cmd}`{what} | {r['accuracy']:.1f} | {r['rouge2']:.1f} | {r['rougeL']:.1f} |")


def brief(res: Path) -> None:
    """The headline numbers the top-level README quotes: experiment 1's and 8's pooled Keyformer - H2O, how
    many of SmolLM2's findings hold on Gemma 3 (experiment 9), and Keyformer's RULER rank (experiment 10)."""
    lines = []
    if (res / "exp1_cnndm" / "points.csv").exists():
        points, samples = analysis.load_experiment(res, "exp1_cnndm")
        evict = points[points["policy"] != "full"]
        d, used = analysis.pooled_difference(samples, evict, "keyformer", "h2o", "rouge2", n_boot=5000)
        lines.append(f"* Experiment 1 (CNN/DM, {d.n} articles, budgets {', '.join(f'{b:g}' for b in used)}): "
                     f"Keyformer - H2O pooled {fmt_ci(d.mean, d.lo, d.hi)} ROUGE-2.")
    if (res / "exp8_powered" / "points.csv").exists():
        points, samples = analysis.load_experiment(res, "exp8_powered")
        r = analysis.powered_study(points, samples)
        if r["n"]:
            q = r["pooled"]
            lines.append(f"* Experiment 8 (powered, {r['n']} articles, two noise seeds per article): "
                         f"Keyformer - H2O "
                         f"pooled {fmt_ci(q['diff'], q['ci_lo'], q['ci_hi'])} ROUGE-2, {q['decision']}.")
    if (res / "exp9_gemma").is_dir():
        g = _gemma_table(res)
        holds = g["holds"].tolist()
        testable = [h for h in holds if h not in ("n/a", "pending")]
        if testable:
            fw = int((g["holds_holm"] == "yes").sum())
            lines.append(f"* Experiment 9 (SmolLM2's findings of experiments 1 and 7 rerun on Gemma 3 270M): "
                         f"{testable.count('yes')} of the {len(testable)} testable comparisons hold"
                         f" ({fw} with Holm's family-wise correction)"
                         + (f" ({holds.count('partial')} on fewer budgets)" if "partial" in holds else "")
                         + (f"; {holds.count('pending')} not run yet" if "pending" in holds else "") + ".")
    lines += _ruler_brief(res) + _ruler_brief(res, "exp10_ruler_gemma")
    if lines:
        print("\n".join(lines))


def _ruler_model(name: str) -> str:
    """The model an experiment 10 section names (SmolLM2's, the default, is not named)."""
    return " on Gemma 3 270M" if name.endswith("_gemma") else ""


def _ruler_brief(res: Path, name: str = "exp10_ruler") -> list[str]:
    """Experiment 10's lines: Keyformer's rank among the compressed policies in each setting and the policies
    whose difference from it survives Holm's correction, in full at the ratio with the most policies, then
    the other ratios in one line. A ``caveat.txt`` in the experiment's folder is quoted after the ratio."""
    parts: dict[float, list[tuple[str, int, int, str]]] = {}
    for folder, label in RULER_SETTINGS:
        if not (res / name / folder / "points.csv").is_file():
            continue
        t = analysis.ruler_leaderboard(*analysis.load_experiment(str(res / name), folder, complete_only=True))
        avg = t[(t["task"] == "average") & (t["policy"] != "full")] if len(t) else t
        for _, g in (avg.groupby("budget") if len(avg) else []):
            kf = g[g["policy"] == "keyformer"]
            if kf.empty or len(g) < 2:  # a rank needs another policy with every task
                continue
            sig = g[g["vs_keyformer_p_holm"] < 0.05]
            said = ", ".join(f"{r['policy']} {'ahead' if r['vs_keyformer'] > 0 else 'behind'} "
                             f"({r['vs_keyformer']:+.1f})" for _, r in sig.sort_values("rank").iterrows())
            parts.setdefault(float(kf["ratio"].iloc[0]), []).append(
                (label, int(g.loc[kf.index[0], "rank"]), len(g), said))
    if not parts:
        return []
    head = max(parts, key=lambda r: (max(n for _, _, n, _ in parts[r]), r == 0.5))
    model = _ruler_model(name)
    note = res / name / "caveat.txt"  # a folder's standing caveat (e.g. how its prompts differ), one line
    caveat = f"; {' '.join(note.read_text().split())}" if note.is_file() else ""
    lines = [f"* Experiment 10{model} (RULER 4k, ratio {head:g}{caveat}): " + "; ".join(
        f"{label}, Keyformer ranks {rank} of {n} compressed policies ("
        + (f"Holm-surviving differences: {said}" if said else "none survives Holm's correction") + ")"
        for label, rank, n, said in parts[head]) + "."]
    rest = [f"ratio {ratio:g} {label} {rank} of {n}" + (f" ({said})" if said else "")
            for ratio, settings in sorted(parts.items()) if ratio != head
            for label, rank, n, said in settings]
    if rest:
        lines.append(f"* Experiment 10{model}, the other ratios (Keyformer's rank; Holm-surviving "
                     f"differences in brackets): {'; '.join(rest)}.")
    return lines


def bench_targets(res: Path, name: str = "bench") -> None:
    """The performance targets and whether the committed benchmark met each (its ``table.txt`` verdict)."""
    f = res / name / "table.txt"
    if not f.exists():
        return
    text = f.read_text(encoding="utf-8")
    head = text.splitlines()[0] if text else ""
    print(f"\n### {name}: targets, as judged by the committed run (`{name}/table.txt`)\n\n{head}\n")
    print("| # | target | verdict | value |\n|---|---|---|---|")
    for m in re.finditer(r"^Target (\d+): (.*): (MET|NOT MET) \(value ([^)]*)\)$", text, re.M):
        print(f"| {m[1]} | {m[2]} | {m[3].lower()} | {m[4]} |")


def exp6_speedup(res: Path, name: str = "bench") -> None:
    """Experiment 6 in brief, from the committed benchmark (``bench.json``): each policy's decode speedup over
    full per group and budget (median of the interleaved ratios) and the equal-KV-memory throughput gain."""
    f = res / name / "bench.json"
    if not f.exists():
        return
    r = json.loads(f.read_text(encoding="utf-8"))
    env = r["environment"]
    names = {"window": "window", "h2o": "H2O", "keyformer": "Keyformer"}
    print(f"\nFrom `{name}/bench.json` (git {str(env['git_commit'])[:7]}, {env['cpu']}, {env['threads']} "
          f"threads, fp32; decode speedup = full's ms per token over the policy's, median of "
          f"interleaved ratios):\n")
    groups: dict[str, list[dict]] = {}
    for row in r["rows"]:
        if row["policy"] in names:
            groups.setdefault(row["group"], []).append(row)
    for rows in groups.values():
        by_budget: dict[float, list[str]] = {}
        for row in rows:
            by_budget.setdefault(row["budget"], []).append(f"{names[row['policy']]} {row['speedup']:.2f}x")
        parts = "; ".join(f"{', '.join(v)} at budget {b:g}" for b, v in by_budget.items())
        L, B = rows[0]["prompt_len"], rows[0]["batch"]
        print(f"- **Decode vs full, {L}-token prompt, batch {B}:** {parts}.")
    t = r.get("throughput")
    if t:
        p, fu = t["policy"], t["full"]
        print(f"- **End to end at equal KV memory** ({t['kv_memory_bytes'] / 2**20:.0f} MiB of K/V, "
              f"{t['prompt_len']} + {t['new_tokens']} tokens): {p['label']} fits batch {p['batch']} against "
              f"full's {fu['batch']} and generates {t['e2e_gain']:.2f}x full's tokens per second, prefill "
              f"included ({t['gain']:.2f}x in decode alone).")


def long_verdict(row: dict) -> str:
    """Issue 23's CPU target for one long-benchmark row: >= 90 % of the bytes model's equal-memory gain, or,
    where the measured compute floor bounds the policy's step (floor ms > bytes-model ms), >= 90 % of the
    bound max(bytes model, floor)."""
    share, bound = row.get("share_of_bytes_model"), row.get("share_of_bound")
    if share is None:
        return "-"
    if share >= 0.9:
        return "met (bytes model)"
    if row.get("compute_bound") and bound is not None and bound >= 0.9:
        return "met (compute floor)"
    return "not met"


def _f2(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


def long_row_sessions(folder: Path, default_commit: str) -> dict[str, str]:
    """Config label (``full``, ``h2o@256``) -> ``"MM-DD HH:MM commit"``: when its first timed round finished
    (UTC) and the commit of the session that measured it, read from the run's ``journal.jsonl`` (each session
    journals its commit before its measurements; older journals have none: ``default_commit``). Empty without
    a journal."""
    f, out, commit = folder / "journal.jsonl", {}, default_commit
    if not f.exists():
        return out
    for line in f.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a last line cut short by a kill
            continue
        key = rec.get("key", "")
        if key.startswith("session/"):
            commit = str(rec["value"]["git_commit"])
        elif key.startswith("run/"):
            t = datetime.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S%z").astimezone(timezone.utc)
            out.setdefault(key.split("/")[2], f"{t:%m-%d %H:%M} {commit[:7]}")
    return out


def bench_long(res: Path, name: str = "bench/long") -> None:
    """The long-generation benchmark at a fixed KV memory budget (``keyformer-bench --long``), one row per
    setting and configuration from each ``<setting>/long.json``, with issue 23's CPU verdict per row and,
    where the setting's journal is there, when and at which commit each row was measured (a resumed run mixes
    sessions)."""
    files = sorted((res / name).glob("*/long.json"))
    runs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    if not runs:
        return
    for f, r in zip(files, runs, strict=True):
        r["_measured"] = long_row_sessions(f.parent, str(r["environment"]["git_commit"]))
    runs.sort(key=lambda r: (r["settings"][0]["prompt_len"], r["settings"][0]["new_tokens"]))
    def git(r: dict) -> str:  # the commits of every session of a resumed run (sorted)
        env = r["environment"]
        return "+".join(str(c)[:7] for c in env.get("sessions_commits") or [env["git_commit"]])

    envs = {(git(r), r["environment"]["cpu"], r["environment"]["threads"]) for r in runs}
    prov = "; ".join(f"git {c}, {cpu}, {t} threads" for c, cpu, t in sorted(envs))
    mixed = len({c for c, _, _ in envs}) > 1  # settings run at different commits: each row names its own
    budgets = sorted({round(r["kv_memory_budget_bytes"] / 2**20, 2) for r in runs})
    print(f"\n### {name}: long generations at a fixed KV memory budget ({prov}; fp32; "
          f"K/V budget {', '.join(f'{b:.0f}' for b in budgets)} MiB)\n")
    print("| setting | config | batch | decode tok/s | gain | bytes model | share | compute-floor bound | "
          "share of bound | e2e gain | agree | K/V MiB | rounds | CPU target | measured (UTC, git) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        for row in r["rows"]:
            cfg = row["policy"] + (f"@{row['budget']:g}" if row["budget"] is not None else "")
            ag = (row.get("agreement") or {}).get("match")
            kv = row.get("peak_kv_bytes")
            measured = r["_measured"].get(cfg)
            at = f" (git {git(r)})" if mixed and not measured else ""
            print(f"| {row['setting']}{'' if r.get('complete', True) else ' (partial)'}{at} | {cfg} | "
                  f"{row['batch']}{'*' if row.get('batch_capped') else ''} | "
                  f"{row['decode_tok_s']['median']:.1f} | {_f2(row.get('decode_gain'))}x | "
                  f"{_f2(row.get('bytes_model_gain'))}x | {_pct(row.get('share_of_bytes_model'))} | "
                  f"{_f2(row.get('bound_gain'))}x | {_pct(row.get('share_of_bound'))} | "
                  f"{_f2(row.get('e2e_gain'))}x | {_f2(ag)} | {'-' if kv is None else f'{kv / 2**20:.0f}'} | "
                  f"{row['decode_tok_s']['n']} | {long_verdict(row) if row['policy'] != 'full' else '-'} | "
                  f"{measured or '-'} |")
    bw = ", ".join(f"{r['settings'][0]['prompt_len']}+{r['settings'][0]['new_tokens']}: "
                   f"{r['bandwidth']['read_gbs']:.1f}" for r in runs)
    print("\nbatch: the largest that fits the K/V budget, measured (`*`: capped by `--max-batch`); gain: "
          "decode tok/s vs full at its own largest batch; share: gain / the bytes model's; compute-floor "
          "bound: the gain if each step took max(bytes model, a measured step over an 8-token cache); agree: "
          "token agreement with full; CPU target (issue 23): share >= 90 %, or share of bound >= 90 % where "
          "the floor bounds the step; measured: when the row's first timed round finished and the commit of "
          "the session that ran it (from the setting's journal; rows measured in different sessions were "
          f"timed hours or days apart). Read bandwidth (GB/s) per setting: {bw}.")
    for r in runs:
        bm = r.get("beams")
        if bm:
            parts = ", ".join(f"{b['policy']} {b['prefill_speedup']:.2f}x"
                              f"{'' if b['same_sequences'] else ' (sequences differ)'}" for b in bm["rows"])
            print(f"\nBeam search ({bm['num_beams']} beams, batch 1, {bm['prompt_len']}+{bm['new_tokens']}): "
                  f"prefill with the prompt run once per sample vs once per beam: {parts} faster.")


def bench_floors(res: Path, name: str = "bench/floors") -> None:
    """What stops each unmet CPU target, as ``keyformer-bench --floors`` measured it (``floors.json``)."""
    f = res / name / "floors.json"
    if not f.exists():
        return
    from keyformer.lab.bench.floors import rounds_label

    r = json.loads(f.read_text(encoding="utf-8"))
    env, pf = r["environment"], r["prefill"]["floors"]
    print(f"\n### What stops each unmet target, measured (`{name}/floors.txt`: git "
          f"{str(env['git_commit'])[:7]}, {env['cpu']}, {env['threads']} threads, "
          f"{rounds_label(r['args'])}, medians)\n")
    print("| target | measured | the floor under it |\n|---|---|---|")
    c = pf["components_x_full"]
    print(f"| 2: prefill at {r['prefill']['prompt_len']} tokens vs full | H2O {pf['h2o']['x_full']:.2f}x, "
          f"Keyformer {pf['keyformer']['x_full']:.2f}x | over full's prefill: materialised probabilities + "
          f"column sums {c['scores']:+.2f}, Gumbel temperature softmax {c['gumbel']:+.2f}, hash noise "
          f"{c['noise']:+.2f}; Keyformer without noise {pf['keyformer']['x_full_without_noise']:.2f}x |")
    for d in r["decode"]:
        fl = d["floors"]
        o, kf, sh = fl["overhead"], fl["overhead"]["keyformer"], fl["share_of_bytes"]
        print(f"| 1: decode {fl['point']} vs window | H2O {o['h2o']['x_window']:.3f}x, Keyformer "
              f"{kf['x_window']:.3f}x | over window's {fl['window_ms']:.1f} ms: scores "
              f"{kf['scores_ms']:+.1f} ms, Gumbel softmax {kf['gumbel_ms']:+.1f} ms, noise "
              f"{kf['noise_ms']:+.1f} ms |")
        print(f"| 3: decode {fl['point']}, share of the bytes model | Keyformer "
              f"{100 * sh['keyformer']:.0f} %, H2O {100 * sh['h2o']:.0f} %, window "
              f"{100 * sh['window']:.0f} % | compute floor {fl['floor_ms']:.1f} ms = "
              f"{100 * fl['floor_share_of_full']:.0f} % of full's "
              f"{fl['full_ms']:.1f} ms step: an evicted step can reach {fl['bound_speedup']:.3f}x vs the "
              f"bytes model's {fl['bytes_speedup']:.3f}x, at most {100 * fl['max_share_of_bytes']:.0f} % |")
    e = r.get("e2e")
    if e:
        pp = e["policy_parts"]
        print(f"| 5: end to end at equal KV memory ({e['setting']}, {e['policy']}) | {e['e2e_gain']:.3f}x "
              f"(decode alone {e['decode_gain']:.3f}x) | its prompt is {100 * pp['prefill_share']:.0f} % of "
              f"its time, at {e['policy_prefill_x_full_per_sample']:.2f}x full's per-sample prefill; at "
              f"full's rate the gain would be {e['e2e_gain_if_prefill_at_full_rate']:.3f}x (from "
              f"`{str(e['commit'])[:7]}`'s run) |")


PROVENANCE = ("device", "dtype", "batch_size", "git_commit", "code_version", "provenance")


def provenance(res: Path) -> None:
    """Per results folder: how many points ran where (device, dtype, batch size) and how that is known
    (``run``: the run's own metrics.json; ``backfilled``: a committed note or log, see
    ``experiments/backfill_provenance.py``), and how many record their code (``git_commit``,
    ``code_version``)."""
    rows = []
    for path in sorted(res.glob("**/points.csv")):
        p = pd.read_csv(path)
        if not set(PROVENANCE) <= set(p.columns):
            rows.append(f"| {path.parent.relative_to(res)} | {len(p)} | no provenance columns | | | |")
            continue
        how = p["provenance"].fillna("").str.split(":").str[0].replace("", "unknown")
        for (dev, dt, bs), g in p.groupby([p["device"].fillna("?"), p["dtype"].fillna("?"),
                                           p["batch_size"].fillna(-1).astype(int)], sort=True):
            kinds = ", ".join(f"{k} {n}" for k, n in how[g.index].value_counts().sort_index().items())
            rows.append(f"| {path.parent.relative_to(res)} | {len(g)} | {dev} {dt}, batch "
                        f"{bs if bs > 0 else '?'} | "
                        f"{kinds} | {int(g['git_commit'].notna().sum())} | "
                        f"{int(g['code_version'].notna().sum())} |")
    print("\n### provenance: where each folder's points ran and how that is known\n")
    print("| folder | points | device, dtype, batch | provenance | with git_commit | with code_version |\n"
          "|---|---|---|---|---|---|")
    print("\n".join(rows))


def exp7_devices(res: Path, name: str = "exp7_field") -> None:
    """Experiment 7's long tasks mix H200 and CPU points: for each task, the points per device and batch size,
    the configs that ran on both (the only way the committed rows can show device agreement), and the
    comparisons against Keyformer at one budget whose two points ran on different devices."""
    print(f"\n### {name}: devices and batch sizes per task (long tasks: what the committed rows can show)\n")
    print("| task | H200 (cuda) points, batch | CPU points, batch | same config on both | "
          "cross-device pairs vs Keyformer at one budget | points on another device than full |\n"
          "|---|---|---|---|---|---|")
    minority = {}
    for task in analysis.EXP7_METRIC:
        f = res / name / task / "points.csv"
        if not f.exists():
            continue
        p = pd.read_csv(f)
        if "device" not in p:
            continue
        quant = p["kv_quant"] if "kv_quant" in p else pd.Series(np.nan, p.index)
        setting = [f"{b:g}@{q}" for b, q in zip(p["budget"], quant.map(_quant_name), strict=True)]
        configs = list(zip(p["policy"], setting, strict=True))
        both = sum(1 for c in set(configs) if len({d for c2, d in zip(configs, p["device"], strict=True)
                                                   if c2 == c}) > 1)
        kf = {st: d for (pol, st), d in zip(configs, p["device"], strict=True) if pol == "keyformer"}
        cross = sum(1 for (pol, st), d in zip(configs, p["device"], strict=True)
                    if pol != "keyformer" and st in kf and kf[st] != d)
        ref = p.loc[(p["policy"] == "full") & quant.isna(), "device"]
        vs_full = int((p["device"] != ref.iloc[0]).sum()) if len(ref) else "-"
        cells = []
        for d in ("cuda", "cpu"):
            g = p[p["device"] == d]
            cells.append(f"{len(g)}, batch {'/'.join(str(int(b)) for b in sorted(g['batch_size'].unique()))}"
                         if len(g) else "0")
        print(f"| {task} | {cells[0]} | {cells[1]} | {both} | {cross} | {vs_full} |")
        if (p["device"] == "cuda").any() and (p["device"] == "cpu").any():
            small = min(("cuda", "cpu"), key=lambda d: int((p["device"] == d).sum()))
            minority[task] = (small, sorted(p.loc[p["device"] == small, "point"]))
    for task, (d, pts) in minority.items():
        print(f"\n{task}: to put every point on one device, rerun the {len(pts)} {d} points on the other: "
              + "; ".join(f"`{x}`" for x in pts))


FULL_STATE_BYTES = 8 + 4  # per (layer, KV head, slot): its position (int64) and its score (fp32), cache.py


def quant_bytes(res: Path, name: str = "exp7_field/cnndm", head_dim: int = 64) -> None:
    """KV bytes of experiment 7's CNN/DM points at 0.3 and full, against a full fp32 cache and a full 16-bit
    cache, with and without the per-slot state (position int64 + score fp32 per layer, KV head and slot, which
    the evicting cache holds for every point). ``head_dim`` is SmolLM2-135M's (576 hidden / 9 heads); the fp32
    bytes per token (layers x KV heads x 2 x head_dim x 4) are read off the data and checked to be a
    multiple."""
    f = res / name / "points.csv"
    if not f.exists():
        return
    points, samples = analysis.load_experiment(res, name)
    tok = samples["prompt_tokens"] + samples["generated_tokens"] - 1  # positions the cache wrote
    per_tok = (samples["kv_bytes_full"] / tok).round().mode().iloc[0]  # fp32 K+V bytes of one token
    heads_layers = per_tok / (2 * head_dim * 4)
    if heads_layers != int(heads_layers):
        raise ValueError(f"{name}: {per_tok} fp32 bytes per token is not layers x heads x 2 x {head_dim} x 4")
    q = points.get("kv_quant", pd.Series(np.nan, points.index))
    sel = points[q.notna() | (np.isclose(points["budget"], 0.3) & points["policy"].isin(["h2o", "keyformer"]))
                 | (points["policy"] == "full")].copy()
    sel["q"] = q[sel.index].map(_quant_name)
    full32 = float(samples["kv_bytes_full"].mean())  # mean per sample, as kv_bytes
    full16 = full32 / 2
    print(f"\n### {name}: KV bytes vs a full fp32 and a full 16-bit cache (per-slot state counted)\n")
    print(f"Per-slot state: {FULL_STATE_BYTES} bytes (position int64 + score fp32) per layer, KV head and "
          f"slot, "
          f"against {2 * head_dim * 4} bytes of fp32 K+V ({int(heads_layers)} layer-heads per token); a "
          f"plain "
          "full cache holds no such state.\n")
    print("| point | metric | bytes / full fp32 | bytes / full 16-bit | with state / full fp32 | "
          "with state / full 16-bit |\n|---|---|---|---|---|---|")
    for _, r in sel.sort_values(["q", "policy", "budget"]).iterrows():
        kv = float(r["kv_bytes"])
        kv16, state = _as_16bit(kv, r["q"]), kv / _slot_bytes(r["q"], head_dim) * FULL_STATE_BYTES
        print(f"| {r['point']} | {r['rouge2']:.2f} | {kv / full32:.3f} | {kv16 / full16:.3f} | "
              f"{(kv + state) / full32:.3f} | {(kv16 + state) / full16:.3f} |")


def _gemma_table(res: Path, name: str = "exp9_gemma") -> pd.DataFrame:
    """:func:`keyformer.lab.analysis.replication` over the committed rows (complete points only)."""

    def load(folder: Path):
        return analysis.load_experiment(folder.parent, folder.name, complete_only=True) \
            if (folder / "points.csv").exists() else None

    return analysis.replication(lambda f: load(res / f), lambda task: load(res / name / task))


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
    (:func:`keyformer.lab.analysis.seed_tables`): per seed and over the seeds' per-record mean."""
    t = analysis.seed_tables(res / name)
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


def _slot_bytes(q: str, head_dim: int) -> int:
    """K+V bytes of one (layer, KV head, slot): fp32 ``2 d 4``; int8/int4 codes ``2 d bits / 8`` plus an fp16
    scale and zero per 32 values (keyformer/core/quant.py)."""
    if q == "fp32":
        return 2 * head_dim * 4
    bits = {"int8": 8, "int4": 4}[q]  # kv_quant is recorded as its bits: see _quant_name
    return 2 * head_dim * bits // 8 + 2 * (head_dim // 32) * 2 * 2


def _quant_name(bits: object) -> str:
    """``fp32`` for an unquantized point (``kv_quant`` empty), else ``int8``/``int4`` (points.csv records
    bits)."""
    if bits is None or (isinstance(bits, float) and np.isnan(bits)):
        return "fp32"
    s = str(bits)
    return s if s.startswith("int") else f"int{int(float(s))}"


def _as_16bit(kv: float, q: str) -> float:
    """The same K/V held in a 16-bit model: unquantized tensors halve; codes and fp16 scales do not change."""
    return kv / 2 if q == "fp32" else kv


def pareto_bytes(res: Path, name: str = "exp7_field", head_dim: int = 64) -> None:
    """Experiment 7's accuracy-vs-bytes Pareto fronts (complete points) with the bytes counted two ways: K/V
    in fp32 (as measured) and in 16 bits, each with the per-slot state; which points are on each front."""
    print(f"\n### {name}: Pareto fronts with K/V in fp32 vs in 16 bits (per-slot state counted)\n")
    print("| task | metric | front, fp32 K/V | front, 16-bit K/V |\n|---|---|---|---|")
    for task, metric in analysis.EXP7_METRIC.items():
        if not (res / name / task / "points.csv").exists():
            continue
        p, _ = analysis.load_experiment(res / name, task, complete_only=True)
        q = (p["kv_quant"] if "kv_quant" in p else pd.Series(np.nan, p.index)).map(_quant_name)
        state = [kv / _slot_bytes(x, head_dim) * FULL_STATE_BYTES for kv,
                 x in zip(p["kv_bytes"], q, strict=True)]
        b32 = p["kv_bytes"].to_numpy(float) + np.array(state)
        b16 = np.array([_as_16bit(kv, x) for kv, x in zip(p["kv_bytes"], q, strict=True)]) + np.array(state)
        label = (p["policy"] + "@" + p["budget"].map(lambda b: f"{b:g}")
                 + q.map(lambda x: "" if x == "fp32" else f"+{x}"))
        fronts = []
        for b in (b32, b16):
            on = analysis.pareto_front(b, p[metric].to_numpy(float))
            order = np.argsort(b[on])
            fronts.append(", ".join(label[on].to_numpy()[order]))
        print(f"| {task} | {metric} | {fronts[0]} | {fronts[1]} |")


RULER_SETTINGS = (("aware", "question-aware"), ("agnostic", "query-agnostic"))


def _p_cell(p: float, n_boot: int = analysis.RULER_N_BOOT) -> str:
    """A bootstrap p as the table prints it: 3 decimals, or ``< 2/n_boot`` where no replicate crossed 0
    (a bootstrap p of 0 means "below its resolution", not 0)."""
    if np.isnan(p):
        return ""
    return f"< {2 / n_boot:g}" if p < 2 / n_boot else f"{p:.3f}"


def _ci_cell(r: pd.Series, key: str) -> str:
    v = r.get(key)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    return fmt_ci(float(v), float(r[f"{key}_lo"]), float(r[f"{key}_hi"]))


def ruler(res: Path, name: str = "exp10_ruler") -> None:
    """Experiment 10: the RULER 4k leaderboard (string_match_all, mean over tasks) per setting, from complete
    points only: policy x compression ratio with CIs, differences from Keyformer and from full, the ranking,
    and the question-aware and query-agnostic averages side by side (``analysis.ruler_leaderboard``)."""
    tables, frames = {}, {}
    for folder, label in RULER_SETTINGS:
        if (res / name / folder / "points.csv").is_file():
            pts, smp = analysis.load_experiment(str(res / name), folder, complete_only=True)
            tables[label], frames[label] = analysis.ruler_leaderboard(pts, smp), (pts, smp)
    if not any(len(t) for t in tables.values()):
        print(f"(no complete points of {name} yet)")
        return
    for label, t in tables.items():
        avg = t[t["task"] == "average"] if len(t) else t
        model = _ruler_model(name)
        print(f"\n**{label}**{model} (RULER 4k, string_match_all x 100, mean over "
              f"{int(avg['n_tasks'].max()) if len(avg) else 0} tasks; 95 % CIs)\n")
        if avg.empty:
            print("(no policy has every task yet)")
            continue
        print("| policy | ratio | budget | average [CI] | vs Keyformer [CI] | p (Holm) | vs full [CI] | rank "
              "| n | K/V held |\n|---|---|---|---|---|---|---|---|---|---|")
        for _, r in avg.sort_values(["ratio", "rank", "policy"]).iterrows():
            ph = r.get("vs_keyformer_p_holm", np.nan)
            print(f"| {r['policy']} | {r['ratio']:g} | {r['budget']:g} | {r['mean']:.1f} [{r['ci_lo']:.1f}, "
                  f"{r['ci_hi']:.1f}] | {_ci_cell(r, 'vs_keyformer')} | "
                  f"{_p_cell(ph)} | {_ci_cell(r, 'vs_full')} | "
                  f"{'' if np.isnan(r.get('rank', np.nan)) else int(r['rank'])} | {int(r['n'])} | "
                  f"{'' if np.isnan(r.get('kv_held', np.nan)) else format(r['kv_held'], '.3f')} |")
        print("\np (Holm): the two-sided bootstrap p of the difference from Keyformer, Holm-adjusted over "
              "the policies at that ratio (below 0.05: the difference survives the number of comparisons); "
              f"< {2 / analysis.RULER_N_BOOT:g}: no bootstrap replicate (of {analysis.RULER_N_BOOT}) "
              "crossed 0, the smallest p the bootstrap resolves, not p = 0. K/V held: the mean over the "
              "samples of `kv_bytes / kv_bytes_full`, the K/V bytes held at the end of each answer over what "
              "the full cache holds for the same tokens (prompt-only policies keep every generated token, "
              "decode-time evictors hold the budget; on a hybrid model the sliding layers' windows count "
              "too: docs/models.md).")
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
        gap = analysis.ruler_setting_gap(*frames.values())
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
    ``scripts/ruler_equal_bytes.py`` from the committed rows): each (setting, policy, ratio) that ends an
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
              f"{eq} | {_p_cell(r.get('equal_p_holm', np.nan))} |")
    print("\nRows: every policy and ratio whose `K/V held` exceeds Keyformer's by more than 0.005; "
          "differences are the policy minus Keyformer over the same records. p (Holm): the equal-bytes "
          "difference's two-sided bootstrap p, Holm-adjusted over the equal-bytes rows.")


def ruler_prompt_change(res: Path, name: str = "exp10_ruler_gemma",
                        old: str = "archive/exp10_ruler_gemma_nobos", change: str = "`<bos>`") -> None:
    """Experiment 10 on the same records with two prompt assemblies: ``name`` (now) against ``old`` (before a
    fix, e.g. Gemma 3's prompts without ``<bos>``), per policy and setting with every task complete in both,
    paired over the records (now - before, resampling within each task: ``analysis.ruler_setting_gap``)."""
    printed = False
    for folder, label in RULER_SETTINGS:
        if not all((res / d / folder / "points.csv").is_file() for d in (name, old)):
            continue
        before = analysis.load_experiment(str(res / old), folder, complete_only=True)
        now = analysis.load_experiment(str(res / name), folder, complete_only=True)
        diff = analysis.ruler_setting_gap(before, now)  # "agnostic" - "aware" = now - before
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


def gpu_runs(res: Path, name: str = "bench/gpu") -> list[Path]:
    """The dated GPU runs of ``scripts/gpu_bench.sh`` (``results/bench/gpu/<date>/``), oldest first."""
    return sorted(d for d in (res / name).glob("20*") if (d / "log.txt").is_file())


def bench_gpu(res: Path, name: str = "bench/gpu") -> None:
    """The latest prepared GPU run (``scripts/gpu_bench.sh``): batch-1 decode at 4k, eager vs CUDA-graph
    captured, and long generation at a fixed KV memory budget (``keyformer.lab.gpu_long``: the run's own
    section, then any extra calls in subfolders), with issue 23's two GPU targets per row."""
    runs = gpu_runs(res, name)
    if not runs:
        return
    d = runs[-1]
    head = (d / "log.txt").read_text(encoding="utf-8").splitlines()
    lat = json.loads((d / "latency" / "gpu_bench.json").read_text(encoding="utf-8"))
    m = lat["meta"]
    print(f"\n### {name}/{d.name}: {m['device_name']}, {m['dtype']}, torch {m['torch']}, transformers "
          f"{m['transformers']}; random weights and prompt ids ({head[0].split(' git ')[0]})\n")
    print("Batch-1 decode, ms/step (prompt + new tokens; `generate`: the latency cell, eager; then the same "
          "prompt decoded step by step, eager and with the steady step captured as a CUDA graph):\n")
    print("| model | setting | config | `generate` | eager | captured | same tokens | vs full (captured / "
          "full's fastest eager) | GPU target |")
    print("|---|---|---|---|---|---|---|---|---|")
    cells = lat["cells"]
    for g in (c for c in cells if c.get("kind") == "graphs"):
        latc = next(c for c in cells if c.get("kind") == "latency" and c["model"] == g["model"]
                    and c["L"] == g["L"])
        full = g["runs"]["full"]
        best_full = min(latc["runs"]["full"]["decode_ms_per_step"], full["eager"]["ms_per_step"],
                        full["captured"]["ms_per_step"])  # full never captures: three eager readings
        for p, r in g["runs"].items():
            cap = r["captured"]["captured_steps"] > 0
            ratio = best_full / (r["captured"] if cap else r["eager"])["ms_per_step"]
            target = "-" if p != "keyformer" else ("met" if ratio >= 1.0 else "not met")
            cfg = p if p == "full" else f"{p}@{m['budget']:g}"
            vs = "-" if p == "full" else f"{ratio:.2f}x"
            print(f"| {g['model']} | {g['L']}+{g['gen']} | {cfg} | "
                  f"{latc['runs'][p]['decode_ms_per_step']:.2f} | {r['eager']['ms_per_step']:.2f} | "
                  f"{r['captured']['ms_per_step']:.2f}{'' if cap else ' (eager)'} | {r['same_tokens']} | "
                  f"{vs} | {target} |")
    print("\nGPU target (issue 23), batch 1: Keyformer@0.5's decode >= 1.0x full's at 4k. Full keeps every "
          "token, so its attended length grows each step and it is never captured.\n")
    static_full_table(d / "static")
    fixed = [d / "fixed"] + sorted(x for x in d.iterdir()
                                   if (x / "gpu_long.json").is_file() and x.name != "fixed")
    print("Long generation at a fixed KV memory budget (full's K/V at batch 4), decode tok/s (median of the "
          "rounds) and gains vs full:\n")
    print("| call | setting | config | mode | batch | decode tok/s [IQR] | gain | bytes model | share | "
          "floor bound | share of bound | e2e gain | peak GPU GiB | rounds | vs captured full | GPU target |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in fixed:
        rep = json.loads((f / "gpu_long.json").read_text(encoding="utf-8"))
        for sec in rep["settings"]:
            st = sec.get("static_full")
            if st:
                t = st["decode_tok_s"]
                print(f"| {f.name} | {sec['setting']} | full, static cache | {st['mode']} | {st['batch']} | "
                      f"{t['median']:.1f} [{t['q1']:.1f}, {t['q3']:.1f}] |" + " - |" * 6
                      + f" {(st.get('peak_gpu_mib') or 0) / 1024:.1f} | {t['n']} | 1.00x | - |")
            for row in sec["rows"]:
                t = row["decode_tok_s"]
                cfg = row["policy"] + (f"@{row['budget']:g}" if row["budget"] is not None else "")
                target = "-" if row["policy"] == "full" else (
                    "met" if row["share_of_bytes_model"] >= 0.9 else "not met")
                vs = row.get("gain_vs_captured_full")
                vs = "-" if vs is None else f"{vs:.2f}x"
                print(f"| {f.name} | {row['setting']} | {cfg} | {row['mode']} | {row['batch']} | "
                      f"{t['median']:.1f} [{t['q1']:.1f}, {t['q3']:.1f}] | {_f2(row.get('decode_gain'))}x | "
                      f"{_f2(row.get('bytes_model_gain'))}x | {_pct(row.get('share_of_bytes_model'))} | "
                      f"{_f2(row.get('bound_gain'))}x | {_pct(row.get('share_of_bound'))} | "
                      f"{_f2(row.get('e2e_gain'))}x | {(row.get('peak_gpu_mib') or 0) / 1024:.1f} | "
                      f"{t['n']} | {vs} | {target} |")
            if sec["skipped"]:
                print(f"| {f.name} | {sec['setting']} | not run (time budget): {', '.join(sec['skipped'])} |"
                      + " |" * 13)
        bw = rep["bandwidth"]["read_gbs"]
        mem = rep["settings"][0]["memory_budget_bytes"] / 2**20 if rep["settings"] else float("nan")
        print(f"| {f.name} | read {bw:.0f} GB/s, K/V budget {mem:.0f} MiB, weights "
              f"{rep['weight_bytes'] / 2**30:.1f} GiB |" + " |" * 14)
    print("\nGPU target (issue 23), fixed memory: every policy >= 90 % of the bytes model's equal-memory "
          "gain (share). The bytes model: a step reads the weights once plus every sample's attended K/V at "
          "the measured read bandwidth; the floor bound: each step at least a measured step over an almost "
          "empty cache in the same mode (full: eager over 8 tokens; a captured policy: window@8, captured). "
          "Peak GPU: the most memory allocated during the run (weights included); the budget equalises the "
          "K/V bytes, not the prompt forward's transients at the larger batch.")


def static_full_table(d: Path) -> None:
    """The captured full baseline of a GPU run (``keyformer.lab.static_full``), or a line saying the run
    predates it."""
    f = d / "static_full.json"
    if not f.is_file():
        print("No captured full baseline in this run (it predates `keyformer.lab.static_full`, which "
              "`scripts/gpu_bench.sh` now runs): the `vs full` column compares a captured step with an eager "
              "one, so its gain is the capture's and eviction's together.\n")
        return
    rep = json.loads(f.read_text(encoding="utf-8"))
    print("The captured full baseline: full attention over a preallocated, masked cache (transformers' "
          "`StaticCache`) with its step captured too, against our full (eager) and each policy (captured "
          "where it can be), interleaved rounds in one process; ms/step median [IQR]:\n")
    print("| model | setting | config | mode | ms/step [IQR] | rounds | vs captured full | "
          "same tokens as full | GPU target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in rep["cells"]:
        if "runs" not in c:
            print(f"| {c['model']} | not run ({c['skipped']}) |" + " |" * 7)
            continue
        for name, r in c["runs"].items():
            m = r["ms_per_step"]
            cfg = name if name == "full" or name.startswith("static_full") else f"{name}@{c['budget']:g}"
            target = "-" if name != "keyformer" else (
                "met" if r["speed_vs_captured_full"] >= 1.0 else "not met")
            print(f"| {c['model']} | {c['L']}+{c['gen']} | {cfg} | "
                  f"{'captured' if r['captured_steps'] else 'eager'} | {m['median']:.2f} [{m['q1']:.2f}, "
                  f"{m['q3']:.2f}] | {m['n']} | {r['speed_vs_captured_full']:.2f}x | "
                  f"{r['same_tokens_as_full']} | {target} |")
    print("\nHere the batch-1 GPU target is judged against the captured full: Keyformer's step is the "
          "capture plus eviction, the baseline's the capture alone.\n")


def _field_task(task: str) -> Callable[[Path], None]:
    return lambda res: field(res, tasks=(task,))


PAIRS = [("keyformer", "h2o"), ("keyformer", "window"), ("h2o", "window")]
# name -> section; a README quotes a section between <!-- keyformer-report:NAME --> and its closing marker
SECTIONS: dict[str, Callable[[Path], None]] = {
    "demo": demo,
    "brief": brief,
    "provenance": provenance,
    "exp1_cnndm": lambda res: curve_experiment(res, "exp1_cnndm", PAIRS),
    "exp2_dialogsum": lambda res: curve_experiment(res, "exp2_dialogsum", PAIRS),
    "exp3_govreport": lambda res: curve_experiment(res, "exp3_govreport", PAIRS),
    "realisations": realisations,
    "devices": devices,
    "new_stream": new_stream,
    "powered": powered,
    "nanfix": nanfix,
    "authors": authors,
    "authors_raw": lambda res: authors(res, "archive/exp8_authors_raw"),
    **{f"exp7_field/{t}": _field_task(t) for t in analysis.EXP7_METRIC},
    "exp7_devices": exp7_devices,
    "quant_bytes": quant_bytes,
    "pareto_bytes": pareto_bytes,
    "exp9_gemma": gemma,
    "attention": attention,
    "ablations": ablations,
    "kvpress": kvpress,
    "kvpress_new": lambda res: kvpress(res, "crosscheck_kvpress/new_policies"),
    "kvpress_kvzip": lambda res: kvpress(res, "crosscheck_kvpress/kvzip"),
    "kvpress_kvzip_long": lambda res: kvpress(res, "crosscheck_kvpress/kvzip_long"),
    "bench_targets": bench_targets,
    "exp6_speedup": exp6_speedup,
    "bench_floors": bench_floors,
    "bench_long": bench_long,
    "bench_gpu": bench_gpu,
    "exp10_ruler": ruler,
    "exp10_ruler_gemma": lambda res: ruler(res, "exp10_ruler_gemma"),
    "exp10_gemma_bos": ruler_prompt_change,
    "exp10_equal_bytes": ruler_equal_bytes,
}
README_FILES = (Path("README.md"), Path("results/README.md"), Path("results/bench/README.md"))


def readme_files() -> tuple[Path, ...]:
    """The files whose marked tables ``--update-readme``/``--check-readme`` handle: READMEs and docs/*.md."""
    return (*README_FILES, *sorted(Path("docs").glob("*.md")))


MARKED = re.compile(r"(<!-- keyformer-report:(?P<name>[^ >]+) -->\n)(?P<body>.*?)(<!-- "
                    r"/keyformer-report:(?P=name) -->)",
                    re.S)


def render(name: str, res: Path) -> str:
    """One section's output as a README quotes it (stripped of surrounding blank lines)."""
    if name not in SECTIONS:
        raise KeyError(f"keyformer-report: unknown section {name!r}; valid: {', '.join(SECTIONS)}")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        SECTIONS[name](res)
    return buf.getvalue().strip("\n")


def marked(text: str) -> list[tuple[str, str]]:
    """``(section, quoted text)`` of every marked region of a README."""
    return [(m["name"], m["body"].strip("\n")) for m in MARKED.finditer(text)]


def update_text(text: str, res: Path, cache: dict[str, str] | None = None) -> str:
    """``text`` with every marked region replaced by its section's current output."""
    cache = {} if cache is None else cache

    def sub(m: re.Match) -> str:
        if m["name"] not in cache:
            cache[m["name"]] = render(m["name"], res)
        return f"{m.group(1)}{cache[m['name']]}\n{m.group(4)}"

    return MARKED.sub(sub, text)


def drift(paths: tuple[Path, ...], res: Path) -> list[str]:
    """``path: section`` for each marked region whose text differs from its section's output."""
    cache: dict[str, str] = {}
    out = []
    for path in paths:
        for name, body in marked(path.read_text(encoding="utf-8")):
            if name not in cache:
                cache[name] = render(name, res)
            if body != cache[name]:
                out.append(f"{path}: {name}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path("results"), help="curated results folder")
    ap.add_argument("--section", action="append", metavar="NAME", help="print only this section (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the section names")
    ap.add_argument("--update-readme", nargs="*", type=Path, metavar="FILE",
                    help="rewrite the marked tables of these files (default: the READMEs and docs/*.md)")
    ap.add_argument("--check-readme", nargs="*", type=Path, metavar="FILE",
                    help="exit 1 if a marked table of these files differs from the data")
    args = ap.parse_args(argv)
    res = args.results
    if args.list:
        print("\n".join(SECTIONS))
        return 0
    if args.update_readme is not None:
        cache: dict[str, str] = {}
        for path in args.update_readme or readme_files():
            old = path.read_text(encoding="utf-8")
            new = update_text(old, res, cache)
            if new != old:
                path.write_text(new, encoding="utf-8")
            print(f"{path}: {len(marked(new))} marked tables, {'updated' if new != old else 'unchanged'}")
        return 0
    if args.check_readme is not None:
        bad = drift(tuple(args.check_readme or readme_files()), res)
        for b in bad:
            print(f"differs from keyformer-report: {b}", file=sys.stderr)
        return 1 if bad else 0
    if not res.is_dir():
        print(f"error: --results {res}: no such folder (a curated results/ tree, or a folder written by "
              "keyformer-collect)", file=sys.stderr)
        return 2
    if (res / "points.csv").is_file() and not args.section:  # one collected sweep (keyformer-collect --out)
        try:
            text = render_collected(res)
        except Exception as e:  # noqa: BLE001 - any unreadable table: one line
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"error: --results {res}: cannot read its points.csv/samples.csv: {why}", file=sys.stderr)
            return 2
        print(text)
        return 0
    if not args.section and not any(res.glob("**/*.csv")):
        print(f"error: --results {res}: nothing to report (no points.csv of keyformer-collect, and none of "
              f"the "
              "curated experiment tables)", file=sys.stderr)
        return 2
    for name in args.section or SECTIONS:
        try:
            text = render(name, res)
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        if text:
            print("\n" + text)
    return 0


def render_collected(folder: Path) -> str:
    """The curve tables of one collected folder (``points.csv`` + ``samples.csv`` of keyformer-collect)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        curve_experiment(folder.parent, folder.name, PAIRS)
    return buf.getvalue().strip("\n")


if __name__ == "__main__":
    raise SystemExit(main())
