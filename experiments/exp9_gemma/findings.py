"""Experiment 9's report sections: SmolLM2's findings rerun on Gemma 3 270M, and Keyformer's noise seeds."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from experiments.exp9_gemma import analysis as exp9
from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import fmt_ci


def gemma(res: Path, name: str = "exp9_gemma") -> None:
    """Experiment 9: each SmolLM2 finding (experiments 1 and 7, paired differences pooled over the budgets
    Gemma reruns), the same measurement on Gemma 3 270M and whether it holds, read from the findings
    (:func:`comparisons`, :func:`keyformer.lab.findings.evaluate`, :func:`replication_rows`); complete points
    only."""
    if not (res / name).is_dir():
        return
    doc = json.loads(fnd.dumps(name, fnd.evaluate(comparisons(res)), DEFINITION))
    rows = replication_rows(doc)
    print(f"\n### {name}: SmolLM2's findings on Gemma 3 270M (pooled paired differences, complete points)\n")
    print("| source | task | metric | SmolLM2 finding | SmolLM2 [95 % CI] | Gemma 3 [95 % CI] | Gemma 3 "
          "reads | budgets (Gemma) | n (Gemma) | holds | holds (Holm) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        said = f"{r['a']} {_SIGN[_raw(r['smol'])]} {r['b']}" if r["smol"] else "-"
        g = r["gemma"]
        reads = "-" if g is None else f"{r['a']} {_SIGN[_raw(g)]} {r['b']}" if g["verdict"] != "n/a" else \
            f"n/a (= {g['meta']['same_as']})"
        print(f"| {r['source']} | {r['task']} | {r['metric']} | {said} | "
              f"{_ci(r['smol']) if r['smol'] else '-'} | {_ci(g) if g else '-'} | {reads} | "
              f"{','.join(f'{b:g}' for b in g['meta']['budgets']) if g else '-'} | {g['n'] if g else '-'} | "
              f"{r['holds_raw']} | {_holm_cell(r)} |")
    c = _counts(doc)
    sizes = {f["meta"]["model"]: f["family_size"] for f in doc["findings"]
             if f["family"] in ("exp9.smollm2", "exp9.gemma3") and f["family_size"]}
    print(f"\nholds: the raw verdicts (each sign-flip p at 0.05) agree; holds (Holm): the verdicts agree, "
          f"each model's p-values Holm-adjusted within a family of the same findings on both models (SmolLM2 "
          f"{sizes.get('smollm2', 0)}, Gemma 3 {sizes.get('gemma3', 0)} comparisons); `no claim`: SmolLM2 "
          "itself is inconclusive (two inconclusive verdicts replicate nothing); `open`: Gemma 3 is "
          "inconclusive where SmolLM2 decided; the verdicts (SmolLM2, Gemma 3) are in parentheses where they "
          f"differ from the raw readings. Of the findings SmolLM2 decided, {c['holm']} of "
          f"{c['testable']} hold family-wise, {c['raw']} of {c['raw_testable']} per comparison.")
    if c["na"]:
        print("\nn/a: arm a gave the same outputs on every paired sample as b or as an arm already compared "
              "with b (the name in parentheses): no evidence of its own. Gemma 3 270M has one KV head, so "
              "Ada-KV has no heads to share a layer's budget among and is its base policy.")
    _gemma_seeds(res, name)


def _holm_cell(r: dict) -> str:
    """``holds`` with Holm, with the verdicts where either differs from its raw CI's direction."""
    if r["holds"] in ("n/a", "pending", "no claim"):
        return r["holds"]
    fw = (r["smol"]["verdict"], r["gemma"]["verdict"])
    pc = (_raw(r["smol"]), _raw(r["gemma"]))
    return r["holds"] if fw == pc else f"{r['holds']} ({_SIGN[fw[0]]}, {_SIGN[fw[1]]})"


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


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp9_gemma': gemma,
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "9: Gemma 3 270M"
QUESTION = "Do SmolLM2's findings of experiments 1 and 7 hold on Gemma 3 270M?"
MODELS = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma 3 270M"}
SEED_TASKS = ("leval_sqa", "multi_news")  # tier 8: Keyformer rerun with noise seed 1 on Gemma's long tasks


