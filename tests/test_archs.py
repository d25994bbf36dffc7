"""Architectures beyond Llama/GPT-J/GPT-2/MPT (issue 20): Mistral, Qwen2 (hybrid), Qwen3 (QK-norm), Phi-3,
Gemma 2 (logit soft-capping, alternating sliding/global layers), Gemma 3 text (hybrid, QK-norm,
``query_pre_attn_scalar``) and multimodal Gemma 3 (text-only). Every tiny arch runs here against the stock
transformers model it wraps:

* ``full`` == stock ``generate()`` token for token, logits within 1e-4, at prompts longer than the sliding
  window (and a left-padded batch on the hybrid models); positive controls show that the window and the cap
  change the stock model's outputs at these lengths, so ignoring them would fail;
* sliding layers hold exactly the model's window (positions (cur - W + 1, cur], W - 1 tokens, tensors of W - 1
  slots + the spare) at every step, whatever the policy; global layers hold the policy's budget;
* ``kv_bytes_full`` equals the bytes the stock ``DynamicCache`` really holds (sliding layers capped);
* refusals: unsupported archs in one line with the reason; an evicting policy kept off the layers of an
  all-sliding model (``sliding='window'``); a cache built without the model's windows; image inputs.

A policy on the sliding layers themselves (all-sliding models, ``sliding='policy'`` on hybrid ones) runs in
``tests/test_all_sliding.py``.

Physical == mask, the budget rules and the hand-written naive reference (with the window and the cap) run for
the hybrid archs in ``tests/test_policy_contract.py``.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, LogitsProcessor, LogitsProcessorList

from keyformer import KVCache, generate, make_cache, make_policy
from keyformer.core.models import (
    SUPPORTED_ARCHS,
    TINY_ARCHS,
    TINY_WINDOW,
    layer_windows,
    prepare_model,
    tiny_config,
    tiny_model,
    tiny_stock_model,
)

N, NEW = 36, 10  # prompt > TINY_WINDOW (12)
HYBRID = ("qwen2", "gemma2", "gemma3_text")  # sliding and global layers (gemma3 wraps gemma3_text)
VARIANTS = [(a, {}) for a in TINY_ARCHS] + [("mistral", {"sliding_window": TINY_WINDOW})]  # + all-sliding

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompt(seed: int, n: int = N, b: int = 1) -> torch.Tensor:
    return torch.randint(3, 256, (b, n), generator=torch.Generator().manual_seed(seed))


def _stock_generate(model, ids, mask=None, cache=None):
    mask = torch.ones_like(ids) if mask is None else mask
    kw = {} if cache is None else {"cache": cache}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False,
                         pad_token_id=0, output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, dim=1)


def test_tiny_configs_cover_what_is_supported():
    assert set(TINY_ARCHS) == set(SUPPORTED_ARCHS)
    assert layer_windows(tiny_config("qwen2")) == [None, TINY_WINDOW]
    assert layer_windows(tiny_config("gemma2")) == [TINY_WINDOW, None]
    assert layer_windows(tiny_config("gemma3_text")) == [TINY_WINDOW, None, TINY_WINDOW]
    assert layer_windows(tiny_config("gemma3")) == [TINY_WINDOW, None, TINY_WINDOW]  # its text model's
    assert layer_windows(tiny_config("mistral", sliding_window=TINY_WINDOW)) == [TINY_WINDOW] * 2
    # a window of at least max_position_embeddings never slides (Phi-3.5's 262144): full attention
    assert layer_windows(tiny_config("phi3", sliding_window=4096)) == [None, None]


@pytest.mark.parametrize(("arch", "over"), VARIANTS, ids=[a + ("-sliding" if o else "") for a, o in VARIANTS])
def test_full_equals_stock_generate(arch, over):
    ids = _prompt(1)
    ref_tok, ref_logits = _stock_generate(tiny_stock_model(arch, **over), ids)
    out = generate(tiny_model(arch, **over), ids, None, make_policy("full"), max_new_tokens=NEW,
                   output_logits=True)
    assert torch.equal(out.sequences, ref_tok)
    assert (out.logits - ref_logits).abs().max() < 1e-4


@pytest.mark.parametrize("arch", HYBRID)
def test_full_equals_stock_on_a_left_padded_batch(arch):
    lengths = (20, 40, 31)
    ids, mask = torch.zeros(3, max(lengths), dtype=torch.long), torch.zeros(3, max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, -n:], mask[i, -n:] = _prompt(10 + i, n)[0], 1
    ref_tok, ref_logits = _stock_generate(tiny_stock_model(arch), ids, mask)
    out = generate(tiny_model(arch), ids, mask, make_policy("full"), max_new_tokens=NEW, output_logits=True,
                   pad_token_id=0)
    assert torch.equal(out.sequences, ref_tok)
    assert (out.logits - ref_logits).abs().max() < 1e-4


@pytest.mark.parametrize(("arch", "field"), [("qwen2", "sliding_window"), ("gemma2", "sliding_window"),
                                             ("gemma3_text", "sliding_window"), ("mistral", "sliding_window"),
                                             ("gemma2", "attn_logit_softcapping")])
def test_window_and_cap_change_the_stock_model(arch, field):
    """Positive controls: at these prompt lengths the stock model's own window and logit cap change its
    logits, so an attention that ignored them could not equal it."""
    ids = _prompt(1)
    over = {"sliding_window": TINY_WINDOW} if arch == "mistral" else {}
    with torch.inference_mode():
        a = tiny_stock_model(arch, **over)(ids).logits
        off = {"use_sliding_window": False} if arch == "qwen2" else {field: None}
        if arch in ("gemma2", "gemma3_text") and field == "sliding_window":
            off = {field: 4096}  # Gemma needs a window; one longer than the prompt never slides
        b = tiny_stock_model(arch, **{**over, **off})(ids).logits
    assert (a - b).abs().max() > 1e-3


class _Every(LogitsProcessor):
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, input_ids, scores):
        self.fn(self.calls)
        self.calls += 1
        return scores


@pytest.mark.parametrize("arch", HYBRID)
@pytest.mark.parametrize("policy", ("full", "h2o", "keyformer", "snapkv"))
def test_sliding_layers_hold_exactly_the_window(arch, policy):
    """After every forward (newest position cur) a sliding layer holds positions (cur - W + 1, cur] in
    W - 1 + 1 slots, whatever the policy; a global layer holds the policy's budget (full: everything)."""
    model, ids = tiny_model(arch), _prompt(2)
    pol = make_policy(policy) if policy == "full" else make_policy(policy, budget=0.5)
    cache = make_cache(model, pol, torch.ones_like(ids), max_new_tokens=NEW)
    windows = layer_windows(model.config)
    k = N // 2

    def check(step):
        cur = N - 1 + step
        for li, w in enumerate(windows):
            heads = cache.kept_positions(li)[0]
            if w is not None:
                assert all(h == set(range(cur - w + 2, cur + 1)) for h in heads), (li, step)
                assert cache.layers[li].keys.shape[2] == w  # W - 1 tokens + the spare slot
            elif policy == "full":
                assert all(h == set(range(cur + 1)) for h in heads), (li, step)
            elif pol.schedule.when == "step":
                assert all(len(h) == k for h in heads), (li, step)
            else:  # snapkv: cut once after the prompt, then keeps every generated token
                assert all(len(h) == k + step for h in heads), (li, step)

    every = _Every(check)
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=NEW,
                   do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([every]))
    assert every.calls == NEW


