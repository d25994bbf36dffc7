"""Findings as data: paired comparisons tested with a sign-flip randomization test within strata, an
interval that agrees with the verdict, a pre-registered correction family and one of four verdicts.

A study turns its collected points into :class:`Comparison` objects (per-stratum paired differences, the
family it belongs to and its role, whether both arms gave identical outputs, the equivalence margin) and
:func:`evaluate` turns them into :class:`Finding` records that :func:`dumps` stores as
``results/<study>/findings.json``. Pages are rendered from that file, so no number on them is typed or drawn
twice. The statistics are :mod:`keyformer.lab.stats`'s; the rules, the same for every study:

* **Estimand.** The mean over the comparison's fixed strata (e.g. RULER's tasks) of each stratum's mean
  difference (``stratified``); with one stratum, the mean difference over the records.
* **Test.** A paired sign-flip test of the estimand being 0, exact up to :data:`stats.EXACT_MAX` records,
  else Monte Carlo with its standard error and replicate count (more replicates where a decision sits
  within four standard errors of its threshold).
* **Families.** A study fixes its families in its definition; Holm's step-down within each. Each family has
  a role: ``confirmatory`` (its definition was committed before its first row: checked from git by the
  study's tests), ``exploratory`` (defined after, or not known to be before), ``descriptive`` (the
  pre-registration asked for estimates only: an interval and no verdict).
* **Interval.** The shifts the same test does not reject at the level Holm tested the comparison at
  (:func:`stats.holm_levels`), so it excludes 0 exactly when the verdict is ``ahead`` or ``behind``;
  unbounded ("too few records") where no p the records can give reaches that level.
* **Verdicts.** ``ahead``/``behind`` (Holm-adjusted p below alpha, by sign), ``equivalent`` (not rejected
  and the interval inside the study's margin for the metric), ``inconclusive`` (with the records per
  stratum that would detect the observed difference at 80 % power), ``n/a`` (identical outputs: no
  evidence of its own, left out of its family), or none (descriptive).
* **Alternative design.** With several strata, the same test on the strata's mean differences as the units
  (``verdict_alt``: the claim for other strata of the same kind, not only these).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from keyformer.lab import stats
from keyformer.lab.stats import STRATIFIED

ALPHA = 0.05
N_PERM = stats.N_PERM  # random sign patterns of every Monte Carlo test
N_PERM_MAX = 200_000  # the most a borderline comparison gets
SCHEMA = 2  # findings.json's layout; bumped on any change that is not an added field
STRATA = "strata"  # the alternative design: each stratum's mean difference as one unit
ROLES = ("confirmatory", "exploratory", "descriptive")
VERDICTS = ("ahead", "behind", "equivalent", "inconclusive", "n/a")
ESTIMAND = {1: "the mean paired difference over the records",
            2: "the mean over the fixed strata of each stratum's mean paired difference"}


@dataclass
class Comparison:
    """``a - b`` on paired records: ``strata`` holds one array of per-record differences per stratum (one
    array: no strata). ``family`` names the correction family (None: reported alone, no correction) and
    ``role`` what it is (:data:`ROLES`). ``identical``: both arms gave the same output on every record.
    ``margin``: the difference within which the arms count as equivalent (None: no equivalence claim)."""

    id: str
    quantity: str
    a: str
    b: str
    strata: Sequence[np.ndarray]
    family: str | None = None
    identical: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    role: str = "exploratory"
    margin: float | None = None


@dataclass
class Finding:
    """One comparison's result (``findings.json``; docs/results-contract.md describes each field)."""

    id: str
    quantity: str
    estimand: str
    a: str
    b: str
    role: str
    estimate: float
    ci_lo: float | None
    ci_hi: float | None
    ci_level: float
    interval: str
    n: int
    n_strata: int
    n_nonzero: int
    design: str
    test: str
    n_perm: int
    p: float | None
    p_mc_se: float | None
    family: str | None
    family_size: int | None
    p_adj: float | None
    level: float
    margin: float | None
    verdict: str | None
    records_needed: float | None
    mde: float | None
    design_alt: str | None
    p_alt: float | None
    p_adj_alt: float | None
    verdict_alt: str | None
    meta: dict[str, Any] = field(default_factory=dict)


MAX_FAMILY = 64  # the borderline rule watches Holm's thresholds alpha/k up to this k, whatever the family


def _thresholds(m: int, alpha: float) -> list[float]:
    """Holm's thresholds a p could be compared with: ``alpha / k`` for ``k`` up to the family's size and at
    least :data:`MAX_FAMILY`, so that the same differences get the same replicates in any family (the
    leaderboard's and a page's)."""
    return [alpha / k for k in range(1, max(m, MAX_FAMILY) + 1)]


