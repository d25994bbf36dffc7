"""The decode-time row of the kvpress cross-check (``wrap=[every]`` vs ``DecodingPress``): its specs, the
recorder's position bookkeeping against a hand-run cut sequence, and that the methods table reads the row
(kvpress is not needed)."""

from __future__ import annotations

import pytest
import torch

from experiments.crosscheck_kvpress import kvpress_crosscheck as xc
from experiments.crosscheck_kvpress import kvpress_decoding as kd
from experiments.crosscheck_kvpress import methods_doc
from keyformer.core.policies import make_policy
from keyformer.core.policies.methods import rows as methods_rows


def test_decoding_rows_pair_the_same_schedule() -> None:
    rows = [m for m in xc.METHODS + xc.DIAGNOSTICS if m in kd.METHODS + kd.DIAGNOSTICS]
    assert len(rows) == 3
    for m in rows:
        policy = make_policy(m["policy"], budget=0.5, **m["policy_kw"])
        assert policy.schedule.when == "every"
        assert policy.schedule.n == m["press"]["kw"]["compression_interval"]
        assert m["press"]["decode"] and m["policy_kw"]["recent"] == 0.0


def test_cache_positions_follow_a_hand_run_cut_sequence() -> None:
    """Two cuts of a 6-token prompt, replayed by hand: the positions the recorder assigns to each slot are
    the tokens the cut sequence leaves there."""
    first = kd.cache_positions(None, 9, 8)  # 6 prompt tokens + 3 decode tokens, no cut yet
    assert first == [list(range(9))]
    kept = [[first[0][i] for i in (0, 4, 8)], [first[0][i] for i in (1, 2, 3)]]  # the cut's survivors
    assert kd.cache_positions(kept, 5, 10) == [[0, 4, 8, 9, 10], [1, 2, 3, 9, 10]]  # two tokens appended
    assert kd.cache_positions(kept, 3, 8) == kept  # nothing appended
    with pytest.raises(ValueError, match="fewer than"):
        kd.cache_positions(kept, 2, 10)
    with pytest.raises(ValueError, match="uncut cache"):
        kd.cache_positions(None, 9, 10)


class _Module:
    layer_idx = 0


class _Press:
    """A press that keeps, per head, the slots named in ``keep`` (one list per call)."""

    def __init__(self, keep: list[list[int]]) -> None:
        self.keep = iter(keep)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):  # type: ignore[no-untyped-def]
        idx = torch.tensor(next(self.keep)).view(1, 1, -1, 1).expand(1, keys.shape[1], -1, keys.shape[-1])
        return keys.gather(2, idx), values.gather(2, idx)


def test_recorder_maps_kept_keys_through_earlier_cuts() -> None:
    """Distinct keys per position: after two cuts the recorded positions are those the hand-written
    sequence keeps (the second cut's slots index the first cut's survivors plus the appended tokens)."""
    g = torch.Generator().manual_seed(0)
    keys_by_pos = torch.randn(1, 2, 20, 4, generator=g)
    press, state = _Press([[0, 2, 5], [1, 3, 4]]), {}
    kd.record_positions(press, state)
    k = keys_by_pos[:, :, :7]
    k_out, _ = press.compress(_Module(), None, k, k, None, {"cache_position": torch.tensor([6])})
    assert state[0] == [[0, 2, 5], [0, 2, 5]]
    # three tokens appended (positions 7, 8, 9): slots hold 0, 2, 5, 7, 8, 9
    k2 = torch.cat([k_out, keys_by_pos[:, :, 7:10]], dim=2)
    press.compress(_Module(), None, k2, k2, None, {"cache_position": torch.tensor([9])})
    assert state[0] == [[2, 7, 8], [2, 7, 8]]


def test_recorder_refuses_a_key_it_cannot_place() -> None:
    press, state = _Press([[0, 1]]), {}
    kd.record_positions(press, state)
    k = torch.zeros(1, 1, 3, 2)  # every key equal: a kept key matches several inputs
    with pytest.raises(RuntimeError, match="matches no or several"):
        press.compress(_Module(), None, k, k, None, {"cache_position": torch.tensor([2])})


def test_methods_table_reads_the_decoding_row() -> None:
    j = methods_doc.jaccards()
    assert set(j["knorm+every"]) == {0.5, 0.2}, "results/crosscheck_kvpress/decoding/table.md has the row"
    row = {r[0]: r[-1] for r in methods_rows(j, methods_doc.closest_variants())}["`wrap=[every]`"]
    assert row.endswith(", over knorm")
