"""A policy on sliding-window layers (docs/models.md, "Sliding-window layers"): on a model whose every layer
slides (Mistral 7B v0.1) the policy compresses them within the model's window (``sliding='auto'``, the
default); on a hybrid model (Gemma 3) only with ``sliding='policy'``.

* a tiny Mistral with ``sliding_window``, built here from ``transformers.MistralConfig`` (not the project's
  tiny configs): ``full`` equals the stock model's greedy tokens and logits for a generation past the window;
  H2O, Keyformer and SnapKV run on it, hold fewer K/V bytes than ``full``, give physical == mask and the naive
  reference's tokens (``keyformer.core.contract``), and every layer holds at most ``min(k, W - 1)`` tokens
  (exactly that under a step policy), none older than the window, at every step;
* a budget of the whole window changes nothing (== ``full``); a prompt and generation that fit in the
  window give exactly the policy cache of the same weights without a window;
* hybrid ``gemma3_text``: by default the sliding layers keep the model's window (as ``sliding='window'``);
  with ``sliding='policy'`` they hold the policy's budget, within the window;
* a bad ``sliding`` value is refused in one line, by ``make_policy`` and by ``run.py`` (exit 2).

The whole policy contract also runs on an all-sliding Mistral (``mistral_sliding`` in
``tests/test_policy_contract.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_policy_contract import _Every  # the contract's per-step probe
from transformers import LogitsProcessorList, MistralConfig, MistralForCausalLM

from keyformer import generate, make_cache, make_policy, prepare_model
from keyformer.core.contract import naive_logits
from keyformer.core.models import TINY_WINDOW, layer_windows, tiny_model

ROOT = Path(__file__).resolve().parent.parent
W = 8  # the tiny Mistral's window: below the prompt, so tokens leave it during the prompt and the generation
N, NEW = 20, 12
BUDGET = 0.25  # k = 5 < W - 1: the policy chooses within the window

pytestmark = pytest.mark.usefixtures("one_thread")


def _mistral(window: int | None = W, seed: int = 0) -> MistralForCausalLM:
    """A tiny random Mistral (2 layers, GQA 4/2) as transformers builds it, every layer sliding with
    ``window`` (None: no window); no eos token, so every generation runs its length."""
    cfg = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        sliding_window=window, eos_token_id=None)
    torch.manual_seed(seed)
    return MistralForCausalLM(cfg).eval()


def _prompt(seed: int, n: int = N) -> torch.Tensor:
    return torch.randint(3, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def _row_score(policy, probs, noise, step, horizon):
    from test_policy_contract import _row_score as plain  # H2O's and Keyformer's scores as plain softmax math

    return plain(policy, probs, noise, step, horizon)


def test_the_window_changes_the_stock_model():
    """Positive control: at these lengths the stock model's window changes its logits."""
    ids = _prompt(1)
    with torch.inference_mode():
        assert (_mistral()(ids).logits - _mistral(None)(ids).logits).abs().max() > 1e-3


def test_full_equals_the_stock_model_past_the_window():
    ids = _prompt(1)
    stock = _mistral().generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                do_sample=False, pad_token_id=0, output_logits=True,
                                return_dict_in_generate=True)
    out = generate(prepare_model(_mistral()), ids, None, make_policy("full"), max_new_tokens=NEW,
                   output_logits=True)
    assert torch.equal(out.sequences, stock.sequences[:, N:])
    assert (out.logits - torch.stack(stock.logits, dim=1)).abs().max() < 1e-4
    assert out.kv_bytes == out.kv_bytes_full  # the stock cache's W - 1 tokens per layer


@pytest.mark.parametrize("name", ("h2o", "keyformer", "snapkv"))
def test_a_policy_compresses_within_the_window(name):
    """The policy acts on every (sliding) layer: each holds at most min(k, W - 1) tokens (a step policy:
    exactly), all of them inside the window, at every step; fewer bytes than full; physical == mask; the
    naive reference (band at the prompt, the token leaving the window dropped first) gives the same
    tokens and logits."""
    model, ids = prepare_model(_mistral()), _prompt(2)
    pol = make_policy(name, budget=BUDGET, **({"window_size": 4} if name == "snapkv" else {}))
    k = int(N * BUDGET)
    cache = make_cache(model, pol, torch.ones_like(ids), max_new_tokens=NEW, seed=3)

    def check(step):
        cur = N - 1 + step
        for li in range(2):
            heads = cache.kept_positions(li)[0]
            assert all(p > cur - W + 1 for h in heads for p in h), (li, step)  # nothing the window has left
            if pol.schedule.when == "step":
                assert [len(h) for h in heads] == [k] * len(heads), (li, step)
            else:  # SnapKV: k after the prompt, then every generated token, within the window
                assert all(len(h) <= min(k + step, W - 1) for h in heads), (li, step)

    every = _Every(check)
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=NEW,
                   do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([every]))
    assert every.calls == NEW

    phys = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=3)
    sim = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=3, mode="mask")
    full = generate(model, ids, None, make_policy("full"), max_new_tokens=NEW)
    assert torch.equal(phys.sequences, sim.sequences) and (phys.logits - sim.logits).abs().max() < 1e-4
    assert all(phys.cache.kept_positions(li) == sim.cache.kept_positions(li) for li in range(2))
    if pol.schedule.when == "step":
        assert phys.kv_bytes[0] < full.kv_bytes[0] and phys.kv_tensor_bytes < full.kv_tensor_bytes
    else:  # SnapKV keeps every generated token: the window (W - 1 newest) at the end
        assert phys.kv_bytes[0] <= full.kv_bytes[0] and phys.kv_tensor_bytes <= full.kv_tensor_bytes
    seq = torch.cat([ids, phys.sequences[:, :-1]], dim=1)
    naive = naive_logits(model, pol, seq, N, seed=3, horizon=NEW, row_score=_row_score)
    assert torch.equal(naive.argmax(-1), phys.sequences) and (naive - phys.logits).abs().max() < 1e-4


