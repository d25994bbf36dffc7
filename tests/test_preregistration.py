"""Pre-registration is a checked fact: every family a study calls confirmatory was defined in a commit that
precedes every row of its data (git history, the rows' provenance); the check catches one that was not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from keyformer.lab import pages
from keyformer.lab import preregistration as pr

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "results"


def _has(commit: str) -> bool:
    got = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", commit], capture_output=True)
    return got.returncode == 0


@pytest.fixture(autouse=True)
def _history(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    if not _has("311ba2d"):
        pytest.skip("no git history in this checkout")


@pytest.mark.parametrize("study", [s for s in pages.pages() if hasattr(s, "DEFINITION")],
                         ids=pages.study_name)
def test_confirmatory_families_precede_their_rows(study) -> None:
    assert pr.problems(study.DEFINITION, RES, ROOT) == []


def test_a_family_defined_after_its_rows_is_caught() -> None:
    """Experiment 10's family of twelve was first committed (2a577ce) after its rows had run: calling it
    confirmatory is refused, row by row."""
    d = {"roles": {"exp10": "confirmatory"},
         "registered": {"exp10": {"commit": "2a577ce", "file": "experiments/exp10_ruler.py",
                                  "contains": "POLICIES", "rows": ["exp10_ruler/aware"]}}}
    got = pr.problems(d, RES, ROOT)
    assert got and all("not after the registration 2a577ce" in g or "is not in commit" in g for g in got)
    assert pr.problems({"roles": {"x": "confirmatory"}}, RES, ROOT) == ["x: confirmatory without a "
                                                                       "registration commit"]


def test_roles_default_to_exploratory_and_are_validated() -> None:
    d = {"roles": {"f": "descriptive", "one": "confirmatory"}}
    assert pr.role(d, "f", "any") == "descriptive" and pr.role(d, None, "one") == "confirmatory"
    assert pr.role(d, "g", "other") == "exploratory"
    with pytest.raises(ValueError, match="role 'maybe' of f; valid: confirmatory, exploratory, descriptive"):
        pr.role({"roles": {"f": "maybe"}}, "f", "x")
