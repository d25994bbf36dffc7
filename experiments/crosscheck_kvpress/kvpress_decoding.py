"""The decode-time row of the kvpress cross-check (``kvpress_crosscheck.py``): ``wrap=[every]`` over Knorm
against kvpress's ``DecodingPress`` over KnormPress.

``DecodingPress`` cuts only while decoding: at every ``compression_interval``-th decode forward of a layer it
cuts the whole cache (prompt and generated tokens) to ``target_size`` tokens with its scorer. Ours cuts after
the prompt, then at every ``cut_every``-th decode forward (``keyformer.core.policies.wrappers.schedule``).
The row sets ``target_size`` to ours, ``floor(n * budget)`` of the prompt's ``n`` (``DecodingRecorded``), and
compares the kept positions at the end of generation, generated tokens included: the last cut's set plus the
tokens appended after it. Knorm scores a token by its own key, so cutting the prompt first changes no later
cut's set (the best ``k`` of a superset hold the best ``k`` of the part), and the sets test the schedule: a
cut one step early or late keeps other tokens. The greedy outputs differ where ours, having cut the prompt,
decodes the first steps from fewer tokens; ``[kv: the prompt cut too]`` runs kvpress's
``PrefillDecodingPress`` with the same scorer at the prompt (floor count), so both sides then decode from
the same caches. Where two keys' norms tie (a repeated token in layer 0, where RoPE leaves the norm
alone), ours keeps the more recent, ``topk`` either; one tie kept differently changes what the next steps
attend to, and can change the outputs. ``[kv: the prompt cut too, ties keep the most recent]`` ranks Knorm's
ties as ours (``KnormRecentTies``, which also keeps its cache in position order: kvpress's stays in score
order after a cut, where a slot's index no longer says how recent its token is): then both sides should keep
the same tokens at every cut.

kvpress's cache does not say which position a slot holds. The recorder (:func:`record_positions`) follows
them: at each ``compress`` call it finds each kept key among the inputs and maps it through the positions of
the layer's previous cut plus those appended since (:func:`cache_positions`).

Importing this module needs only the standard library; :func:`variant_presses` imports kvpress.
"""

from __future__ import annotations

from typing import Any

KNORM = {"cls": "KnormPress", "kw": {}}
EVERY = 8  # decode forwards between cuts: 3 cuts in the 31 decode forwards of 32 new tokens
DECODE = {"recent": 0.0, "cut_every": EVERY}

METHODS: list[dict[str, Any]] = [
    {"name": "Decoding-Knorm",
     "press": {"cls": "DecodingRecorded", "kw": {"compression_interval": EVERY}, "inner": KNORM,
               "inner_arg": "base_press", "decode": True},
     "policy": "knorm+every", "policy_kw": DECODE},
]
DIAGNOSTICS: list[dict[str, Any]] = [
    {"name": "Decoding-Knorm [kv: the prompt cut too]",
     "press": {"cls": "PrefillDecodingRecorded", "kw": {"compression_interval": EVERY},
               "inner": {**KNORM, "exact_count": True}, "inner_arg": "base_press", "decode": True},
     "policy": "knorm+every", "policy_kw": DECODE},
    {"name": "Decoding-Knorm [kv: the prompt cut too, ties keep the most recent]",
     "press": {"cls": "PrefillDecodingRecorded", "kw": {"compression_interval": EVERY},
               "inner": {"cls": "KnormRecentTies", "kw": {}, "exact_count": True}, "inner_arg": "base_press",
               "decode": True},
     "policy": "knorm+every", "policy_kw": DECODE},
]


def cache_positions(previous: list[list[int]] | None, n: int, newest: int) -> list[list[int]]:
    """Per head, the positions a layer's ``n`` cache slots hold at a forward whose newest token is at
    ``newest``: ``previous`` (per head, the positions kept by the layer's last cut, in slot order) followed by
    the tokens appended since, ``newest - appended + 1 .. newest``; before any cut (``previous`` None), one
    head's list ``0 .. n - 1`` (the caller repeats it per head)."""
    if previous is None:
        if n != newest + 1:
            raise ValueError(f"an uncut cache of {n} slots whose newest token is at {newest}")
        return [list(range(n))]
    out = []
    for held in previous:
        appended = n - len(held)
        if appended < 0:
            raise ValueError(f"{n} slots, fewer than the {len(held)} the last cut kept")
        out.append(held + list(range(newest - appended + 1, newest + 1)))
    return out


def kept_slots(k_out: Any, keys: Any, layer: int, head: int) -> list[int]:
    """The input slot of each key a cut kept (batch row 0, one KV head), in ``k_out``'s order: each kept key
    must equal exactly one input key, else RuntimeError."""
    eq = (k_out[0, head].unsqueeze(1) == keys[0, head].unsqueeze(0)).all(-1)  # [kept, n]
    if not bool((eq.sum(1) == 1).all()):
        raise RuntimeError(f"layer {layer} head {head}: a kept key matches no or several inputs")
    return eq.float().argmax(1).tolist()


