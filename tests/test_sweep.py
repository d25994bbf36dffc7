"""``keyformer-report --sweep``: a user's sweep as a page, on rows with known answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyformer.lab import sweep

ROOT = Path(__file__).resolve().parents[1]


def _write(folder: Path, scores: dict[tuple[str, float], list[float]], metric: str, ids: list[str],
           same_as: dict[str, str] | None = None) -> None:
    """A collected folder: one point per (policy, budget), ``scores`` per record in ``ids`` order."""
    folder.mkdir(parents=True)
    points, samples = [], []
    for (policy, budget), ys in scores.items():
        name = f"budget={budget:g},policy={policy}"
        points.append({"point": name, "policy": policy, "budget": budget, "model": "m", "dataset": "d",
                       "complete": True, "n_done": len(ys), "kv_ratio": min(1.0, budget),
                       "decode_ms_per_token": 10.0})
        pred_of = (same_as or {}).get(policy, policy)
        for i, y in zip(ids, ys, strict=True):
            samples.append({"point": name, "id": i, metric: y, "rouge2": 50.0,
                            "prediction": f"{pred_of}-{i}"})
    pd.DataFrame(points).to_csv(folder / "points.csv", index=False)
    pd.DataFrame(samples).to_csv(folder / "samples.csv", index=False)


def test_a_sweep_page_has_its_figure_table_and_findings_with_the_known_differences(tmp_path: Path) -> None:
    ids = [f"r{i}" for i in range(8)]
    full = [100.0] * 8
    kf = [100.0] * 6 + [0.0] * 2  # keyformer - full: -25 exactly
    h2o = [100.0] * 2 + [0.0] * 6  # h2o - keyformer: (0*2 - 100*4 + 0*2) / 8 = -50
    _write(tmp_path / "mine", {("full", 1.0): full, ("keyformer", 0.25): kf, ("h2o", 0.25): h2o}, "accuracy",
           ids)
    written = sweep.build(tmp_path / "mine", tmp_path / "page")
    assert {p.name for p in written} == {"figure.png", "findings.json", "README.md"}
    assert (tmp_path / "page" / "figure.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((tmp_path / "page" / "findings.json").read_text())
    assert doc["definition"]["metric"] == "accuracy"  # the task's own metric, not ROUGE
    assert doc["definition"]["registration"] == "exploratory"
    est = {f["id"]: f["estimate"] for f in doc["findings"]}
    assert est == {"h2o@0.25-full": -75.0, "h2o@0.25-keyformer": -50.0, "keyformer@0.25-full": -25.0}
    page = (tmp_path / "page" / "README.md").read_text()
    assert "| keyformer | 0.25 |" in page and "| keyformer | 0.2 |" not in page  # budgets as recorded


def test_identical_outputs_are_not_a_finding_and_ruler_rows_are_stratified_by_task(tmp_path: Path) -> None:
    ids = [f"ruler-{t}-L4096-{i}" for t in ("vt", "cwe", "niah_single_1") for i in range(3)]
    ys = list(np.linspace(0, 100, len(ids)))
    _write(tmp_path / "r", {("full", 1.0): ys, ("tova", 0.5): ys, ("keyformer", 0.5): ys}, "string_match_all",
           ids, same_as={"tova": "keyformer"})
    metric, _, found, _ = sweep.analyse(*sweep.load(tmp_path / "r", tmp_path / "r"))
    assert metric == "string_match_all"
    by = {f.id: f for f in found}
    assert by["tova@0.5-keyformer"].verdict == "n/a"  # same predictions on every record
    assert all(f.n_strata == 3 and f.n == 9 for f in found)


def test_the_main_metric_order_and_a_missing_metric_is_one_error() -> None:
    assert sweep.main_metric(pd.DataFrame({"rouge2": [1.0], "accuracy": [1.0]})) == "accuracy"
    assert sweep.main_metric(pd.DataFrame({"rouge2": [1.0], "string_match_all": [1.0]})) == "string_match_all"
    with pytest.raises(sweep.SweepError, match="no metric column"):
        sweep.main_metric(pd.DataFrame({"x": [1.0]}))


def test_report_results_prints_budgets_as_recorded(tmp_path: Path) -> None:
    ids = [f"r{i}" for i in range(4)]
    _write(tmp_path / "c", {("full", 1.0): [100.0] * 4, ("h2o", 0.25): [50.0] * 4}, "accuracy", ids)
    from keyformer.lab.report import render_collected

    text = render_collected(tmp_path / "c")
    assert "| h2o | 0.25 | 4 |" in text and "accuracy" in text


@pytest.mark.slow
def test_a_raw_sweep_becomes_a_page_in_one_command(tmp_path: Path) -> None:
    """``python run.py -m ...`` then ``keyformer-report --sweep`` on the raw sweep folder."""
    sweep_dir = tmp_path / "multirun"
    r = subprocess.run([sys.executable, "run.py", "-m", "model=tiny_llama", "policy=full,window,keyformer",
                        "budget=0.25", "n_samples=2", "progress=false", f"hydra.sweep.dir={sweep_dir}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "keyformer.lab.cli", "--sweep", str(sweep_dir), "--out",
                        str(tmp_path / "page")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "page" / "findings.json").read_text())
    assert doc["definition"]["metric"] == "accuracy"  # the sample task's metric
    assert {f["id"] for f in doc["findings"]} == {"window@0.25-full", "window@0.25-keyformer",
                                                   "keyformer@0.25-full"}
    assert (tmp_path / "page" / "points.csv").is_file()


def test_a_sweeps_findings_go_to_its_wandb_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sweep ... --wandb-group G`` logs the findings.json it wrote as a W&B Table of group G (offline)."""
    pytest.importorskip("wandb")
    from keyformer.lab.cli import main
    from keyformer.run.wandb_offline import OfflineApi

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # a W&B session an earlier test started ignores WANDB_DIR: ./wandb is here
    ids = [f"r{i}" for i in range(4)]
    _write(tmp_path / "c", {("full", 1.0): [100.0] * 4, ("h2o", 0.5): [50.0] * 4}, "accuracy", ids)
    args = ["--sweep", str(tmp_path / "c"), "--out", str(tmp_path / "page"), "--wandb-group", "mine"]
    assert main(args) == 0
    (run,) = OfflineApi(tmp_path).runs(filters={"group": "mine"})
    with run.file(run.summary["findings"]["path"]).download() as f:
        table = json.load(f)
    assert [dict(zip(table["columns"], r, strict=True))["estimate"] for r in table["data"]] == [-50.0]
