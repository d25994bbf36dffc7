"""Findings as data: paired comparisons with a bootstrap CI, a two-sided p with its Monte Carlo error, a
pre-registered correction family and a verdict.

A study turns its collected points into :class:`Comparison` objects (per-stratum paired differences, the
family it belongs to, whether both arms gave identical outputs) and :func:`evaluate` turns them into
:class:`Finding` records that :func:`write` stores as ``results/<study>/findings.json``. Pages are rendered
from that file, so no number on them is typed.

Rules, the same for every study:

* **Design.** A comparison's differences come in strata (e.g. RULER's tasks). The primary design resamples
  within each stratum and averages the stratum means (the estimand: the mean over those fixed strata); the
  alternative resamples all records as one pool. Each finding carries both verdicts, so a claim that holds
  under one design only is visible.
* **Families.** A study fixes its families in its definition (pre-registered), so a comparison added later
  joins a wider family reported beside them instead of moving the adjusted p of the committed ones.
* **Identical outputs.** A comparison whose arms produced the same output on every sample has no evidence of
  its own: its verdict is ``n/a`` and it is left out of its family (it would count another comparison's
  evidence twice).
* **Monte Carlo error.** A bootstrap p is an estimate; :func:`evaluate` adds replicates where a verdict
  could flip within four Monte Carlo standard errors of ``alpha``, so that a rerun with another seed keeps
  every verdict.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from keyformer.lab.analysis import holm

ALPHA = 0.05
N_BOOT = 10_000  # replicates of every comparison
N_BOOT_MAX = 200_000  # the most a borderline comparison gets
SCHEMA = 1  # findings.json's layout; bumped on any change that is not an added field
STRATIFIED, POOLED = "stratified", "pooled"
VERDICTS = ("ahead", "behind", "tied", "n/a")


@dataclass
class Comparison:
    """``a - b`` on paired samples: ``strata`` holds one array of per-sample differences per stratum (one
    array: no strata). ``family`` names the pre-registered correction family (None: reported alone, no
    correction). ``identical``: both arms gave the same output on every sample."""

    id: str
    quantity: str
    a: str
    b: str
    strata: Sequence[np.ndarray]
    family: str | None = None
    identical: bool = False
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Finding:
    """One comparison's result. ``p`` is two-sided, ``p_mc_se`` its Monte Carlo standard error at ``n_boot``
    replicates; ``p_adj`` is Holm's adjustment within ``family``; ``verdict`` reads ``p_adj`` (or ``p``
    without a family) at ``alpha`` under ``design``; ``verdict_alt`` is the same under ``design_alt``."""

    id: str
    quantity: str
    a: str
    b: str
    estimate: float
    ci_lo: float
    ci_hi: float
    n: int
    n_strata: int
    design: str
    n_boot: int
    p: float | None
    p_mc_se: float | None
    family: str | None
    family_size: int | None
    p_adj: float | None
    verdict: str
    design_alt: str
    p_alt: float | None
    p_adj_alt: float | None
    verdict_alt: str
    meta: dict[str, Any] = field(default_factory=dict)


def replicate_means(strata: Sequence[np.ndarray], n_boot: int, seed: int, design: str) -> np.ndarray:
    """``[n_boot]`` bootstrap replicates of the statistic: the mean over strata of each stratum's mean
    (``stratified``: each stratum resampled on its own, stratum ``t`` with seed ``seed + t``), or the mean
    of all samples pooled (``pooled``: one resample of every sample)."""
    xs = [np.asarray(x, dtype=float) for x in strata]
    if not xs or any(len(x) == 0 for x in xs):
        raise ValueError("every stratum needs at least one sample")
    if design == POOLED:
        xs = [np.concatenate(xs)]
    elif design != STRATIFIED:
        raise ValueError(f"design {design!r}; valid: {STRATIFIED}, {POOLED}")
    out = np.zeros(n_boot)
    for t, x in enumerate(xs):
        rng = np.random.default_rng(seed + t)
        for s in range(0, n_boot, 20_000):  # in chunks: bounded memory at any n_boot
            k = min(20_000, n_boot - s)
            out[s:s + k] += x[rng.integers(0, len(x), size=(k, len(x)))].mean(axis=1)
    return out / len(xs)


def estimate(strata: Sequence[np.ndarray], design: str) -> float:
    """The statistic itself: the mean of stratum means (``stratified``) or of all samples (``pooled``)."""
    xs = [np.asarray(x, dtype=float) for x in strata]
    return float(np.mean(np.concatenate(xs))) if design == POOLED else float(np.mean([x.mean() for x in xs]))


def bootstrap_test(strata: Sequence[np.ndarray], n_boot: int = N_BOOT, seed: int = 0,
                   design: str = STRATIFIED, ci: float = 0.95) -> tuple[float, float, float, float, float]:
    """``(estimate, ci_lo, ci_hi, p, p_mc_se)``: the percentile bootstrap CI and the two-sided bootstrap p
    of the statistic being 0 (twice the smaller share of replicates on either side of 0), with the Monte
    Carlo standard error of that p."""
    boots = replicate_means(strata, n_boot, seed, design)
    lo, hi = np.quantile(boots, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    q = min(float((boots <= 0).mean()), float((boots >= 0).mean()))
    p = min(1.0, 2 * q)
    return estimate(strata, design), float(lo), float(hi), p, 2 * math.sqrt(q * (1 - q) / n_boot)


def _verdict(est: float, p: float | None, identical: bool, alpha: float) -> str:
    if identical:
        return "n/a"
    if p is None or p >= alpha:
        return "tied"
    return "ahead" if est > 0 else "behind"


def _adjust(ps: dict[str, float], families: dict[str, str | None]) -> dict[str, float]:
    """Holm within each family (a comparison without a family keeps its p)."""
    out: dict[str, float] = {}
    by: dict[str | None, list[str]] = {}
    for k in ps:
        by.setdefault(families[k], []).append(k)
    for fam, keys in by.items():
        adj = holm([ps[k] for k in keys]) if fam is not None else [ps[k] for k in keys]
        out.update({k: float(v) for k, v in zip(keys, adj, strict=True)})
    return out


def _borderline(p: float, se: float, family_size: int, alpha: float) -> bool:
    """Whether a p could cross ``alpha`` after Holm's scaling within four Monte Carlo standard errors (any
    scale from 1 to the family's size, the rank it takes being unknown beforehand)."""
    return any(abs(k * p - alpha) < 4 * k * se for k in range(1, family_size + 1))


