"""Experiment 7's field ranking and quantization pricing, on synthetic rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp7_field import findings as exp7

ROOT = Path(__file__).resolve().parents[2]


def test_report_field_ranks_policies_and_prices_quantization(tmp_path: Path, capsys) -> None:
    """keyformer-report's experiment 7 section: per budget each policy's mean and rank, the pooled difference
    from Keyformer, and the quantized points against full (left out of the ranking)."""

    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(50)]
    base = rng.normal(0, 2, 50)
    base += 10 - base.mean()  # point means 10 + add
    arms = [("full", 1.0, None, 3.0), ("keyformer", 0.2, None, 1.0), ("h2o", 0.2, None, 0.0),
            ("keyformer", 0.5, None, 2.0), ("h2o", 0.5, None, 2.0), ("full", 1.0, 4.0, 2.5),
            ("tova", 0.5, None, 9.0)]
    points, samples = [], []
    for pol, b, q, add in arms:
        pt = f"{pol},{b},{q}"
        points.append({"point": pt, "policy": pol, "budget": b, "kv_quant": q, "kv_ratio": 0.2 if q else b,
                       "rouge2": float((base + add).mean()), "complete": pol != "tova"})  # tova still running
        samples += [{"point": pt, "id": i, "rouge2": float(v)} for i, v in zip(ids, base + add, strict=True)]
    d = tmp_path / "exp7_field" / "cnndm"
    d.mkdir(parents=True)
    pd.DataFrame(points).to_csv(d / "points.csv", index=False)
    pd.DataFrame(samples).to_csv(d / "samples.csv", index=False)
    exp7.field(tmp_path)
    out = capsys.readouterr().out
    assert "Full cache: 13.00" in out and "| keyformer | 11.00 (1) | 12.00 (1) | 50 | - | - |" in out
    assert "| h2o |" in out and "-0.50 [-0.50, -0.50] (boot) | 0.2,0.5 |" in out  # no findings.json here
    assert "| full,1.0,4.0 |" in out and "-0.50 [-0.50, -0.50] |" in out
    assert "tova" not in out  # an unfinished point is not ranked
