"""The findings engine's statistics, once, on synthetic data with known answers and against scipy and
statsmodels where they implement the same procedure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from keyformer.lab import findings as fnd
from keyformer.lab.analysis import holm

ROOT = Path(__file__).resolve().parents[1]


def test_holm_equals_statsmodels() -> None:
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    rng = np.random.default_rng(3)
    for m in (1, 2, 5, 12, 40):
        p = rng.uniform(0, 0.2, size=m) ** 2
        assert np.allclose(holm(p), multipletests(p, method="holm")[1])


def test_pooled_percentile_ci_equals_scipy_bootstrap() -> None:
    """One stratum, the pooled design: the same percentile interval as scipy's bootstrap of the mean (up to
    Monte Carlo error of the two independent resamplings)."""
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(0).normal(0.4, 1.0, size=60)
    _, lo, hi, _, _ = fnd.bootstrap_test([x], n_boot=40_000, design=fnd.POOLED)
    ref = stats.bootstrap((x,), np.mean, n_resamples=40_000, method="percentile",
                          rng=np.random.default_rng(1)).confidence_interval
    assert lo == pytest.approx(ref.low, abs=0.02) and hi == pytest.approx(ref.high, abs=0.02)


def test_known_answers() -> None:
    """A constant difference has a zero-width CI at itself and p below resolution; a symmetric one has p 1."""
    est, lo, hi, p, se = fnd.bootstrap_test([np.full(20, 2.0)], n_boot=1000)
    assert (est, lo, hi, p, se) == (2.0, 2.0, 2.0, 0.0, 0.0)
    est, lo, hi, p, _ = fnd.bootstrap_test([np.array([-1.0, 1.0] * 10)], n_boot=2000)
    assert est == 0.0 and lo < 0 < hi and p == 1.0


def test_stratified_mean_weights_strata_equally_and_resamples_within() -> None:
    """Strata of different sizes: the statistic is the mean of stratum means; a stratum with no spread adds
    none to the replicates, so two constant strata give a zero-width CI."""
    a, b = np.full(3, 1.0), np.full(9, 4.0)
    assert fnd.estimate([a, b], fnd.STRATIFIED) == 2.5 and fnd.estimate([a, b], fnd.POOLED) == 3.25
    reps = fnd.replicate_means([a, b], 500, 0, fnd.STRATIFIED)
    assert np.all(reps == 2.5)
    assert fnd.replicate_means([a, b], 500, 0, fnd.POOLED).std() > 0  # pooling mixes the strata


def test_stratified_design_is_narrower_when_strata_differ() -> None:
    """The case the two designs disagree on: a difference that varies between strata but little within them
    is resolved when resampling within strata, not when pooling (the between-stratum spread counts there)."""
    rng = np.random.default_rng(0)
    strata = [rng.normal(mu, 0.3, size=5) for mu in (2.0, -1.5, 1.5, -1.0, 0.5, -0.3)]
    s = fnd.bootstrap_test(strata, 20_000, design=fnd.STRATIFIED)
    p = fnd.bootstrap_test(strata, 20_000, design=fnd.POOLED)
    assert s[3] < 0.05 < p[3] and (s[2] - s[1]) < (p[2] - p[1])


def test_mc_error_matches_the_spread_over_seeds() -> None:
    """The reported Monte Carlo standard error of p is the spread of p over independent seeds."""
    x = np.random.default_rng(5).normal(0.25, 1.0, size=40)
    ps = [fnd.bootstrap_test([x], 2000, seed=s)[3] for s in range(60)]
    se = fnd.bootstrap_test([x], 2000, seed=0)[4]
    assert np.std(ps) == pytest.approx(se, rel=0.35)


def test_evaluate_families_identical_and_borderline() -> None:
    rng = np.random.default_rng(1)
    strong = fnd.Comparison("s", "q", "a", "ref", [rng.normal(1.0, 0.5, 40)], family="f")
    null = fnd.Comparison("z", "q", "b", "ref", [rng.normal(0.0, 1.0, 40)], family="f")
    same = fnd.Comparison("i", "q", "c", "ref", [np.zeros(40)], family="f", identical=True)
    alone = fnd.Comparison("x", "q", "d", "ref", [rng.normal(-1.0, 0.5, 40)])
    out = {f.id: f for f in fnd.evaluate([strong, null, same, alone])}
    assert out["s"].verdict == "ahead" and out["x"].verdict == "behind" and out["z"].verdict == "tied"
    assert out["i"].verdict == "n/a" and out["i"].p is None and out["i"].family_size is None
    assert out["s"].family_size == out["z"].family_size == 2  # the identical one is outside the family
    assert out["s"].p_adj == holm([out["s"].p, out["z"].p])[0]
    assert out["x"].p_adj == out["x"].p  # no family: no correction
    with pytest.raises(ValueError, match="unique"):
        fnd.evaluate([strong, strong])
    # a p sitting near alpha gets more replicates than one far from it
    z = rng.normal(size=50)
    z = (z - z.mean()) / z.std() + 1.96 / np.sqrt(50)  # a mean 1.96 standard errors from 0: p near 0.05
    near = fnd.Comparison("n", "q", "e", "ref", [z])
    assert abs(fnd.bootstrap_test(near.strata, fnd.N_BOOT)[3] - fnd.ALPHA) < 0.01
    assert fnd.evaluate([near])[0].n_boot > fnd.N_BOOT >= out["s"].n_boot


def test_design_is_validated() -> None:
    with pytest.raises(ValueError, match="design 'nope'; valid: stratified, pooled"):
        fnd.replicate_means([np.ones(3)], 10, 0, "nope")