def key(f: exp9.Finding) -> str:
    """A finding's id without the model: ``<source>.<task>.<a>-<b>``."""
    return f"{f.source}.{f.task}.{f.a}-{f.b}"


def _seed_findings() -> list[exp9.Finding]:
    """The findings rerun against Keyformer's seed 1: each ``a - keyformer`` of :data:`SEED_TASKS` with a
    deterministic ``a`` (one that is not Keyformer)."""
    return [f for f in exp9.EXP9_FINDINGS
            if f.task in SEED_TASKS and f.b == "keyformer" and "keyformer" not in f.a]


DEFINITION = {
    "models": MODELS,
    "metric": "per task: " + ", ".join(sorted({f"{f.task}: {f.metric}" for f in exp9.EXP9_FINDINGS})),
    "comparison": ("a - b per sample, averaged over the finding's budgets that both arms ran ('full': its "
                   "one point at every budget), paired over the samples both finished; SmolLM2 from "
                   "exp1_cnndm and exp7_field/<task>, Gemma 3 from exp9_gemma/<task>; complete points only"),
    "families": {**{f"exp9.{m}": [key(f) for f in exp9.EXP9_FINDINGS] for m in MODELS},
                 "exp9.gemma3.keyformer_seed1": [f"seed1.{f.task}.{f.a}-{f.b}" for f in _seed_findings()]},
    "identical": ("a comparison whose arm a gave the same prediction on every paired sample as b, or as "
                  "another arm already compared with the same b on the same task in the same family, is n/a "
                  "and outside its family (on Gemma's one KV head Ada-KV gives its base policy's outputs)"),
    "holds": ("a finding SmolLM2 decided (ahead, behind or equivalent) holds when Gemma's verdict is the "
              "same (with Holm: the verdicts; without: each raw p at alpha); 'no' when Gemma decides "
              "otherwise, 'open' when Gemma is inconclusive; 'no claim' when SmolLM2 itself is inconclusive "
              "(two inconclusive verdicts replicate nothing); n/a when either side is n/a; pending without "
              "Gemma's points"),
    "like_with_like": ("each model's Holm family holds the same findings: those both models tested (not "
                       "pending, not n/a on either); the others are reported in exp9.<model>.unmatched"),
    "design": ("paired sign-flip test over samples of the per-sample mean difference over the budgets (one "
               "stratum); Holm within each model's family at alpha 0.05"),
    "alpha": fnd.ALPHA,
    "margin": 0.5,  # metric points (ROUGE-2, F1, accuracy x 100), declared after the data
    # the list of findings was fixed before Gemma's runs, but as Holm families only on 2026-12-06, after them
    "roles": {"exp9.smollm2": "exploratory", "exp9.gemma3": "exploratory",
              "exp9.gemma3.keyformer_seed1": "exploratory"},
}


def _load(folder: Path):
    return analysis.load_experiment(folder.parent, folder.name, complete_only=True) \
        if (folder / "points.csv").exists() else None


def _with_seed(base, seeded, k: int):
    """``base``'s rows with Keyformer's points replaced by those of ``seeded`` (noise seed ``k``)."""
    (bp, bs), (sp, ss) = base, seeded
    sp = sp[sp["policy"] == "keyformer"].assign(point=lambda f: f"seed{k}/" + f["point"].astype(str))
    ss = ss.assign(point=f"seed{k}/" + ss["point"].astype(str))
    rest = bp[bp["policy"] != "keyformer"]
    return (pd.concat([rest, sp], ignore_index=True),
            pd.concat([bs[bs["point"].isin(rest["point"])], ss[ss["point"].isin(sp["point"])]],
                      ignore_index=True))


