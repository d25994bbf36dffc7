"""What the pages say is what findings.json holds, and no committed verdict hangs on a random stream: every
interval a page prints from its findings equals one of its findings.json, and every study's findings
recomputed under three other seeds give the same verdicts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from keyformer.lab import pages

ROOT = Path(__file__).resolve().parents[1]
RES = Path("results")
STUDIES = [pages.study_name(s) for s in pages.pages() if hasattr(s, "comparisons")]
INTERVAL = re.compile(r"([+-]\d+\.(\d+)) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\]")


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def _study(name: str):
    return next(s for s in pages.pages() if pages.study_name(s) == name)


def _without_report_tables(mod, monkeypatch: pytest.MonkeyPatch) -> str:
    """The page as rendered from the committed findings.json, its report-section tables left out (those are
    keyformer-report's per-point tables, not findings)."""
    from keyformer.lab import findings as fnd
    from keyformer.lab import report

    monkeypatch.setattr(report, "render", lambda *a, **k: "")
    doc = fnd.load(RES / pages.results_folder(mod) / "findings.json")
    return pages.render_page(mod, RES, doc)


@pytest.mark.parametrize("study", STUDIES)
def test_every_interval_a_page_prints_from_findings_is_one_of_findings_json(
        study: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every "estimate [lo, hi]" on the page outside keyformer-report's tables (bullets, the study's
    placeholders, the verdicts-changed table) equals a finding's, at the digits printed."""
    mod = _study(study)
    doc = json.loads((RES / pages.results_folder(mod) / "findings.json").read_text(encoding="utf-8"))
    got = INTERVAL.findall(_without_report_tables(mod, monkeypatch))
    assert got, f"{study}: no interval outside the report tables"
    for est, dec, lo, hi in got:
        d = len(dec)
        assert any(f["ci_lo"] is not None and f"{f['estimate']:+.{d}f}" == est
                   and f"{f['ci_lo']:+.{d}f}" == lo and f"{f['ci_hi']:+.{d}f}" == hi
                   for f in doc["findings"]), (study, est, lo, hi)


def test_the_interval_check_catches_a_second_draw() -> None:
    """A planted interval no finding holds is caught by the same matching."""
    doc = json.loads((RES / "exp5_ablations" / "findings.json").read_text(encoding="utf-8"))
    f = doc["findings"][0]
    planted = f"{f['estimate']:+.2f} [{f['ci_lo'] - 0.01:+.2f}, {f['ci_hi']:+.2f}]"
    (est, dec, lo, hi), = INTERVAL.findall(planted)
    assert not any(f"{g['estimate']:+.2f}" == est and g["ci_lo"] is not None and f"{g['ci_lo']:+.2f}" == lo
                   and f"{g['ci_hi']:+.2f}" == hi for g in doc["findings"])


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_verdicts_survive_three_other_seeds(study: str) -> None:
    """Every committed verdict (and its strata-as-units verdict) is what the engine gives under seeds 1, 2
    and 3: no verdict hangs on Monte Carlo noise."""
    mod = _study(study)
    committed = {f["id"]: f for f in
                 json.loads((RES / pages.results_folder(mod) / "findings.json").read_text())["findings"]}
    for seed in (1, 2, 3):
        rerun = pages.findings_doc(mod, RES, seed=seed)["findings"]
        flips = [(f["id"], committed[f["id"]]["verdict"], f["verdict"]) for f in rerun
                 if (f["verdict"], f["verdict_alt"]) != (committed[f["id"]]["verdict"],
                                                         committed[f["id"]]["verdict_alt"])]
        assert not flips, (seed, flips)