def evaluate(comparisons: Sequence[Comparison], alpha: float = ALPHA, seed: int = 0, n_boot: int = N_BOOT,
             n_boot_max: int = N_BOOT_MAX) -> list[Finding]:
    """Every comparison's finding under both designs; families adjusted with Holm, identical-output
    comparisons ``n/a`` and outside their family; borderline p (see :func:`_borderline`) recomputed with
    ten times the replicates until stable or at ``n_boot_max``."""
    ids = [c.id for c in comparisons]
    if len(set(ids)) != len(ids):
        raise ValueError("comparison ids must be unique")
    tested = [c for c in comparisons if not c.identical]
    sizes: dict[str | None, int] = {}
    for c in tested:
        sizes[c.family] = sizes.get(c.family, 0) + 1
    results: dict[str, dict[str, tuple]] = {}
    for design in (STRATIFIED, POOLED):
        res = {}
        for c in comparisons:
            if design == POOLED and len(c.strata) == 1:  # one stratum: the pooled design is the same draw
                res[c.id] = results[STRATIFIED][c.id]
                continue
            b = n_boot
            r = bootstrap_test(c.strata, b, seed, design)
            m = sizes.get(c.family, 1) if c.family is not None else 1
            while not c.identical and b < n_boot_max and _borderline(r[3], r[4], m, alpha):
                b = min(10 * b, n_boot_max)
                r = bootstrap_test(c.strata, b, seed, design)
            res[c.id] = (*r, b)
        results[design] = res
    fams = {c.id: c.family for c in tested}
    adj = {d: _adjust({c.id: results[d][c.id][3] for c in tested}, fams) for d in results}
    out = []
    for c in comparisons:
        est, lo, hi, p, se, b = results[STRATIFIED][c.id]
        p_alt = results[POOLED][c.id][3]
        pa = None if c.identical else adj[STRATIFIED][c.id]
        pa_alt = None if c.identical else adj[POOLED][c.id]
        out.append(Finding(
            id=c.id, quantity=c.quantity, a=c.a, b=c.b, estimate=est, ci_lo=lo, ci_hi=hi,
            n=int(sum(len(x) for x in c.strata)), n_strata=len(c.strata), design=STRATIFIED, n_boot=b,
            p=None if c.identical else p, p_mc_se=None if c.identical else se, family=c.family,
            family_size=sizes.get(c.family) if c.family is not None and not c.identical else None,
            p_adj=pa, verdict=_verdict(est, pa, c.identical, alpha), design_alt=POOLED,
            p_alt=None if c.identical else p_alt, p_adj_alt=pa_alt,
            verdict_alt=_verdict(results[POOLED][c.id][0], pa_alt, c.identical, alpha), meta=dict(c.meta)))
    return out


# -- files ---------------------------------------------------------------------------------------------------
def _clean(v: Any) -> Any:
    """JSON-safe and stable: floats rounded to 6 significant digits, NaN as null."""
    if isinstance(v, float | np.floating):
        v = float(v)
        return None if math.isnan(v) else float(f"{v:.6g}")
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
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: findings schema {doc.get('schema')!r}; this code reads {SCHEMA}")
    return doc


def fmt_p(p: float | None, n_boot: int | None = None) -> str:
    """A p as pages print it: 3 significant digits, or ``< 1/n_boot`` where no replicate crossed 0."""
    if p is None:
        return "n/a"
    if n_boot and p < 2 / n_boot:
        return f"< {2 / n_boot:.1g}"
    return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"
