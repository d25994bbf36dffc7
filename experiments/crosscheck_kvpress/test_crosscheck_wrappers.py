"""The wrapper rows of the kvpress cross-check (chunk, merging, cam, dms): their specs, the merged-value
comparison and the copy of our CaM draws the kvpress side uses (kvpress is not needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.crosscheck_kvpress import kvpress_crosscheck as xc
from experiments.crosscheck_kvpress import kvpress_wrappers as kw
from experiments.crosscheck_kvpress import methods_doc
from keyformer.core.policies import make_policy, policy_class
from keyformer.core.policies.methods import rows as methods_rows
from keyformer.core.policies.random_scores import uniform_hash
from keyformer.core.policies.wrappers import cam


def test_cam_draws_are_ours() -> None:
    """The kvpress side's copy of the hash gives our CaM's draws (seed salted as the wrapper does)."""
    assert kw.CAM_SALT == cam.SALT
    pos = torch.arange(0, 700, dtype=torch.int64)
    for seed in (0, 7, 2**40 + 3):
        for layer in (0, 5, 29):
            for head in (0, 2):
                want = uniform_hash(seed ^ cam.SALT, layer, torch.tensor(head), pos)
                assert torch.equal(kw.cam_uniform(seed, layer, head, pos), want)
    assert not torch.equal(kw.cam_uniform(1, 0, 0, pos), kw.cam_uniform(0, 0, 0, pos))


def test_wrapper_rows_pair_the_same_knobs() -> None:
    rows = {m["name"]: m for m in xc.METHODS + xc.DIAGNOSTICS if m in kw.METHODS + kw.DIAGNOSTICS}
    assert len(rows) == 8
    for m in rows.values():
        policy_class(m["policy"])  # a registered composition
        make_policy(m["policy"], budget=float(m.get("our_budget", 0.5)), **m["policy_kw"])
        assert m["policy"].startswith("knorm+") and m["press"]["inner"]["cls"] == "KnormPress"
        p = m["press"]["kw"]
        if m["policy"] == "knorm+chunk":
            assert p["chunk_length"] == m["policy_kw"]["chunk_tokens"]
        if m["policy"] == "knorm+merging":
            assert p["similarity_threshold"] == m["policy_kw"]["similarity_threshold"]
            assert m["press"]["values"]
        if m["policy"] == "knorm+cam":
            assert p["merge_budget"] == m["policy_kw"]["merge_budget"] and m["press"]["values"]
            assert p.get("cam_seed", 0) == m["policy_kw"]["cam_seed"]
            assert m["press"]["inner_arg"] == "base_press"
        if m["policy"] == "knorm+dms":
            assert p["threshold"] == m["policy_kw"]["dms_threshold"]
            assert p["sliding_window_size"] == m["policy_kw"]["dms_window"]
            assert m["our_budget"] == 1.0 and m["press"]["no_ratio"]  # kvpress's threshold alone decides


def test_block_rows_pair_the_same_knobs() -> None:
    rows = [m for m in xc.METHODS + xc.DIAGNOSTICS if m in kw.BLOCK_METHODS + kw.BLOCK_DIAGNOSTICS]
    assert len(rows) == 2
    for m in rows:
        make_policy(m["policy"], budget=0.5, **m["policy_kw"])
        assert m["policy"] == "keydiff+block" and m["press"]["inner"]["cls"] == "KeyDiffPress"
        assert m["press"]["kw"]["block_size"] == m["policy_kw"]["block_tokens"]
        assert m["policy_kw"]["recent"] == 0.0 and m["policy_kw"]["prefill_only"]


def test_baseline_rows_use_our_draws_and_shares() -> None:
    """The kvpress side's copies: ``hash_uniform`` is Random's hash, ``curve_shares`` the layers wrapper's
    per-layer share; the rows pair the same seed and curve."""
    from keyformer.core.policies.wrappers.layers import curve_at

    pos = torch.arange(0, 700, dtype=torch.int64)
    for seed in (0, 5, 2**40 + 3):
        for layer, head in ((0, 0), (7, 2), (29, 1)):
            want = uniform_hash(seed, layer, torch.tensor(head), pos)
            assert torch.equal(kw.hash_uniform(seed, layer, head, pos), want)
    for curve in ((1.5, 0.5), (2.0,), (1.0, 3.0, 0.5)):
        for layers in (1, 2, 30):
            c = curve_at(curve, layers)
            assert kw.curve_shares(curve, layers) == pytest.approx([v * len(c) / sum(c) for v in c])
    rows = [m for m in xc.METHODS + xc.DIAGNOSTICS if m in kw.BASELINE_METHODS + kw.BASELINE_DIAGNOSTICS]
    assert len(rows) == 4
    for m in rows:
        make_policy(m["policy"], budget=0.5, **m["policy_kw"])
        if m["policy"] == "random":
            assert m["press"]["kw"]["seed"] == m["policy_kw"]["seed"]
        else:
            assert m["press"]["kw"]["curve"] == m["policy_kw"]["layer_curve"]


def test_value_sum_of_the_listed_slots() -> None:
    v = torch.tensor([[1.0, 2.0], [10.0, 0.5], [-3.0, 1.0]])
    assert xc.value_sum(v, torch.tensor([2, 0])) == 1.0
    assert xc.value_sum(v, slice(None)) == 11.5
    assert xc.value_sum(torch.tensor([[1 / 3, 0.0]], dtype=torch.float64), torch.tensor([0])) == 0.3333333333


def _run(kept: list[list[list[int]]], vsum: list[list[float]],
         pre: list[list[float]] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"id": "a", "n": 10, "tokens": [1], "vsum": vsum,
                         "kept": [[xc.encode_kept(h) for h in layer] for layer in kept]}
    if pre is not None:
        r["vsum_pre"] = pre
    return r


def test_compare_values_only_on_identical_sets() -> None:
    # two layers, two heads: in layer 0 head 0 has identical sets, head 1 not; layer 1 identical sets
    kept_o, kept_k = [[[1, 4], [0, 2]], [[0], [1]]], [[[1, 4], [0, 3]], [[0], [1]]]
    ours = [_run(kept_o, [[3.0, 9.0], [1.0, 2.0]])]
    kv = [_run(kept_k, [[3.5, 0.0], [1.0, 1.0]], pre=[[-1.0, 5.0], [1.0, 3.0]])]
    v = xc.compare_values(ours, kv)
    assert v == pytest.approx({"compared": 0.75, "diff_max": 1.0, "diff_mean": 0.5, "merge_max": 4.5,
                               "merge_mean": 6.5 / 3})
    m = xc.compare_runs(ours, kv, ours, kv)
    assert m["values"] == v
    # no identical set: nothing compared, and rows without value sums carry no "values" field
    other = [_run([[[2], [3]], [[5], [6]]], [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]])]
    assert xc.compare_values(ours, other) == {"compared": 0.0}
    plain = [{k: x for k, x in r.items() if k != "vsum"} for r in ours]
    assert "values" not in xc.compare_runs(plain, kv, ours, kv)


def test_values_table_lists_only_rows_with_values() -> None:
    m = {"values": {"compared": 1.0, "diff_max": 0.0, "diff_mean": 0.0, "merge_max": 2.0, "merge_mean": 1.0}}
    table = xc.format_values([{"method": "M", "budget": 0.5, "metrics": m},
                              {"method": "N", "budget": 0.5, "metrics": {}}, {"method": "S", "budget": 0.2,
                                                                              "skipped": "x"}])
    assert "| M | 0.5 | 1.000 | 0.00e+00 | 0.00e+00 | 2.00e+00 | 1.00e+00 |" in table
    assert "| N |" not in table and "| S |" not in table
    assert xc.format_values([{"method": "N", "budget": 0.5, "metrics": {}}]) == ""


def test_methods_doc_reads_the_wrapper_rows() -> None:
    j = methods_doc.jaccards()
    wrapped = {m["policy"] for m in kw.METHODS}
    assert wrapped <= set(j), "results/crosscheck_kvpress/wrappers/table.md has a row per wrapper"
    assert all(set(j[p]) == {0.5, 0.2} for p in wrapped)
    rows = {r[0]: r[-1] for r in methods_rows(j)}
    for name in ("chunk", "merging", "cam", "dms"):
        assert rows[f"`wrap=[{name}]`"].endswith(", over knorm")


def test_report_section_keeps_the_values_table_apart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from experiments.crosscheck_kvpress import findings

    text = ("note\n\n| method | budget | Jaccard | ident. |\n|---|---|---|---|\n| A | 0.5 | 0.900 | 0.000 |\n"
            "\nMerged values caption\n\n| method | budget | compared |\n|---|---|---|\n| A | 0.5 | 1.000 |\n")
    tables = findings._tables(text)
    assert [c for c, _ in tables] == ["note", "Merged values caption"]
    assert [len(t) for _, t in tables] == [3, 3]
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "table.md").write_text(text)
    assert findings._rows(tmp_path, "x") == [{"method": "A", "budget": "0.5", "Jaccard": "0.900",
                                              "ident.": "0.000"}]


def test_lukv_row_reads_the_committed_synthetic_curve(tmp_path) -> None:
    """The LU-KV row's curve regenerates from its seed, averages to each row's keep ratio, and fits SmolLM2;
    both sides read the same file."""
    import numpy as np

    from keyformer.core.policies.wrappers.lukv import LUKV

    path = tmp_path / "curve.npy"
    kw.lukv_curve(str(path))
    committed = np.load(Path(__file__).resolve().parents[2] / kw.LUKV_CURVE)
    assert np.array_equal(np.load(path), committed)
    assert committed.shape == (99, 30, 3)
    assert np.allclose(1 - committed[49].mean(), 0.5, atol=1e-6)  # ratio 0.5: keep half on average
    (m,) = kw.LUKV_METHODS
    assert m["press"]["kw"]["curve_path"] == m["policy_kw"]["lukv_curve"] == kw.LUKV_CURVE
    assert issubclass(type(make_policy(m["policy"], budget=0.5, **{**m["policy_kw"],
                                       "lukv_curve": str(path)})), LUKV)
