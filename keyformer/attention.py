"""Attention over an evicting cache, with the policy's scores computed on the side.

* The attention output uses SDPA (Llama, GPT-J, GPT-2) or MPT's own eager math with ALiBi at the kept
  tokens' *original* distances.
* Prompt scores are computed per sample over its real tokens, in blocks of query rows: no n x n matrix.
* Decode steps of scoring policies compute logits once and use them for both the output and the score.
* GQA: scores are computed per query head and **summed over the query heads of each KV-head group**, so
  state and selection are per KV head.

The attention function finds the cache layer through the ``_kf_layer`` attribute that
:meth:`keyformer.cache.EvictingLayer.update` sets on the key view it returns; with any other cache the
model's usual SDPA path runs unchanged.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import noise as gumbel
from .cache import EvictingLayer

SCORE_BLOCK_FLOATS = 8 * 2**20  # ~32 MB of fp32 logits per prompt-scoring block


def keyformer_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``AttentionInterface`` entry: our path for our cache, plain SDPA otherwise."""
    layer = getattr(key, "_kf_layer", None)
    if layer is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    return attend(module, layer, query, key, value, scaling=scaling, dropout=dropout), None


def attend(module, layer: EvictingLayer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
           scaling: float, dropout: float = 0.0, slopes: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for one layer, then score accumulation and eviction.

    query [B, Hq, q, D]; key/value [B, Hkv, S, D] (S = L + q slots); ``slopes`` [Hq] for ALiBi.
    Returns [B, q, Hq, Dv].
    """
    policy = layer.cache.policy
    B, Hq, q, _ = query.shape
    G = Hq // key.shape[1]
    mask = layer.attention_mask()  # bool, True = attend
    bias = _alibi(layer, slopes) if slopes is not None else None  # [B, Hq, 1, S]
    if policy.needs_scores and q == 1 and layer.length > 0:
        out = _decode_with_scores(module, layer, query, key, value, mask, bias, scaling)
    elif policy.needs_scores:
        if layer.length > 0:
            raise NotImplementedError("multi-token forwards over a non-empty evicting cache (chunked "
                                      "prefill) are not supported by scoring policies")
        out = _prompt_with_scores(layer, query, key, value, slopes, scaling)
    elif bias is not None:
        out = _eager(query, key, value, mask, bias, scaling)
    else:
        if mask is not None and mask.shape[1] > 1 and G > 1:
            mask = mask.repeat_interleave(G, dim=1)
        out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling)
    layer.evict()
    return out


def _alibi(layer: EvictingLayer, slopes: torch.Tensor) -> torch.Tensor:
    """ALiBi bias at the kept tokens' original distances: slope * (pos_j - newest), [B, Hq, 1, S]."""
    S = layer.length + layer.q_len
    dist = layer.pos[:, :, :S] - layer.cache.cur_pos().view(-1, 1, 1)  # [B, Hkv, S], per head
    dist = dist.repeat_interleave(slopes.numel() // dist.shape[1], dim=1).float()
    return (dist * slopes.view(1, -1, 1)).unsqueeze(2).to(layer.dtype)


def _eager(query, key, value, mask, bias, scaling):
    """MPT's own attention math (eager, additive bias, finfo.min fill), at kept positions."""
    G = query.shape[1] // key.shape[1]
    if G > 1:
        key, value = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling + bias
    q, S = query.shape[2], key.shape[2]
    if mask is None and q > 1:  # plain causal (no pads, empty cache)
        mask = torch.ones(q, S, dtype=torch.bool, device=query.device).tril(S - q).view(1, 1, q, S)
    if mask is not None:
        if mask.shape[1] > 1 and G > 1:
            mask = mask.repeat_interleave(G, dim=1)
        scores = scores.masked_fill(~mask, torch.finfo(query.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    return torch.matmul(probs, value).transpose(1, 2)


def _decode_with_scores(module, layer, query, key, value, mask, bias, scaling):
    """One query token: logits once, used for the output and for the policy score."""
    policy = layer.cache.policy
    B, Hq, _, D = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    G = Hq // Hkv
    qg = query.reshape(B, Hkv, G, D)
    logits = torch.matmul(qg, key.transpose(-1, -2)).float() * scaling  # [B, Hkv, G, S]
    if bias is not None:
        logits = logits + bias.view(B, Hkv, G, S)
    if mask is not None:
        logits = logits.masked_fill(~mask.view(B, -1, 1, S), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value)  # [B, Hkv, G, Dv]
    step = layer.cache.tau_step(layer)
    if getattr(policy, "score_is_attention", False):
        s = probs
    else:
        noise = _decode_noise(layer, Hq).view(B, Hkv, G, S) if policy.uses_noise else None
        s = policy.score(logits, step=step, noise=noise)
    layer.score[:, :, :S] += s.sum(2)
    return out.reshape(B, Hq, 1, -1).transpose(1, 2)


def _decode_noise(layer: EvictingLayer, Hq: int) -> torch.Tensor:
    """Gumbel noise for the decode row of every sample at its slots' positions: [B, Hq, S]."""
    cache = layer.cache
    S = layer.length + layer.q_len
    pos = layer.pos[:, :, :S].clamp(min=0)  # dead slots are masked anyway
    Hkv = pos.shape[1]
    out = []
    for b, p in enumerate(cache.cur_pos().tolist()):
        row = gumbel.decode_noise(cache.seeds[b], layer.layer_idx, p, Hq, layer.device)  # [p + 1, Hq]
        idx = pos[b].repeat_interleave(Hq // Hkv, dim=0)  # [Hq, S]
        out.append(row.t().gather(1, idx))
    return torch.stack(out)


def _prompt_with_scores(layer: EvictingLayer, query, key, value, slopes, scaling) -> torch.Tensor:
    """Prompt attention and score accumulation in one pass: per sample, over its real tokens, in blocks of
    query rows (the logits of a block serve the output and the score). Returns [B, N, Hq, Dv]."""
    cache, policy = layer.cache, layer.cache.policy
    B, Hq, N, D = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    G = Hq // Hkv
    out = query.new_zeros(B, N, Hq, Dv)  # pad rows stay 0: nothing ever attends to a pad
    for b, n in enumerate(cache.n.tolist()):
        o = N - n
        if not bool(cache.real[b, o:].all()):
            raise ValueError("prompts must be left-padded (real tokens contiguous at the end)")
        qb, kb, vb = query[b, :, o:], key[b, :, o:], value[b, :, o:]  # [Hq, n, D], [Hkv, n, D], [Hkv, n, Dv]
        rows = max(gumbel.ROWS, SCORE_BLOCK_FLOATS // max(1, Hq * n) // gumbel.ROWS * gumbel.ROWS)
        acc = torch.zeros(Hkv, n, dtype=torch.float32, device=query.device)
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            r = r1 - r0
            qc = qb[:, r0:r1].reshape(Hkv, G * r, D)
            logits = (torch.matmul(qc, kb[:, :r1].transpose(-1, -2)).float() * scaling).view(Hkv, G, r, r1)
            if slopes is not None:  # ALiBi: slope * key position (a per-row shift of the true distance)
                dist = torch.arange(r1, device=query.device, dtype=torch.float32)
                logits = logits + slopes.view(Hkv, G, 1, 1).float() * dist
            causal = torch.arange(r1, device=query.device).view(1, -1) <= torch.arange(
                r0, r1, device=query.device).view(-1, 1)
            logits = logits.masked_fill(~causal, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            ctx = torch.matmul(probs.view(Hkv, G * r, r1).to(vb.dtype), vb[:, :r1])  # [Hkv, G*r, Dv]
            out[b, o + r0 : o + r1] = ctx.view(Hq, r, Dv).transpose(0, 1)
            if getattr(policy, "score_is_attention", False):
                s = probs
            else:
                noise = None
                if policy.uses_noise:
                    noise = gumbel.prompt_noise(cache.seeds[b], layer.layer_idx, r0, r1, Hq, query.device)
                    noise = noise.view(Hkv, G, r, r1)
                s = policy.score(logits, step=0, noise=noise)
            acc[:, :r1] += s.sum(dim=(1, 2))
        layer.score[b, :, o:N] += acc
    return out
