"""Experiment 7's findings on hand-made rows with a known answer: each policy's per-record difference from
Keyformer averaged over the budgets both ran, identical outputs flagged, quantized points in no family."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp7_field import findings as exp7
from keyformer.lab import findings as fnd

IDS = [f"r{i}" for i in range(6)]
BASE = np.array([2.0, 4.0, 6.0, 8.0, 10.0, 12.0])


def _write(folder: Path) -> None:
    """CNN/DM rows: Keyformer at 0.1 and 0.5; H2O 1 above it at 0.1 and 3 above at 0.5 (other text);
    Ada-KV over Keyformer equal to it in text and score; window at 0.1 only, 2 below; a quantized H2O point
    far above (must not count); full."""
    points, samples = [], []

    def add(policy: str, budget: float, score: np.ndarray, text: str, quant: float = np.nan) -> None:
        name = f"budget={budget},policy={policy}" + ("" if np.isnan(quant) else f",kv_quant={quant:g}")
        points.append({"point": name, "policy": policy, "budget": budget, "kv_quant": quant,
                       "complete": True, "rouge2": float(score.mean())})
        samples.extend([{"point": name, "id": i, "rouge2": s, "prediction": f"{text} {i}"}
                        for i, s in zip(IDS, score, strict=True)])

    for b in (0.1, 0.5):
        add("keyformer", b, BASE + b, "kf")
        add("adakv_keyformer", b, BASE + b, "kf")
        add("h2o", b, BASE + b + (1.0 if b == 0.1 else 3.0), "h2o")
    add("window", 0.1, BASE + 0.1 - 2.0, "win")
    add("h2o", 0.3, BASE + 50.0, "q", quant=8.0)
    add("full", 1.0, BASE + 5.0, "full")
    folder.mkdir(parents=True)
    pd.DataFrame(points).to_csv(folder / "points.csv", index=False)
    pd.DataFrame(samples).to_csv(folder / "samples.csv", index=False)


def test_pooled_differences_identity_and_family(tmp_path: Path) -> None:
    _write(tmp_path / "exp7_field" / "cnndm")
    cs = {c.id: c for c in exp7.comparisons(tmp_path)}
    assert set(cs) == {"exp7.cnndm.h2o", "exp7.cnndm.adakv_keyformer", "exp7.cnndm.window"}
    h2o = cs["exp7.cnndm.h2o"]
    assert len(h2o.strata) == 1 and np.allclose(h2o.strata[0], 2.0)  # mean of +1 and +3; quantized point out
    assert h2o.meta["budgets"] == [0.1, 0.5] and h2o.family == "exp7.cnndm" and not h2o.identical
    assert h2o.meta["rank_a"] == {"0.1": 1, "0.5": 1}  # best mean at both budgets
    assert cs["exp7.cnndm.adakv_keyformer"].identical
    win = cs["exp7.cnndm.window"]
    assert win.meta["budgets"] == [0.1] and np.allclose(win.strata[0], -2.0) and not win.identical
    found = {f.id: f for f in fnd.evaluate(list(cs.values()), n_perm=2000)}
    assert found["exp7.cnndm.adakv_keyformer"].verdict == "n/a"
    assert found["exp7.cnndm.h2o"].family_size == 2  # the identical arm leaves the family


def test_families_are_fixed_lists() -> None:
    """The pre-registered families name the seven policies of the field per task, whatever the rows hold."""
    fams = exp7.DEFINITION["families"]
    assert set(fams) == {f"exp7.{t}" for t in exp7.EXP7_METRIC}
    assert all(v == list(exp7.POLICIES) for v in fams.values()) and "keyformer" not in exp7.POLICIES
