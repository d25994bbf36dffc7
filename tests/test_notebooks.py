"""Execute every notebook headless (nbclient) against the committed results.

A notebook whose results are not committed is skipped. Notebooks write their figures under
results/figures/ (and small derived tables next to their results); outputs are not saved back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# Results each notebook reads (relative to the repo root); unknown notebooks need results/<stem>/.
REQUIRES = {
    "exp1_cnndm": ["results/exp1_cnndm/points.csv", "results/exp1_cnndm/samples.csv"],
    "exp2_dialogsum": ["results/exp2_dialogsum/points.csv", "results/exp2_dialogsum/samples.csv"],
    "exp3_govreport": ["results/exp3_govreport/points.csv", "results/exp3_govreport/samples.csv"],
    "exp4_attention": ["results/exp4_attention/layers.csv", "results/exp4_attention/meta.json"],
    "exp5_ablations": ["results/exp5_ablations/points.csv", "results/exp5_ablations/samples.csv"],
    "exp6_speedup": ["results/bench/bench.csv"],
    "fewshot": ["results/fewshot"],
}
# Notebooks owned elsewhere that are known to fail against the committed results (reported to their owner).
KNOWN_FAILING: dict[str, str] = {}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    missing = [r for r in REQUIRES.get(path.stem, [f"results/{path.stem}"]) if not (ROOT / r).exists()]
    if missing:
        pytest.skip(f"results not committed: {', '.join(missing)}")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError:
        if path.stem in KNOWN_FAILING:
            pytest.xfail(KNOWN_FAILING[path.stem])
        raise
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


def test_notebooks_are_stripped():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        if not path.stem.startswith("exp"):
            continue
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, f"{path.name} has outputs"
