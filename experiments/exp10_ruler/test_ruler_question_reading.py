"""The two diagnostics of KVzip's query-agnostic loss (experiments/exp10_ruler/ruler_cut_overlap.py and
ruler_question_reading.py; both scripts themselves need the real model and the experiment's records):
the kept-set overlap by hand, and the hybrid cut keeping exactly the context positions it is given."""

from __future__ import annotations

import pytest
import torch

from experiments.exp10_ruler import ruler_cut_overlap as OVERLAP
from experiments.exp10_ruler import ruler_question_reading as READING
from keyformer import generate, make_policy, tiny_model
from keyformer.core.models import layer_windows
from keyformer.core.policies import Prompt


def test_overlap_by_hand() -> None:
    a = torch.tensor([[1.0, 1, 0, 0], [1, 0, 1, 0]])
    b = torch.tensor([[1.0, 0, 1, 0], [1, 0, 1, 0]])
    jac, share = OVERLAP.overlap(a, b)
    assert jac == pytest.approx((1 / 3 + 1) / 2) and share == pytest.approx((1 / 2 + 1) / 2)
    jac, share = OVERLAP.overlap(b, a)  # the share is of the first set
    assert jac == pytest.approx((1 / 3 + 1) / 2) and share == pytest.approx((1 / 2 + 1) / 2)
    c = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 0]])
    assert OVERLAP.overlap(c, c) == (1.0, 1.0)
    assert OVERLAP.overlap(a, c) == pytest.approx(((1 + 2 / 3) / 2, 1.0))  # a lies inside c
    assert OVERLAP.overlap(c, a) == pytest.approx(((1 + 2 / 3) / 2, (1 + 2 / 3) / 2))


def _kept_sets(model, n_ctx: int, k: int, seed: int) -> dict[int, torch.Tensor]:
    """Per cut layer, a head-adaptive kept set: the 4 sinks in every head and ``H * k - 4 H + d`` other (head,
    position) pairs drawn at random (``d`` in -1, 0, 1 by layer), so heads hold different counts and a
    layer's total need not be a multiple of ``H`` (a question-aware cut's context positions: it may drop
    question positions)."""
    g = torch.Generator().manual_seed(seed)
    H = model.config.num_key_value_heads
    out = {}
    for li, win in enumerate(layer_windows(model.config)):
        if win is not None:
            continue
        m = torch.zeros(H, n_ctx)
        m[:, :4] = 1
        free = torch.nonzero(m == 0)
        pick = free[torch.randperm(len(free), generator=g)[: H * k - 4 * H + li % 3 - 1]]
        m[pick[:, 0], pick[:, 1]] = 1
        out[li] = m
    return out


@pytest.mark.parametrize("arch,n_q", [("llama", 5), ("gemma3_text", 5), ("llama", 0), ("gemma3_text", 0)])
def test_fixed_keep_keeps_exactly_the_given_context_and_the_question(arch, n_q, one_thread) -> None:
    """With question positions after the context (``agnostic_cut``: the question read before the cut) and
    without (``aware_cut``: the context cut alone, the question read afterwards)."""
    model = tiny_model(arch, seed=0)
    n_ctx, k = 24, 12
    kept = _kept_sets(model, n_ctx, k, seed=3)
    assert len({tuple(m.sum(1).tolist()) for m in kept.values()}) > 1 or any(
        len(set(m.sum(1).tolist())) > 1 for m in kept.values())  # the heads' counts differ somewhere
    ids = torch.randint(3, 256, (1, n_ctx + n_q), generator=torch.Generator().manual_seed(1))
    pol = READING.fixed_keep(make_policy("kvzip", budget=0.5, repeat_ids=[7]), kept,
                                model.config.num_hidden_layers, n_ctx, n_q)
    assert pol.budget == max(int(m.sum(1).max()) for m in kept.values()) + n_q
    for li, want in kept.items():  # the question outranks every context position, not by a tie-break
        sc = pol.prepare(model, Prompt(ids, torch.ones_like(ids)))["scores"][li][0]
        assert sc.shape[-1] == n_ctx + n_q and torch.equal(sc[:, :n_ctx] > 0, want > 0)
        assert n_q == 0 or bool(sc[:, n_ctx:].min() > sc[:, :n_ctx].max())
    out = generate(model, ids, None, pol, max_new_tokens=3)
    for li, want in kept.items():
        pos = out.cache.layers[li].pos[0]
        assert torch.equal(READING.held(pos, n_ctx), want), f"layer {li}"
        q_held = READING.held(pos, n_ctx + n_q)[:, n_ctx:]
        assert bool((q_held == 1).all()), f"layer {li}: a question position was cut"
