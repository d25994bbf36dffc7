"""Architecture support: install our attention in a transformers model, and tiny random test models.

Supported (each has a tiny random config below, and every one of them runs the policy contract tests and the
stock-``generate()`` comparison in ``tests/test_archs.py``; see ``docs/models.md``):

* through transformers' ``AttentionInterface`` (standard per-layer K/V): ``llama``, ``mistral``, ``qwen2``,
  ``qwen3`` (QK-norm), ``phi3``, ``gemma2`` (logit soft-capping, alternating sliding/global layers),
  ``gemma3_text`` (hybrid 5:1 sliding/global, QK-norm, ``query_pre_attn_scalar``), ``gemma3`` (the
  multimodal Gemma 3, text-only prompts: image inputs are refused by :func:`keyformer.generate`), GPT-J
  (partial RoPE) and
  GPT-2 / Cerebras-GPT (learned absolute positions);
* MPT (ALiBi; eager-only in transformers, so its attention forward is replaced on the instance).

**Sliding layers** (``config.layer_types`` / ``config.sliding_window``, read exactly as the stock
``DynamicCache`` reads them, :func:`layer_windows`) never hold a token older than the model's window. On a
hybrid model they keep exactly that window, as the stock cache does, and an eviction policy acts on the
full-attention (global) layers; on a model whose every layer slides, or with the policy's
``sliding='policy'``, the policy compresses the sliding layers too, within their window (``docs/models.md``).

Everything else is refused by :func:`prepare_model` in one line that says why. After :func:`prepare_model` the
model behaves exactly as before with any ordinary cache; our path runs only with a
:class:`keyformer.core.cache.KVCache`.
"""

from __future__ import annotations

import math
import types

import torch
from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .attention import attend, keyformer_attention
from .cache import KVCache

ATTN_IMPL = "keyformer"
INTERFACE_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "gemma3", "gptj",
                   "gpt2")
SUPPORTED_ARCHS = (*INTERFACE_ARCHS, "mpt")
LAYER_TYPES = ("full_attention", "sliding_attention")  # the per-layer K/V kinds our cache models

# Architectures we know and refuse, with the reason (anything else unlisted is refused as untested).
REFUSED = {
    "gemma": "Gemma 1 is untested here (its attention goes through AttentionInterface, but no test runs it)",
    "llama4": "Llama 4 has chunked-attention layers, which the evicting cache does not model",
    "gemma3n": "Gemma 3n shares K/V across layers, which the evicting cache does not model",
    "gemma4": "Gemma 4 shares K/V across layers, which the evicting cache does not model",
    "qwen3_next": "Qwen3-Next has linear-attention layers with recurrent state, not a per-layer K/V",
    "cohere2": "Cohere 2 is untested here (hybrid layers without RoPE on the global ones)",
}

AttentionInterface.register(ATTN_IMPL, keyformer_attention)
AttentionMaskInterface.register(ATTN_IMPL, sdpa_mask)


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why ``model`` cannot run on the evicting cache (one line), or None when it is supported."""
    cfg = model.config
    arch = cfg.model_type
    supported = f"supported: {', '.join(SUPPORTED_ARCHS)}"
    if arch in SUPPORTED_ARCHS:
        if getattr(cfg.get_text_config(decoder=True), "use_bidirectional_attention", False):
            return (f"model_type={arch!r} with use_bidirectional_attention=True is an encoder, not a causal "
                    f"LM; {supported}")
        try:
            layer_windows(cfg)
        except ValueError as e:
            return str(e)
        return None
    if arch in REFUSED:
        return f"model_type={arch!r} is not supported: {REFUSED[arch]}; {supported}"
    if not type(model)._can_set_attn_implementation():
        return (f"model_type={arch!r} is not supported: its attention does not go through transformers' "
                f"AttentionInterface; {supported}")
    return (f"model_type={arch!r} is not supported: its attention goes through AttentionInterface, but no "
            f"test runs it (add a tiny config in keyformer/core/models.py and tests first); {supported}")


def layer_windows(config: PreTrainedConfig) -> list[int | None]:
    """Per decoder layer: the sliding window ``W`` of a sliding layer (a query at position i attends to keys
    in (i - W, i]), or None for a full-attention layer. Read as the stock ``DynamicCache`` reads it
    (``config.layer_types``, else ``sliding_window`` on every layer). A window of at least
    ``max_position_embeddings`` never slides within the model's context and counts as full (Phi-3.5's
    262144)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    cfg = config.get_text_config(decoder=True)
    types_, kwargs = get_layer_types_and_kwargs(cfg)
    types_, kwargs = list(types_)[: cfg.num_hidden_layers], list(kwargs)[: cfg.num_hidden_layers]
    bad = sorted({t for t in types_ if t not in LAYER_TYPES})
    if bad:
        raise ValueError(f"model_type={cfg.model_type!r} is not supported: layer types {bad} are not a "
                         f"standard per-layer K/V (supported layer types: {', '.join(LAYER_TYPES)})")
    limit = getattr(cfg, "max_position_embeddings", None)
    out: list[int | None] = []
    for t, kw in zip(types_, kwargs, strict=True):
        w = kw.get("sliding_window") if t == "sliding_attention" else None
        if w is not None:
            if int(w) < 1:
                raise ValueError(f"sliding_window={w!r} must be an int >= 1")
            w = None if limit is not None and int(w) >= int(limit) else int(w)
        out.append(w)
    return out


