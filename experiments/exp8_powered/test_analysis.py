"""Experiment 8's analysis (experiments/exp8_powered/analysis.py) on synthetic frames with known answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.exp8_powered import analysis as exp8

ROOT = Path(__file__).resolve().parents[2]


def _exp8_frames(shift: float, n: int = 400, noise: float = 1.0):
    """Synthetic experiment 8: Keyformer seeds = H2O + shift + noise, per article and budget."""
    rng = np.random.default_rng(0)
    ids = [f"a{i}" for i in range(n)]
    points, samples = [], []
    for b in (0.2, 0.3, 0.5):
        base = rng.normal(10, 3, n)
        for v, add in (("h2o", 0.0), ("keyformer_s0", shift), ("keyformer_s1", shift),
                       ("h2o_recent05", -1.0)):
            if v == "h2o_recent05" and b != 0.3:
                continue
            point = f"budget={b},{v}"
            points.append({"point": point, "variant": v, "budget": b})
            x = base + add + (rng.normal(0, noise, n) if v.startswith("keyformer") else 0)
            samples += [{"point": point, "id": i, "rouge2": float(val)} for i,
                        val in zip(ids, x, strict=True)]
    return pd.DataFrame(points), pd.DataFrame(samples)

def _authors_frames(n: int = 300, gap_greedy: float = 0.2, gap_beam: float = 1.0):
    """Synthetic authors'-setting subset: Keyformer = H2O + gap (per decoding), full = H2O + 2."""
    rng = np.random.default_rng(1)
    ids = [f"a{i}" for i in range(n)]
    points, samples = [], []
    for beams, gap in ((1, gap_greedy), (4, gap_beam)):
        base = rng.normal(10, 3, n)
        arms = [("full", 1.0, 2.0)] + [(p, b, gap if p == "keyformer" else 0.0) for p in ("h2o", "keyformer")
                                       for b in (0.5, 0.3)]
        for pol, b, add in arms:
            point = f"budget={b},generation={beams},policy={pol}"
            points.append({"point": point, "policy": pol, "budget": b, "num_beams": beams})
            x = base + add + rng.normal(0, 0.5, n)
            samples += [{"point": point, "id": i, "rouge2": float(v)} for i, v in zip(ids, x, strict=True)]
    return pd.DataFrame(points), pd.DataFrame(samples)

def ids_of(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


@pytest.mark.parametrize("shift, noise, decision", [(0.0, 1.0, "does not transfer"), (1.0, 1.0, "transfers"),
                                                    (0.3, 1.0, "Keyformer beats H2O"),
                                                    (0.4, 10.0, "inconclusive")])
def test_powered_study_decision_and_estimates(shift, noise, decision):
    points, samples = _exp8_frames(shift, noise=noise)
    r = exp8.powered_study(points, samples, n_boot=2000)
    p = r["pooled"]
    assert r["n"] == 400 and abs(p["diff"] - shift) < 0.15 * noise and p["ci_lo"] < p["diff"] < p["ci_hi"]
    assert p["decision"].startswith(decision), p
    assert [b["budget"] for b in r["budgets"]] == [0.2, 0.3, 0.5]
    assert abs(r["budgets"][0]["s0_minus_s1"]["diff"]) < 0.3 * noise  # two seeds of the same method
    (extra,) = r["extras"]
    assert extra["variant"] == "h2o_recent05" and extra["diff"] == pytest.approx(-1.0)
    assert extra["kf_minus_h2o_same_articles"]["diff"] == pytest.approx(shift, abs=0.15 * noise + 0.05)
    # the n that the observed SD needs for a half-width of 0.25
    assert p["n_for_half_width"] == int(np.ceil((1.96 * p["sd"] / 0.25) ** 2))
    # the n at which a CI of that SD around the observed mean would exclude 0 or +0.3: more than n when
    # undecided
    margin = max(abs(p["diff"]), abs(p["diff"] - 0.3))
    assert p["n_decisive"] == int(np.ceil((1.96 * p["sd"] / margin) ** 2))
    assert (p["n_decisive"] > r["n"]) == decision.startswith("inconclusive")


def test_powered_study_uses_only_articles_every_core_arm_finished():
    points, samples = _exp8_frames(0.5, n=50)
    samples = samples[~((samples["point"] == "budget=0.5,keyformer_s1") & samples["id"].isin(["a0", "a1"]))]
    assert exp8.powered_study(points, samples, n_boot=200)["n"] == 48
    assert exp8.powered_study(points[points["variant"] != "keyformer_s1"], samples)["n"] == 0


def test_authors_setting_gaps_beam_effect_and_short_reference():
    points, samples = _authors_frames()
    short = _exp8_frames(0.0, n=300)  # the 512-token study: no gap on articles a0..a299
    r = exp8.authors_setting(points, samples, short=short, n_boot=1000)
    rows = {(x["num_beams"], x["budget"]): x for x in r["rows"]}
    assert set(rows) == {(1, 0.5), (1, 0.3), (4, 0.5), (4, 0.3)} and all(x["n"] == 300 for x in rows.values())
    assert rows[(4, 0.3)]["kf_minus_h2o"]["diff"] == pytest.approx(1.0, abs=0.15)
    assert rows[(1, 0.5)]["h2o_minus_full"]["diff"] == pytest.approx(-2.0, abs=0.15)
    pooled = {p["num_beams"]: p for p in r["pooled"]}
    assert pooled[1]["diff"] == pytest.approx(0.2, abs=0.1) and pooled[4]["decision"].startswith("transfers")
    assert r["beam_minus_greedy"]["diff"] == pytest.approx(0.8, abs=0.15)
    lms = r["long_minus_short"]
    assert lms["n"] == 300 and lms["diff"] == pytest.approx(pooled[1]["diff"] - lms["short_gap"], abs=1e-9)
    # a missing Keyformer point at one budget drops that row and the pooled gap of its decoding
    r2 = exp8.authors_setting(points[points["point"] != "budget=0.3,generation=4,policy=keyformer"],
                                  samples,
                                  n_boot=200)
    assert (len(r2["rows"]) == 3 and [p["num_beams"] for p in r2["pooled"]] == [1]
            and r2["beam_minus_greedy"] is None)
    # a full reference that finished fewer articles limits only the comparisons with full
    fewer = samples[~((samples["point"] == "budget=1.0,generation=4,policy=full")
                      & samples["id"].isin(ids_of(100)))]
    r3 = exp8.authors_setting(points, fewer, n_boot=200)
    beam = [x for x in r3["rows"] if x["num_beams"] == 4]
    assert all(x["n"] == 300 and x["n_full"] == 200 for x in beam)
