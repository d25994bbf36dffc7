"""KVzip in the kvpress cross-check: the recorder's pure parts (kvpress is not needed)."""

from __future__ import annotations

import math

import pytest

from experiments.crosscheck_kvpress import kvpress_crosscheck as xc
from experiments.crosscheck_kvpress import kvpress_kvzip as kz


def test_kept_sets_are_the_complement_of_the_masked_indices():
    # (batch, head, position) of the pruned pairs; batch row 1 is ignored (batch 1 runs only)
    kept = kz.kept_from_masked([0, 0, 0, 1], [0, 2, 2, 1], [3, 0, 4, 2], heads=3, n=5)
    assert kept == [[0, 1, 2, 4], [0, 1, 2, 3, 4], [1, 2, 3]]
    assert xc.count(xc.encode_kept(kept[2])) == 3


@pytest.mark.parametrize("budget", [0.5, 0.2, 0.3, 0.1])
def test_floor_count_ratio_keeps_our_count(budget):
    """kvpress's layerwise KVzip prunes ``int(H * n * ratio)`` pairs per layer; with the nudged ratio it keeps
    ``H * floor(n * budget)``, ours, on every prompt length."""
    for heads in (1, 3, 8):
        for n in range(16, 700):
            r = kz.floor_count_ratio(n, heads, 1 - budget)
            assert 0 <= r < 1
            assert heads * n - int(heads * n * r) == heads * math.floor(n * budget + 1e-9)


def test_kvzip_rows_in_the_crosscheck():
    names = [m["name"] for m in xc.METHODS + xc.DIAGNOSTICS if m["policy"] == "kvzip"]
    assert names == ["KVzip", "KVzip [kv: whole prompt scored]", "KVzip [kv: whole prompt, floor count]"]
    for m in kz.METHODS + kz.DIAGNOSTICS:
        assert m["press"]["kvzip"] and m["press"]["kw"]["layerwise"] is True
        assert m["policy_kw"]["n_sink"] == m["press"]["kw"]["n_sink"] and m["policy_kw"]["prefill_only"]