def _family(fam: str, model: str, found: list[tuple[str, exp9.Finding]], data) -> list[fnd.Comparison]:
    """One family's comparisons: ``found`` as ``(id, finding)`` in the family's fixed order, ``data(f)`` a
    finding's ``(points, samples)`` or None (not run: left out)."""
    out: list[fnd.Comparison] = []
    seen: list[tuple[exp9.Finding, object]] = []  # findings compared so far: (finding, its rows)
    for cid, f in found:
        rows = data(f)
        r = exp9.pooled_diffs(*rows, f.a, f.b, f.budgets, f.metric) if rows is not None else None
        if r is None:
            continue
        d, used = r
        same_as = None
        for c in [f.b] + [g.a for g, rg in seen if rg is rows and g.b == f.b and g.metric == f.metric]:
            if c != f.a and exp9.same_outputs(*rows, f.a, f.b, c, used):
                same_as = c
                break
        seen.append((f, rows))
        out.append(fnd.Comparison(
            id=cid, quantity=f"{f.metric}, {f.a} - {f.b} ({MODELS[model]}, {f.task})", a=f.a, b=f.b,
            strata=[d.to_numpy()], family=fam, identical=same_as is not None,
            meta={"key": cid.split(".", 2)[2], "model": model, "source": f.source, "task": f.task,
                  "metric": f.metric, "budgets": used, "same_as": same_as}))
    return out


def comparisons(res: Path) -> list[fnd.Comparison]:
    """Every finding of ``EXP9_FINDINGS`` on each model (its family), then Gemma's seed-1 reruns."""
    if not (res / "exp9_gemma").is_dir():
        return []
    cache: dict[Path, object] = {}

    def rows(folder: Path):
        if folder not in cache:
            cache[folder] = _load(folder)
        return cache[folder]

    where = {"smollm2": lambda f: rows(res / f.smol), "gemma3": lambda f: rows(res / "exp9_gemma" / f.task)}
    out = []
    for model in MODELS:
        out += _family(f"exp9.{model}", model,
                       [(f"exp9.{model}.{key(f)}", f) for f in exp9.EXP9_FINDINGS], where[model])
    tested = [{c.meta["key"] for c in out if c.meta["model"] == m and not c.identical} for m in MODELS]
    both = set.intersection(*tested)
    for c in out:  # like with like: each model's family holds the findings both models tested
        if c.meta["key"] not in both:
            c.family = f"{c.family}.unmatched"
    seeded: dict[str, object] = {}
    for task in SEED_TASKS:
        base, other = rows(res / "exp9_gemma" / task), rows(res / "exp9_gemma" / f"{task}_seed1")
        seeded[task] = _with_seed(base, other, 1) if base is not None and other is not None else None
    out += _family("exp9.gemma3.keyformer_seed1", "gemma3",
                   [(f"exp9.gemma3.seed1.{f.task}.{f.a}-{f.b}", f) for f in _seed_findings()],
                   lambda f: seeded[f.task])
    return out


# -- reading the findings document (bullets, answer, tables) ------------------------------------------------
_SIGN = {"ahead": ">", "behind": "<", "inconclusive": "?", "equivalent": "≈", "n/a": "n/a"}
DECIDED = ("ahead", "behind", "equivalent")


def _raw(f: dict) -> str:
    """A finding's verdict without the correction: its raw p at alpha, by sign."""
    if f["verdict"] == "n/a":
        return "n/a"
    if f["p"] < DEFINITION["alpha"]:
        return "ahead" if f["estimate"] > 0 else "behind"
    return "equivalent" if f["verdict"] == "equivalent" else "inconclusive"


def _holds(s: dict, g: dict, read) -> str:
    a, b = read(s), read(g)
    if a not in DECIDED:
        return "no claim"
    if b == a:
        return "yes" if g["meta"]["budgets"] == s["meta"]["budgets"] else "partial"
    return "open" if b == "inconclusive" else "no"


def replication_rows(doc: dict) -> list[dict]:
    """One row per finding of the fixed list, in its order: ``smol`` / ``gemma`` (the findings, None if not
    run) and ``holds`` (with Holm: the verdicts) / ``holds_raw`` (the raw CI directions): ``yes``, ``no``,
    ``partial`` (equal, but Gemma ran fewer budgets), ``n/a`` (either side n/a), ``pending`` (not run)."""
    by = {(f["meta"]["model"], f["meta"]["key"]): f for f in doc["findings"]}
    described = {key(f): f for f in exp9.EXP9_FINDINGS}
    rows = []
    for k in doc["definition"]["families"]["exp9.smollm2"]:
        s, g = by.get(("smollm2", k)), by.get(("gemma3", k))
        d = described[k]
        row = {"key": k, "smol": s, "gemma": g, "source": d.source, "task": d.task, "metric": d.metric,
               "a": d.a, "b": d.b}
        for col, read in (("holds", lambda f: f["verdict"]), ("holds_raw", _raw)):
            if s is None or g is None:
                row[col] = "pending"
            elif "n/a" in (s["verdict"], g["verdict"]):
                row[col] = "n/a"
            else:
                row[col] = _holds(s, g, read)
        rows.append(row)
    return rows


