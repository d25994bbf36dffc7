"""Experiment 8's report sections: the powered study, the zero-noise fix, the authors' setting."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp8_powered import analysis as exp8
from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import findings_of, fmt_ci


def powered(res: Path, name: str = "exp8_powered") -> None:
    """Experiment 8: the powered, paired Keyformer vs H2O study and its pre-registered decision."""
    if not (res / name / "points.csv").exists():
        return
    points, samples = analysis.load_experiment(res, name)
    r = exp8.powered_study(points, samples)
    found = findings_of(res, name)

    def ci(fid: str, d: dict) -> str:
        """The finding's interval where the findings hold it (one draw per number), else the bootstrap's."""
        f = found.get(fid)
        return fnd.fmt_ci(f, 2) if f is not None else f"{fmt_ci(d['diff'], d['ci_lo'], d['ci_hi'])} (boot)"

    print(f"\n### {name}: Keyformer (mean of 2 noise seeds) - H2O, ROUGE-2, {r['n']} articles every core arm "
          "finished\n")
    if not r["n"]:
        return
    print("| budget | H2O | Keyformer | KF - H2O [95 %, findings] | SD of d | seed 0 - seed 1 [95 %, "
          "findings] |\n|---|---|---|---|---|---|")
    for b in r["budgets"]:
        at = f"{b['budget']:g}"
        print(f"| {b['budget']:.1f} | {b['h2o']:.2f} | {b['keyformer']:.2f} | {ci('exp8.budget@' + at, b)} | "
              f"{b['sd']:.2f} | {ci('exp8.seeds@' + at, b['s0_minus_s1'])} |")
    p = r["pooled"]
    print(f"\nPooled over {len(r['budgets'])} budgets: {ci('exp8.pooled', p)} "
          f"(half-width "
          f"{p['half_width']:.3f}, per-article SD {p['sd']:.2f}; half-width 0.25 needs n = "
          f"{p['n_for_half_width']}). "
          f"Decision: **{p['decision']}**. If the true gap is the observed one, a CI excluding 0 or +0.3 "
          f"needs "
          f"n = {p['n_decisive']}.")
    for e in r["extras"]:
        k = e.get("kf_minus_h2o_same_articles")
        print(f"\nAt 0.3, {e['variant']} - H2O over {e['n']} articles: "
              f"{ci('exp8.extra.' + e['variant'], e)} "
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


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'powered': powered,
    'nanfix': nanfix,
    'authors': authors,
    'authors_raw': lambda res: authors(res, "archive/exp8_authors_raw"),
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
RESULTS = "exp8_powered"
TITLE = "8: powered Keyformer vs H2O"
QUESTION = ("Does the paper's Keyformer > H2O gain (at least +0.3 ROUGE-2) transfer to SmolLM2 on CNN/DM, "
            "and does the authors' setting (long prompt, long generation, beam 4) bring it?")
BUDGETS = (0.2, 0.3, 0.5)  # experiment 8's core budgets (its README)
AUTHORS_BUDGETS = (0.5, 0.3)  # the authors'-setting subset's
DECODINGS = {1: "greedy", 4: "beam4"}
DEFINITION = {
    "metric": "rouge2",
    "paper_gap": exp8.PAPER_GAP,
    "headline": ("exp8.pooled: per article, d = mean(Keyformer seeds 0 and 1) - H2O averaged over the "
                 "budgets 0.2, 0.3, 0.5; the single pre-registered test (no family), read with the "
                 "pre-registered rule experiments.exp8_powered.analysis.decide on its 95 % CI against the "
                 "paper's +0.3"),
    "families": {
        "exp8.budgets": [f"exp8.budget@{b:g}" for b in BUDGETS],
        "exp8.seeds": [f"exp8.seeds@{b:g}" for b in BUDGETS],
        "exp8.extras": ["exp8.extra.keyformer_ns4", "exp8.extra.h2o_recent05"],
        "exp8.authors.gap": ["exp8.authors.greedy", "exp8.authors.beam4", "exp8.authors.beam_minus_greedy",
                             "exp8.authors.long_minus_short"],
        "exp8.authors.budgets": [f"exp8.authors.{d}@{b:g}" for d in DECODINGS.values()
                                 for b in AUTHORS_BUDGETS],
        "exp8.authors.vs_full": [f"exp8.authors.{d}@{b:g}.{p}_full" for d in DECODINGS.values()
                                 for b in AUTHORS_BUDGETS for p in ("h2o", "keyformer")],
    },
    "design": ("paired sign-flip test over articles, one stratum (a pooled comparison's per-article value is "
               "already its mean over budgets); the core "
               "comparisons use the articles every core arm finished, the others the articles their points "
               "finished; Holm within each family at alpha 0.05; only exp8.pooled decides, the families are "
               "secondary (per-budget and extra arms descriptive in the pre-registration)"),
    "alpha": fnd.ALPHA,
    "margin": 0.3,  # ROUGE-2 points: the paper's gap; within +-0.3 no paper-sized gain either way
    "roles": {"exp8.pooled": "confirmatory", "exp8.budgets": "descriptive", "exp8.seeds": "descriptive",
              "exp8.extras": "descriptive", "exp8.authors.*": "exploratory"},
    "registered": {"exp8.pooled": {"commit": "311ba2d", "file": "experiments/exp8_powered.md",
                                   "contains": "## Decision rule (stated before the runs",
                                   "rows": ["exp8_powered"]}},
    "incomplete": "a point with fewer records than planned enters only over the records it finished and is "
                  "named (meta.incomplete); the extras are descriptive, so no verdict rests on one",
}


def _preds(points, samples, **match) -> pd.Series:
    sel = points
    for k, v in match.items():
        sel = sel[np.isclose(sel[k].astype(float), v)] if isinstance(v, float) else sel[sel[k] == v]
    if sel.empty or "prediction" not in samples:
        return pd.Series(dtype=object)
    return samples[samples["point"] == sel["point"].iloc[0]].set_index("id")["prediction"].fillna("")


def _same(a: pd.Series, b: pd.Series, ids) -> bool:
    """Whether two points' predictions are equal on every one of ``ids`` (False without predictions)."""
    ids = list(ids)
    return bool(ids) and a.index.is_unique and set(ids) <= set(a.index) & set(b.index) and bool(
        (a.loc[ids] == b.loc[ids]).all())


