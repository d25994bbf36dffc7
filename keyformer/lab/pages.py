"""Results pages rendered from data: each study's ``findings.json``, ``README.md`` and the results index.

A study (a ``findings`` module a registry lists: :mod:`keyformer.lab.studies`) gives, in ``findings.py``:

* ``RESULTS``: its folder under ``results/`` (default: the study's name);
* ``QUESTION``: the question it answers, one line;
* ``DEFINITION``: its pre-registered analysis (families, design, alpha, metric), stored in findings.json;
* ``comparisons(res) -> list[Comparison]``: what :func:`keyformer.lab.findings.evaluate` turns into findings;
* ``bullets(doc) -> list[str]``: at most 8 findings as sentences, read from the findings document;
* ``answer(doc) -> str``: the one-line answer the index shows (a descriptive study, without comparisons,
  gives ``answer_rows(res) -> str`` instead, read from its rows);
* ``PLACEHOLDERS``: optional ``{name: fn(res, doc) -> str}`` for the page template.

Its page template ``page.md`` (beside ``findings.py``) holds the words; ``{{ table:SECTION }}`` is replaced by
a report section (:func:`keyformer.lab.report.render`), ``{{ findings }}`` by the bullets, ``{{ NAME }}`` by a
study placeholder. Nothing else on a page carries a number, so a page is current exactly when it equals what
:func:`build` renders from the committed rows (``keyformer-report --check-pages``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from keyformer.lab import findings as fnd
from keyformer.lab import preregistration, report, studies
from keyformer.lab.studies import answers, results_folder, study_name

PLACEHOLDER = re.compile(r"\{\{\s*([\w:/.,-]+)\s*\}\}")
MAX_BULLETS = 8
INDEX_TEMPLATE = "index.md"  # beside the registry (experiments/index.md): the results index's words


def findings_doc(study: ModuleType, res: Path, seed: int = 0) -> dict[str, Any] | None:
    """The study's findings document, computed from the committed rows (None: the study has no findings).
    Each comparison's role comes from the definition's ``roles`` (:func:`preregistration.role`) and its
    equivalence margin, unless it sets one, from the definition's ``margin``."""
    if not hasattr(study, "comparisons"):
        return None
    comps = study.comparisons(res)
    for c in comps:
        c.role = preregistration.role(study.DEFINITION, c.family, c.id)
        if c.margin is None:
            c.margin = study.DEFINITION.get("margin")
    found = fnd.evaluate(comps, seed=seed)
    return json.loads(fnd.dumps(study_name(study), found, study.DEFINITION))


CHANGED = "verdicts_schema1.json"  # beside the registry: each study's verdicts under the bootstrap engine
MAX_CHANGED = 12


def _why(old: dict[str, Any], f: dict[str, Any]) -> str:
    """Why a schema-1 verdict (bootstrap p, Holm) became the sign-flip one."""
    if f["verdict"] is None:
        return "descriptive in the pre-registration: no verdict"
    if old["verdict"] in ("ahead", "behind") and f["verdict"] == "inconclusive":
        if f.get("ci_lo") is None:
            return f"the exact test cannot reach Holm's level with n = {f['n']}"
        return (f"the sign-flip test does not reject at Holm's level {f['level']:.2g} "
                f"(p {fnd.fmt_p(f, False)})")
    if f["verdict"] == "equivalent":
        return f"interval inside the margin +-{f['margin']:g}"
    return "the sign-flip test rejects where the bootstrap did not"


