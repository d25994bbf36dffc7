"""Experiment 8's findings on hand-made rows with a known answer: the pre-registered pooled test (no family),
the per-budget family, the extra arms on their subset, and the authors'-setting comparisons with identical
outputs flagged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.exp8_powered import analysis as exp8
from experiments.exp8_powered import findings as f8
from keyformer.lab import findings as fnd

IDS = [f"a{i}" for i in range(8)]
BASE = np.arange(8, dtype=float)


def _save(folder: Path, points: list[dict], samples: list[dict]) -> None:
    folder.mkdir(parents=True)
    pd.DataFrame(points).to_csv(folder / "points.csv", index=False)
    pd.DataFrame(samples).to_csv(folder / "samples.csv", index=False)


def _add(points: list, samples: list, name: str, score: np.ndarray, text: str, ids=IDS, **cols) -> None:
    points.append({"point": name, "complete": True, **cols})
    samples.extend({"point": name, "id": i, "rouge2": s, "prediction": f"{text} {i}"}
                   for i, s in zip(ids, score, strict=True))


def _powered(res: Path, same_text: bool = False) -> None:
    """H2O at each budget; Keyformer seed 0 one above it, seed 1 three above (d = 2 everywhere); the
    noise_samples=4 arm four above on the first half of the articles."""
    points, samples = [], []
    for b in f8.BUDGETS:
        _add(points, samples, f"budget={b},h2o", BASE, "h", variant="h2o", budget=b)
        for v, up in (("keyformer_s0", 1.0), ("keyformer_s1", 3.0)):
            _add(points, samples, f"budget={b},{v}", BASE + up, "h" if same_text else v, variant=v, budget=b)
    _add(points, samples, "budget=0.3,keyformer_ns4", BASE[:4] + 4.0, "ns4", ids=IDS[:4],
         variant="keyformer_ns4", budget=0.3)
    _save(res / "exp8_powered", points, samples)


def _authors(res: Path) -> None:
    """Greedy: Keyformer one above H2O (other text); beam: the same text and score as H2O, H2O at 0.5 on
    the first six articles; full five above H2O."""
    points, samples = [], []
    for beams, dec in ((1, "greedy"), (4, "beam")):
        _add(points, samples, f"full,{dec}", BASE + 5.0, "full", policy="full", budget=1.0, num_beams=beams)
        for b in f8.AUTHORS_BUDGETS:
            ids = IDS[:6] if (beams == 4 and b == 0.5) else IDS
            _add(points, samples, f"{b},{dec},h2o", BASE[:len(ids)], "h", ids=ids, policy="h2o", budget=b,
                 num_beams=beams)
            _add(points, samples, f"{b},{dec},kf", BASE + (1.0 if beams == 1 else 0.0),
                 "k" if beams == 1 else "h", policy="keyformer", budget=b, num_beams=beams)
    _save(res / "exp8_authors", points, samples)


def test_powered_comparisons_known_answer(tmp_path: Path) -> None:
    _powered(tmp_path)
    cs = {c.id: c for c in f8.comparisons(tmp_path)}
    pooled = cs["exp8.pooled"]
    assert pooled.family is None and len(pooled.strata) == 1 and np.allclose(pooled.strata[0], 2.0)
    assert len(pooled.strata[0]) == len(IDS) and not pooled.identical
    assert [cs[i].family for i in f8.DEFINITION["families"]["exp8.budgets"]] == ["exp8.budgets"] * 3
    assert all(np.allclose(cs[f"exp8.seeds@{b:g}"].strata[0], -2.0) for b in f8.BUDGETS)
    ns4 = cs["exp8.extra.keyformer_ns4"]
    assert len(ns4.strata[0]) == 4 and np.allclose(ns4.strata[0], 4.0) and ns4.family == "exp8.extras"
    assert "exp8.extra.h2o_recent05" not in cs  # an arm without rows is left out, the family list stays
    assert not any(c.id.startswith("exp8.authors") for c in cs.values())


def test_pooled_decision_reads_the_ci(tmp_path: Path) -> None:
    """The headline decision is the pre-registered rule applied to the finding's CI."""
    _powered(tmp_path)
    cs = f8.comparisons(tmp_path)
    pooled = next(c for c in cs if c.id == "exp8.pooled")
    pooled.strata = [pooled.strata[0] + np.linspace(-0.5, 0.5, len(pooled.strata[0]))]  # a spread to invert
    f = next(x for x in fnd.evaluate(cs, n_perm=2000) if x.id == "exp8.pooled")
    assert f.ci_lo >= exp8.PAPER_GAP and f.p_adj == f.p and f.family_size is None
    doc = {"definition": f8.DEFINITION, "findings": [vars(f)]}
    decision = exp8.decide(f.ci_lo, f.ci_hi)
    assert decision in f8.bullets(doc)[0] and decision[1:] in f8.answer(doc)


def test_identical_outputs_flagged(tmp_path: Path) -> None:
    _powered(tmp_path, same_text=True)
    cs = {c.id: c for c in f8.comparisons(tmp_path)}
    assert cs["exp8.pooled"].identical and cs["exp8.budget@0.3"].identical
    assert not cs["exp8.extra.keyformer_ns4"].identical


def test_authors_comparisons_known_answer(tmp_path: Path) -> None:
    _powered(tmp_path)
    _authors(tmp_path)
    cs = {c.id: c for c in f8.comparisons(tmp_path)}
    greedy, beam = cs["exp8.authors.greedy"], cs["exp8.authors.beam4"]
    assert np.allclose(greedy.strata[0], 1.0) and not greedy.identical
    assert len(beam.strata[0]) == 6 and np.allclose(beam.strata[0], 0.0) and beam.identical
    assert cs["exp8.authors.beam4@0.3"].identical and len(cs["exp8.authors.beam4@0.5"].strata[0]) == 6
    assert np.allclose(cs["exp8.authors.beam_minus_greedy"].strata[0], -1.0)
    long_short = cs["exp8.authors.long_minus_short"]  # greedy gap 1 - exp8's seed-0 gap 1
    assert np.allclose(long_short.strata[0], 0.0) and long_short.meta["short_gap"] == 1.0
    assert np.allclose(cs["exp8.authors.greedy@0.3.h2o_full"].strata[0], -5.0)
    fams = f8.DEFINITION["families"]
    assert {c.family for c in cs.values() if c.id.startswith("exp8.authors")} == {
        "exp8.authors.gap", "exp8.authors.budgets", "exp8.authors.vs_full"}
    assert all(c.id in fams[c.family] for c in cs.values() if c.family)