def _cmp(id_: str, quantity: str, a: str, b: str, d, family: str | None, identical: bool = False,
         **meta) -> fnd.Comparison:
    return fnd.Comparison(id=id_, quantity=quantity, a=a, b=b, strata=[np.asarray(d, dtype=float)],
                          family=family, identical=identical, meta=meta)


def powered_comparisons(points: pd.DataFrame, samples: pd.DataFrame) -> list[fnd.Comparison]:
    """The core study (as :func:`exp8.powered_study` pairs it): the pooled test, per budget, seed 0 - seed 1,
    and the two extra arms at 0.3 against H2O."""
    m = "rouge2"
    arms = {(v, b): analysis._point_series(points, samples, m, variant=v, budget=b) for b in BUDGETS
            for v in ("h2o", "keyformer_s0", "keyformer_s1")}
    if not all(len(s) for s in arms.values()):
        return []
    ids = sorted(set.intersection(*[set(s.index) for s in arms.values()]))
    preds = {k: _preds(points, samples, variant=k[0], budget=k[1]) for k in arms}
    out, ds, same_all = [], [], True
    q = "ROUGE-2, Keyformer (mean of seeds 0 and 1) - H2O"
    for b in BUDGETS:
        h, k0, k1 = (arms[(v, b)].loc[ids] for v in ("h2o", "keyformer_s0", "keyformer_s1"))
        kf = (k0 + k1) / 2
        same = all(_same(preds[(v, b)], preds[("h2o", b)], ids) for v in ("keyformer_s0", "keyformer_s1"))
        same_all = same_all and same
        ds.append((kf - h).rename(b))
        out.append(_cmp(f"exp8.budget@{b:g}", f"{q}, budget {b:g}", "keyformer", "h2o", (kf - h).to_numpy(),
                        "exp8.budgets", same, budget=b, a_mean=float(kf.mean()), b_mean=float(h.mean()),
                        sd=float((kf - h).std(ddof=1))))
        out.append(_cmp(f"exp8.seeds@{b:g}", f"ROUGE-2, Keyformer seed 0 - seed 1, budget {b:g}",
                        "keyformer_s0", "keyformer_s1", (k0 - k1).to_numpy(), "exp8.seeds",
                        _same(preds[("keyformer_s0", b)], preds[("keyformer_s1", b)], ids), budget=b,
                        a_mean=float(k0.mean()), b_mean=float(k1.mean())))
    d = pd.concat(ds, axis=1).mean(axis=1)
    sd, est = float(d.std(ddof=1)), float(d.mean())
    over = ", ".join(f"{b:g}" for b in BUDGETS)
    pooled = _cmp("exp8.pooled", f"{q}, per article averaged over budgets {over}",
                  "keyformer", "h2o", d.to_numpy(), None, same_all, budgets=list(BUDGETS), sd=sd,
                  a_mean=float(np.mean([c.meta["a_mean"] for c in out if c.family == "exp8.budgets"])),
                  b_mean=float(np.mean([c.meta["b_mean"] for c in out if c.family == "exp8.budgets"])),
                  # the n at which the observed SD gives a half-width of 0.25, and at which a CI around the
                  # observed mean would exclude 0 or +0.3 (the README's power calculation and rule 3)
                  n_for_half_width=int(np.ceil((1.96 * sd / 0.25) ** 2)),
                  n_decisive=int(np.ceil((1.96 * sd / max(abs(est), abs(est - exp8.PAPER_GAP))) ** 2)))
    out.insert(0, pooled)
    ref, ref_p = arms[("h2o", 0.3)], preds[("h2o", 0.3)]
    for v in ("keyformer_ns4", "h2o_recent05"):
        x = analysis._point_series(points, samples, m, variant=v, budget=0.3)
        common = sorted(set(x.index) & set(ref.index))
        if not common:
            continue
        kf = (arms[("keyformer_s0", 0.3)] + arms[("keyformer_s1", 0.3)]).reindex(common) / 2
        extra = {}
        if {"n_done", "n_samples"} <= set(points):  # a point with fewer records than the core's is named
            pt = points[(points["variant"] == v) & np.isclose(points["budget"].astype(float), 0.3)].iloc[0]
            planned = int(points.loc[points["variant"] == "h2o", "n_samples"].max())
            if int(pt["n_done"]) < planned:
                extra["incomplete"] = f"{int(pt['n_done'])} of {planned} records"
        out.append(_cmp(f"exp8.extra.{v}", f"ROUGE-2, {v} - H2O, budget 0.3", v, "h2o",
                        (x.loc[common] - ref.loc[common]).to_numpy(), "exp8.extras",
                        _same(_preds(points, samples, variant=v, budget=0.3), ref_p, common), budget=0.3,
                        a_mean=float(x.loc[common].mean()), b_mean=float(ref.loc[common].mean()),
                        kf_minus_h2o_same=float((kf - ref.loc[common]).mean()), **extra))
    return out