def method(study: ModuleType, doc: dict[str, Any] | None) -> str:
    """How the page's verdicts are reached, from its findings: the test, the interval, Holm, the verdicts,
    the margin, and each family's role (confirmatory only where git shows it came before its rows)."""
    if doc is None:
        return ""
    d, fs = doc["definition"], doc["findings"]
    tests = {f["test"] for f in fs if f["test"]}
    margin = d.get("margin")
    said = "; ".join(f"`{k}` {r}" for k, r in d.get("roles", {}).items()) or "every family exploratory"
    if {f["role"] for f in fs} - set(d.get("roles", {}).values()):
        said += " (a family not named: exploratory)"
    how = " and ".join(sorted(tests)) or "none"
    return (f"paired sign-flip test of a zero difference ({how}; a Monte Carlo p carries its standard error "
            "and pattern count), Holm within each family at alpha "
            f"{d.get('alpha', fnd.ALPHA):g}; the interval is the same test inverted at the level Holm tested "
            "the comparison at, so it excludes 0 exactly when the verdict is `ahead`/`behind`; `equivalent`: "
            + (f"the interval inside +-{margin:g} (the margin declared for the metric, after the data: "
               "exploratory)" if margin is not None else "not claimed (no margin declared)")
            + "; `inconclusive` names the records a stratum 80 % power would need. Roles (confirmatory only "
            "where git shows the definition came before the rows): " + said + ".")


def changed_table(study: ModuleType, doc: dict[str, Any] | None) -> str:
    """The verdicts that changed from the schema-1 engine (bootstrap) to this one (old, new, why): ``tied``
    read as ``inconclusive`` is a renaming and not listed."""
    path = studies.registry_folder() / CHANGED
    if doc is None or not path.is_file():
        return ""
    old = json.loads(path.read_text(encoding="utf-8")).get(study_name(study), {})
    rows = []
    for f in doc["findings"]:
        o = old.get(f["id"])
        same = (f["verdict"], f["verdict"])
        if o is None or (o["verdict"], f["verdict"]) in (("tied", "inconclusive"), same):
            continue
        rows.append(f"| `{f['id']}` | {o['verdict']} | {fnd.fmt_verdict(f)} {fnd.fmt_ci(f)} | {_why(o, f)} |")
    if not rows:
        return "No verdict changed with the sign-flip engine (`tied` now reads `inconclusive`, `equivalent`)."
    more = len(rows) - MAX_CHANGED
    head = ("| finding | old (bootstrap) | new (sign-flip) [interval at Holm's level] | why |\n"
            "|---|---|---|---|\n")
    tail = f"\n\n... and {more} more (findings.json; the old verdicts: {CHANGED} beside the registry)."
    return head + "\n".join(rows[:MAX_CHANGED]) + (tail if more > 0 else "")


def provenance(res: Path, folders: list[str]) -> str:
    """What produced a study's rows, read from its collected ``points.csv`` files: points, models, datasets,
    records per point, prompt and generation lengths, budgets, devices and dtypes, and the commits."""
    import pandas as pd

    frames = [pd.read_csv(res / f / "points.csv") for f in folders if (res / f / "points.csv").is_file()]
    if not frames:
        return "(no collected points yet)"
    p = pd.concat(frames, ignore_index=True)

    def vals(col: str, fmt: str = "{}") -> str:
        if col not in p:
            return "-"
        xs = p[col].dropna().unique()
        try:
            xs = sorted(xs, key=float)
        except (TypeError, ValueError):
            xs = sorted(xs, key=str)
        v = list(dict.fromkeys(fmt.format(x) for x in xs))
        return ", ".join(v) if v else "-"

    commits = sorted({str(c)[:7] for c in p.get("git_commit", pd.Series(dtype=object)).dropna()})
    done = int(p["complete"].sum()) if "complete" in p else len(p)
    return (f"*Rows:* {len(p)} points ({done} complete) in "
            f"{', '.join(f'`{f}/points.csv`' for f in folders)}; model {vals('model')}; dataset "
            f"{vals('dataset')}; records per point {vals('n_done', '{:.0f}')}; prompt limit "
            f"{vals('max_prompt_tokens', '{:.0f}')} tokens, {vals('max_new_tokens', '{:.0f}')} new tokens; "
            f"budgets {vals('budget', '{:g}')}; {vals('device')} {vals('dtype')}, batch "
            f"{vals('batch_size', '{:.0f}')}; commits {', '.join(commits) if commits else 'not recorded'}.")


