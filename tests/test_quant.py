"""KV quantization (keyformer/core/quant.py): the quantizer, its storage in the evicting cache, composability
with every policy, and the bytes it reports."""

from __future__ import annotations

import pytest
import torch

from keyformer import generate, make_policy, tiny_model
from keyformer.core.policies import POLICIES
from keyformer.core.quant import KVQuant, kv_quant_from

pytest.importorskip("hqq")
pytestmark = pytest.mark.usefixtures("one_thread")


def test_quantizer_by_hand():
    """Min-max per group: [0, 1, 2, 3] in 8 bits is codes 0, 85, 170, 255, scale 3/255, zero 0."""
    x = torch.tensor([[0.0, 1.0, 2.0, 3.0, -1.0, -1.0, 1.0, 1.0]])
    codes, scale, zero = KVQuant(8, 4).quantize(x)
    assert codes.tolist() == [[0, 85, 170, 255, 0, 0, 255, 255]]
    assert torch.allclose(scale.float(), torch.tensor([[3 / 255, 2 / 255]]), rtol=1e-3)
    assert torch.allclose(KVQuant(8, 4).dequantize(codes, scale, zero, torch.float32), x, atol=2e-3)
    c4, s4, z4 = KVQuant(4, 4).quantize(x)  # 15 levels, two codes a byte: low nibble first
    assert c4.shape == (1, 4) and c4[0, 0].item() == 0 | (5 << 4) and c4[0, 1].item() == 10 | (15 << 4)


@pytest.mark.parametrize("bits", [8, 4])
def test_round_trip_error_is_half_a_step(bits):
    x = torch.randn(3, 2, 7, 64, generator=torch.Generator().manual_seed(0))
    q = KVQuant(bits, 16)
    y = q.dequantize(*q.quantize(x), dtype=torch.float32)
    g = x.view(3, 2, 7, 4, 16)
    step = ((g.amax(-1) - g.amin(-1)) / (2**bits - 1)).repeat_interleave(16, -1).view_as(x)
    assert ((y - x).abs() <= step / 2 + 2e-3 * x.abs().amax()).all()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_composes_physical_equals_mask(name):
    """Quantized rows move with eviction exactly as full-precision ones: physical == mask simulation."""
    model = tiny_model("llama", seed=0)
    ids = torch.randint(3, 256, (2, 40), generator=torch.Generator().manual_seed(2))
    pol = make_policy(name) if not POLICIES[name].evicts else make_policy(name, budget=0.5)
    qz = KVQuant(4, 8)
    outs = [generate(model, ids, None, pol, max_new_tokens=6, seed=3, mode=m, kv_quant=qz, output_logits=True)
            for m in ("physical", "mask")]
    assert torch.equal(outs[0].sequences, outs[1].sequences)
    assert [outs[0].cache.kept_positions(li) for li in range(2)] == [outs[1].cache.kept_positions(li)
                                                                     for li in range(2)]
    assert (outs[0].logits - outs[1].logits).abs().max() < 1e-4


@pytest.mark.parametrize("bits", [8, 4])
def test_bytes_held_are_the_codes_scales_and_zeros(bits):
    model = tiny_model("llama", seed=0)
    cfg = model.config
    ids = torch.randint(3, 256, (1, 40), generator=torch.Generator().manual_seed(4))
    qz, pol = KVQuant(bits, 8), make_policy("h2o", budget=0.5)
    out = generate(model, ids, None, pol, max_new_tokens=5, seed=0, kv_quant=qz)
    d = cfg.hidden_size // cfg.num_attention_heads
    per_head = 2 * (d * bits // 8 + 2 * 2 * d // 8)  # K and V: codes + fp16 scale and zero per group of 8
    held = sum(len(h) for li in range(cfg.num_hidden_layers) for h in out.cache.kept_positions(li)[0])
    assert out.kv_bytes == [held * per_head]
    assert out.kv_tensor_bytes == cfg.num_hidden_layers * cfg.num_key_value_heads * (held // (
        cfg.num_hidden_layers * cfg.num_key_value_heads) + 1) * per_head  # the budget + one spare slot
    fp = generate(model, ids, None, pol, max_new_tokens=5, seed=0)
    assert out.kv_bytes_full == fp.kv_bytes_full  # the reference stays the unquantized full cache


def test_prompt_is_exact_and_int8_is_closer_than_int4():
    """The prompt forward attends in full precision (first token's logits exact); later steps read quantized
    rows back, int8 closer to full precision than int4."""
    model = tiny_model("llama", seed=0)
    ids = torch.randint(3, 256, (1, 48), generator=torch.Generator().manual_seed(5))
    ref = generate(model, ids, None, None, max_new_tokens=6, output_logits=True)
    err = {}
    for bits in (8, 4):
        out = (generate(model, ids, None, None, max_new_tokens=6, output_logits=True,
                        kv_quant=KVQuant(bits, 8)))
        assert torch.equal(out.logits[:, 0], ref.logits[:, 0])
        err[bits] = (out.logits[:, 1:] - ref.logits[:, 1:]).abs().max().item()
    assert 0 < err[8] < err[4]


def test_config_errors_name_the_value_and_choices():
    with pytest.raises(ValueError, match=r"bits=3 .*valid: 8, 4"):
        KVQuant(3, 32)
    with pytest.raises(ValueError, match="group_size"):
        KVQuant(8, 3)
    with pytest.raises(ValueError, match=r"no option\(s\) \['nbits'\]"):
        kv_quant_from({"nbits": 4})
    assert kv_quant_from(None) is None and kv_quant_from({"bits": 4}) == KVQuant(4, 32)
    with pytest.raises(ValueError, match="divisor of 16"):
        generate(tiny_model("llama"), torch.ones(1, 8, dtype=torch.long), None, None, max_new_tokens=2,
                 kv_quant=KVQuant(8, 32))
