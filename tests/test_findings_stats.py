"""The statistics engine (keyformer.lab.stats) and the findings built on it, on synthetic data with known
answers and against scipy and statsmodels where they implement the same procedure."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from keyformer.lab import findings as fnd
from keyformer.lab import stats


def _naive_p(d: np.ndarray, w: np.ndarray, delta: float = 0.0) -> float:
    """Every sign pattern written out: the share with |sum w s (d - delta)| >= |sum w (d - delta)|."""
    obs = abs(float(w @ (d - delta)))
    hits = [abs(float(w @ (np.array(s) * (d - delta)))) >= obs - 1e-12
            for s in itertools.product((1, -1), repeat=len(d))]
    return float(np.mean(hits))


def test_holm_equals_statsmodels() -> None:
    multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests
    rng = np.random.default_rng(3)
    for m in (1, 2, 5, 12, 40):
        p = rng.uniform(0, 0.2, size=m) ** 2
        assert np.allclose(stats.holm(p), multipletests(p, method="holm")[1])


def test_exact_p_equals_scipy_permutation_test() -> None:
    """Paired sign flips: scipy's permutation_test with permutation_type='samples' on one sample flips each
    difference's sign, exactly when its resamples cover every pattern; the same p, unweighted and with the
    stratified weights."""
    sp = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (5, 9, 12):
        d = rng.normal(0.4, 1.0, size=n).round(1)
        ours = stats.sign_flip([d]).p()
        ref = sp.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                  n_resamples=np.inf, alternative="two-sided").pvalue
        assert ours == pytest.approx(ref, abs=1e-12)
    strata = [rng.normal(0.5, 1.0, size=k).round(2) for k in (3, 5, 4)]
    w = stats.weights(strata)
    ref = sp.permutation_test((np.concatenate(strata),), lambda x, axis: np.sum(w * x, axis=axis),
                              permutation_type="samples", n_resamples=np.inf).pvalue
    assert stats.sign_flip(strata).p() == pytest.approx(ref, abs=1e-12)


def test_exact_p_and_shifted_p_equal_the_naive_enumeration() -> None:
    rng = np.random.default_rng(1)
    strata = [rng.integers(-1, 2, size=k) * 100.0 for k in (4, 3, 5)]
    sf = stats.sign_flip(strata)
    w, d = stats.weights(strata), np.concatenate(strata)
    for delta in (0.0, 10.0, -35.0, sf.estimate):
        assert sf.p(delta) == pytest.approx(_naive_p(d, w, delta), abs=1e-12)
    assert sf.exact and sf.n_perm == 2 ** 12


def test_monte_carlo_p_is_near_the_exact_one_and_reports_its_error() -> None:
    sp = pytest.importorskip("scipy.stats")
    d = np.random.default_rng(2).normal(0.3, 1.0, size=14)
    exact = sp.permutation_test((d,), lambda x, axis: np.mean(x, axis=axis), permutation_type="samples",
                                n_resamples=np.inf).pvalue
    mc = stats.sign_flip([d], n_perm=40_000, rng=stats.stream(0, "x"), exact_max=0)
    p = mc.p()
    assert not mc.exact and mc.n_perm == 40_000
    assert abs(p - exact) < 4 * mc.p_se(p) and mc.p_se(p) > 0
    ps = [stats.sign_flip([d], n_perm=2000, rng=stats.stream(s, "x"), exact_max=0).p() for s in range(40)]
    assert np.std(ps) == pytest.approx(math.sqrt(exact * (1 - exact) / 2000), rel=0.4)


def test_known_answers_at_small_n() -> None:
    """Four records all one way: 2/16 is the smallest p, so no verdict and no bounded interval; six equal
    ones: p 2/64 but no spread to build an interval from; a symmetric sample: p 1."""
    sf = stats.sign_flip([np.full(2, -100.0), np.full(2, -100.0)])
    assert sf.p() == pytest.approx(2 / 16)
    assert sf.interval(0.95) == (-math.inf, math.inf)
    assert stats.sign_flip([np.full(6, 2.0)]).p() == pytest.approx(2 / 64)
    assert stats.sign_flip([np.array([-1.0, 1.0] * 5)]).p() == 1.0


def test_interval_excludes_zero_exactly_when_the_test_rejects() -> None:
    rng = np.random.default_rng(4)
    for k in range(40):
        n = int(rng.integers(6, 40))
        strata = [rng.normal(rng.normal(0, 0.6), 1.0, size=n // 2), rng.normal(0.2, 1.0, size=n - n // 2)]
        sf = stats.sign_flip(strata, n_perm=3000, rng=stats.stream(k, "c"), exact_max=12)
        for level in (0.95, 0.99, 0.995):
            lo, hi = sf.interval(level)
            assert (lo <= 0 <= hi) == (sf.p() >= 1 - level)
            assert lo <= sf.estimate <= hi


def test_interval_covers_the_true_shift() -> None:
    """Coverage on synthetic data with a known mean difference (symmetric errors): near 95 %."""
    rng = np.random.default_rng(5)
    hits = 0
    for k in range(200):
        d = 0.7 + rng.standard_t(5, size=25)
        lo, hi = stats.sign_flip([d], n_perm=2000, rng=stats.stream(k, "cov")).interval(0.95)
        hits += lo <= 0.7 <= hi
    assert 0.91 <= hits / 200 <= 0.99


def test_sign_flip_test_holds_its_level_at_small_n() -> None:
    """Under no difference, the exact test rejects at most alpha of the time (5 records a stratum, 0/1
    outcomes, as in experiment 10)."""
    rng = np.random.default_rng(6)
    rejections = 0
    for _ in range(300):
        strata = [(rng.integers(0, 2, 5) - rng.integers(0, 2, 5)) * 100.0 for _ in range(3)]
        rejections += stats.sign_flip(strata).p() < 0.05
    assert rejections / 300 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300)


def test_holm_levels_agree_with_holm() -> None:
    rng = np.random.default_rng(7)
    for m in (1, 3, 8, 20):
        for _ in range(50):
            p = rng.uniform(0, 0.1, size=m) ** 1.5
            assert np.array_equal(p < stats.holm_levels(p, 0.05), stats.holm(p) < 0.05)


def test_streams_are_independent_of_order_and_seed() -> None:
    a = stats.stream(0, "exp10.x").integers(0, 1 << 30, 4)
    assert np.array_equal(a, stats.stream(0, "exp10.x").integers(0, 1 << 30, 4))
    assert not np.array_equal(a, stats.stream(1, "exp10.x").integers(0, 1 << 30, 4))
    assert not np.array_equal(a, stats.stream(0, "exp10.y").integers(0, 1 << 30, 4))
    # seed + t reuse: the old scheme gave seed 1's first stratum seed 0's second; spawning does not
    assert not np.array_equal(stats.stream(1, "k", 0).integers(0, 1 << 30, 4),
                              stats.stream(0, "k", 1).integers(0, 1 << 30, 4))


def test_bootstrap_mean_equals_scipy_bootstrap() -> None:
    sp = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(0).normal(0.4, 1.0, size=60)
    _, lo, hi = stats.bootstrap_mean([x], 40_000, stats.stream(0, "b"))
    ref = sp.bootstrap((x,), np.mean, n_resamples=40_000, method="percentile",
                       rng=np.random.default_rng(1)).confidence_interval
    assert lo == pytest.approx(ref.low, abs=0.02) and hi == pytest.approx(ref.high, abs=0.02)
    assert stats.bootstrap_valid([x]) and not stats.bootstrap_valid([x[:5], x])


def test_power_known_answer() -> None:
    """One stratum of +-1 (mean square 1, variance 100/99): n = (z_0.975 * 1 + z_0.8 * sd)^2 / effect^2, and
    a simulation at that n rejects about 80 % of the time."""
    x = np.array([-1.0, 1.0] * 50)
    var = stats.within_variance([x])
    assert var == pytest.approx(100 / 99)
    n = stats.records_needed([x + 0.5], 0.5, 0.05)
    sd = math.sqrt(var)
    m2 = float(np.mean((x + 0.5) ** 2))
    assert 0 <= n - (1.96 * math.sqrt(m2) + 0.8416 * sd) ** 2 / 0.25 < 1
    assert stats.records_needed([x], 0.0, 0.05) == math.inf
    assert stats.detectable([x], 0.05) == pytest.approx(2.8016 * math.sqrt(var / 100), rel=1e-3)
    rng = np.random.default_rng(8)
    hits = [stats.sign_flip([rng.normal(0.5, 1.0, n)], n_perm=999, rng=stats.stream(k, "pw")).p() < 0.05
            for k in range(150)]
    assert 0.68 <= np.mean(hits) <= 0.92


def test_evaluate_verdicts_families_and_roles() -> None:
    rng = np.random.default_rng(1)
    strong = fnd.Comparison("s", "q", "a", "ref", [rng.normal(1.0, 0.5, 40)], family="f")
    null = fnd.Comparison("z", "q", "b", "ref", [rng.normal(0.0, 1.0, 40)], family="f")
    same = fnd.Comparison("i", "q", "c", "ref", [np.zeros(40)], family="f", identical=True)
    close = fnd.Comparison("e", "q", "g", "ref", [rng.normal(0.0, 0.2, 200)], family="f", margin=0.5)
    alone = fnd.Comparison("x", "q", "d", "ref", [rng.normal(-1.0, 0.5, 40)])
    desc = fnd.Comparison("d", "q", "h", "ref", [rng.normal(2.0, 0.5, 40)], family="f", role="descriptive")
    out = {f.id: f for f in fnd.evaluate([strong, null, same, close, alone, desc])}
    assert out["s"].verdict == "ahead" and out["x"].verdict == "behind"
    assert out["z"].verdict == "inconclusive" and out["z"].records_needed > 40
    assert out["e"].verdict == "equivalent" and -0.5 <= out["e"].ci_lo and out["e"].ci_hi <= 0.5
    assert out["i"].verdict == "n/a" and out["i"].p is None and out["i"].family_size is None
    assert out["d"].verdict is None and out["d"].family_size is None and out["d"].ci_lo is not None
    assert out["s"].family_size == out["z"].family_size == 3  # identical and descriptive are outside
    assert out["s"].p_adj == pytest.approx(stats.holm([out["s"].p, out["z"].p, out["e"].p])[0])
    assert out["x"].p_adj == out["x"].p and out["x"].level == fnd.ALPHA
    for f in out.values():  # the interval printed beside a verdict agrees with it
        if f.verdict in ("ahead", "behind"):
            assert f.ci_lo > 0 or f.ci_hi < 0
        elif f.verdict in ("inconclusive", "equivalent"):
            assert f.ci_lo <= 0 <= f.ci_hi
    with pytest.raises(ValueError, match="unique"):
        fnd.evaluate([strong, strong])
    with pytest.raises(ValueError, match="role 'x'; valid: confirmatory, exploratory, descriptive"):
        fnd.evaluate([fnd.Comparison("r", "q", "a", "b", [np.ones(3)], role="x")])


def test_a_small_sweep_gets_no_decisive_verdict() -> None:
    """Two records on each of two tasks, all wrong against a field that got them right: the exact test
    cannot reject (2/16), so the finding is inconclusive with no bounded interval."""
    f = fnd.evaluate([fnd.Comparison("tiny", "q", "mine", "theirs", [np.full(2, -100.0)] * 2, family="f")])[0]
    assert f.verdict == "inconclusive" and f.ci_lo is None and "too few records (n = 4)" in f.interval
    assert f.test == "exact" and f.p == pytest.approx(0.125)


def test_equal_differences_get_no_zero_width_interval() -> None:
    f = fnd.evaluate([fnd.Comparison("c", "q", "a", "b", [np.full(8, 3.0)])])[0]
    assert f.verdict == "ahead" and f.ci_lo is None and "no spread" in f.interval


def test_strata_as_units_alternative() -> None:
    """Large differences in a few strata, none elsewhere: significant over these strata's records, not with
    the strata as the units (few strata, mixed signs)."""
    strata = [np.full(5, 100.0), np.full(5, 80.0), np.full(5, -20.0), np.zeros(5), np.zeros(5)]
    f = fnd.evaluate([fnd.Comparison("u", "q", "a", "b", strata)])[0]
    assert f.verdict == "ahead" and f.design_alt == fnd.STRATA and f.verdict_alt == "inconclusive"
    assert f.p_alt == pytest.approx(_naive_p(np.array([100.0, 80.0, -20.0, 0.0, 0.0]), np.full(5, 0.2)))


def test_borderline_comparisons_get_more_patterns() -> None:
    z = np.random.default_rng(0).normal(0.3, 1.0, size=50)
    lo, _ = stats.sign_flip([z], n_perm=100_000, rng=stats.stream(9, "b")).interval(0.95)
    z = z - lo  # its p of 0 is now the edge's: near 0.05
    far = np.random.default_rng(1).normal(2.0, 1.0, 50)
    out = fnd.evaluate([fnd.Comparison("n", "q", "e", "r", [z]), fnd.Comparison("f", "q", "e", "r", [far])])
    assert out[0].n_perm == fnd.N_PERM_MAX and out[1].n_perm == fnd.N_PERM


def test_design_is_validated() -> None:
    with pytest.raises(ValueError, match="design 'nope'; valid: stratified, pooled"):
        stats.weights([np.ones(3)], "nope")
