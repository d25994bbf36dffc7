"""Architecture support: install our attention in a transformers model, and tiny random test models.

Supported: Llama-family (``llama``, ``mistral``, ``qwen2``, ``qwen3``; RoPE, GQA), GPT-J (partial RoPE),
GPT-2 / Cerebras-GPT (learned absolute positions) and MPT (ALiBi; eager-only in transformers, so its
attention forward is replaced on the instance). After :func:`prepare_model` the model behaves exactly as
before with any ordinary cache; our path runs only with a :class:`keyformer.core.cache.KVCache`.
"""

from __future__ import annotations

import math
import types

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention import attend, keyformer_attention
from .cache import KVCache

ATTN_IMPL = "keyformer"
INTERFACE_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gptj", "gpt2")
SUPPORTED_ARCHS = (*INTERFACE_ARCHS, "mpt")

AttentionInterface.register(ATTN_IMPL, keyformer_attention)
AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


def prepare_model(model: PreTrainedModel) -> PreTrainedModel:
    """Install the evicting-cache attention; raise ``ValueError`` for unsupported architectures."""
    arch = model.config.model_type
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"model_type={arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}")
    model.config.use_cache = True  # MptConfig defaults to False, which silently disables the cache
    if arch == "mpt":
        for block in model.transformer.blocks:
            attn = block.attn
            if not hasattr(attn, "_kf_slopes"):
                attn._kf_slopes = mpt_alibi_slopes(attn.n_heads, model.config.attn_config.alibi_bias_max)
                attn._kf_orig_forward = attn.forward
                attn.forward = types.MethodType(_mpt_attention_forward, attn)
    else:
        model.set_attn_implementation(ATTN_IMPL)
    return model


def mpt_alibi_slopes(n_heads: int, alibi_bias_max: float = 8) -> torch.Tensor:
    """ALiBi slopes exactly as ``transformers``' ``build_mpt_alibi_tensor``: [H]."""
    n2 = 2 ** math.ceil(math.log2(n_heads))
    base = torch.arange(1, n2 + 1, dtype=torch.int64).float() * (alibi_bias_max / n2)
    slopes = 1.0 / torch.pow(2, base)
    if n2 != n_heads:
        slopes = torch.concat([slopes[1::2], slopes[::2]])[:n_heads]
    return slopes


def _mpt_attention_forward(self, hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
    """MptAttention.forward with ALiBi at original positions over an evicting cache."""
    if not isinstance(cache, KVCache):
        return self._kf_orig_forward(hidden_states, position_bias, cache=cache, attention_mask=attention_mask,
                                     **kwargs)
    B, q = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (t.reshape(B, q, self.n_heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=2))
    key, value = cache.update(key, value, self.layer_idx)
    out = attend(self, key._kf_layer, query, key, value, scaling=self.softmax_scale,
                 slopes=self._kf_slopes.to(query.device))
    return self.out_proj(out.reshape(B, q, -1)), None


def tiny_config(arch: str, vocab_size: int = 256):
    """Small random configs (2 layers) for tests and smoke runs; ``llama`` has GQA (4 query / 2 KV heads)."""
    from transformers import GPT2Config, GPTJConfig, LlamaConfig, MptConfig

    if arch == "gptj":
        return GPTJConfig(vocab_size=vocab_size, n_positions=2048, n_embd=64, n_layer=2, n_head=4, rotary_dim=8)
    if arch == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_positions=2048, n_embd=64, n_layer=2, n_head=4)
    if arch == "mpt":
        return MptConfig(vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=2048, use_cache=True)
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    raise ValueError(f"tiny arch={arch!r} is unknown; valid: gptj, gpt2, mpt, llama")


TINY_ARCHS = ("gptj", "gpt2", "mpt", "llama")


def tiny_model(arch: str, vocab_size: int = 256, seed: int = 0, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """A tiny random-initialised model of ``arch``, prepared for our caches, in eval mode."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, vocab_size)
    torch.manual_seed(seed)
    impl = "eager" if arch == "mpt" else attn_implementation
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
    return prepare_model(model)