def record_positions(press: Any, state: dict[int, list[list[int]]]) -> None:
    """Wrap ``press.compress`` so that ``state[layer]`` holds, per KV head (batch 1), the positions its cache
    keeps after each cut, in slot order."""
    orig = press.compress

    def compress(module, hidden_states, keys, values, attentions, kwargs):  # type: ignore[no-untyped-def]
        k_out, v_out = orig(module, hidden_states, keys, values, attentions, kwargs)
        li, heads, n = int(module.layer_idx), keys.shape[1], keys.shape[2]
        held = cache_positions(state.get(li), n, int(kwargs["cache_position"][-1]))
        held = held * heads if len(held) == 1 else held
        state[li] = [[held[h][i] for i in kept_slots(k_out, keys, li, h)] for h in range(heads)]
        return k_out, v_out

    press.compress = compress


def run_decoding(model: Any, press: Any, ids: list[int], n_new: int) -> dict[str, Any]:
    """Greedy ``n_new`` tokens with ``press``; returns the tokens and, per layer and KV head, the sorted
    positions the cache holds at the end (:func:`cache_positions` after the last forward)."""
    import torch
    from transformers import DynamicCache

    state: dict[int, list[list[int]]] = {}
    for p in (getattr(press, "prefilling_press", None), getattr(press, "decoding_press", None)):
        if p is not None:
            record_positions(p, state)
    if not hasattr(press, "decoding_press"):
        record_positions(press, state)
    x, cache = torch.tensor([ids]), DynamicCache()
    with torch.inference_mode(), press(model):
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), past_key_values=cache,
                             max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                             pad_token_id=model.generation_config.eos_token_id)
    newest = len(ids) + n_new - 2  # the last generated token is never fed back
    kept = []
    for li, layer in enumerate(cache.layers):
        n, heads = layer.keys.shape[2], layer.keys.shape[1]
        held = cache_positions(state.get(li), n, newest)
        kept.append([sorted(h) for h in (held * heads if len(held) == 1 else held)])
    return {"tokens": out[0, len(ids):].tolist(), "kept": kept}


def variant_presses() -> dict[str, Any]:
    """The presses above that kvpress does not name; kvpress is imported here."""
    import torch
    from kvpress import DecodingPress, KnormPress, PrefillDecodingPress
    from kvpress.presses.base_press import is_prefilling
    from kvpress.utils import compute_n_kept

    class KnormRecentTies(KnormPress):
        """KnormPress whose scores are their ranks, equal norms ranked by slot (the later higher), and whose
        kept keys stay in slot order, so that slot order is position order at every cut and ties keep the
        more recent token (ours). kvpress gathers the kept keys in score order, so after its first cut a
        slot's index no longer says how recent its token is, and ``topk`` orders ties either way."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            s = super().score(module, hidden_states, keys, values, attentions, kwargs)
            order = torch.argsort(s, dim=-1, stable=True)  # ascending: among ties the earlier first
            ranks = torch.empty_like(order).scatter_(-1, order, torch.arange(s.shape[-1]).expand_as(order))
            return ranks.to(s.dtype)

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
            n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
            idx = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # slot (= position) order
            idx = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
            return keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous()

    class DecodingRecorded(DecodingPress):
        """DecodingPress whose ``target_size`` is ``floor(n * (1 - ratio))`` of the prompt's ``n`` (its
        scorer's ratio, as ours reads the budget), set at the prompt forward."""

        def __init__(self, base_press: Any, compression_interval: int) -> None:
            super().__init__(base_press=base_press, compression_interval=compression_interval)
            self.keep_share = 1 - base_press.compression_ratio

        def forward_hook(self, module, input, kwargs, output):  # type: ignore[no-untyped-def]
            q = kwargs["hidden_states"].shape[1]
            if is_prefilling(kwargs["cache_position"], q):
                self.target_size = int(q * self.keep_share + 1e-9)
            return super().forward_hook(module, input, kwargs, output)

    class PrefillDecodingRecorded(PrefillDecodingPress):
        """PrefillDecodingPress: its scorer at the prompt (``target_size`` tokens, ours), then
        ``DecodingRecorded`` over a second instance of the scorer's class."""

        def __init__(self, base_press: Any, compression_interval: int) -> None:
            decoding = DecodingRecorded(type(base_press)(compression_ratio=base_press.compression_ratio),
                                        compression_interval)
            super().__init__(prefilling_press=base_press, decoding_press=decoding)

        def forward_hook(self, module, input, kwargs, output):  # type: ignore[no-untyped-def]
            q = kwargs["hidden_states"].shape[1]
            if is_prefilling(kwargs["cache_position"], q):  # the decoding press learns its target
                self.decoding_press.target_size = int(q * self.decoding_press.keep_share + 1e-9)
            return super().forward_hook(module, input, kwargs, output)

    return {"DecodingRecorded": DecodingRecorded, "PrefillDecodingRecorded": PrefillDecodingRecorded,
            "KnormRecentTies": KnormRecentTies}
