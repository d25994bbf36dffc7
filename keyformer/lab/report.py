"""Print the markdown tables of results/README.md from the curated results (paired bootstrap CIs).

    keyformer-report                    # all experiments whose results exist under ./results
    keyformer-report --results DIR      # another curated results folder
"""

from __future__ import annotations

import argparse
import json
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
    print("\nPaired ROUGE-2 differences (95 % bootstrap CI; each pair over the articles both points finished):\n")
    print("| budget | comparison | n | diff [95 % CI] | P(diff <= 0) |\n|---|---|---|---|---|")
    t = analysis.pairwise_table(samples, evict, pairs, "rouge2", n_boot=5000)
    for r in t.itertuples():
        print(f"| {r.budget:.1f} | {r.a} - {r.b} | {r.n} | {fmt_ci(r.diff, r.ci_lo, r.ci_hi)} | {r.p_le_0:.3f} |")
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
    print(f"\n### exp4_attention: {meta['n_prompts']} prompts, mean {meta['prompt_tokens_mean']:.0f} tokens\n")
    c = layers[layers["stat"] != "sparsity"].groupby(["stat", "x"])["value"].mean().unstack("stat")
    print("| top x % of tokens | " + " | ".join(c.columns) + " |\n|---|" + "---|" * len(c.columns))
    for x, r in c.iterrows():
        print(f"| {100 * x:.0f} | " + " | ".join(f"{v:.3f}" for v in r) + " |")
    sp = layers[layers["stat"] == "sparsity"].set_index("layer")["value"]
    print(f"\nsparsity per layer: mean {100 * sp.mean():.1f} %, min {100 * sp.min():.1f} % (layer {sp.idxmin()}), "
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


_CONFIG = ("policy", "budget", "recent", "kv_quant", "num_beams", "beam_scores", "max_prompt_tokens", "max_new_tokens",
           "seed", "chat_template", "n_samples")


def _same(x: object, y: object) -> bool:
    if pd.isna(x) and pd.isna(y):
        return True
    if isinstance(x, float | int) and isinstance(y, float | int):
        return bool(np.isclose(x, y))
    return x == y


def same_config(res: Path, a: str, b: str, title: str) -> None:
    """Points of two result folders with the same config (policy and its knobs, budget, quantization, prompt and
    generation settings): identical outputs per point and the paired ROUGE-2 difference (``a`` - ``b``)."""
    if not (res / a / "points.csv").exists() or not (res / b / "points.csv").exists():
        return
    p_a, s_a = analysis.load_experiment(res, a)
    p_b, s_b = analysis.load_experiment(res, b)
    print(f"\n### {title} (same config; ROUGE-2)\n")
    print(f"| policy | budget | identical outputs | {b} | {a} | difference [95 % CI] |\n|---|---|---|---|---|---|")
    def config(p: pd.DataFrame) -> list[str]:
        return [c for c in p.columns if c in _CONFIG or c.startswith("policy.")]

    # compared: the config columns both sides record; a knob only ``a`` records (newer code) is matched by
    # preferring its unset or default-looking rows, e.g. the plain point over its quantized twin
    common, extra = [c for c in config(p_a) if c in p_b.columns], [c for c in config(p_a) if c not in p_b.columns]
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
        print(f"| {pb['policy']} | {pb['budget']:.1f} | {same}/{len(ids)} | {y.loc[ids, 'rouge2'].mean():.2f} | "
              f"{x.loc[ids, 'rouge2'].mean():.2f} | {fmt_ci(d.mean, d.lo, d.hi)} |")


def realisations(res: Path) -> None:
    """Same config, two code versions: H2O must match exactly; Keyformer's noise stream changed in between."""
    same_config(res, "exp1_cnndm", "exp1_cnndm_7e9326a", "exp1 at core commit 7e9326a vs now")


def devices(res: Path) -> None:
    """Same config on two devices: experiment 1 (CPU) against experiment 7's CNN/DM points (the H200, fp32)."""
    same_config(res, "exp7_field/cnndm", "exp1_cnndm", "exp1 on the CPU vs exp7's CNN/DM points on the H200")


def new_stream(res: Path, old: str = "exp1_cnndm_oldstream") -> None:
    """Experiment 1's Keyformer points (the fast core's noise stream: hash noise, per-sample seeds) against the
    same points on the previous stream (kept in ``old``) and against H2O, paired over the same articles."""
    if not (res / old / "points.csv").exists() or not (res / "exp1_cnndm" / "points.csv").exists():
        return
    p_old, s_old = analysis.load_experiment(res, old)
    p_ref, s_ref = analysis.load_experiment(res, "exp1_cnndm")
    print(f"\n### exp1: Keyformer on the current noise stream vs the previous stream ({old}) and H2O (ROUGE-2)\n")
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
        print(f"| {pk['budget']:.1f} | {len(ids)} | {a.loc[ids, 'rouge2'].mean():.2f} | {o.loc[ids, 'rouge2'].mean():.2f} | "
              f"{h.loc[ids, 'rouge2'].mean():.2f} | {fmt_ci(dh.mean, dh.lo, dh.hi)} | {fmt_ci(do.mean, do.lo, do.hi)} |")
    if len(diffs) > 1:  # pooled over budgets: per-article mean difference, bootstrapped over articles
        per_article = pd.concat(diffs, axis=1).dropna().mean(axis=1)
        m, lo, hi = analysis.mean_ci(per_article.to_numpy(), n_boot=5000)
        print(f"\nPooled over {len(diffs)} budgets ({len(per_article)} articles): now - old {fmt_ci(m, lo, hi)}")


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
    print("| budget | H2O | Keyformer | KF - H2O [95 % CI] | SD of d | seed 0 - seed 1 [95 % CI] |\n|---|---|---|---|---|---|")
    for b in r["budgets"]:
        s = b["s0_minus_s1"]
        print(f"| {b['budget']:.1f} | {b['h2o']:.2f} | {b['keyformer']:.2f} | {fmt_ci(b['diff'], b['ci_lo'], b['ci_hi'])} | "
              f"{b['sd']:.2f} | {fmt_ci(s['diff'], s['ci_lo'], s['ci_hi'])} |")
    p = r["pooled"]
    print(f"\nPooled over {len(r['budgets'])} budgets: {fmt_ci(p['diff'], p['ci_lo'], p['ci_hi'])} (half-width "
          f"{p['half_width']:.3f}, per-article SD {p['sd']:.2f}; half-width 0.25 needs n = {p['n_for_half_width']}). "
          f"Decision: **{p['decision']}**. If the true gap is the observed one, a CI excluding 0 or +0.3 needs "
          f"n = {p['n_decisive']}.")
    for e in r["extras"]:
        k = e.get("kf_minus_h2o_same_articles")
        print(f"\nAt 0.3, {e['variant']} - H2O over {e['n']} articles: {fmt_ci(e['diff'], e['ci_lo'], e['ci_hi'])} "
              f"({e['mean']:.2f} vs {e['h2o']:.2f})"
              + (f"; on the same articles Keyformer (2 seeds) - H2O is {fmt_ci(k['diff'], k['ci_lo'], k['ci_hi'])}"
                 if k else ""))


def nanfix(res: Path, name: str = "exp8_powered", old: str = "exp8_powered_buggy") -> None:
    """Experiment 8's Keyformer arms after the zero-noise fix (``name``), against the buggy run (``old``) on the
    same articles."""
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
    print(f"\nPooled Keyformer - H2O, fixed: {fmt_ci(p['diff'], p['ci_lo'], p['ci_hi'])}; buggy, same articles: "
          f"{fmt_ci(q['diff'], q['ci_lo'], q['ci_hi'])}")


def authors(res: Path, name: str = "exp8_authors", short: str = "exp8_powered") -> None:
    """Experiment 8's authors'-setting subset: does the long prompt, the long generation or the beam bring the gap?"""
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    ref = analysis.load_experiment(res, short) if (res / short / "points.csv").exists() else None
    r = analysis.authors_setting(points, samples, short=ref)
    chat = "raw Alpaca prompts" if points["chat_template"].eq(False).all() else "chat template"
    print(f"\n### {name}: 1920-token prompts ({chat}), 128 new tokens, greedy and beam 4 (shared scores); ROUGE-2\n")
    print("| decoding | budget | n | H2O | Keyformer | KF - H2O [95 % CI] | n with full | full | H2O - full [95 % CI] | "
          "KF - full [95 % CI] |\n|---|---|---|---|---|---|---|---|---|---|")
    for row in r["rows"]:
        ci = {k: fmt_ci(v["diff"], v["ci_lo"], v["ci_hi"]) if k in row else "-"
              for k, v in ((k, row.get(k, {})) for k in ("kf_minus_h2o", "h2o_minus_full", "kf_minus_full"))}
        print(f"| {'greedy' if row['num_beams'] == 1 else 'beam ' + str(row['num_beams'])} | {row['budget']:.1f} | "
              f"{row['n']} | {row['h2o']:.2f} | {row['keyformer']:.2f} | {ci['kf_minus_h2o']} | {row.get('n_full', 0)} | "
              f"{row.get('full', float('nan')):.2f} | {ci['h2o_minus_full']} | {ci['kf_minus_full']} |")
    for p in r["pooled"]:
        print(f"\nPooled KF - H2O, {'greedy' if p['num_beams'] == 1 else 'beam 4'} ({p['n']} articles): "
              f"{fmt_ci(p['diff'], p['ci_lo'], p['ci_hi'])} ({p['decision']})")
    if "prediction" in samples:
        loops = analysis.looping_share(samples, sorted(points["point"]))
        print("\nOutputs that loop (over 20 % of their word 4-grams repeat an earlier one): "
              + "; ".join(f"{pt} {v:.0%}" for pt, v in loops.items()))
    for key, what in (("beam_minus_greedy", "gap under beam 4 - gap under greedy"),
                      ("long_minus_short", "authors' greedy gap - exp8's gap (512-token chat prompt, 48 tokens, seed 0)")):
        d = r[key]
        if d:
            short = f"; exp8's gap on these articles {d['short_gap']:+.2f}" if "short_gap" in d else ""
            print(f"\n{what} ({d['n']} articles): {fmt_ci(d['diff'], d['ci_lo'], d['ci_hi'])}{short}")


def field(res: Path, name: str = "exp7_field") -> None:
    """Experiment 7 per task, complete points only: every policy's mean (rank) per budget, its pooled paired
    difference from Keyformer, and the quantized points against full."""
    for task, metric in analysis.EXP7_METRIC.items():
        if not (res / name / task / "points.csv").exists():
            continue
        points, samples = analysis.load_experiment(res / name, task, complete_only=True)
        r = analysis.field_ranking(points, samples, metric, n_boot=5000)
        if r.empty:
            continue
        per, pooled = r[r["budget"] != "pooled"], r[r["budget"] == "pooled"].set_index("policy")
        budgets = sorted(per["budget"].unique())
        full = points[(points["policy"] == "full") & points.get("kv_quant", pd.Series(np.nan, points.index)).isna()]
        print(f"\n### {name}/{task}: {metric}, mean (rank among the policies at that budget) and n\n")
        if not full.empty:
            x = samples.loc[samples["point"] == full["point"].iloc[0], metric].astype(float)
            m, lo, hi = analysis.mean_ci(x.to_numpy(), n_boot=5000)
            print(f"Full cache: {m:.2f} [{lo:.2f}, {hi:.2f}] (n = {len(x)}).\n")
        print("| policy | " + " | ".join(f"{b:g}" for b in budgets) + " | n | pooled - Keyformer [95 % CI] | budgets |")
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
            print(f"| {pol} | " + " | ".join(cells) + f" | {n} | {diff} | {d['budgets_used'] if d is not None else '-'} |")
        quant = points[points.get("kv_quant", pd.Series(np.nan, points.index)).notna()]
        if len(quant) and not full.empty:
            print("\n| quantized point | " + metric + " | KV held / full | - full [95 % CI] |\n|---|---|---|---|")
            for _, q in quant.sort_values("point").iterrows():
                d = analysis.compare_points(samples, q["point"], full["point"].iloc[0], metric, n_boot=5000)
                print(f"| {q['point']} | {q[metric]:.2f} | {q['kv_ratio']:.3f} | {fmt_ci(d.mean, d.lo, d.hi)} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path("results"), help="curated results folder")
    res = ap.parse_args(argv).results
    pairs = [("keyformer", "h2o"), ("keyformer", "window"), ("h2o", "window")]
    for name in ("exp1_cnndm", "exp2_dialogsum", "exp3_govreport"):
        curve_experiment(res, name, pairs)
    realisations(res)
    devices(res)
    new_stream(res)
    powered(res)
    nanfix(res)
    authors(res)
    authors(res, "exp8_authors_raw")
    field(res)
    attention(res)
    ablations(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