def render_page(study: ModuleType, res: Path, doc: dict[str, Any] | None) -> str:
    """The study's page: its template with every placeholder filled."""
    template = Path(study.__file__).with_name("page.md").read_text(encoding="utf-8")
    extra = getattr(study, "PLACEHOLDERS", {})

    def fill(m: re.Match) -> str:
        key = m[1]
        if key.startswith("table:"):
            return report.render(key.split(":", 1)[1], res)
        if key.startswith("provenance:"):
            return provenance(res, key.split(":", 1)[1].split(","))
        if key == "changed":
            return changed_table(study, doc)
        if key == "method":
            return method(study, doc)
        if key == "findings":
            items = study.bullets(doc) if doc is not None else []
            if len(items) > MAX_BULLETS:
                raise ValueError(f"{study_name(study)}: {len(items)} findings bullets; at most {MAX_BULLETS}")
            return "\n".join(f"- {b}" for b in items)
        if key in extra:
            return extra[key](res, doc)
        raise KeyError(f"{study_name(study)}/page.md: unknown placeholder {{{{ {key} }}}}; valid: "
                       f"table:<section>, findings, {', '.join(extra) or '(no study placeholders)'}")

    return PLACEHOLDER.sub(fill, template).rstrip("\n") + "\n"


def pages(registry: str | None = None) -> list[ModuleType]:
    """The registered studies that have a page template."""
    return [s for s in studies.studies(registry) if Path(s.__file__).with_name("page.md").is_file()]


def study_files(study: ModuleType, res: Path, seed: int = 0) -> dict[Path, str]:
    """One study's generated files: ``findings.json`` (computed from the committed rows) and its page."""
    out: dict[Path, str] = {}
    folder = res / results_folder(study)
    doc = findings_doc(study, res, seed)
    if doc is not None:
        out[folder / "findings.json"] = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    with report.rendering(results_folder(study), doc):
        out[folder / "README.md"] = render_page(study, res, doc)
    return out


def index_file(res: Path, registry: str | None = None,
               fresh: dict[Path, str] | None = None) -> dict[Path, str]:
    """The results index ``results/README.md``: its template (``index.md`` beside the registry) with
    ``{{ index }}`` replaced by one row per study (question, one-line answer from its committed
    ``findings.json``, link; ``fresh``: generated files to read instead of the committed ones)."""
    template = studies.registry_folder(registry) / INDEX_TEMPLATE
    if not template.is_file():
        return {}
    said = {study_name(s): a for s, a in answers(res, registry, fresh)}
    rows = [f"| [{s.TITLE}]({results_folder(s)}/README.md) | {s.QUESTION} | {said.get(study_name(s), '')} |"
            for s in pages(registry)]
    table = "| experiment | question | answer |\n|---|---|---|\n" + "\n".join(rows)
    text = template.read_text(encoding="utf-8").replace("{{ index }}", table)
    text = PLACEHOLDER.sub(lambda m: report.render(m[1].split(":", 1)[1], res) if m[1].startswith("table:")
                           else m[0], text)
    return {res / "README.md": text.rstrip("\n") + "\n"}


def build(res: Path, registry: str | None = None, only: str | None = None, seed: int = 0) -> dict[Path, str]:
    """Every generated file: each study's (or only ``only``'s) findings and page, then the index (``seed``:
    the random streams' root; the committed files use 0)."""
    out: dict[Path, str] = {}
    for study in pages(registry):
        if only is None or study_name(study) == only:
            out.update(study_files(study, res, seed))
    if only is None:
        out.update(index_file(res, registry, out))
    return out


def write(files: dict[Path, str]) -> list[Path]:
    """Write the files that differ; the paths written."""
    changed = []
    for path, text in files.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def drift(files: dict[Path, str]) -> list[Path]:
    """The generated files whose committed text differs from what the data renders."""
    return [p for p, text in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != text]
