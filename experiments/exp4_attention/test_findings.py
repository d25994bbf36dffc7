"""Experiment 4's page numbers (descriptive, no findings.json) on synthetic rows with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.exp4_attention import findings as exp4

XS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


def test_mass_crossing_interpolates_and_bounds() -> None:
    curve = pd.Series([0.5, 0.7, 0.8, 0.85, 0.95, 0.99], index=XS)
    assert exp4._mass_at(curve) == pytest.approx(0.35)  # 0.9 between 0.85 at 30 % and 0.95 at 40 %
    assert exp4._mass_at(curve + 0.5) == pytest.approx(0.05)  # reached at the smallest share measured
    assert np.isnan(exp4._mass_at(curve * 0.5))


def test_observations_read_the_rows(tmp_path: Path) -> None:
    d = tmp_path / "exp4_attention"
    d.mkdir()
    rows = []
    for layer, row in ((0, [0.5, 0.7, 0.8, 0.85, 0.95, 0.99]), (1, [0.95] * 6)):
        rows += [{"layer": layer, "stat": s, "x": x, "value": v}
                 for s in ("row_mass", "last_mass", "acc_mass") for x, v in zip(XS, row, strict=True)]
        rows.append({"layer": layer, "stat": "sparsity", "x": np.nan, "value": 0.2 + 0.6 * layer})
    pd.DataFrame(rows).to_csv(d / "layers.csv", index=False)
    (d / "meta.json").write_text(json.dumps({"sparsity_threshold": 0.01}))
    text = exp4.observations(tmp_path)
    assert "in layer 1 to 35 % in layer 0" in text  # per-layer crossings: layer 1 at the smallest share
    assert "mean **50 %**, from 20 % in layer 0 to 80 % in layer 1" in text
    assert exp4.observations(tmp_path / "none") == "(no rows yet)"
