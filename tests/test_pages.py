"""Results pages and findings.json are what the committed rows render: one regeneration test per study, and
the index. Pages are never matched sentence by sentence: the words live in each study's page.md template."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyformer.lab import pages

ROOT = Path(__file__).resolve().parents[1]
RES = Path("results")
STUDIES = [pages.study_name(s) for s in pages.pages()]
MAX_PAGE_LINES = 150
MAX_INDEX_LINES = 200


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # pages link and read relative to the checkout


@pytest.mark.parametrize("study", STUDIES)
def test_study_page_and_findings_regenerate(study: str) -> None:
    """``keyformer-report --pages --study <study>`` would change nothing: the committed findings.json and
    page equal what the committed rows render (on drift: run it and commit the result)."""
    files = pages.build(RES, only=study)
    assert files and not pages.drift(files), f"stale: {pages.drift(files)}; run keyformer-report --pages"
    page = next(text for path, text in files.items() if path.name == "README.md")
    assert len(page.splitlines()) <= MAX_PAGE_LINES + 10, f"{study}: {len(page.splitlines())} lines"
    assert "![" in page or study in ("crosscheck_kvpress", "gpu_studies"), f"{study}: no figure"
    folder = RES / next(pages.results_folder(s) for s in pages.pages() if pages.study_name(s) == study)
    for line in page.splitlines():
        if line.startswith("![") and "](" in line:
            target = folder / line.split("](", 1)[1].rstrip(")").split()[0]
            assert target.resolve().is_file(), f"{study}: figure {target} missing"


def test_results_index_regenerates_and_is_short() -> None:
    files = pages.index_file(RES)
    assert not pages.drift(files), "results/README.md is stale: run keyformer-report --pages"
    text = next(iter(files.values()))
    assert len(text.splitlines()) <= MAX_INDEX_LINES
    for study in pages.pages():
        assert f"]({pages.results_folder(study)}/README.md)" in text  # every study is linked


def test_unknown_placeholder_and_too_many_bullets_are_refused(tmp_path: Path) -> None:
    """A template naming an unknown placeholder, or a study giving more than 8 bullets, is an error."""
    import types

    folder = tmp_path / "experiments" / "s1"
    folder.mkdir(parents=True)
    (folder / "page.md").write_text("{{ nope }}\n")
    study = types.ModuleType("experiments.s1.findings")
    study.__file__ = str(folder / "findings.py")
    with pytest.raises(KeyError, match="unknown placeholder"):
        pages.render_page(study, tmp_path, None)
    (folder / "page.md").write_text("{{ findings }}\n")
    study.bullets = lambda doc: ["x"] * 9
    with pytest.raises(ValueError, match="at most 8"):
        pages.render_page(study, tmp_path, {"findings": []})