@pytest.mark.parametrize("arch", (*HYBRID, "gemma3"))
def test_kv_bytes_full_is_what_the_stock_cache_holds(arch):
    """``kv_bytes_full`` = the K/V bytes of the stock ``DynamicCache`` (sliding layers capped at W - 1) after
    the same generation; ``kv_bytes`` counts the sliding layers' window too."""
    ids = _prompt(3)
    stock = tiny_stock_model(arch)
    dc = DynamicCache(config=stock.config)
    _stock_generate(stock, ids, cache=dc)
    held = sum(t.numel() * t.element_size() for layer in dc.layers for t in (layer.keys, layer.values))
    out = generate(tiny_model(arch), ids, None, make_policy("full"), max_new_tokens=NEW)
    assert out.kv_bytes_full == [held] and out.kv_bytes == [held]
    h2o = generate(tiny_model(arch), ids, None, make_policy("h2o", budget=0.5), max_new_tokens=NEW)
    assert h2o.kv_bytes_full == [held]
    cfg, windows = stock.config.get_text_config(decoder=True), layer_windows(stock.config)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = 2 * cfg.num_key_value_heads * head_dim * 4  # K + V, fp32, per layer
    assert h2o.kv_bytes == [sum((N // 2 if w is None else w - 1) * per_token for w in windows)]


def test_all_sliding_model_refuses_a_policy_kept_off_its_layers():
    """Every layer slides and ``sliding='window'`` keeps the policy off them: it would act on no layer, so it
    is refused in one line (the default, ``auto``, compresses them: ``tests/test_all_sliding.py``)."""
    model, ids = tiny_model("mistral", sliding_window=TINY_WINDOW), _prompt(4)
    why = "every layer of this model slides.*act on no layer.*sliding=auto"
    with pytest.raises(ValueError, match=why) as e:
        generate(model, ids, None, make_policy("h2o", budget=0.5, sliding="window"), max_new_tokens=2)
    assert "\n" not in str(e.value)
    full = make_policy("full", sliding="window")
    assert generate(model, ids, None, full, max_new_tokens=2).sequences.shape == (1, 2)


def test_cache_without_the_models_windows_is_refused():
    model, ids = tiny_model("gemma3_text"), _prompt(5)
    cache = KVCache(make_policy("full"), model.config.num_hidden_layers)  # built by hand, no windows
    with pytest.raises(RuntimeError, match="window 12 but its cache layer has window None"):
        model(input_ids=ids, cache=cache)


@pytest.mark.parametrize(("config", "reason"), [
    ("GemmaConfig", "Gemma 1 is untested"),
    ("OlmoConfig", "goes through AttentionInterface, but no test runs it"),
    ("Gemma3TextConfig:bidirectional", "encoder, not a causal LM"),
])
def test_unsupported_archs_are_refused_with_the_reason(config, reason):
    import transformers

    name, _, flag = config.partition(":")
    kw = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1)
    if name.startswith("Gemma"):
        kw["head_dim"] = 16
    if flag:
        kw["use_bidirectional_attention"] = True
    model = AutoModelForCausalLM.from_config(getattr(transformers, name)(**kw))
    with pytest.raises(ValueError, match=reason) as err:
        prepare_model(model)
    assert "\n" not in str(err.value) and "supported:" in str(err.value)


def test_every_tiny_arch_has_a_model_config():
    """``conf/model/tiny_<arch>.yaml`` for every tiny arch, and the config validation knows them all."""
    from keyformer.run.paths import CONF_DIR
    from keyformer.run.validate import TINY_ARCHS as VALID_TINY

    assert set(VALID_TINY) == set(TINY_ARCHS)
    for arch in TINY_ARCHS:
        assert (CONF_DIR / "model" / f"tiny_{arch}.yaml").is_file(), arch


@pytest.mark.parametrize("arch", HYBRID)
def test_prepared_model_with_an_ordinary_cache_is_the_stock_model(arch):
    """``prepare_model`` changes nothing outside our cache: with the stock ``DynamicCache`` the prepared
    model generates what the stock one does (windows from the model's masks; Gemma 2's cap in the eager
    fallback)."""
    ids = _prompt(6)
    ref_tok, ref_logits = _stock_generate(tiny_stock_model(arch), ids)
    tok, logits = _stock_generate(tiny_model(arch), ids)
    assert torch.equal(tok, ref_tok) and (logits - ref_logits).abs().max() < 1e-4


@pytest.mark.parametrize("arch", ("qwen2", "gemma3_text"))
def test_full_equals_stock_beam_search(arch):
    ids = _prompt(7)
    ref = tiny_stock_model(arch).generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          max_new_tokens=NEW, num_beams=3, do_sample=False, pad_token_id=0)
    out = generate(tiny_model(arch), ids, None, make_policy("full"), max_new_tokens=NEW, num_beams=3,
                   pad_token_id=0)
    assert torch.equal(out.sequences, ref[:, ids.shape[1]:])


def test_image_inputs_are_refused():
    model, ids = tiny_model("gemma3"), _prompt(8)
    with pytest.raises(ValueError, match="pixel_values: image inputs are not supported"):
        generate(model, ids, None, make_policy("full"), max_new_tokens=2,
                 pixel_values=torch.zeros(1, 3, 28, 28))


@pytest.mark.parametrize("policy", ("h2o", "keyformer"))
def test_multimodal_gemma3_physical_equals_mask(policy):
    """The multimodal wrapper runs the same text layers: physical eviction == the mask simulation there."""
    model, ids, pol = tiny_model("gemma3"), _prompt(9), make_policy(policy, budget=0.5)
    phys = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=3)
    sim = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=3, mode="mask")
    assert torch.equal(phys.sequences, sim.sequences) and (phys.logits - sim.logits).abs().max() < 1e-4
    assert all(phys.cache.kept_positions(li) == sim.cache.kept_positions(li) for li in range(3))


