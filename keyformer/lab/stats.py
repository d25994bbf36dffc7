"""The lab's statistics engine: paired sign-flip randomization tests within strata, the intervals that invert
them, Holm's step-down with intervals that agree with it, equivalence and power.

A comparison is a set of paired differences ``d[t][i]`` (arm ``a`` minus arm ``b`` on record ``i`` of stratum
``t``). The estimand is ``T = sum_t w_t * mean_i d[t][i]``: with the ``stratified`` weights (``w_t = 1/K``)
the mean over the fixed strata, with ``pooled`` weights (``w_t = n_t/N``) the mean over all records.

* **Test.** Under "no difference" the two arms of a record are exchangeable, so each ``d[t][i]`` is as likely
  to carry either sign. The p of ``T = delta`` is the share of sign patterns ``s`` with
  ``|sum w s (d - delta)| >= |T - delta|``: all ``2^n`` patterns when ``n <= EXACT_MAX`` records (exact), else
  ``B`` random patterns with ``p = (1 + hits) / (1 + B)`` (valid at any ``B``; its Monte Carlo standard error
  is reported with ``B``).
* **Interval.** The shifts ``delta`` the same test does not reject at the stated level (the same patterns,
  so the interval excludes 0 exactly when the test rejects there). Where no shift can be rejected
  (``2 / 2^n`` is above the level) the interval is unbounded: too few records.
* **Holm.** :func:`holm_levels` gives each hypothesis the level at which Holm's step-down tested it; the
  interval at that level excludes 0 exactly when Holm rejects.
* **Equivalence.** Not rejected and the interval inside ``[-margin, margin]`` (TOST at the interval's level).
* **Power.** :func:`records_needed`: records per stratum for 80 % power to detect the observed difference at
  the level used (normal approximation of the sign-flip test).

Random streams come from ``numpy.random.SeedSequence(seed, spawn_key=key)``: one independent stream per
comparison key, whatever the order or the number of comparisons, and no stream shared between seeds.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

EXACT_MAX = 20  # records up to which every sign pattern is enumerated (2^20)
N_PERM = 20_000  # random sign patterns otherwise
STRATIFIED, POOLED = "stratified", "pooled"
_CHUNK = 1 << 16
_REL = 1e-9  # ties: |T*| >= |T| (1 - _REL), so equal sums that differ by rounding count as ties


def stream(seed: int, key: str, part: int = 0) -> np.random.Generator:
    """An independent generator for ``key`` (e.g. a comparison id) under ``seed``: ``SeedSequence(seed)``'s
    child ``(crc32(key), part)``; the same key and seed give the same stream in any order."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(zlib.crc32(key.encode()), part)))


def weights(strata: Sequence[np.ndarray], design: str = STRATIFIED) -> np.ndarray:
    """Each record's weight in the statistic (summing to 1): ``1 / (K n_t)`` (``stratified``) or ``1 / N``
    (``pooled``)."""
    if not strata or any(len(x) == 0 for x in strata):
        raise ValueError("every stratum needs at least one record")
    if design == STRATIFIED:
        return np.concatenate([np.full(len(x), 1.0 / (len(strata) * len(x))) for x in strata])
    if design == POOLED:
        n = sum(len(x) for x in strata)
        return np.full(n, 1.0 / n)
    raise ValueError(f"design {design!r}; valid: {STRATIFIED}, {POOLED}")


