"""Experiments 1-3's findings (experiments/exp1_cnndm/curves.py and each study's comparisons) on synthetic
rows with known answers: the pooled per-article differences, the pre-registered families and the
identical-output flags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.exp1_cnndm import curves
from experiments.exp1_cnndm import findings as exp1
from experiments.exp2_dialogsum import findings as exp2
from experiments.exp3_govreport import findings as exp3
from keyformer.lab import analysis
from keyformer.lab import findings as fnd

IDS = [f"a{i}" for i in range(20)]
BASE = np.random.default_rng(0).normal(8, 3, size=len(IDS))
# policy -> budget -> per-article shift from BASE; keyformer - h2o is +1 at 0.2 and +3 at 0.5: pooled +2
SHIFT = {"h2o": {0.2: 0.0, 0.5: 0.0}, "keyformer": {0.2: 1.0, 0.5: 3.0}, "window": {0.2: -2.0, 0.5: -2.0}}


def _write(root: Path, name: str, policies: dict[str, dict[float, float]], full: float | None = 5.0,
           text: str = "{policy}") -> None:
    """A results folder: one point per (policy, budget) and one full point, every article finished."""
    points, samples = [], []
    rows = [(p, b, s) for p, by in policies.items() for b, s in by.items()]
    if full is not None:
        rows.append(("full", 1.0, full))
    for policy, budget, shift in rows:
        point = f"budget={budget},policy={policy}"
        points.append({"point": point, "policy": policy, "budget": budget, "n_done": len(IDS),
                       "complete": True})
        samples += [{"point": point, "id": i, "rouge2": v + shift,
                     "prediction": text.format(policy=policy, budget=budget, id=i)}
                    for i, v in zip(IDS, BASE, strict=True)]
    (root / name).mkdir(parents=True)
    pd.DataFrame(points).to_csv(root / name / "points.csv", index=False)
    pd.DataFrame(samples).to_csv(root / name / "samples.csv", index=False)


def test_exp1_pooled_families_and_identical_flags(tmp_path: Path) -> None:
    _write(tmp_path, "exp1_cnndm", SHIFT)
    # an older commit: H2O gives the same outputs (identical), Keyformer other outputs 0.5 lower at 0.2
    _write(tmp_path, "archive/exp1_cnndm_7e9326a", {"h2o": {0.2: 0.0}, "keyformer": {0.2: 0.5}}, full=None,
           text="{policy}{budget}old")
    (tmp_path / "archive/exp1_cnndm_7e9326a/samples.csv").write_text(
        (tmp_path / "archive/exp1_cnndm_7e9326a/samples.csv").read_text().replace("h2o0.2old", "h2o"))
    _write(tmp_path, "exp7_field/cnndm", {k: {0.2: v[0.2]} for k, v in SHIFT.items()})  # same outputs
    cs = {c.id: c for c in exp1.comparisons(tmp_path)}
    assert set(cs) == {i for ids in exp1.DEFINITION["families"].values() for i in ids} - {
        "exp1.stream.keyformer-oldstream"}  # no old-stream folder here
    kh = cs["exp1.keyformer-h2o"]
    assert kh.family == "exp1.policies" and len(kh.strata) == 1 and len(kh.strata[0]) == len(IDS)
    np.testing.assert_allclose(kh.strata[0], 2.0)
    assert kh.meta["budgets"] == [0.2, 0.5] and not kh.identical
    np.testing.assert_allclose(cs["exp1.window-full"].strata[0], -7.0)  # every budget against the one full
    assert cs["exp1.window-full"].family == "exp1.vs_full"
    np.testing.assert_allclose(cs["exp1.stream.keyformer-7e9326a"].strata[0], 0.5)
    assert cs["exp1.stream.h2o-7e9326a"].identical and not cs["exp1.stream.keyformer-7e9326a"].identical
    assert all(cs[f"exp1.h200.{p}"].identical for p in ("full", "keyformer", "h2o", "window"))
    assert cs["exp1.h200.keyformer"].meta["budgets"] == [0.2]
    found = {f.id: f for f in fnd.evaluate(list(cs.values()), n_perm=500, n_perm_max=500)}
    assert found["exp1.keyformer-h2o"].verdict == "ahead" and found["exp1.window-full"].verdict == "behind"
    assert found["exp1.h200.full"].verdict == "n/a" and found["exp1.stream.h2o-7e9326a"].family_size is None
    assert found["exp1.stream.keyformer-7e9326a"].family_size == 1  # the identical H2O arm leaves the family


def test_pooled_estimate_is_the_report_tables_pooled_row(tmp_path: Path) -> None:
    """With unequal per-article noise, the pooled comparison is analysis.pooled_difference's statistic."""
    rng = np.random.default_rng(1)
    _write(tmp_path, "exp2_dialogsum", SHIFT)
    s = pd.read_csv(tmp_path / "exp2_dialogsum/samples.csv")
    s["rouge2"] += rng.normal(0, 1, size=len(s))
    s = s[~((s["point"] == "budget=0.5,policy=keyformer") & s["id"].isin(IDS[:3]))]  # a partial point
    s.to_csv(tmp_path / "exp2_dialogsum/samples.csv", index=False)
    points, samples = analysis.load_experiment(tmp_path, "exp2_dialogsum")
    d, used = analysis.pooled_difference(samples, points[points["policy"] != "full"], "keyformer", "h2o")
    c = next(c for c in exp2.comparisons(tmp_path) if c.id == "exp2.keyformer-h2o")
    assert c.strata[0].mean() == pytest.approx(d.mean) and len(c.strata[0]) == d.n
    assert c.meta["budgets"] == used


def test_exp3_families_are_its_design_only(tmp_path: Path) -> None:
    """Experiment 3 runs H2O and Keyformer: its policy family has one member; a window point does not join."""
    _write(tmp_path, "exp3_govreport", SHIFT)
    cs = {c.id: c.family for c in exp3.comparisons(tmp_path)}
    assert cs == {"exp3.keyformer-h2o": "exp3.policies", "exp3.keyformer-full": "exp3.vs_full",
                  "exp3.h2o-full": "exp3.vs_full"}


def test_missing_policy_or_rows_give_no_comparison(tmp_path: Path) -> None:
    assert exp2.comparisons(tmp_path) == []
    _write(tmp_path, "exp2_dialogsum", {"h2o": SHIFT["h2o"], "keyformer": SHIFT["keyformer"]}, full=None)
    assert [c.id for c in exp2.comparisons(tmp_path)] == ["exp2.keyformer-h2o"]
    assert curves.policy_pairs(pd.DataFrame({"point": ["x"], "policy": ["h2o"], "budget": [0.2]}), "h2o",
                               "full") == []
