"""Policy construction, validation messages and selection rules."""

from __future__ import annotations

import pytest
import torch

from keyformer import KVCache, make_policy, tiny_model
from keyformer.core.models import prepare_model
from keyformer.core.policies.base import Context


@pytest.mark.parametrize(
    ("name", "kwargs", "fragment"),
    [
        ("h2o", {"budget": 0.0}, "budget=0.0"),
        ("h2o", {"budget": 1.5}, "budget=1.5"),
        ("window", {"budget": 0}, "budget=0"),
        ("keyformer", {"budget": -3}, "budget=-3"),
        ("h2o", {"recent": 1.2}, "recent=1.2"),
        ("keyformer", {"recent": -0.1}, "recent=-0.1"),
        ("keyformer", {"tau_init": 0.0}, "tau_init=0.0"),
        ("keyformer", {"tau_init": 2.0, "tau_end": 1.0}, "tau_end=1.0"),
        ("keyformer", {"candidates": "sometimes"}, "candidates='sometimes'"),
        ("keyformer", {"head_reduction": "max"}, "head_reduction='max'"),
        ("window", {"sinks": -1}, "sinks=-1"),
        ("lru", {}, "policy='lru'"),
        ("h2o", {"tau_init": 1.0}, "no option"),
    ],
)
def test_bad_input_names_the_value(name, kwargs, fragment):
    with pytest.raises(ValueError, match=None) as err:
        make_policy(name, **kwargs)
    assert fragment in str(err.value)


def test_valid_choices_are_listed():
    with pytest.raises(ValueError) as err:
        make_policy("nope")
    assert "keyformer" in str(err.value) and "h2o" in str(err.value)
    with pytest.raises(ValueError) as err:
        make_policy("keyformer", candidates="x")
    assert "paper" in str(err.value) and "reference" in str(err.value)


def test_bad_mode_and_architecture():
    with pytest.raises(ValueError, match="mode='fast'"):
        KVCache(None, 2, mode="fast")
    from transformers import BertConfig, BertModel

    with pytest.raises(ValueError, match="model_type='bert'"):
        prepare_model(BertModel(BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                           intermediate_size=32)))


def test_budget_arithmetic():
    n = torch.tensor([10, 37, 1])
    p = make_policy("h2o", budget=0.5, recent=0.3)
    assert p.budget_tokens(n).tolist() == [5, 18, 1]
    assert p.recent_tokens(p.budget_tokens(n)).tolist() == [1, 5, 0]
    assert make_policy("h2o", budget=16).budget_tokens(n).tolist() == [16, 16, 16]


def test_keyformer_tau_schedule():
    p = make_policy("keyformer", tau_init=1.0, tau_end=2.0, max_new_tokens=128)
    assert p.tau(0) == 1.0 and p.tau(64) == 1.5 and p.tau(128) == 2.0


def test_reference_rule_drops_the_leaving_token_at_decode_only():
    p = make_policy("keyformer", candidates="reference")
    score = torch.tensor([[[5.0, 4.0, 3.0, 2.0]]])
    pos = torch.tensor([[[0, 1, 2, 3]]])
    cur, w = torch.tensor([4]), torch.tensor([2])  # recent = {3, 4}; token 2 just left the window
    assert p.priority(score, Context(step=1, pos=pos, newest=cur, recent_window=w))[0, 0, 2] == float("-inf")
    assert torch.equal(p.priority(score, Context(step=0, pos=pos, newest=cur, recent_window=w)), score)


def test_shared_head_reduction_keeps_the_same_tokens_in_every_head():
    model = tiny_model("gptj")
    ids = torch.randint(3, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    from keyformer import generate

    out = generate(model, ids, None, make_policy("keyformer", budget=0.4, head_reduction="shared"),
                   max_new_tokens=6)
    for li in range(len(out.cache.layers)):
        heads = out.cache.kept_positions(li)[0]
        assert all(h == heads[0] for h in heads)
    per_head = generate(model, ids, None, make_policy("keyformer", budget=0.4), max_new_tokens=6)
    heads = per_head.cache.kept_positions(0)[0]
    assert any(h != heads[0] for h in heads)


def test_cache_refuses_a_model_that_bypasses_it():
    model = tiny_model("llama")
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 256, (1, 20))
    from keyformer import generate

    with pytest.raises(RuntimeError, match="prepare_model"):
        generate(model, ids, None, make_policy("h2o", budget=0.5), max_new_tokens=4)


def test_snapkv_pools_only_the_keys_before_the_observation_window():
    """As the authors' ``avg_pool1d(attn[..., -window:, :-window])``: the window is cut off before pooling
    (it is kept regardless), so the keys just before it do not average in the window's own local attention."""
    import torch

    from keyformer.core.policies import make_policy
    from keyformer.core.policies.base import Context

    pol = make_policy("snapkv", budget=0.5, window_size=3, kernel_size=3)
    state = torch.tensor([[[1.0, 1, 1, 1, 1, 1, 1, 9, 9, 9]]])
    ctx = Context(pos=torch.arange(10).view(1, 1, -1), newest=torch.tensor([9]))
    out = pol.after_prompt(state.clone(), ctx)
    assert torch.allclose(out[0, 0, :7], torch.tensor([2 / 3, 1, 1, 1, 1, 1, 2 / 3]))
    assert out[0, 0, 7:].max() < 1  # the window's own 9s are gone (its scores do not matter: it is kept)