@dataclass(frozen=True)
class SignFlip:
    """The randomization distribution of one comparison: for every sign pattern ``b``, ``A[b] = sum w s d``
    and ``C[b] = sum w s``, so the statistic of ``d - delta`` under pattern ``b`` is ``A[b] - delta C[b]``.
    ``exact``: ``A`` and ``C`` hold all ``2^n`` patterns; else ``n_perm`` random ones."""

    estimate: float
    A: np.ndarray
    C: np.ndarray
    exact: bool
    n: int

    @property
    def n_perm(self) -> int:
        return len(self.A)

    def p(self, delta: float = 0.0) -> float:
        """Two-sided p of ``T = delta``."""
        obs = abs(self.estimate - delta)
        hits = int(np.count_nonzero(np.abs(self.A - delta * self.C) >= obs * (1 - _REL) - 1e-12))
        return hits / len(self.A) if self.exact else (1 + hits) / (1 + len(self.A))

    def p_se(self, p: float) -> float:
        """Monte Carlo standard error of a p (0 when exact)."""
        return 0.0 if self.exact else math.sqrt(p * (1 - p) / len(self.A))

    def p_min(self) -> float:
        """The smallest p any shift can get: both constant sign patterns (exact), one hit (Monte Carlo)."""
        return 2 / len(self.A) if self.exact else 1 / (1 + len(self.A))

    def interval(self, level: float) -> tuple[float, float]:
        """The shifts not rejected at ``1 - level`` (``-inf``/``inf`` where none is); the edge toward 0
        agrees with :meth:`p` at 0 exactly."""
        alpha = 1 - level
        if self.p_min() >= alpha:
            return -math.inf, math.inf
        t = self.estimate
        accept0 = self.p(0.0) >= alpha
        toward = -1.0 if t > 0 else 1.0
        if accept0:
            near = self._edge(0.0, toward, alpha)
        else:
            near = self._bisect(t, 0.0, alpha)
        far = self._edge(t, -toward, alpha)
        lo, hi = sorted((near, far))
        if accept0:
            lo, hi = min(lo, 0.0), max(hi, 0.0)
        return lo, hi

    def _scale(self) -> float:
        spread = float(np.max(np.abs(self.A))) if len(self.A) else 0.0
        return max(spread, abs(self.estimate), 1e-6)

    def _edge(self, start: float, direction: float, alpha: float) -> float:
        """From an accepted ``start``, step outward until a rejected shift, then bisect."""
        step = self._scale()
        out = start + direction * step
        for _ in range(60):
            if self.p(out) < alpha:
                return self._bisect(start, out, alpha)
            step *= 2
            out = start + direction * step
        return direction * math.inf

    def _bisect(self, accepted: float, rejected: float, alpha: float) -> float:
        for _ in range(60):
            mid = 0.5 * (accepted + rejected)
            if mid in (accepted, rejected):
                break
            if self.p(mid) >= alpha:
                accepted = mid
            else:
                rejected = mid
        return accepted


def sign_flip(strata: Sequence[np.ndarray], design: str = STRATIFIED, n_perm: int = N_PERM,
              rng: np.random.Generator | None = None, exact_max: int = EXACT_MAX) -> SignFlip:
    """The sign-flip distribution of a comparison (:class:`SignFlip`): exact when it has at most
    ``exact_max`` records, else ``n_perm`` random patterns from ``rng``."""
    w = weights(strata, design)
    d = np.concatenate([np.asarray(x, dtype=float) for x in strata])
    if not np.all(np.isfinite(d)):
        raise ValueError("differences must be finite")
    est = float(w @ d)
    n = len(d)
    if n <= exact_max:
        A, C = _enumerate(w * d, w)
        return SignFlip(est, A, C, True, n)
    if rng is None:
        raise ValueError(f"{n} records: more than exact_max={exact_max}, a Monte Carlo test needs an rng")
    A, C = np.empty(n_perm), np.empty(n_perm)
    for s in range(0, n_perm, _CHUNK):
        k = min(_CHUNK, n_perm - s)
        signs = rng.integers(0, 2, size=(k, n), dtype=np.int8) * 2 - 1
        A[s:s + k] = signs @ (w * d)
        C[s:s + k] = signs @ w
    return SignFlip(est, A, C, False, n)


