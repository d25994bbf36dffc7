"""Four wrappers in the kvpress cross-check (``kvpress_crosscheck.py``): ``chunk`` (``ChunkPress``),
``merging`` (``MergingPress``), ``cam`` (``CAMPress``) and ``dms`` (``DMSPress``), each over KnormPress,
whose plain row keeps kvpress's sets (a token's score is its own key's norm, so scoring a chunk alone or the
whole prompt gives the same scores): a difference is the wrapper's.

* ``chunk``: kvpress keeps ``max(1, int(m_c * (1 - ratio)))`` tokens of each chunk and no more; ours gives
  each chunk that share (from ``floor(n * budget)``) and fills the budget with the best of the rest.
  ``[kv: our shares, filled up to the budget]`` gives kvpress both.
* ``merging``: the kept set is the scorer's; the merged values are compared on the kept positions
  (``vsum``, below) and by the greedy outputs.
* ``cam``: kvpress's ``CAMPress`` cuts only while decoding. The row calls its own ``compress`` once at the
  prompt (``CAMAtPrompt``): target ``floor(n * budget)`` (ours), every evicted token a merge candidate (ours
  merges all a prompt cut evicts; kvpress the ``k`` best, ``k`` the steps since its last cut), the cumulative
  attention of the prompt's last query row averaged over each KV head's group (ours for a scorer that reads
  no attention; kvpress's decode-step attention). Two differences stay: kvpress keeps one set per layer
  (scores averaged over the KV heads), ours one per KV head (``[kv: a set per KV head]`` runs kvpress's
  ``compress`` one head at a time); kvpress draws its Bernoulli merges with ``torch.bernoulli``, unseeded,
  ours from a hash of (seed, layer, KV head, position) (``..., our hashed draws]`` draws kvpress's from that
  hash, :func:`cam_uniform`).
* ``dms``: kvpress has no budget (its threshold decides, ``DMSPress`` has no ``compression_ratio``); ours
  caps at the budget first, so ours runs at budget 1.0 (``our_budget``, as SimLayerKV): at the prompt both
  then evict every token older than the ``dms_window`` newest whose score is below the threshold. Knorm
  scores a token by its own key alone, so kvpress's score on arrival is ours at the cut. ``DMSPress`` masks
  (``masked_key_indices``) instead of calling ``compress``: ``DMSRecorded`` hands the recorder its input
  unchanged after the prompt, and the kept set is the complement of the mask.

``block`` (``BlockPress``) runs over KeyDiffPress (:data:`BLOCK_METHODS`), whose plain row keeps kvpress's
sets: over key norm block processing changes nothing (a token's score is its own), over KeyDiff the anchor is
the mean of the block's candidates, so the row tests the iteration. BlockPress counts with its scorer's ratio;
``[kv: floor count]`` gives it ours at 0.2.

``rerotate`` (``KeyRerotationPress``, :data:`ROTATE_METHODS`) over KnormPress keeps Knorm's sets; the row's
test is the outputs (``out =``, ``prefix``), which the rotated keys decide. ``KeyRerotationRecorded`` names
its kept indices to the recorder (its keys match none of its inputs).

Two more (:data:`BASELINE_METHODS`): ``Random`` (``RandomPress``, seeded) and ``layers`` over KnormPress
(``PerLayerCompressionPress``). kvpress draws Random's scores with ``torch.rand``, ours hashes them from
(seed, layer, KV head, position), so the plain row compares two uniform samples; ``[kv: our hashed draws,
floor count]`` draws kvpress's from our hash (:func:`hash_uniform`). ``PerLayerCompressionPress`` sets its
scorer's ratio per layer: the row gives it ``1 - budget * s_l``, ``s_l`` our ``layer_curve``'s share of layer
``l`` (``LayersRecorded``, which records the delegated ``compress``); ours keeps ``floor(floor(n * budget) *
s_l)``, kvpress ``int(n * budget * s_l)``, and ``[kv: our counts]`` sets the ratio so that they agree.

Importing this module needs only the standard library; :func:`variant_presses` imports torch and kvpress.
"""

from __future__ import annotations

from typing import Any

KNORM = {"cls": "KnormPress", "kw": {}}
PREFILL = {"recent": 0.0, "prefill_only": True}
CHUNK = 64  # several chunks per 400-512-token prompt (kvpress's default, 1024, would be one chunk)
DMS_THRESHOLD = -17.0  # Knorm's score is -||k||: about the median key norm of SmolLM2 on these prompts
DMS_WINDOW = 128
BLOCK = 64  # several blocks after the first k of a 400-512-token prompt (kvpress's default: 128)
CAM_BUDGET = 32
M32 = 0xFFFFFFFF
CAM_SALT = 0x5CA1AB1E  # keyformer.core.policies.wrappers.cam.SALT