def prepare_model(model: PreTrainedModel) -> PreTrainedModel:
    """Install the evicting-cache attention; raise ``ValueError`` (one line, with the reason) for unsupported
    architectures."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(reason)
    arch = model.config.model_type
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
        if model.config._attn_implementation != ATTN_IMPL:
            raise ValueError(f"model_type={arch!r}: transformers refused attn_implementation={ATTN_IMPL!r}")
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
        out = self._kf_orig_forward(hidden_states, position_bias, cache=cache, attention_mask=attention_mask,
                                    **kwargs)
        record = getattr(cache, "_kf_record", None)  # a KVzip reconstruction forward: its recorder reads
        if record is not None:  # the probabilities (keyformer.core.policies.kvzip.Recorder)
            record.probs(self.layer_idx, out[1])
        return out
    B, q = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (t.reshape(B, q, self.n_heads, self.head_dim).transpose(1, 2)
                         for t in qkv.chunk(3, dim=2))
    key, value = cache.update(key, value, self.layer_idx)
    out = attend(self, key._kf_layer, query, key, value, scaling=self.softmax_scale,
                 slopes=self._kf_slopes.to(query.device))
    return self.out_proj(out.reshape(B, q, -1)), None


TINY_ARCHS = ("gptj", "gpt2", "mpt", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text",
              "gemma3")
TINY_WINDOW = 12  # sliding window of the tiny hybrid models: test prompts (>= 26 tokens) exceed it


def tiny_config(arch: str, vocab_size: int = 256, **overrides):
    """Small random configs (2 layers, 64 hidden; 3 for ``gemma3_text``) for tests and smoke runs.

    ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``phi3`` and the Gemmas have GQA (4 query / 2 KV heads).
    Sliding layers (window :data:`TINY_WINDOW`): ``qwen2`` layer 1, ``gemma2`` layer 0 (alternating),
    ``gemma3_text`` layers 0 and 2 (global layer 1). ``mistral`` and ``phi3`` have no window by default (as
    Mistral v0.2+ and Phi-3.5); ``gemma3`` is the multimodal model around the ``gemma3_text`` config (a
    1-layer SigLIP vision tower). ``overrides`` (config fields, e.g. ``sliding_window=12``) change any field
    (of the text config for ``gemma3``).
    ``gemma2`` caps its attention logits at 2.0 (real: 50) so that the cap acts on a random model.
    """
    from transformers import (
        Gemma2Config,
        Gemma3Config,
        Gemma3TextConfig,
        GPT2Config,
        GPTJConfig,
        LlamaConfig,
        MistralConfig,
        MptConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    gqa = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    if arch == "gptj":
        cfg = dict(vocab_size=vocab_size, n_positions=2048, n_embd=64, n_layer=2, n_head=4, rotary_dim=8)
        cls = GPTJConfig
    elif arch == "gpt2":
        cfg, cls = dict(vocab_size=vocab_size, n_positions=2048, n_embd=64, n_layer=2, n_head=4), GPT2Config
    elif arch == "mpt":
        cfg = dict(vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, max_seq_len=2048, use_cache=True)
        cls = MptConfig
    elif arch == "llama":
        cfg, cls = gqa, LlamaConfig
    elif arch == "mistral":
        cfg, cls = dict(gqa, sliding_window=None), MistralConfig
    elif arch == "qwen2":
        cfg = dict(gqa, use_sliding_window=True, sliding_window=TINY_WINDOW, max_window_layers=1)
        cls = Qwen2Config
    elif arch == "qwen3":
        cfg, cls = dict(gqa, head_dim=16), Qwen3Config
    elif arch == "phi3":
        cfg = dict(gqa, sliding_window=None, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        cls = Phi3Config
    elif arch == "gemma2":
        cfg = dict(gqa, head_dim=16, query_pre_attn_scalar=24, sliding_window=TINY_WINDOW,
                   attn_logit_softcapping=2.0, final_logit_softcapping=30.0)
        cls = Gemma2Config
    elif arch == "gemma3_text":
        cfg = dict(gqa, num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=24,
                   sliding_window=TINY_WINDOW,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"])
        cls = Gemma3TextConfig
    elif arch == "gemma3":
        text = tiny_config("gemma3_text", vocab_size, **overrides).to_dict()
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14)
        return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    else:
        raise ValueError(f"tiny arch={arch!r} is unknown; valid: {', '.join(TINY_ARCHS)}")
    return cls(**{**cfg, **overrides})


GEMMA2_QK_GAIN = 8.0  # tiny gemma2: query/key projections scaled so that its logits reach the cap (2.0)


def tiny_stock_model(arch: str, vocab_size: int = 256, seed: int = 0, attn_implementation: str = "sdpa",
                     **overrides) -> PreTrainedModel:
    """The tiny random model of ``arch`` (config :func:`tiny_config`) as transformers builds it, *not*
    prepared (the stock reference of the tests), in eval mode. MPT and Gemma 2 (no SDPA in transformers) are
    built eager; Gemma 2's query/key projections are scaled by :data:`GEMMA2_QK_GAIN` (the random init's
    logits are ~0.01, far below any cap), so that soft-capping changes its outputs."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, vocab_size, **overrides)
    torch.manual_seed(seed)
    impl = "eager" if arch in ("mpt", "gemma2") else attn_implementation
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).eval()
    if arch == "gemma2":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(GEMMA2_QK_GAIN)
                layer.self_attn.k_proj.weight.mul_(GEMMA2_QK_GAIN)
    return model


def tiny_model(arch: str, vocab_size: int = 256, seed: int = 0, attn_implementation: str = "sdpa",
               **overrides) -> PreTrainedModel:
    """:func:`tiny_stock_model`, prepared for our caches."""
    return prepare_model(tiny_stock_model(arch, vocab_size, seed, attn_implementation, **overrides))