def _enumerate(wd: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``A``, ``C`` over every sign pattern, built by doubling (each record doubles the patterns)."""
    A, C = np.array([0.0]), np.array([0.0])
    for x, v in zip(wd, w, strict=True):
        A = np.concatenate([A + x, A - x])
        C = np.concatenate([C + v, C - v])
    return A, C


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values of ``p`` in the input order; NaN entries stay NaN (outside the
    family). ``adjusted < alpha`` rejects at family-wise ``alpha``."""
    p = np.asarray(p, dtype=float)
    out = np.full_like(p, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def holm_levels(p: Sequence[float], alpha: float) -> np.ndarray:
    """The level at which Holm's step-down tested each hypothesis: ``alpha / (m - k)`` at step ``k``
    (0-based, ascending p) while every earlier step rejected; the hypotheses after the first step that did
    not reject all get that step's level. An interval at ``1 - level`` excludes 0 exactly when Holm rejects
    (for the rejected ones ``p < level``; for the others ``p >= level``)."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    out = np.empty(m)
    stop = None
    for k, i in enumerate(order):
        lvl = alpha / (m - k)
        if stop is None and p[i] >= lvl:
            stop = lvl
        out[i] = lvl if stop is None else stop
    return out


def adjusted_bound(p_adj: float, p_min: float, family_size: int) -> float:
    """The honest floor of a Holm-adjusted p whose raw p sat at the test's resolution: ``family_size`` times
    the smallest p the test can give (a Monte Carlo p with no hit is not below ``1 / (1 + B)``)."""
    return min(1.0, max(p_adj, family_size * p_min))


def within_variance(strata: Sequence[np.ndarray]) -> float:
    """The pooled within-stratum variance of the differences (ddof 1 per stratum; 0 with one record each)."""
    ss = sum(float(((np.asarray(x, float) - np.mean(x)) ** 2).sum()) for x in strata)
    dof = sum(len(x) - 1 for x in strata)
    return ss / dof if dof > 0 else 0.0


def records_needed(strata: Sequence[np.ndarray], effect: float, level: float, power: float = 0.8) -> float:
    """Records per stratum at which the sign-flip test of the stratified mean, two-sided at ``level``,
    detects ``effect`` with ``power`` (normal approximation: the test's null spread comes from the mean
    square of the differences, the estimate's spread from their pooled within-stratum variance); ``inf``
    for ``effect`` 0."""
    if effect == 0:
        return math.inf
    k = len(strata)
    m2 = sum(float(np.mean(np.asarray(x, float) ** 2)) for x in strata) / k
    var = within_variance(strata)
    za, zb = NormalDist().inv_cdf(1 - level / 2), NormalDist().inv_cdf(power)
    return math.ceil((za * math.sqrt(m2 / k) + zb * math.sqrt(var / k)) ** 2 / effect ** 2)


def detectable(strata: Sequence[np.ndarray], level: float, power: float = 0.8) -> float:
    """The smallest difference detected with ``power`` at the records the comparison has (normal
    approximation; 0 where the differences show no variance)."""
    var = within_variance(strata)
    k = len(strata)
    se = math.sqrt(sum(var / len(x) for x in strata) / k ** 2)
    return (NormalDist().inv_cdf(1 - level / 2) + NormalDist().inv_cdf(power)) * se


def bootstrap_valid(strata: Sequence[np.ndarray], min_per_stratum: int = 20) -> bool:
    """The rule for a percentile bootstrap of a mean: every stratum holds at least ``min_per_stratum``
    records (below, resampling a handful of values understates the spread by ``(n - 1) / n`` and a stratum
    of equal values adds none)."""
    return all(len(x) >= min_per_stratum for x in strata)


def bootstrap_mean(strata: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator,
                   level: float = 0.95, design: str = STRATIFIED) -> tuple[float, float, float]:
    """``(estimate, lo, hi)``: the percentile bootstrap interval of the weighted mean, records resampled
    within each stratum (``stratified``) or as one pool (``pooled``)."""
    xs = [np.asarray(x, dtype=float) for x in strata]
    if design == POOLED:
        xs = [np.concatenate(xs)]
    w = weights(xs, STRATIFIED)
    est = float(w @ np.concatenate(xs))
    reps = np.zeros(n_boot)
    for x in xs:
        reps += x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1) / len(xs)
    lo, hi = np.quantile(reps, [(1 - level) / 2, (1 + level) / 2])
    return est, float(lo), float(hi)