def test_kv_quant_on_a_hybrid_model():
    """Quantized K/V (int8 codes) compose with sliding layers: physical == mask, the windows hold."""
    pytest.importorskip("hqq")
    from keyformer.core.quant import KVQuant

    model, ids, q = tiny_model("gemma3_text"), _prompt(10), KVQuant(bits=8, group_size=16)
    pol = make_policy("h2o", budget=0.5)
    phys = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, kv_quant=q)
    sim = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, kv_quant=q, mode="mask")
    assert torch.equal(phys.sequences, sim.sequences) and (phys.logits - sim.logits).abs().max() < 1e-4
    cur = N + NEW - 2  # the newest cached position (the last token is generated, not fed)
    for li, w in enumerate(layer_windows(model.config)):
        held = phys.cache.kept_positions(li)[0]
        assert all(h == (set(range(cur - w + 2, cur + 1)) if w else h) for h in held)
        assert all(len(h) == (w - 1 if w else N // 2) for h in held)


def test_a_budget_below_the_window_leaves_the_sliding_layers_whole():
    """k = 7 < W - 1 = 11: the global layer holds 7, the sliding layers still their 11 newest (documented
    choice: a policy never compresses a sliding layer below its window); physical == mask."""
    model, ids, pol = tiny_model("gemma3_text"), _prompt(11), make_policy("h2o", budget=0.2)
    phys = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True)
    sim = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, mode="mask")
    assert torch.equal(phys.sequences, sim.sequences) and (phys.logits - sim.logits).abs().max() < 1e-4
    held = [[len(h) for h in phys.cache.kept_positions(li)[0]] for li in range(3)]
    assert held == [[TINY_WINDOW - 1] * 2, [int(N * 0.2)] * 2, [TINY_WINDOW - 1] * 2]


