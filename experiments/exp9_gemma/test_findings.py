"""Experiment 9's findings (experiments/exp9_gemma/findings.py): its comparisons on hand-made rows with a
known answer, and the committed findings.json recomputed with another bootstrap seed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.exp9_gemma import findings as exp9
from keyformer.lab import findings as fnd

ROOT = Path(__file__).resolve().parents[2]
IDS = ("x", "y", "z")


def _write(folder: Path, arms: dict[tuple[str, float], tuple[list[float], list[str]]],
           metric: str = "rouge2") -> None:
    """``points.csv``/``samples.csv`` from ``{(policy, budget): (metric per id, prediction per id)}``."""
    folder.mkdir(parents=True)
    pd.DataFrame([{"point": f"{p}@{b}", "policy": p, "budget": b, "complete": True} for p, b in arms]) \
        .to_csv(folder / "points.csv", index=False)
    pd.DataFrame([{"point": f"{p}@{b}", "id": i, metric: v, "prediction": t}
                  for (p, b), (vs, ts) in arms.items() for i, v, t in zip(IDS, vs, ts, strict=True)]) \
        .to_csv(folder / "samples.csv", index=False)


def _field(res: Path, folder: str, one_head: bool) -> None:
    """CNN/DM rows at 0.2 and 0.5. Keyformer scores 1, 2, 3 at both budgets; SnapKV 0, 0, 0 at 0.2 and 2, 2,
    2 at 0.5, so SnapKV - Keyformer per sample is (-1 + 1)/2 = 0, (-2 + 0)/2 = -1, (-3 - 1)/2 = -2. H2O scores
    as Keyformer but writes other words. ``one_head``: Ada-KV writes exactly its base policy's words (Gemma
    3)."""
    kf = ([1.0, 2.0, 3.0], ["k1", "k2", "k3"])
    arms = {}
    for b, snap in ((0.2, [0.0, 0.0, 0.0]), (0.5, [2.0, 2.0, 2.0])):
        sk = (snap, [f"s{b}{i}" for i in IDS])
        arms |= {("keyformer", b): kf, ("snapkv", b): sk, ("h2o", b): (kf[0], ["h1", "h2", "h3"]),
                 ("adakv_snapkv", b): sk if one_head else (snap, ["a1", "a2", "a3"]),
                 ("adakv_keyformer", b): kf if one_head else ([1.0, 2.0, 4.0], ["k1", "k2", "q3"])}
    _write(res / folder, arms)


@pytest.fixture
def res(tmp_path: Path) -> Path:
    _field(tmp_path, "exp7_field/cnndm", one_head=False)
    _field(tmp_path, "exp9_gemma/cnndm", one_head=True)
    return tmp_path


def test_comparisons_pair_each_sample_over_budgets_and_flag_identical_outputs(res: Path) -> None:
    cs = {c.id: c for c in exp9.comparisons(res)}
    snap = cs["exp9.gemma3.exp7.cnndm.snapkv-keyformer"]
    assert len(snap.strata) == 1 and np.allclose(snap.strata[0], [0.0, -1.0, -2.0])
    assert snap.family == "exp9.gemma3" and not snap.identical and snap.meta["budgets"] == [0.2, 0.5]
    # Ada-KV over SnapKV wrote SnapKV's words on Gemma (one KV head): SnapKV's evidence again, so n/a
    ada = cs["exp9.gemma3.exp7.cnndm.adakv_snapkv-keyformer"]
    assert ada.identical and ada.meta["same_as"] == "snapkv" and np.allclose(ada.strata[0], snap.strata[0])
    # Ada-KV over Keyformer wrote Keyformer's words: identical to b itself
    assert cs["exp9.gemma3.exp7.cnndm.adakv_keyformer-keyformer"].meta["same_as"] == "keyformer"
    # the same scores in other words are not identical outputs: a tie with evidence of its own
    h2o = cs["exp9.gemma3.exp7.cnndm.h2o-keyformer"]
    assert not h2o.identical and np.allclose(h2o.strata[0], 0.0)
    # on SmolLM2's rows Ada-KV wrote its own words: both are tested, but outside SmolLM2's family, which
    # holds only what both models tested (like with like)
    for a in ("adakv_snapkv", "adakv_keyformer"):
        c = cs[f"exp9.smollm2.exp7.cnndm.{a}-keyformer"]
        assert not c.identical and c.family == "exp9.smollm2.unmatched"
    assert np.allclose(cs["exp9.smollm2.exp7.cnndm.adakv_keyformer-keyformer"].strata[0], [0.0, 0.0, 1.0])
    # experiment 1's keyformer - h2o on Gemma: the budgets both ran (0.3 missing); its SmolLM2 rows, the
    # window's and full's points are absent: those comparisons are not built
    assert cs["exp9.gemma3.exp1.cnndm.keyformer-h2o"].meta["budgets"] == [0.2, 0.5]
    assert "exp9.smollm2.exp1.cnndm.keyformer-h2o" not in cs and "exp9.gemma3.exp1.cnndm.h2o-window" not in cs
    assert not any(c.family == "exp9.gemma3.keyformer_seed1" for c in cs.values())  # no <task>_seed1 rows
    assert exp9.comparisons(res / "nothing") == []


def test_holds_reads_the_verdicts_and_leaves_identical_and_missing_ones_out(res: Path) -> None:
    doc = json.loads(fnd.dumps("exp9_gemma", fnd.evaluate(exp9.comparisons(res), n_perm=2000),
                               exp9.DEFINITION))
    rows = {r["key"]: r for r in exp9.replication_rows(doc)}
    assert len(rows) == len(exp9.DEFINITION["families"]["exp9.smollm2"])
    assert rows["exp7.cnndm.adakv_snapkv-keyformer"]["holds"] == "n/a"
    assert rows["exp7.cnndm.adakv_keyformer-keyformer"]["holds_raw"] == "n/a"
    assert rows["exp7.cnndm.h2o-keyformer"]["holds"] == "no claim"  # inconclusive on both: replicates nothing
    assert rows["exp1.cnndm.keyformer-h2o"]["holds"] == "pending"  # no SmolLM2 rows for experiment 1 here
    g = {f["id"]: f for f in doc["findings"]}
    assert g["exp9.gemma3.exp7.cnndm.adakv_snapkv-keyformer"]["family_size"] is None
    # both families hold what both models tested: snapkv and h2o - keyformer (Gemma's Ada-KV rows are n/a,
    # experiment 1's keyformer - h2o has no SmolLM2 rows here)
    assert g["exp9.gemma3.exp7.cnndm.snapkv-keyformer"]["family_size"] == 2
    assert g["exp9.smollm2.exp7.cnndm.snapkv-keyformer"]["family_size"] == 2
    assert g["exp9.gemma3.exp1.cnndm.keyformer-h2o"]["family"] == "exp9.gemma3.unmatched"


def test_another_bootstrap_seed_keeps_every_committed_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed findings recomputed with seed 1: every verdict (both designs) equals findings.json's."""
    monkeypatch.chdir(ROOT)
    from keyformer.lab import pages

    committed = {f["id"]: f for f in fnd.load(Path("results/exp9_gemma/findings.json"))["findings"]}
    again = pages.findings_doc(exp9, Path("results"), seed=1)["findings"]
    assert {f["id"] for f in again} == set(committed)
    for f in again:
        c = committed[f["id"]]
        assert (f["verdict"], f["verdict_alt"]) == (c["verdict"], c["verdict_alt"]), f["id"]
