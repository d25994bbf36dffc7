"""Experiment 8's report sections: the powered study, the zero-noise fix, the authors' setting."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.exp8_powered import analysis as exp8
from keyformer.lab import analysis
from keyformer.lab.report import fmt_ci


def powered(res: Path, name: str = "exp8_powered") -> None:
    """Experiment 8: the powered, paired Keyformer vs H2O study and its pre-registered decision."""
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    r = exp8.powered_study(points, samples)
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
    r = exp8.powered_study(p_new, s_new)
    if not r["n"]:
        return
    ids = set(s_new.loc[s_new["point"].isin(p_new.loc[p_new["variant"] != "h2o", "point"]), "id"])
    r_old = exp8.powered_study(p_old, s_old[s_old["id"].isin(ids)])
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
    r = exp8.authors_setting(points, samples, short=ref)
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


def brief(res: Path) -> list[str]:
    """The headline line: experiment 8's pooled Keyformer - H2O and its pre-registered decision."""
    if not (res / "exp8_powered" / "points.csv").exists():
        return []
    r = exp8.powered_study(*analysis.load_experiment(res, "exp8_powered"))
    if not r["n"]:
        return []
    q = r["pooled"]
    return [f"* Experiment 8 (powered, {r['n']} articles, two noise seeds per article): Keyformer - H2O "
            f"pooled {fmt_ci(q['diff'], q['ci_lo'], q['ci_hi'])} ROUGE-2, {q['decision']}."]


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'powered': powered,
    'nanfix': nanfix,
    'authors': authors,
    'authors_raw': lambda res: authors(res, "archive/exp8_authors_raw"),
}
