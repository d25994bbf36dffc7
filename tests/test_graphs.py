"""CUDA-graph capture of the steady decode step (:mod:`keyformer.core.graphs`).

On CPU: when a step can be captured and why not, the explicit-position eager step equals ``generate()``'s
greedy decode, and the device-scalar temperature used while capturing Keyformer gives its float results. On
a GPU (``KEYFORMER_TEST_DEVICE=cuda pytest -m on_device``): the captured step equals the eager one.
"""

from __future__ import annotations

import copy

import pytest
import torch

from keyformer import generate, make_cache, make_policy, tiny_model
from keyformer.core import graphs

N, STEPS = 40, 10


def _ids(b: int = 2, n: int = N, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 256, (b, n), generator=torch.Generator().manual_seed(seed))


def _prefill(model, ids, mask, pol, steps, seed=0):
    """The prompt forward as generate() runs it: real positions from the mask (pads at 1)."""
    cache = make_cache(model, pol, mask, max_new_tokens=steps + 1, seed=seed)
    pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, logits_to_keep=1)
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


def test_capture_reasons(model):
    ids = _ids()
    mask = torch.ones_like(ids)
    assert "every token" in graphs.capture_reason(_prefill(model, ids, mask, make_policy("full"), 4)[0])
    assert ("compress" in graphs.capture_reason(_prefill(model, ids, mask, make_policy("snapkv", budget=0.5),
                                                         4)[0]))
    # absolute budget above the prompt
    grow = _prefill(model, ids, mask, make_policy("h2o", budget=N + 5), 4)[0]
    assert "budget yet" in graphs.capture_reason(grow)
    assert "CUDA" in graphs.capture_reason(_prefill(model, ids, mask, make_policy("h2o", budget=0.5), 4)[0])


@pytest.mark.parametrize("arch,name", [("llama", "window"), ("llama", "h2o"), ("llama", "keyformer"),
                                       ("gemma3_text", "keyformer")])
def test_eager_step_equals_generate(model, arch, name):
    """The step the graph records (explicit real positions) is generate()'s greedy step, padded batch too;
    Gemma 3 has sliding-window layers."""
    model = model if arch == "llama" else tiny_model(arch, seed=0)
    ids = _ids(seed=1)
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    pol = make_policy(name, budget=0.5)
    ref = generate(model, ids, mask, pol, max_new_tokens=STEPS + 1, seed=3)
    cache, tok = _prefill(model, ids, mask, pol, STEPS, seed=3)
    with torch.inference_mode():
        toks, info = graphs.greedy_decode(model, cache, tok, STEPS, capture=True)
    assert info["captured_steps"] == 0 and "CUDA" in info["reason"]  # CPU: the eager fallback
    assert torch.equal(torch.cat([tok, toks], dim=1), ref.sequences)
    for li in range(len(cache.layers)):
        assert cache.kept_positions(li) == ref.cache.kept_positions(li)


def test_device_tau_matches_the_float_schedule(model):
    """While capturing, Keyformer's annealed tau is a device scalar; eager with it gives the float's
    results."""
    ids = _ids(seed=2)
    mask = torch.ones_like(ids)
    pol = make_policy("keyformer", budget=0.5, tau_init=1.0, tau_end=2.0)
    a, tok = _prefill(model, ids, mask, pol, STEPS, seed=5)
    b = copy.deepcopy(a)
    with torch.inference_mode():
        ta, _ = graphs.greedy_decode(model, a, tok, STEPS, capture=False)
        orig = pol.tau
        pol.tau = lambda step, horizon=None: graphs.DeviceTau(torch.tensor(1.0 / orig(step, horizon)))
        try:
            tb, _ = graphs.greedy_decode(model, b, tok, STEPS, capture=False)
        finally:
            del pol.tau
    assert torch.equal(ta, tb)
    for li in range(len(a.layers)):
        assert a.kept_positions(li) == b.kept_positions(li)
        torch.testing.assert_close(a.layers[li].score, b.layers[li].score, rtol=1e-5, atol=1e-6)


CAPTURED = ([("llama", n, d) for n in ("window", "streaming", "h2o", "keyformer", "tova")
             for d in (torch.float32, torch.bfloat16)]
            + [("gemma3_text", n, torch.float32) for n in ("h2o", "keyformer")])


@pytest.mark.parametrize("arch,name,dtype", CAPTURED)
def test_captured_step_equals_eager(device, arch, name, dtype):
    """On a GPU: the replayed graph gives the eager step's tokens, kept sets and scores (CPU: skipped).
    Gemma 3 adds sliding-window layers."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a CUDA device (KEYFORMER_TEST_DEVICE=cuda)")
    model = tiny_model(arch, seed=0).to(device=device, dtype=dtype)
    ids = _ids(seed=4).to(device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    pol = make_policy(name, budget=0.5)
    eager, tok = _prefill(model, ids, mask, pol, STEPS, seed=7)
    captured = copy.deepcopy(eager)
    with torch.inference_mode():
        te, ie = graphs.greedy_decode(model, eager, tok, STEPS, capture=False)
        tc, ic = graphs.greedy_decode(model, captured, tok, STEPS, capture=True)
    assert ic["captured_steps"] >= STEPS - 2, ic
    assert torch.equal(te, tc)
    for li in range(len(eager.layers)):
        assert eager.kept_positions(li) == captured.kept_positions(li)
        torch.testing.assert_close(eager.layers[li].score, captured.layers[li].score, rtol=1e-4, atol=1e-6)
    assert torch.equal(eager.next_pos, captured.next_pos)
    assert [lay.seen for lay in eager.layers] == [lay.seen for lay in captured.layers]


@pytest.mark.parametrize("name", ["h2o", "keyformer"])
def test_steady_step_changes_only_what_a_replay_carries(model, name):
    """What a graph replay relies on, checked on CPU: a steady step re-binds only per-forward bookkeeping
    tensors of the cache (carried from one replay to the next), updates the layers' tensors in place, and
    changes no Python number but each layer's ``seen`` (advanced by hand)."""
    ids = _ids(seed=3)
    cache, tok = _prefill(model, ids, torch.ones_like(ids), make_policy(name, budget=0.5), STEPS)
    scalar = (int, float, bool)
    with torch.inference_mode():
        tok = graphs.eager_step(model, cache, tok)  # the first step sets up per-step buffers
        objs = [cache, *cache.layers]
        before = graphs._tensor_attrs(cache)
        nums = [{k: v for k, v in vars(o).items() if isinstance(v, scalar)} for o in objs]
        graphs.eager_step(model, cache, tok)
    after = graphs._tensor_attrs(cache)
    rebound = {k for k in before.keys() & after.keys() if after[k] is not before[k]}  # (object index, name)
    assert {name for _, name in rebound} <= {"next_pos", "cur", "recent_floor", "fwd_pos", "_step_noise"}
    assert all(i == 0 for i, _ in rebound)  # layers: every tensor updated in place
    assert after.keys() == before.keys()
    for o, n0 in zip(objs, nums, strict=True):
        changed = {k for k, v in n0.items() if vars(o).get(k) != v}
        assert changed <= {"seen"}, changed