def authors_comparisons(points: pd.DataFrame, samples: pd.DataFrame,
                        short: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> list[fnd.Comparison]:
    """The authors'-setting subset, paired as :func:`exp8.authors_setting` pairs it: Keyformer - H2O per
    decoding and budget and pooled per decoding, each against full, what the beam adds to the pooled gap, and
    what the long prompt and generation add (against experiment 8's seed-0 gap on the same articles)."""
    m, out, gaps = "rouge2", [], {}
    for beams, dec in DECODINGS.items():
        full = analysis._point_series(points, samples, m, policy="full", num_beams=beams)
        full_p = _preds(points, samples, policy="full", num_beams=beams)
        per_budget, same_all = [], True
        for b in AUTHORS_BUDGETS:
            s = {p: analysis._point_series(points, samples, m, policy=p, num_beams=beams, budget=b)
                 for p in ("h2o", "keyformer")}
            pr = {p: _preds(points, samples, policy=p, num_beams=beams, budget=b) for p in s}
            ids = sorted(set(s["h2o"].index) & set(s["keyformer"].index))
            if not ids:
                continue
            same = _same(pr["keyformer"], pr["h2o"], ids)
            same_all = same_all and same
            h, k = s["h2o"][ids], s["keyformer"][ids]
            out.append(_cmp(f"exp8.authors.{dec}@{b:g}", f"ROUGE-2, Keyformer - H2O, {dec}, budget {b:g}",
                            "keyformer", "h2o", (k - h).to_numpy(), "exp8.authors.budgets", same,
                            decoding=dec, budget=b, a_mean=float(k.mean()), b_mean=float(h.mean())))
            per_budget.append((k - h).rename(b))
            f_ids = sorted(set(ids) & set(full.index))
            for p in ("h2o", "keyformer"):
                if f_ids:
                    x = s[p][f_ids]
                    out.append(_cmp(f"exp8.authors.{dec}@{b:g}.{p}_full", f"ROUGE-2, {p} - full, {dec}, "
                                    f"budget {b:g}", p, "full", (x - full[f_ids]).to_numpy(),
                                    "exp8.authors.vs_full", _same(pr[p], full_p, f_ids), decoding=dec,
                                    budget=b, a_mean=float(x.mean()), b_mean=float(full[f_ids].mean())))
        if len(per_budget) == len(AUTHORS_BUDGETS):
            g = pd.concat(per_budget, axis=1).dropna()
            gaps[dec] = g
            out.append(_cmp(f"exp8.authors.{dec}", f"ROUGE-2, Keyformer - H2O, {dec}, per article averaged "
                            "over budgets", "keyformer", "h2o", g.mean(axis=1).to_numpy(),
                            "exp8.authors.gap", same_all, decoding=dec, budgets=list(AUTHORS_BUDGETS)))
    if len(gaps) == 2:
        ids = gaps["greedy"].index.intersection(gaps["beam4"].index)
        d = gaps["beam4"].loc[ids].mean(axis=1) - gaps["greedy"].loc[ids].mean(axis=1)
        out.append(_cmp("exp8.authors.beam_minus_greedy", "ROUGE-2, pooled Keyformer - H2O gap: beam 4 - "
                        "greedy", "gap_beam4", "gap_greedy", d.to_numpy(), "exp8.authors.gap"))
    if short is not None and "greedy" in gaps:
        sp, ss = short
        per_budget = []
        for b in AUTHORS_BUDGETS:
            h = analysis._point_series(sp, ss, m, variant="h2o", budget=b)
            k = analysis._point_series(sp, ss, m, variant="keyformer_s0", budget=b)
            if len(h) and len(k):
                per_budget.append((k - h).dropna().rename(b))
        if len(per_budget) == len(AUTHORS_BUDGETS):
            g_short = pd.concat(per_budget, axis=1).dropna().mean(axis=1)
            ids = gaps["greedy"].index.intersection(g_short.index)
            if len(ids):
                d = gaps["greedy"].loc[ids].mean(axis=1) - g_short.loc[ids]
                out.append(_cmp("exp8.authors.long_minus_short", "ROUGE-2, pooled Keyformer - H2O gap: "
                                "authors' greedy setting - experiment 8's (Keyformer seed 0)", "gap_long",
                                "gap_short", d.to_numpy(), "exp8.authors.gap",
                                short_gap=float(g_short.loc[ids].mean())))
    return out


def comparisons(res: Path) -> list[fnd.Comparison]:
    """Experiment 8's pre-registered comparisons from its committed rows (each family's fixed list)."""
    out: list[fnd.Comparison] = []
    short = None
    if (res / "exp8_powered" / "points.csv").exists():
        short = analysis.load_experiment(res, "exp8_powered")
        out += powered_comparisons(*short)
    if (res / "exp8_authors" / "points.csv").exists():
        out += authors_comparisons(*analysis.load_experiment(res, "exp8_authors"), short=short)
    listed = {i for ids in DEFINITION["families"].values() for i in ids} | {"exp8.pooled"}
    unknown = [c.id for c in out if c.id not in listed]
    if unknown:
        raise ValueError(f"comparisons outside the pre-registered families: {unknown}")
    return out


def _ci(f: dict) -> str:
    return fnd.fmt_ci(f, 2)


def _p(f: dict, adjusted: bool = True) -> str:
    return fnd.fmt_p(f, adjusted)


def _decide(f: dict, gap: float) -> str:
    """The pre-registered rule on the finding's interval (none where the interval could not be built)."""
    if f["ci_lo"] is None:
        return f"no decision: {f['interval']}"
    return exp8.decide(f["ci_lo"], f["ci_hi"], gap)


def _fam(doc: dict, family: str) -> list[dict]:
    return [f for f in doc["findings"] if f["family"] == family]


def _one(doc: dict, id_: str) -> dict | None:
    return next((f for f in doc["findings"] if f["id"] == id_), None)


def _list(fs: list[dict], label) -> str:
    def one(f: dict) -> str:
        inc = f" ({f['meta']['incomplete']})" if f["meta"].get("incomplete") else ""
        if f["verdict"] is None:  # descriptive: an interval (95 %), no verdict
            return f"{label(f)}{inc} {_ci(f)}"
        return f"{label(f)}{inc} {_ci(f)} **{fnd.fmt_verdict(f)}** (Holm p {_p(f)})"

    return "; ".join(one(f) for f in fs)


def bullets(doc: dict) -> list[str]:
    """The pre-registered test and its decision, then each family: per budget, the seeds, the extra arms,
    the authors' setting (pooled gaps, per budget, against full), and any call an unadjusted p would make
    that Holm does not."""
    out = []
    gap = doc["definition"]["paper_gap"]
    f = _one(doc, "exp8.pooled")
    if f:
        m = f["meta"]
        over = ", ".join(f"{b:g}" for b in m["budgets"])
        out.append(f"**Pre-registered test** ({f['n']} articles, Keyformer averaged over two noise seeds per "
                   f"article): Keyformer - H2O pooled over budgets {over} = **{_ci(f)}** ROUGE-2 "
                   f"({m['a_mean']:.2f} vs {m['b_mean']:.2f}; p {_p(f, False)}). Decision against the "
                   f"paper's {gap:+.1f}: **{_decide(f, gap)}**. "
                   f"At the observed SD ({m['sd']:.2f}) and gap, a CI excluding 0 or {gap:+.1f} needs "
                   f"n {m['n_decisive']}.")
    fs = _fam(doc, "exp8.budgets")
    if fs:
        out.append("Per budget (descriptive in the pre-registration: 95 % intervals, no verdict): "
                   + _list(fs, lambda f: f"{f['meta']['budget']:g}") + ".")
    fs = _fam(doc, "exp8.seeds")
    if fs:
        out.append("The noise alone, Keyformer seed 0 - seed 1 (descriptive): "
                   + _list(fs, lambda f: f"{f['meta']['budget']:g}") + ".")
    fs = _fam(doc, "exp8.extras")
    if fs:
        out.append(f"Extra arms at {fs[0]['meta']['budget']:g} on the first {fs[0]['n']} articles "
                   "(descriptive): " + _list(fs, lambda f: f"`{f['a']}` - H2O")
                   + f"; on those articles the core Keyformer - H2O is "
                     f"{fs[0]['meta']['kf_minus_h2o_same']:+.2f}.")
    fs = _fam(doc, "exp8.authors.gap")
    if fs:
        pooled = [f for f in fs if f["a"] == "keyformer"]
        names = {"gap_beam4": "the beam's effect on the gap (beam 4 - greedy)",
                 "gap_long": "the long prompt and generation's effect (authors' greedy gap - experiment 8's)"}
        out.append(f"**Authors' setting** (Holm over {fs[0]['family_size']}): Keyformer - H2O pooled, "
                   + "; ".join(f"{f['meta']['decoding']} {_ci(f)} (n {f['n']}, **{fnd.fmt_verdict(f)}**, "
                               f"Holm p {_p(f)}; by the rule: {_decide(f, gap)})"
                               for f in pooled) + "; "
                   + _list([f for f in fs if f["a"] in names], lambda f: names[f["a"]]) + ".")
    fs = _fam(doc, "exp8.authors.budgets")
    if fs:
        out.append(f"Authors' setting, Keyformer - H2O per decoding and budget (Holm over "
                   f"{fs[0]['family_size']}): "
                   + _list(fs, lambda f: f"{f['meta']['decoding']} {f['meta']['budget']:g}") + ".")
    fs = _fam(doc, "exp8.authors.vs_full")
    if fs:
        below = [f"{f['a']} {f['meta']['decoding']} {f['meta']['budget']:g}" for f in fs
                 if f["verdict"] == "behind"]
        rest = [f"{f['a']} {f['meta']['decoding']} {f['meta']['budget']:g} {_ci(f)} {f['verdict']}"
                for f in fs if f["verdict"] in ("inconclusive", "equivalent")]
        out.append(f"Authors' setting against full (Holm over {fs[0]['family_size']}): below full: "
                   f"{', '.join(below) or 'none'}; not separated: {', '.join(rest) or 'none'}.")
    lost = [f for f in doc["findings"] if f["family"] and f["p"] is not None and f["verdict"] is not None
            and f["p"] < doc["definition"]["alpha"] and f["verdict"] in ("inconclusive", "equivalent")]
    if lost:
        out.append("An unadjusted p below alpha that Holm does not keep: " + "; ".join(
            f"`{f['id']}` {_ci(f)} (p {_p(f, False)}, Holm {_p(f)})" for f in lost) + ".")
    return out[:8]


def answer(doc: dict) -> str:
    """The pre-registered decision, and the authors' setting's pooled gaps."""
    f = _one(doc, "exp8.pooled")
    if f is None:
        return ""
    gap = doc["definition"]["paper_gap"]
    auth = [g for g in _fam(doc, "exp8.authors.gap") if g["a"] == "keyformer"]
    decision = _decide(f, gap)
    return (f"{decision[0].upper() + decision[1:]}: Keyformer - H2O {_ci(f)} ROUGE-2 over {f['n']} articles"
            + (("; in the authors' setting " + ", ".join(
                f"{g['meta']['decoding']} {_ci(g)} ({g['verdict']})" for g in auth)) if auth else "") + ".")