def test_pyramidkv_spreads_its_budget_over_the_global_layers_only():
    """PyramidKV on a hybrid model: depth is the rank among the full-attention layers (the sliding ones keep
    their window), so the three global layers of a 6-layer 1:1 model hold max, mean and min of the pyramid
    (KVCache-Factory's rule over 3 layers, written out here) and their mean is the budget k, as for every
    other policy; physical == mask."""
    types = ["sliding_attention", "full_attention"] * 3
    model = tiny_model("gemma3_text", num_hidden_layers=6, layer_types=types)
    ids, (beta, ws) = _prompt(12), (4, 4)
    pol = make_policy("pyramidkv", budget=0.5, window_size=ws, beta=beta)
    phys = generate(model, ids, None, pol, max_new_tokens=NEW)
    sim = generate(model, ids, None, pol, max_new_tokens=NEW, mode="mask")
    assert torch.equal(phys.sequences, sim.sequences)
    k = int(N * 0.5)  # 18: 14 outside the window, min 3.5, max 24.5 (below n - w, so no cap)
    kk = k - ws
    lo, hi = kk / beta, 2 * kk - kk / beta
    want = [ws + round(hi), ws + round((hi + lo) / 2), ws + round(lo)]  # ranks 0, 1, 2 of 3
    held = [len(phys.cache.kept_positions(li)[0][0]) for li in range(6)]
    # the prompt cut, then every generated token kept (SnapKV family): NEW - 1 tokens added after the cut
    assert [held[i] - (NEW - 1) for i in (1, 3, 5)] == want
    assert abs(sum(want) - 3 * k) <= 1  # the pyramid's mean is k, up to rounding
    assert [held[i] for i in (0, 2, 4)] == [TINY_WINDOW - 1] * 3
