"""ruler_kept_depth.py's two helpers (the script itself needs the real model and the experiment's
records): the needle's token span and the held-position mask, each against a rule written out here."""

from __future__ import annotations

import pytest
import torch

from experiments.exp10_ruler import queue as make
from experiments.exp10_ruler import ruler_kept_depth as SCRIPT


class _Pieces:
    """A tokenizer stub: token t decodes to ``pieces[t]``."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def test_value_span_is_the_smallest_token_range_that_covers_the_value() -> None:
    pieces = ["The", " magic", " number", " is", " 12", "345", "67", ".", " Done"]
    tok = _Pieces(pieces)
    ids = list(range(len(pieces)))
    lo, hi = SCRIPT._value_span(tok, ids, "1234567")
    assert (lo, hi) == (4, 7) and "1234567" in tok.decode(ids[lo:hi])
    assert "1234567" not in tok.decode(ids[lo + 1:hi]) and "1234567" not in tok.decode(ids[lo:hi - 1])
    assert SCRIPT._value_span(tok, ids, "345") == (5, 6)  # a value inside one token
    with pytest.raises(ValueError, match="'999' is not in the decoded prompt"):
        SCRIPT._value_span(tok, ids, "999")


def test_held_marks_exactly_the_prompt_positions_in_the_slots() -> None:
    g = torch.Generator().manual_seed(0)
    n, H, S = 40, 3, 25
    pos = torch.full((H, S), -1, dtype=torch.long)
    for h in range(H):
        k = 18 + h
        pos[h, :k] = torch.randperm(n - (h == 0), generator=g)[:k]  # head 0 never holds position n - 1
    pos[0, -1] = n  # a generated token's slot: not a prompt position
    got = SCRIPT.held(pos, n)
    want = torch.zeros(H, n)
    for h in range(H):
        for p in pos[h].tolist():
            if 0 <= p < n:
                want[h, p] = 1.0
    assert torch.equal(got, want)
    assert got[0, n - 1] == 0  # the generated token's position n does not leak onto n - 1


def test_point_overrides_are_the_queue_lines_of_every_task() -> None:
    """The diagnostics rerun an exp10 point's records with the overrides the experiment's queue ran them with
    (experiments/exp10_ruler/queue.py), the task's tokens to generate included (cwe: 120, not the default)."""
    for exp in ("exp10_ruler", "exp10_ruler_gemma"):
        for task in make.TASKS:
            queued = make.line("aware", task, "kvzip", 0.5, exp=exp).split()[2:]
            want = [o for o in queued if not o.startswith(("policy=", "budget="))]
            got = SCRIPT.point_overrides(exp, task, 5)
            assert got == [want[0], want[1], "n_samples=5", want[2]], (exp, task)
    assert SCRIPT.point_overrides("exp10_ruler", "cwe", 5)[-1] == "generation.max_new_tokens=120"