def _borderline(sf: stats.SignFlip, deltas: Sequence[float], thresholds: Sequence[float]) -> bool:
    """Whether a Monte Carlo p at any of ``deltas`` sits within four standard errors of a threshold."""
    if sf.exact:
        return False
    for d in deltas:
        p = sf.p(d)
        se = math.sqrt(max(p * (1 - p), 1 / sf.n_perm) / sf.n_perm)
        if any(abs(p - t) < 4 * se for t in thresholds):
            return True
    return False


def _test(c: Comparison, thresholds: list[float], seed: int, n_perm: int, n_perm_max: int,
          design: str = STRATIFIED, part: int = 0) -> stats.SignFlip:
    strata = c.strata if design != STRATA else [np.array([np.mean(x) for x in c.strata])]
    key = _stream_key(strata)
    sf = stats.sign_flip(strata, STRATIFIED, n_perm, stats.stream(seed, key, part))
    deltas = [0.0] + ([-c.margin, c.margin] if c.margin and design != STRATA else [])
    if _borderline(sf, deltas, thresholds) and n_perm < n_perm_max:
        sf = stats.sign_flip(strata, STRATIFIED, n_perm_max, stats.stream(seed, key, part + 1))
    return sf


def _stream_key(strata: Sequence[np.ndarray]) -> str:
    """The random stream of a comparison is keyed by its shape (records per stratum, in order), not its
    name: the same differences get the same p and interval wherever they are compared (a page, the
    leaderboard); each comparison's p is valid on its own, and Holm needs no independence between them."""
    return "strata:" + ",".join(str(len(x)) for x in strata)


def _verdict(est: float, p_adj: float | None, lo: float | None, hi: float | None, c: Comparison,
             alpha: float) -> str | None:
    if c.identical:
        return "n/a"
    if c.role == "descriptive" or p_adj is None:
        return None
    if p_adj < alpha:
        return "ahead" if est > 0 else "behind"
    if c.margin is not None and lo is not None and hi is not None and -c.margin <= lo and hi <= c.margin:
        return "equivalent"
    return "inconclusive"


def _test_name(sf: stats.SignFlip | None) -> str:
    return "" if sf is None else "exact" if sf.exact else "monte carlo"


def _family_key(c: Comparison) -> str | None:
    return c.family if c.role != "descriptive" else None


def evaluate(comparisons: Sequence[Comparison], alpha: float = ALPHA, seed: int = 0, n_perm: int = N_PERM,
             n_perm_max: int = N_PERM_MAX) -> list[Finding]:
    """Every comparison's finding (see the module's rules): sign-flip p's, Holm within each family (identical
    and descriptive comparisons outside), the interval at the level Holm tested each at, verdicts, power."""
    ids = [c.id for c in comparisons]
    if len(set(ids)) != len(ids):
        raise ValueError("comparison ids must be unique")
    for c in comparisons:
        if c.role not in ROLES:
            raise ValueError(f"{c.id}: role {c.role!r}; valid: {', '.join(ROLES)}")
    tested = [c for c in comparisons if not c.identical]
    sizes: dict[str | None, int] = {}
    for c in tested:
        if _family_key(c) is not None:
            sizes[c.family] = sizes.get(c.family, 0) + 1
    main: dict[str, stats.SignFlip] = {}
    alt: dict[str, stats.SignFlip] = {}
    for c in tested:
        m = sizes.get(_family_key(c), 1)
        main[c.id] = _test(c, _thresholds(m, alpha), seed, n_perm, n_perm_max)
        if len(c.strata) > 1:
            alt[c.id] = _test(c, _thresholds(m, alpha), seed, n_perm, n_perm_max, STRATA, part=2)
    p = {k: sf.p(0.0) for k, sf in main.items()}
    p_alt = {k: sf.p(0.0) for k, sf in alt.items()}
    adj, lvl, adj_alt = {}, {}, {}
    by: dict[str | None, list[str]] = {}
    for c in tested:
        by.setdefault(_family_key(c), []).append(c.id)
    for fam, keys in by.items():
        if fam is None:
            for k in keys:
                adj[k], lvl[k] = p[k], alpha
                if k in p_alt:
                    adj_alt[k] = p_alt[k]
            continue
        ps = [p[k] for k in keys]
        adj.update(zip(keys, map(float, stats.holm(ps)), strict=True))
        lvl.update(zip(keys, map(float, stats.holm_levels(ps, alpha)), strict=True))
        ka = [k for k in keys if k in p_alt]
        adj_alt.update(zip(ka, map(float, stats.holm([p_alt[k] for k in ka])), strict=True))
    out = []
    for c in comparisons:
        n = int(sum(len(x) for x in c.strata))
        nz = int(sum(np.count_nonzero(np.asarray(x, float)) for x in c.strata))
        est = float(np.mean([np.mean(x) for x in c.strata]))
        sf = main.get(c.id)
        level = lvl.get(c.id, alpha)
        lo = hi = None
        how = "identical outputs: no interval"
        if sf is not None:
            lo, hi = sf.interval(1 - level)
            how = "sign-flip inversion" if math.isfinite(lo) and math.isfinite(hi) else \
                f"too few records (n = {n}): no p below {sf.p_min():.2g}"
            lo, hi = (lo, hi) if math.isfinite(lo) and math.isfinite(hi) else (None, None)
            if lo is not None and hi - lo <= 1e-9 * max(1.0, abs(est)):
                how = f"no spread: every difference is {est:+.3g}, no interval from n = {n}"
                lo = hi = None
        fam = _family_key(c)
        pa = adj.get(c.id)
        verdict = _verdict(est, pa, lo, hi, c, alpha)
        need = mde = None
        if sf is not None and verdict == "inconclusive":
            need = stats.records_needed(c.strata, est, level)
            mde = stats.detectable(c.strata, level)
        pa_alt = adj_alt.get(c.id)
        v_alt = None
        if pa_alt is not None and c.role != "descriptive":
            v_alt = ("ahead" if est > 0 else "behind") if pa_alt < alpha else "inconclusive"
        out.append(Finding(
            id=c.id, quantity=c.quantity, estimand=ESTIMAND[min(len(c.strata), 2)], a=c.a, b=c.b, role=c.role,
            estimate=est, ci_lo=lo, ci_hi=hi, ci_level=1 - level, interval=how, n=n, n_strata=len(c.strata),
            n_nonzero=nz, design=STRATIFIED, test=_test_name(sf), n_perm=0 if sf is None else sf.n_perm,
            p=p.get(c.id), p_mc_se=None if sf is None else sf.p_se(p[c.id]), family=c.family,
            family_size=sizes.get(fam) if fam is not None and sf is not None else None, p_adj=pa,
            level=level, margin=c.margin, verdict=verdict, records_needed=need, mde=mde,
            design_alt=STRATA if c.id in alt else None, p_alt=p_alt.get(c.id), p_adj_alt=pa_alt,
            verdict_alt=v_alt, meta=dict(c.meta)))
    return out


