"""KVzip in the kvpress cross-check (``kvpress_crosscheck.py``): the methods, and the
kvpress-side recorder.

kvpress's ``KVzipPress`` overrides the press call: the context manager's forward wrapper stores the prompt ids
and the cache, and only on leaving the ``with`` block does it run the reconstruction forward (hooks on every
attention layer score the prompt) and ``compress_post``, which cuts nothing but leaves on every attention
module ``masked_key_indices = (batch, head, position)``, the pruned pairs; kvpress's attention patch then
hides those keys at every later decoding step. So the recorder prefills the prompt inside the ``with`` block
(``model.model``, as kvpress's pipeline does), reads the kept set of every (layer, KV head) as the complement
of ``masked_key_indices`` once the block is left, then decodes greedily with the masked cache as kvpress's
pipeline does (``generate_answer``), with the end-of-sequence token suppressed as ``min_new_tokens`` does on
the other rows. (Inside the ``with`` block ``model.generate`` cannot be used: the wrapper would record the
last decoding step's ids as the context.)

Settings, so that both sides implement the same rule as far as they can: ``layerwise=True`` (ours has
per-layer budgets), ``n_sink=4``, prompts well inside one 2048-token chunk, and kvpress's repeat instruction,
which ours reproduces with ``repeat_ids: auto``. What stays different is kvpress's handling of the chat
template's prefix (the tokens before the user content): kvpress repeats and scores only the tokens after it,
leaves the prefix out of the reconstruction softmax (but for its first ``n_sink`` tokens) and gives it score
0, so it is pruned first; ours repeats and scores the whole prompt. The diagnostics change kvpress in that
respect (``[kv: whole prompt scored]``, the prefix length set to 0) and then also in the kept count (``...,
floor count]``: each layer keeps ``H * floor(n * budget)`` pairs, ours, instead of ``H n - int(H n (1 -
budget))``).

Importing this module needs only the standard library; :func:`variant_presses` and :func:`run_kvzip` import
torch and kvpress (the kvpress venv).
"""

from __future__ import annotations

from typing import Any

KVZIP_KW = {"layerwise": True, "n_sink": 4}
OURS_KW = {"n_sink": 4, "repeat_ids": "auto", "prefill_only": True}

# "kvzip": the press is run by run_kvzip (its kept sets are read from masked_key_indices, not from compress)
METHODS: list[dict[str, Any]] = [
    {"name": "KVzip", "press": {"cls": "KVzipPress", "kw": KVZIP_KW, "kvzip": True},
     "policy": "kvzip", "policy_kw": OURS_KW},
]
DIAGNOSTICS: list[dict[str, Any]] = [
    {"name": "KVzip [kv: whole prompt scored]",
     "press": {"cls": "KVzipWholePrompt", "kw": KVZIP_KW, "kvzip": True},
     "policy": "kvzip", "policy_kw": OURS_KW},
    {"name": "KVzip [kv: whole prompt, floor count]",
     "press": {"cls": "KVzipWholePromptFloor", "kw": KVZIP_KW, "kvzip": True},
     "policy": "kvzip", "policy_kw": OURS_KW},
]


def kept_from_masked(batch: list[int], head: list[int], pos: list[int], heads: int,
                     n: int) -> list[list[int]]:
    """Per KV head, the kept positions of batch row 0 of an ``n``-token prompt: the complement of kvpress's
    ``masked_key_indices`` (given as three lists)."""
    gone: list[set[int]] = [set() for _ in range(heads)]
    for b, h, p in zip(batch, head, pos, strict=True):
        if b == 0:
            gone[h].add(p)
    return [[p for p in range(n) if p not in g] for g in gone]


def floor_count_ratio(n: int, heads: int, ratio: float) -> float:
    """A compression ratio ``r`` with ``int(heads * n * r) == heads * (n - floor(n * (1 - ratio)))``:
    kvpress's layerwise KVzip then keeps ``heads * floor(n * budget)`` pairs per layer (ours) instead of
    ``heads * n - int(heads * n * ratio)`` (ratio = 1 - budget; ``1e-9`` absorbs the float error of
    ``1 - budget``)."""
    keep = int(n * (1 - ratio) + 1e-9)
    return (heads * (n - keep) + 0.5) / (heads * n)


def variant_presses() -> dict[str, Any]:
    """The diagnostic KVzip presses (kvpress is imported here)."""
    from kvpress import KVzipPress

    class KVzipWholePrompt(KVzipPress):
        """KVzip with the chat-template prefix length set to 0: the whole prompt is repeated, scored and in
        the reconstruction softmax (ours), instead of the tokens after the prefix (kvpress)."""

        def prepare(self, model, tokenizer, prev_postfix_size=8):  # type: ignore[no-untyped-def]
            self.prefix_length = 0
            return super().prepare(model, tokenizer, prev_postfix_size)

    class KVzipWholePromptFloor(KVzipWholePrompt):
        """KVzipWholePrompt keeping ``H * floor(n * budget)`` pairs per layer (ours; layerwise only)."""

        def compress_post(self, model):  # type: ignore[no-untyped-def]
            saved = self.compression_ratio
            _, _, heads, n = self.score_val.shape
            self.compression_ratio = floor_count_ratio(n, heads, saved)
            try:
                return super().compress_post(model)
            finally:
                self.compression_ratio = saved

    return {"KVzipWholePrompt": KVzipWholePrompt, "KVzipWholePromptFloor": KVzipWholePromptFloor}


def run_kvzip(model: Any, press: Any, ids: list[int], n_new: int) -> dict[str, Any]:
    """kvpress's KVzip on one prompt: ``{"tokens": n_new greedy ids, "kept": [layer][head] kept
    positions}``."""
    import torch
    from transformers import DynamicCache

    x = torch.tensor([ids])
    n = x.shape[1]
    cache = DynamicCache()
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    with torch.inference_mode():
        with press(model):
            hidden = model.model(input_ids=x, past_key_values=cache).last_hidden_state
        if cache.get_seq_length() != n:
            raise RuntimeError(f"KVzip left {cache.get_seq_length()} cached tokens, expected {n}")
        kept = []
        for layer in model.model.layers:
            masked = getattr(layer.self_attn, "masked_key_indices", None)
            if masked is None:
                raise RuntimeError(f"layer {layer.self_attn.layer_idx}: KVzip left no masked_key_indices")
            b, h, p = (t.tolist() for t in masked)
            kept.append(kept_from_masked(b, h, p, model.config.num_key_value_heads, n))
        logits = model.lm_head(hidden[:, -1:])
        tokens: list[int] = []
        for i in range(n_new):
            if i:
                pos = torch.tensor([[n + i - 1]])
                logits = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache,
                               position_ids=pos).logits
            step = logits[0, -1].float().clone()
            step[eos] = float("-inf")  # min_new_tokens = n_new, as on the other rows
            tokens.append(int(step.argmax()))
        for layer in model.model.layers:  # the next press starts clean
            layer.self_attn.masked_key_indices = None
    return {"tokens": tokens, "kept": kept}