# values: the rows record ``vsum`` (each kept position's value summed over its dimensions, after the merges)
METHODS: list[dict[str, Any]] = [
    {"name": "Chunk-Knorm", "press": {"cls": "ChunkPress", "kw": {"chunk_length": CHUNK}, "inner": KNORM},
     "policy": "knorm+chunk", "policy_kw": {**PREFILL, "chunk_tokens": CHUNK}},
    {"name": "Merging-Knorm", "press": {"cls": "MergingPress", "kw": {"similarity_threshold": 0.0},
                                        "inner": KNORM, "values": True},
     "policy": "knorm+merging", "policy_kw": {**PREFILL, "similarity_threshold": 0.0}},
    # kvpress's CAMPress cuts only while decoding and keeps one set per layer; kvpress draws its Bernoulli
    # merges unseeded (torch.bernoulli), ours hashed from cam_seed: different draws, same rule
    {"name": "CaM-Knorm", "press": {"cls": "CAMAtPrompt", "kw": {"merge_budget": CAM_BUDGET}, "inner": KNORM,
                                    "inner_arg": "base_press", "values": True},
     "policy": "knorm+cam", "policy_kw": {**PREFILL, "merge_budget": CAM_BUDGET, "cam_seed": 0}},
    # kvpress's threshold alone decides (no ratio); ours caps at the budget first, so ours at budget 1.0
    {"name": "DMS-Knorm", "press": {"cls": "DMSRecorded", "inner": KNORM, "no_ratio": True,
                                    "kw": {"threshold": DMS_THRESHOLD, "sliding_window_size": DMS_WINDOW}},
     "policy": "knorm+dms",
     "policy_kw": {**PREFILL, "dms_threshold": DMS_THRESHOLD, "dms_window": DMS_WINDOW},
     "our_budget": 1.0},
]
DIAGNOSTICS: list[dict[str, Any]] = [
    {"name": "Chunk-Knorm [kv: our shares, filled up to the budget]",
     "press": {"cls": "ChunkFilled", "kw": {"chunk_length": CHUNK}, "inner": {**KNORM, "exact_count": True}},
     "policy": "knorm+chunk", "policy_kw": {**PREFILL, "chunk_tokens": CHUNK}},
    {"name": "Merging-Knorm [kv: floor count]",
     "press": {"cls": "MergingPress", "kw": {"similarity_threshold": 0.0},
               "inner": {**KNORM, "exact_count": True}, "values": True},
     "policy": "knorm+merging", "policy_kw": {**PREFILL, "similarity_threshold": 0.0}},
    {"name": "CaM-Knorm [kv: a set per KV head]",
     "press": {"cls": "CAMPerHead", "kw": {"merge_budget": CAM_BUDGET}, "inner": KNORM,
               "inner_arg": "base_press", "values": True},
     "policy": "knorm+cam", "policy_kw": {**PREFILL, "merge_budget": CAM_BUDGET, "cam_seed": 0}},
    {"name": "CaM-Knorm [kv: a set per KV head, our hashed draws]",
     "press": {"cls": "CAMPerHeadHashed", "kw": {"merge_budget": CAM_BUDGET, "cam_seed": 0}, "inner": KNORM,
               "inner_arg": "base_press", "values": True},
     "policy": "knorm+cam", "policy_kw": {**PREFILL, "merge_budget": CAM_BUDGET, "cam_seed": 0}},
]

KEYDIFF = {"cls": "KeyDiffPress", "kw": {}}
BLOCK_METHODS: list[dict[str, Any]] = [
    {"name": "Block-KeyDiff", "press": {"cls": "BlockPress", "kw": {"block_size": BLOCK}, "inner": KEYDIFF},
     "policy": "keydiff+block", "policy_kw": {**PREFILL, "block_tokens": BLOCK}},
]
BLOCK_DIAGNOSTICS: list[dict[str, Any]] = [
    {"name": "Block-KeyDiff [kv: floor count]",
     "press": {"cls": "BlockPress", "kw": {"block_size": BLOCK}, "inner": {**KEYDIFF, "exact_count": True}},
     "policy": "keydiff+block", "policy_kw": {**PREFILL, "block_tokens": BLOCK}},
]