@pytest.mark.parametrize("name", ("h2o", "keyformer"))
def test_a_budget_of_the_whole_window_changes_nothing(name):
    """k >= W - 1: the layer keeps its whole window, as full does (the stock model)."""
    model, ids = prepare_model(_mistral()), _prompt(3)
    out = generate(model, ids, None, make_policy(name, budget=W - 1), max_new_tokens=NEW, output_logits=True)
    full = generate(model, ids, None, make_policy("full"), max_new_tokens=NEW, output_logits=True)
    assert torch.equal(out.sequences, full.sequences) and (out.logits - full.logits).abs().max() < 1e-4
    cur = N + NEW - 2  # the newest cached position
    assert out.cache.kept_positions(0)[0] == [set(range(cur - W + 2, cur + 1))] * 2


@pytest.mark.parametrize("name", ("h2o", "keyformer", "snapkv"))
def test_within_the_window_it_is_a_normal_policy_cache(name):
    """Prompt + generation within the window: no token ever leaves it, and the policy cache is exactly the
    one of the same weights without a window (tokens, logits, kept positions)."""
    ids = _prompt(4)
    pol = make_policy(name, budget=0.5, **({"window_size": 4} if name == "snapkv" else {}))
    sliding, plain = prepare_model(_mistral(N + NEW)), prepare_model(_mistral(None))
    assert layer_windows(sliding.config) == [N + NEW] * 2 and layer_windows(plain.config) == [None] * 2
    a, b = (generate(m, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=5)
            for m in (sliding, plain))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.logits, b.logits)
    assert all(a.cache.kept_positions(li) == b.cache.kept_positions(li) for li in range(2))
    assert a.kv_bytes == b.kv_bytes


@pytest.mark.parametrize("name", ("h2o", "keyformer", "snapkv"))
def test_hybrid_sliding_layers_keep_the_window_unless_asked(name):
    """gemma3_text (layers 0 and 2 slide, window 12): by default (``auto``, as ``window``) they keep the
    model's window; with ``sliding='policy'`` they hold the policy's budget within it (k = 7 < W - 1 = 11),
    physical == mask and the naive reference agree, and the model holds fewer bytes."""
    model, ids = tiny_model("gemma3_text"), _prompt(5, 36)
    kw = dict(budget=0.2, **({"window_size": 4} if name == "snapkv" else {}))
    new, k = 4, int(36 * 0.2)
    cur = 36 + new - 2
    window = set(range(cur - TINY_WINDOW + 2, cur + 1))
    auto, kept_off, on = (generate(model, ids, None, make_policy(name, sliding=s, **kw), max_new_tokens=new,
                                   output_logits=True, seed=3) for s in ("auto", "window", "policy"))
    assert torch.equal(auto.sequences, kept_off.sequences) and torch.equal(auto.logits, kept_off.logits)
    for li in (0, 2):
        assert auto.cache.kept_positions(li)[0] == [window] * 2
        held = on.cache.kept_positions(li)[0]
        assert all(h <= window for h in held) and held != [window] * 2
        if name != "snapkv":
            assert [len(h) for h in held] == [k] * 2
    grown = new - 1 if name == "snapkv" else 0  # SnapKV keeps the generated tokens (the last is not fed)
    assert [len(h) for h in on.cache.kept_positions(1)[0]] == [k + grown] * 2  # the global layer: its budget
    assert on.kv_bytes[0] < auto.kv_bytes[0]
    pol = make_policy(name, sliding="policy", **kw)
    sim = generate(model, ids, None, pol, max_new_tokens=new, output_logits=True, seed=3, mode="mask")
    assert torch.equal(on.sequences, sim.sequences) and (on.logits - sim.logits).abs().max() < 1e-4
    assert all(on.cache.kept_positions(li) == sim.cache.kept_positions(li) for li in range(3))
    seq = torch.cat([ids, on.sequences[:, :-1]], dim=1)
    naive = naive_logits(model, pol, seq, 36, seed=3, horizon=new, row_score=_row_score)
    assert torch.equal(naive.argmax(-1), on.sequences) and (naive - on.logits).abs().max() < 1e-4


def test_a_bad_sliding_value_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^sliding='layers' is unknown; valid: auto, window, policy$"):
        make_policy("h2o", budget=0.5, sliding="layers")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), "model=tiny_mistral", "policy=h2o",
                        "+policy.sliding=layers", f"output_dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("error:"), lines[0]
    assert "sliding='layers' is unknown; valid: auto, window, policy" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()
