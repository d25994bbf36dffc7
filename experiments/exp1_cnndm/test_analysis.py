"""Experiments 1-3's report sections (new stream, nanfix reruns, equal-config pairing), on synthetic rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp1_cnndm import findings as exp1
from experiments.exp8_powered import findings as exp8_findings
from experiments.exp8_powered.test_analysis import _exp8_frames

ROOT = Path(__file__).resolve().parents[2]





def test_report_new_stream_table(tmp_path: Path, capsys) -> None:
    """keyformer-report pairs exp1's Keyformer points with its H2O points and the previous stream's
    Keyformer."""

    rng = np.random.default_rng(3)
    ids = [f"a{i}" for i in range(40)]
    base = rng.normal(10, 4, size=40)

    def write(name: str, pts: dict[str, tuple[str, float, np.ndarray]]) -> None:
        d = tmp_path / name
        d.mkdir(parents=True)
        pd.DataFrame([{"point": p, "policy": pol, "budget": b, "complete": True} for p,
                      (pol, b, _) in pts.items()]
                     ).to_csv(d / "points.csv", index=False)
        pd.DataFrame([{"point": p, "id": i, "rouge2": v} for p, (_, _, vals) in pts.items()
                      for i, v in zip(ids, vals, strict=True)]).to_csv(d / "samples.csv", index=False)

    write("exp1_cnndm", {"h": ("h2o", 0.2, base), "n": ("keyformer", 0.2, base + 1.0),
                         "h5": ("h2o", 0.5, base), "n5": ("keyformer", 0.5, base + 1.0)})
    write("archive/exp1_cnndm_oldstream",
          {"k": ("keyformer", 0.2, base + 0.5), "k5": ("keyformer", 0.5, base)})
    exp1.new_stream(tmp_path)
    out = capsys.readouterr().out
    assert "| 0.2 | 40 |" in out and "+1.00 [+1.00, +1.00] | +0.50 [+0.50, +0.50] |" in out
    assert "Pooled over 2 budgets (40 articles): now - old +0.75 [+0.75, +0.75]" in out


def test_report_nanfix_pairs_the_rerun_with_the_buggy_run(tmp_path: Path, capsys) -> None:
    """keyformer-report's re-run section: identical outputs per Keyformer point and both pooled gaps, over the
    articles the re-run finished."""

    for name, shift in (("archive/exp8_powered_buggy", 0.0), ("exp8_powered", 1.0)):
        points, samples = _exp8_frames(shift, n=60)
        points = points[points["variant"] != "h2o_recent05"]
        if name == "exp8_powered":
            samples = samples[samples["id"].isin([f"a{i}" for i in range(40)])]
        samples = samples.assign(prediction=np.where(samples["point"].str.contains("keyformer") & (shift > 0)
                                                     & (samples["id"] == "a0"), "new", "same"))
        (tmp_path / name).mkdir(parents=True)
        points.to_csv(tmp_path / name / "points.csv", index=False)
        samples.to_csv(tmp_path / name / "samples.csv", index=False)
    exp8_findings.nanfix(tmp_path)
    out = capsys.readouterr().out
    assert "40 articles every arm finished" in out and "| budget=0.3,keyformer_s0 | 39/40 |" in out
    assert out.count("/40 |") == 6 and "buggy, same articles:" in out


def test_report_same_config_pairs_points_of_equal_config_only(tmp_path: Path, capsys) -> None:
    """keyformer-report's device/realisation tables pair points with the same config: a quantized point with
    the same policy and budget is not the plain point's twin, and a column one side lacks counts as unset."""

    ids = [f"a{i}" for i in range(10)]
    plain = {"policy": "h2o", "budget": 0.3}
    sides = {"cpu": [("p", plain, "x")],
             "gpu": [("q8", {**plain, "kv_quant": 8.0}, "y"), ("p", {**plain, "kv_quant": np.nan}, "x")]}
    for name, pts in sides.items():
        rows = [{"point": pt, **cfg, "variant": ""} for pt, cfg, _ in pts]
        samples = [{"point": pt, "id": i, "rouge2": 1.0, "prediction": text} for pt, _, text in pts
                   for i in ids]
        (tmp_path / name).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / name / "points.csv", index=False)
        pd.DataFrame(samples).to_csv(tmp_path / name / "samples.csv", index=False)
    exp1.same_config(tmp_path, "gpu", "cpu", "t")
    out = capsys.readouterr().out
    assert "| h2o | 0.3 | 10/10 |" in out and out.count("| h2o |") == 1