def _counts(doc: dict) -> dict[str, int]:
    rows = replication_rows(doc)
    testable = [r for r in rows if r["holds"] not in ("n/a", "pending", "no claim")]
    raw = [r for r in rows if r["holds_raw"] not in ("n/a", "pending", "no claim")]
    return {"testable": len(testable), "holm": sum(r["holds"] == "yes" for r in testable),
            "raw": sum(r["holds_raw"] == "yes" for r in raw), "raw_testable": len(raw),
            "no_claim": sum(r["holds"] == "no claim" for r in rows),
            "open": sum(r["holds"] == "open" for r in rows),
            "partial": sum(r["holds"] == "partial" for r in testable),
            "na": sum(r["holds"] == "n/a" for r in rows),
            "pending": sum(r["holds"] == "pending" for r in rows)}


def _ci(f: dict) -> str:
    return fnd.fmt_ci(f, 2)


def _p(f: dict) -> str:
    return fnd.fmt_p(f)


def _side(f: dict, who: str) -> str:
    if f["verdict"] == "n/a":
        return f"{who} n/a (same outputs as `{f['meta']['same_as']}`)"
    return f"{who} {_ci(f)}, Holm p {_p(f)}: **{fnd.fmt_verdict(f)}**"


def _name(r: dict) -> str:
    return f"`{r['a']} - {r['b']}` on {r['task']} ({r['source']})"


def bullets(doc: dict) -> list[str]:
    """The count that holds with and without Holm; each finding that does not hold with Holm; those Holm
    decides; the n/a and pending ones; Keyformer's second noise seed."""
    rows, c = replication_rows(doc), _counts(doc)
    sizes = {f["meta"]["model"]: f["family_size"] for f in doc["findings"]
             if f["family"] in ("exp9.smollm2", "exp9.gemma3") and f["family_size"]}
    out = [f"**{c['holm']} of {c['testable']}** findings SmolLM2 decided hold on Gemma 3 with Holm (the same "
           f"verdict; each model's family holds the same {sizes.get('smollm2', 0)} findings); "
           f"**{c['raw']} of {c['raw_testable']}** without it (each raw p at 0.05)"
           + (f"; {c['partial']} more agree on fewer budgets" if c["partial"] else "")
           + f"; {c['open']} open (Gemma 3 inconclusive); {c['no_claim']} are no claim (SmolLM2 "
           "inconclusive: nothing to replicate)."]
    no = [r for r in rows if r["holds"] == "no"]
    for r in no[:4]:
        out.append(f"Does not hold: {_name(r)}: {_side(r['smol'], 'SmolLM2')}; "
                   f"{_side(r['gemma'], 'Gemma 3')}.")
    if len(no) > 4:
        out.append("Also does not hold: " + "; ".join(_name(r) for r in no[4:]) + ".")
    flips = [r for r in rows if r["holds"] in ("yes", "no", "partial", "open")
             and r["holds"] != r["holds_raw"]]
    if flips:
        out.append("Holm decides " + "; ".join(
            f"{_name(r)} (raw CIs: SmolLM2 {_SIGN[_raw(r['smol'])]}, Gemma 3 {_SIGN[_raw(r['gemma'])]}: "
            f"{r['holds_raw']}; Holm: {r['holds']})" for r in flips) + ".")
    na = [r for r in rows if r["holds"] == "n/a"]
    pend = [r for r in rows if r["holds"] == "pending"]
    parts = []
    for who, label in (("gemma", "Gemma 3"), ("smol", "SmolLM2")):
        same = [f"{_name(r)} (= `{r[who]['meta']['same_as']}`)" for r in na
                if r[who] is not None and r[who]["verdict"] == "n/a"]
        if same:
            parts.append(f"n/a on {label}, whose arm `a` gave the same outputs on every paired sample as "
                         f"the arm named (outside the family): {'; '.join(same)}")
    if pend:
        parts.append(f"pending (no Gemma 3 points): {'; '.join(_name(r) for r in pend)}")
    if parts:
        out.append(". ".join(parts) + ".")
    seeds = [f for f in doc["findings"] if f["family"] == "exp9.gemma3.keyformer_seed1"]
    by = {f["meta"]["key"]: f for f in doc["findings"] if f["meta"]["model"] == "gemma3"}
    pairs = [(f, by.get(f["meta"]["key"].replace("seed1.", "exp7.", 1))) for f in seeds]
    pairs = [(s1, s0) for s1, s0 in pairs if s0 is not None and s0["verdict"] != "n/a"]
    if pairs:
        same = sum(s1["verdict"] == s0["verdict"] for s1, s0 in pairs)
        raw = [f"`{s1['a']} - {s1['b']}` on {s1['meta']['task']} ({_SIGN[_raw(s0)]} -> {_SIGN[_raw(s1)]})"
               for s1, s0 in pairs if _raw(s1) != _raw(s0)]
        size = max(f["family_size"] or 0 for f in seeds)
        out.append(f"Keyformer's noise seed 1 on Gemma 3 ({', '.join(SEED_TASKS)}; its own Holm family of "
                   f"{size}): {same} of {len(pairs)} verdicts equal seed 0's"
                   + (f"; the raw verdict changes for {', '.join(raw)}" if raw else "") + ".")
    return out[:8]


