"""Execute every notebook headless (nbclient) against the committed results.

A notebook whose results are not committed is skipped. Notebooks write their figures under
results/<study>/ (and small derived tables next to their results) and show them inline; outputs are not
saved back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the studies' notebooks (experiments/<study>/) and the library's (notebooks/)
NOTEBOOKS = sorted([*(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "experiments").glob("*/*.ipynb")])
# Results each notebook reads (relative to the repo root); unknown notebooks need results/<stem>/.
REQUIRES = {
    "exp1_cnndm": ["results/exp1_cnndm/points.csv", "results/exp1_cnndm/samples.csv"],
    "exp2_dialogsum": ["results/exp2_dialogsum/points.csv", "results/exp2_dialogsum/samples.csv"],
    "exp3_govreport": ["results/exp3_govreport/points.csv", "results/exp3_govreport/samples.csv"],
    "exp4_attention": ["results/exp4_attention/layers.csv", "results/exp4_attention/meta.json"],
    "exp5_ablations": ["results/exp5_ablations/points.csv", "results/exp5_ablations/samples.csv"],
    "exp6_speedup": ["results/bench/bench.csv"],
    "exp7_field": ["results/exp7_field"],
    "exp8_powered": ["results/exp8_powered/points.csv", "results/exp8_powered/samples.csv"],
    "exp8_authors": ["results/exp8_authors/points.csv", "results/exp8_authors/samples.csv"],
    "fewshot": ["results/fewshot"],
    "new_policy": ["results/exp10_ruler/aware/points.csv", "results/exp10_ruler/aware/samples.csv"],
}


def _missing(path: Path) -> list[str]:
    return [r for r in REQUIRES.get(path.stem, [f"results/{path.stem}"]) if not (ROOT / r).exists()]


def _code(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path: Path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    missing = _missing(path)
    if missing:
        pytest.skip(f"results not committed: {', '.join(missing)}")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if "savefig" in _code(path):  # the saved figure is also shown inline
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name}: no inline figure"


def test_notebooks_do_not_force_a_backend():
    """Figures show inline when a notebook runs interactively (files are still saved): no Agg."""
    for path in NOTEBOOKS:
        code = _code(path)
        assert "matplotlib.use(" not in code and "MPLBACKEND" not in code, path.name


@pytest.mark.slow
def test_jupyter_nbconvert_executes_a_notebook(tmp_path: Path):
    """The [notebooks] extra brings nbconvert: the README's `jupyter nbconvert --execute` works."""
    path = ROOT / "experiments" / "exp4_attention" / "exp4_attention.ipynb"
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent))
    if jupyter is None or _missing(path):
        pytest.skip("jupyter (nbconvert) not installed or results not committed")
    r = subprocess.run([jupyter, "nbconvert", "--to", "notebook", "--execute", str(path), "--output-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=path.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((tmp_path / path.name).read_text())
    assert any("image/png" in o.get("data", {}) for c in out["cells"] for o in c.get("outputs", []))


def test_notebooks_are_stripped():
    nbformat = pytest.importorskip("nbformat")
    for path in NOTEBOOKS:
        if not path.stem.startswith("exp"):
            continue
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.get("outputs") and c.get("execution_count") is None, f"{path.name} has outputs"