LAYER_CURVE = [1.5, 0.5]  # the layers wrapper's default: 1.5x the budget at the first layer, 0.5x at the last
RANDOM = {"cls": "RandomPress", "kw": {"seed": 0}}
BASELINE_METHODS: list[dict[str, Any]] = [
    {"name": "Random", "press": RANDOM, "policy": "random", "policy_kw": {**PREFILL, "seed": 0}},
    {"name": "Layers-Knorm", "press": {"cls": "LayersRecorded", "kw": {"curve": LAYER_CURVE}, "inner": KNORM},
     "policy": "knorm+layers", "policy_kw": {**PREFILL, "layer_curve": LAYER_CURVE}},
]
LUKV_CURVE = "results/crosscheck_kvpress/lukv/curve.npy"  # written by lukv_curve(); relative to the repo
LUKV_METHODS: list[dict[str, Any]] = [
    {"name": "LUKV-Knorm", "press": {"cls": "LUKVLocal", "kw": {"curve_path": LUKV_CURVE}, "inner": KNORM},
     "policy": "knorm+lukv", "policy_kw": {**PREFILL, "lukv_curve": LUKV_CURVE}},
]
ROTATE_METHODS: list[dict[str, Any]] = [
    {"name": "KeyRerotation-Knorm", "press": {"cls": "KeyRerotationRecorded", "kw": {}, "inner": KNORM},
     "policy": "knorm+rerotate", "policy_kw": {"recent": 0.0}},
]
BASELINE_DIAGNOSTICS: list[dict[str, Any]] = [
    {"name": "Random [kv: our hashed draws, floor count]",
     "press": {"cls": "RandomHashed", "kw": {"seed": 0}, "exact_count": True},
     "policy": "random", "policy_kw": {**PREFILL, "seed": 0}},
    {"name": "Layers-Knorm [kv: our counts]",
     "press": {"cls": "LayersRecorded", "kw": {"curve": LAYER_CURVE, "our_counts": True}, "inner": KNORM},
     "policy": "knorm+layers", "policy_kw": {**PREFILL, "layer_curve": LAYER_CURVE}},
]


def _mix32(x: Any) -> Any:
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    return (x >> 16) ^ x


def hash_uniform(seed: int, layer: int, head: int, pos: Any) -> Any:
    """Our uniform draws (``uniform_hash(seed, layer, head, pos)`` of
    ``keyformer.core.policies.random_scores``, repeated here: the kvpress venv has no keyformer) for int64
    positions ``pos``: float64 in [0, 1)."""
    import torch

    s = int(seed)
    s = ((s & M32) ^ ((s >> 32) & M32) ^ ((s >> 64) & M32)) & M32
    base = _mix32(torch.tensor((s * 0x9E3779B1 + int(layer) * 0x85EBCA77) & M32, dtype=torch.int64))
    hk = _mix32(base ^ (int(head) * 0x27D4EB2F & M32))
    h = _mix32(hk ^ (pos.long() * 0x165667B1 & M32))
    return (h.double() + 0.5) / 2.0**32


def cam_uniform(seed: int, layer: int, head: int, pos: Any) -> Any:
    """Our CaM's uniform draws: :func:`hash_uniform` of the seed salted as the wrapper salts it."""
    return hash_uniform(int(seed) ^ CAM_SALT, layer, head, pos)


def lukv_curve(path: str, layers: int = 30, heads: int = 3, seed: int = 0) -> None:
    """A synthetic LU-KV curve for SmolLM2 (``[99, layers, heads]`` prune ratios, float32): at keep ratio
    ``q`` (row ``100 (1 - q) - 1``) head ``(l, h)`` keeps ``q w_lh`` (clipped to [0, 1]), ``w`` uniform in
    [0.5, 1.5] from ``seed``, scaled to mean 1. Not a trained curve: the row tests the counting and
    selection."""
    import numpy as np

    w = np.random.default_rng(seed).uniform(0.5, 1.5, (layers, heads))
    q = 1 - (np.arange(99) + 1) / 100
    keep = np.clip(q[:, None, None] * (w / w.mean())[None], 0, 1)
    np.save(path, (1 - keep).astype(np.float32))


def curve_shares(curve: tuple[float, ...], layers: int) -> list[float]:
    """Our ``layer_curve``'s share of each layer (``c_l * L / sum(c)``, ``c`` interpolated linearly at ``L``
    evenly spaced depths: ``keyformer.core.policies.wrappers.layers``, repeated here)."""
    if len(curve) == 1 or layers == 1:
        c = [float(curve[0])] * layers
    else:
        c = []
        for li in range(layers):
            x = li * (len(curve) - 1) / (layers - 1)
            i = min(int(x), len(curve) - 2)
            c.append(curve[i] + (x - i) * (curve[i + 1] - curve[i]))
    return [v * layers / sum(c) for v in c]