def answer(doc: dict) -> str:
    """How many of SmolLM2's findings hold on Gemma 3, with and without Holm."""
    c = _counts(doc)
    return (f"{c['holm']} of the {c['testable']} findings SmolLM2 decided hold on Gemma 3 with Holm, "
            f"{c['raw']} of {c['raw_testable']} without"
            + (f" ({c['na']} n/a: Ada-KV is its base policy on one KV head" if c["na"] else "")
            + (f"; {c['pending']} pending" if c["pending"] else "") + (")" if c["na"] else "") + ".")


def replication_table(res: Path, doc: dict | None) -> str:
    """The page's table, from the findings: per finding, each model's difference [95 % CI], Holm p and
    verdict, and whether it holds without and with Holm."""
    if doc is None:
        return "(no findings yet)"
    lines = ["| source | task | a - b | SmolLM2 [95 % CI] | Holm p | verdict | Gemma 3 [95 % CI] | Holm p | "
             "verdict | holds (CI) | holds (Holm) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in replication_rows(doc):
        cells = []
        for x in (r["smol"], r["gemma"]):
            cells += ["-", "-", "pending"] if x is None else \
                [_ci(x), "n/a" if x["verdict"] == "n/a" else _p(x),
                 f"n/a (= {x['meta']['same_as']})" if x["verdict"] == "n/a" else x["verdict"]]
        lines.append(f"| {r['source']} | {r['task']} ({r['metric']}) | {r['a']} - {r['b']} | "
                     f"{' | '.join(cells)} | {r['holds_raw']} | {r['holds']} |")
    return "\n".join(lines)


def seed_table(res: Path, doc: dict | None) -> str:
    """Gemma 3's comparisons against Keyformer at noise seeds 0 and 1, from the findings."""
    if doc is None:
        return "(no findings yet)"
    by = {f["meta"]["key"]: f for f in doc["findings"] if f["meta"]["model"] == "gemma3"}
    lines = ["| task | a - b | seed 0 [95 % CI] | Holm p | verdict | seed 1 [95 % CI] | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for f in doc["findings"]:
        if f["family"] != "exp9.gemma3.keyformer_seed1":
            continue
        s0 = by.get(f["meta"]["key"].replace("seed1.", "exp7.", 1))
        cells = [[_ci(x), "n/a" if x["verdict"] == "n/a" else _p(x), x["verdict"]] if x else ["-", "-", "-"]
                 for x in (s0, f)]
        lines.append(f"| {f['meta']['task']} | {f['a']} - {f['b']} | {' | '.join(cells[0])} | "
                     f"{' | '.join(cells[1])} |")
    return "\n".join(lines)


def design(res: Path, doc: dict | None) -> str:
    """The design the verdicts use, as the findings document records it (``DEFINITION["design"]``)."""
    return (doc or {"definition": DEFINITION})["definition"]["design"]


PLACEHOLDERS = {"replication": replication_table, "seeds": seed_table, "design": design}