# -- files ---------------------------------------------------------------------------------------------------
def _clean(v: Any) -> Any:
    """JSON-safe and stable: floats rounded to 6 significant digits, NaN and infinities as null."""
    if isinstance(v, float | np.floating):
        v = float(v)
        return None if not math.isfinite(v) else float(f"{v:.6g}")
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def dumps(study: str, findings: Sequence[Finding], definition: dict[str, Any]) -> str:
    """``findings.json``'s text: the study, its definition (families, design, alpha, data), the findings."""
    doc = {"schema": SCHEMA, "study": study, "definition": definition,
           "findings": [asdict(f) for f in findings]}
    return json.dumps(_clean(doc), indent=1, ensure_ascii=False) + "\n"


def load(path: str | Path) -> dict[str, Any]:
    """A ``findings.json``: its definition and its findings (as dicts)."""
    return loads(Path(path).read_text(encoding="utf-8"), path)


def loads(text: str, path: str | Path = "findings.json") -> dict[str, Any]:
    """:func:`load` of a ``findings.json``'s text."""
    doc = json.loads(text)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: findings schema {doc.get('schema')!r}; this code reads {SCHEMA}")
    return doc


def _num(p: float) -> str:
    return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"


def fmt_p(f: dict[str, Any], adjusted: bool = True) -> str:
    """A finding's p (Holm-adjusted by default) as pages print it: exact, or with its Monte Carlo standard
    error and replicate count (``0.012 ± 0.0008 MC, 20000``); an adjusted p carries its raw p's error scaled
    by the same factor. ``n/a`` without a test."""
    p = f.get("p_adj") if adjusted else f.get("p")
    if p is None:
        return "n/a"
    if f.get("test") == "exact":
        return f"{_num(p)} (exact)"
    if p >= 1:
        return "1"
    se = f.get("p_mc_se") or 0.0
    if adjusted and f.get("p"):
        se *= p / f["p"]
    return f"{_num(p)} ± {se:.1g} (MC, {f['n_perm']})"


def fmt_ci(f: dict[str, Any], digits: int = 1) -> str:
    """A finding's estimate and interval as pages print them: ``+3.1 [+1.2, +5.0]`` (its level is the
    finding's ``ci_level``), or the estimate with why there is no interval."""
    est = f"{f['estimate']:+.{digits}f}"
    if f.get("ci_lo") is None:
        return f"{est} [{f['interval']}]"
    return f"{est} [{f['ci_lo']:+.{digits}f}, {f['ci_hi']:+.{digits}f}]"


def fmt_verdict(f: dict[str, Any]) -> str:
    """A finding's verdict as pages print it: the word, the records an inconclusive one would need, and
    ``descriptive`` for a finding with no verdict."""
    v = f.get("verdict")
    if v is None:
        return "descriptive"
    n = f.get("records_needed")
    if v == "inconclusive" and n is not None and math.isfinite(n):
        return f"inconclusive (~{n:.0f} a stratum for 80 % power)"
    return v