def variant_presses() -> dict[str, Any]:
    """The presses above that kvpress does not name; kvpress is imported here."""
    import torch
    from kvpress import (
        CAMPress,
        ChunkPress,
        DMSPress,
        KeyRerotationPress,
        PerLayerCompressionPress,
        RandomPress,
    )
    from kvpress.presses.base_press import BasePress, is_prefilling
    from kvpress.utils import extract_keys_and_values

    bernoulli = torch.bernoulli

    class ChunkFilled(ChunkPress):
        """ChunkPress whose chunk shares are ``max(1, floor(m_c * k / n))``, ``k = int(n * (1 - ratio))``, and
        are topped up to ``k`` tokens with the best-scored of the rest (ours; the best ``k`` shares where the
        floors of 1 overfill), instead of ``max(1, int(m_c * (1 - ratio)))`` each and no more."""

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            n, k = keys.shape[2], int(keys.shape[2] * (1 - self.press.compression_ratio))
            scores = torch.cat([self.press.score(module, hidden_states[:, i: i + self.chunk_length],
                                                 keys[:, :, i: i + self.chunk_length],
                                                 values[:, :, i: i + self.chunk_length], None, kwargs)
                                for i in range(0, n, self.chunk_length)], dim=-1)
            share = torch.zeros_like(scores, dtype=torch.bool)
            for i in range(0, n, self.chunk_length):
                c = scores[..., i: i + self.chunk_length]
                top = c.topk(max(1, c.shape[-1] * k // n), dim=-1).indices
                share.scatter_(-1, i + top, True)
            lift = (scores.max() - scores.min() + 1).item()
            idx = (scores + share * lift).topk(k, dim=-1).indices
            idx = idx.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
            return keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous()

    class CAMAtPrompt(CAMPress):
        """kvpress's CAMPress ``compress`` run once, at the prompt (module docstring), nothing while
        decoding."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self.budget = 1 - self.base_press.compression_ratio  # the kept share; compress resets the ratio

        def forward_hook(self, module, input, kwargs, output):  # type: ignore[no-untyped-def]
            hidden_states, cache = kwargs["hidden_states"], kwargs["past_key_values"]
            if not is_prefilling(kwargs["cache_position"], hidden_states.shape[1]):
                return output
            layer = int(module.layer_idx)
            keys, values = extract_keys_and_values(cache, layer)
            n, hkv = keys.shape[2], keys.shape[1]
            self.target_size = int(n * self.budget + 1e-9)
            a = self._compute_current_token_attention(module, hidden_states, keys, kwargs)
            self._running_attn_sum[layer] = self._aggregate_attention_per_kv_head(a, hkv).squeeze(2)
            self.layer_step_counts[layer] = n - self.target_size  # every evicted token a merge candidate
            keys, values = self.compress(module, hidden_states, keys, values, self._running_attn_sum[layer],
                                         kwargs)
            cache.layers[layer].keys, cache.layers[layer].values = keys, values
            return output

    class CAMPerHead(CAMAtPrompt):
        """CAMAtPrompt with one kept set per KV head (ours; kvpress's ``compress`` on one head at a time),
        instead of one per layer from the scores averaged over the heads."""

        def draw(self, layer: int, head: int, merge_idx: Any, p: Any) -> Any:
            return bernoulli(p)  # kvpress's draw (torch.bernoulli is patched while compress runs)

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            layer, outs = int(module.layer_idx), []
            running = self._running_attn_sum[layer]
            try:
                for h in range(keys.shape[1]):
                    self._running_attn_sum[layer] = running[:, h: h + 1]
                    k, v, a = keys[:, h: h + 1], values[:, h: h + 1], attentions[:, h: h + 1]
                    scores = self.base_press.score(module, hidden_states, k, v, None, kwargs)
                    kept = scores.mean(1).topk(self.target_size, dim=-1).indices
                    gone = torch.ones(scores.shape[-1], dtype=torch.bool)
                    gone[kept[0]] = False
                    merge_idx = gone.nonzero().view(1, 1, -1)  # sorted: every evicted token merges
                    torch.bernoulli = (lambda p, h=h, m=merge_idx:  # type: ignore[misc]
                                       self.draw(layer, h, m, p))
                    outs.append(CAMPress.compress(self, module, hidden_states, k, v, a, kwargs))
                    outs[-1] += (self._running_attn_sum[layer],)
            finally:
                torch.bernoulli = bernoulli
            self._running_attn_sum[layer] = torch.cat([o[2] for o in outs], dim=1)
            return torch.cat([o[0] for o in outs], dim=1), torch.cat([o[1] for o in outs], dim=1)

    class CAMPerHeadHashed(CAMPerHead):
        """CAMPerHead whose merge draws are ours (``u < p``, ``u`` hashed from the seed, layer, KV head and
        position: :func:`cam_uniform`) instead of ``torch.bernoulli``."""

        def __init__(self, *args: Any, cam_seed: int = 0, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.cam_seed = cam_seed

        def draw(self, layer: int, head: int, merge_idx: Any, p: Any) -> Any:
            u = cam_uniform(self.cam_seed, layer, head, merge_idx).to(p.device)
            return (u < p.double()).to(p.dtype)

    class DMSRecorded(DMSPress):
        """DMSPress whose prompt pass ends with an identity ``compress`` call, so the cross-check's recorder
        sees the layer (its kept set: the complement of ``masked_key_indices``)."""

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            return keys, values

        def forward_hook(self, module, input, kwargs, output):  # type: ignore[no-untyped-def]
            output = super().forward_hook(module, input, kwargs, output)
            if is_prefilling(kwargs["cache_position"], kwargs["hidden_states"].shape[1]):
                keys, values = extract_keys_and_values(kwargs["past_key_values"], int(module.layer_idx))
                self.compress(module, kwargs["hidden_states"], keys, values, None, kwargs)
            return output

    class RandomHashed(RandomPress):
        """RandomPress whose scores are our hashed draws (:func:`hash_uniform`) instead of ``torch.rand``."""

        def score(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                  kwargs):
            pos = torch.arange(keys.shape[2], dtype=torch.int64)
            s = torch.stack([hash_uniform(self.seed or 0, int(module.layer_idx), h, pos)
                             for h in range(keys.shape[1])])
            return s.unsqueeze(0).expand(keys.shape[0], -1, -1).to(keys.device)

    class LayersRecorded(PerLayerCompressionPress):
        """PerLayerCompressionPress's rule (its scorer's ratio set per layer) with ``1 - budget * s_l``
        (:func:`curve_shares`; ``budget`` from the scorer's ratio), called through ``compress`` so the
        recorder sees it; ``our_counts``: the ratio that keeps ``floor(floor(n * budget) * s_l)`` tokens."""

        def __init__(self, press: Any, curve: list[float], our_counts: bool = False) -> None:
            super().__init__(press=press, compression_ratios=[press.compression_ratio])
            self.curve, self.our_counts = tuple(curve), our_counts

        def forward_hook(self, module, input, kwargs, output):  # type: ignore[no-untyped-def]
            return BasePress.forward_hook(self, module, input, kwargs, output)

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            n, saved = keys.shape[2], self.press.compression_ratio
            share = curve_shares(self.curve, module.config.num_hidden_layers)[int(module.layer_idx)]
            if self.our_counts:
                kept = min(max(int(int(n * (1 - saved) + 1e-9) * share), 1), n)
                ratio = 1 - (kept + 0.5) / n
            else:
                ratio = min(max(1 - (1 - saved) * share, 0.0), 1.0)
            self.press.compression_ratio = ratio
            try:
                return self.press.compress(module, hidden_states, keys, values, attentions, kwargs)
            finally:
                self.press.compression_ratio = saved

    class KeyRerotationRecorded(KeyRerotationPress):
        """KeyRerotationPress that names the kept indices (``kept_indices``) for the recorder: its keys come
        back rotated, so they match none of its inputs."""

        def compress(self, module, hidden_states, keys, values, attentions,  # type: ignore[no-untyped-def]
                     kwargs):
            scores = self.press.score(module, hidden_states, keys, values, attentions, kwargs)
            n_kept = int(keys.shape[2] * (1 - self.press.compression_ratio))
            self.kept_indices = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values
            return super().compress(module, hidden_states, keys, values, attentions, kwargs)

    from kvpress import LUKVPress

    class LUKVLocal(LUKVPress):
        """LUKVPress whose curve is read from ``curve_path`` (no download), at its scorer's ratio."""

        def __init__(self, press: Any, curve_path: str) -> None:
            super().__init__(press=press, compression_ratio=press.compression_ratio)
            self.curve_path = curve_path

        def _load_budget_curves(self, model):  # type: ignore[no-untyped-def]
            import numpy as np

            return np.load(self.curve_path, allow_pickle=False)

    return {"ChunkFilled": ChunkFilled, "CAMAtPrompt": CAMAtPrompt, "CAMPerHead": CAMPerHead,
            "CAMPerHeadHashed": CAMPerHeadHashed, "DMSRecorded": DMSRecorded, "RandomHashed": RandomHashed,
            "LayersRecorded": LayersRecorded, "KeyRerotationRecorded": KeyRerotationRecorded,
            "LUKVLocal": LUKVLocal}
