"""Beams without waste, and the prefill flash path (CPU, tiny random models).

* Prompt once: ``generate(num_beams=nb)`` runs the prompt forward over the B samples, not B * nb rows, then
  expands the cache. The reference is transformers' own way (``prompt_once=False``: the batch is expanded
  before the prompt forward), which the physical cache is tested against elsewhere (mask simulation, plain
  ``generate``); both must give the same sequences, logits and kept sets, per-beam and shared beam scores.
* Reorder: only the rows whose source beam changed are copied; the result equals plain indexing.
* Prefill flash: a policy that scores only its last ``observe_rows`` prompt rows gets the prompt output from
  SDPA and logits for those rows only; tokens equal the blocked pass's and logits agree.
"""

from __future__ import annotations

import pytest
import torch

from keyformer import generate, make_policy, tiny_model
from keyformer.core import attention

NB, NEW = 4, 8


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


def _batch(seed: int = 0, b: int = 2, n: int = 30, pad: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batch [b, n]: sample 1 has ``pad`` pads."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (b, n), generator=g)
    mask = torch.ones_like(ids)
    if b > 1:
        mask[1, :pad] = 0
    return ids, mask


class _PromptForwards:
    """Counts multi-token forwards (prompt forwards) and the batch each one had."""

    def __init__(self, model):
        self.batches: list[int] = []
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            self.batches.append(ids.shape[0])


@pytest.mark.parametrize("prompt_once", [True, False])
def test_prompt_forward_runs_once_per_sample(model, prompt_once):
    ids, mask = _batch()
    spy = _PromptForwards(model)
    try:
        generate(model, ids, mask, make_policy("h2o", budget=0.5), max_new_tokens=4, num_beams=NB,
                 prompt_once=prompt_once)
    finally:
        spy.handle.remove()
    # prompt once: one forward over the 2 samples; transformers' way (positive control): over 2 * NB rows
    assert spy.batches == ([2] if prompt_once else [2 * NB])


@pytest.mark.parametrize("beam_scores", ["per_beam", "shared"])
@pytest.mark.parametrize("name", ["full", "h2o", "keyformer"])
def test_prompt_once_changes_nothing(model, name, beam_scores):
    ids, mask = _batch(1)
    pol = make_policy(name, budget=0.5)
    kw = dict(max_new_tokens=NEW, num_beams=NB, beam_scores=beam_scores, seeds=[7, 9], output_logits=True)
    once = generate(model, ids, mask, pol, **kw)
    ref = generate(model, ids, mask, pol, prompt_once=False, **kw)
    assert torch.equal(once.sequences, ref.sequences)
    assert (once.logits - ref.logits).abs().max() < 1e-5
    for li in range(len(ref.cache.layers)):
        assert once.cache.kept_positions(li) == ref.cache.kept_positions(li)
    assert once.kv_bytes == ref.kv_bytes
    assert torch.equal(once.cache.seed_t, ref.cache.seed_t)  # per-beam noise seeds after the expansion


def test_prompt_once_in_mask_mode(model):
    ids, mask = _batch(2)
    pol = make_policy("keyformer", budget=0.5)
    kw = dict(max_new_tokens=NEW, num_beams=NB, beam_scores="shared", seed=3, mode="mask")
    once = generate(model, ids, mask, pol, **kw)
    ref = generate(model, ids, mask, pol, prompt_once=False, **kw)
    assert torch.equal(once.sequences, ref.sequences)
    assert [once.cache.kept_positions(li) for li in range(2)] == [ref.cache.kept_positions(li)
                                                                  for li in range(2)]


@torch.inference_mode()  # as inside generate(): the cache's tensors are inference tensors
def test_reorder_copies_only_the_rows_that_changed(model):
    """The cache's reorder equals plain indexing of every per-row tensor, and leaves unchanged rows' storage
    in place (no whole-tensor copy)."""
    ids, mask = _batch(3, b=1)
    out = (generate(model, ids.repeat(NB, 1), mask.repeat(NB, 1), make_policy("h2o", budget=0.5),
                    max_new_tokens=3))
    cache = out.cache
    layer = cache.layers[0]
    names = ("keys", "values", "pos", "score", "count")
    for lay in cache.layers:  # make the rows distinguishable
        for t in (lay.keys, lay.values):
            t += torch.arange(NB, dtype=t.dtype).view(-1, 1, 1, 1)
    before = {n: getattr(layer, n).clone() for n in names}
    ptr = layer.keys.data_ptr()
    idx = torch.tensor([0, 0, 2, 1])  # rows 1 and 3 change; 0 and 2 stay
    cache.reorder_cache(idx)
    for n in names:
        assert torch.equal(getattr(layer, n), before[n][idx]), n
    assert layer.keys.data_ptr() == ptr  # updated in place
    cache.reorder_cache(torch.arange(NB))  # identity: nothing moves
    for n in names:
        assert torch.equal(getattr(layer, n), before[n][idx]), n
    idx = torch.tensor([3, 2, 1, 0])  # every row changes: one gather
    want = {n: getattr(layer, n).clone()[idx] for n in names}
    cache.reorder_cache(idx)
    for n in names:
        assert torch.equal(getattr(layer, n), want[n]), n


class _BlockRows:
    """Records the first query row of every scored prompt block (the blocked pass calls ``_upper`` per
    block)."""

    def __init__(self, monkeypatch):
        self.starts: list[int] = []
        real = attention._upper

        def spy(r0, r1, device):
            self.starts.append(r0)
            return real(r0, r1, device)

        monkeypatch.setattr(attention, "_upper", spy)


@pytest.mark.parametrize("name,kw", [("snapkv", dict(window_size=8)), ("tova", {})])
def test_observed_rows_prefill_uses_flash(model, monkeypatch, name, kw):
    ids, mask = _batch(4, n=200)
    pol = make_policy(name, budget=0.5, **kw)
    blocks = _BlockRows(monkeypatch)
    fast = generate(model, ids, mask, pol, max_new_tokens=NEW, output_logits=True)
    rows_from = ids.shape[1] - int(pol.observe_rows)
    assert blocks.starts and min(blocks.starts) >= rows_from  # no logits for the rows that are not scored
    blocks.starts.clear()
    monkeypatch.setattr(attention, "PREFILL_FLASH", False)  # the blocked pass over every row (the reference)
    ref = generate(model, ids, mask, pol, max_new_tokens=NEW, output_logits=True)
    assert min(blocks.starts) == 0
    assert torch.equal(fast.sequences, ref.sequences)
    assert (fast.logits - ref.logits).abs().max() < 1e-4
    for li in range(len(ref.cache.layers)):
        assert fast.cache.kept_positions(li) == ref.cache.kept_positions(li)


@pytest.mark.parametrize("arch", ["gpt2", "mpt", "gemma3_text"])
def test_prompt_once_other_architectures(arch):
    """Learned positions (GPT-2), ALiBi (MPT) and sliding-window layers (Gemma 3): same results both ways."""
    model = tiny_model(arch, seed=0)
    ids, mask = _batch(5)
    pol = make_policy("keyformer", budget=0.5)
    kw = dict(max_new_tokens=6, num_beams=3, beam_scores="shared", seed=2, output_logits=True)
    once = generate(model, ids, mask, pol, **kw)
    ref = generate(model, ids, mask, pol, prompt_once=False, **kw)
    assert torch.equal(once.sequences, ref.sequences)
    assert (once.logits - ref.logits).abs().max() < 1e-5
    for li in range(len(ref.cache.layers)):
        assert once.cache.kept_positions(li) == ref.cache.kept_positions(li)
