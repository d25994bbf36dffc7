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

import contextlib

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import noise as gumbel
from .cache import EvictingLayer

SCORE_BLOCK_FLOATS = 8 * 2**20  # ~32 MB of fp32 logits per block (fallback log-sum-exp)
SCORE_ROWS = gumbel.ROWS  # query rows per prompt-scoring block: one noise block each, no copies


class _NoCudnnSDPA:
    """Turns cuDNN's SDPA off for one call and back on after (entered only while it is on). Two flag writes:
    ``torch.nn.attention.sdpa_kernel`` costs ~12 us per entry, which adds up at every layer of every step."""

    def __enter__(self) -> None:
        torch.backends.cuda.enable_cudnn_sdp(False)

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.enable_cudnn_sdp(True)


_NO_CUDNN = _NoCudnnSDPA()


def _sdpa_backends(device: torch.device):
    """SDPA without cuDNN on CUDA; the other backends stay as the caller set them. cuDNN's SDPA, PyTorch's first
    choice on Hopper, plans a graph per key length, and every decode step has a new one: on an H200, GPT-J-6B
    at batch 1 decoded at 96.6 ms/step with it and 33.4 with flash (``results/bench/gpu``)."""
    if device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        return _NO_CUDNN
    return contextlib.nullcontext()


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
        with _sdpa_backends(query.device):
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
    noise = _decode_noise(layer, Hq).view(B, Hkv, G, S) if policy.uses_noise else None
    s = policy.score(probs, step=layer.cache.tau_step(layer), noise=noise)
    layer.score[:, :, :S] += s.sum(2)
    return out.reshape(B, Hq, 1, -1).transpose(1, 2)


def _decode_noise(layer: EvictingLayer, Hq: int) -> torch.Tensor:
    """Noise of the decode row of every sample at its slots' positions: [B, Hq, S]. Drawn once per
    forward for all layers (at layer 0), then gathered per layer."""
    cache = layer.cache
    S = layer.length + layer.q_len
    if layer.layer_idx == 0 or getattr(cache, "fwd_noise", None) is None:
        cur = cache.cur_pos().tolist()
        cache.fwd_noise = [gumbel.decode_noise(cache.seeds[b], p, len(cache.layers), Hq, layer.device)
                           for b, p in enumerate(cur)]  # [layers, p + 1, Hq] each
    pos = layer.pos[:, :, :S].clamp(min=0)  # dead slots are masked anyway
    G = Hq // pos.shape[1]
    rows = [cache.fwd_noise[b][layer.layer_idx].t().gather(1, pos[b].repeat_interleave(G, dim=0))
            for b in range(pos.shape[0])]
    return torch.stack(rows)


def _prompt_with_scores(layer: EvictingLayer, query, key, value, slopes, scaling) -> torch.Tensor:
    """Prompt attention plus score accumulation, per sample over its real tokens. Returns [B, N, Hq, Dv].

    Without ALiBi the output comes from the SDPA flash kernel, which also returns each row's log-sum-exp;
    the score pass then recomputes logits in blocks of query rows (no n x n matrix): H2O's column sums are
    ``sum_i exp(s_ij - lse_i)``; Keyformer normalises ``(s + g) / tau`` with its own log-sum-exp. With
    ALiBi (MPT, eager-only) each block's logits serve both the output and the score.
    """
    cache = layer.cache
    B, Hq, N, D = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    G = Hq // Hkv
    out = query.new_zeros(B, N, Hq, Dv)  # pad rows stay 0: nothing ever attends to a pad
    for b, n in enumerate(cache.n.tolist()):
        o = N - n
        if not bool(cache.real[b, o:].all()):
            raise ValueError("prompts must be left-padded (real tokens contiguous at the end)")
        qb, kb, vb = query[b, :, o:], key[b, :, o:], value[b, :, o:]  # [Hq, n, D], [Hkv, n, D], [Hkv, n, Dv]
        lse = None
        if slopes is None:
            kx, vx = (kb, vb) if G == 1 else (kb.repeat_interleave(G, 0), vb.repeat_interleave(G, 0))
            ctx, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qb[None], kx[None], vx[None], 0.0, True, scale=scaling) if qb.device.type == "cpu" else \
                _sdpa_with_lse(qb, kx, vx, scaling)
            out[b, o:] = ctx[0].transpose(0, 1)
            lse = lse[0].float()  # [Hq, n]
        acc = _score_blocks(layer, b, qb, kb, vb, out[b, o:] if lse is None else None, lse, slopes, scaling)
        layer.score[b, :, o:N] += acc
    return out


def _sdpa_with_lse(q, k, v, scaling):
    """Non-CPU path: [1, Hq, n, Dv] output and [1, Hq, n] fp32 row log-sum-exp. On CUDA from the fused kernel
    that returns it (flash for fp16/bf16, memory-efficient for fp32); otherwise, or if the kernel refuses the
    shapes, SDPA plus a blocked recomputation of the log-sum-exp."""
    if q.device.type == "cuda":
        try:
            if q.dtype in (torch.float16, torch.bfloat16):
                r = torch.ops.aten._scaled_dot_product_flash_attention(q[None], k[None], v[None], 0.0, True,
                                                                       False, scale=scaling)
            else:
                r = torch.ops.aten._scaled_dot_product_efficient_attention(q[None], k[None], v[None], None, True,
                                                                           0.0, True, scale=scaling)
            return r[0], r[1][..., : q.shape[1]]
        except RuntimeError:
            pass
    return _sdpa_blocked_lse(q, k, v, scaling)


def _sdpa_blocked_lse(q, k, v, scaling):
    """Portable fallback: output from SDPA, row log-sum-exp recomputed in blocks."""
    with _sdpa_backends(q.device):
        ctx = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                                               scale=scaling)
    n = q.shape[1]
    lse = torch.empty(q.shape[0], n, dtype=torch.float32, device=q.device)
    step = max(1, SCORE_BLOCK_FLOATS // max(1, q.shape[0] * n))
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        s = torch.matmul(q[:, r0:r1].float(), k[:, :r1].float().transpose(-1, -2)) * scaling
        s = s.masked_fill(_upper(r0, r1, q.device), float("-inf"))
        lse[:, r0:r1] = torch.logsumexp(s, dim=-1)
    return ctx, lse[None]


def _upper(r0: int, r1: int, device) -> torch.Tensor:
    """[r1 - r0, r1] True above the causal frontier of rows r0..r1."""
    return torch.arange(r1, device=device).view(1, -1) > torch.arange(r0, r1, device=device).view(-1, 1)


def _score_blocks(layer, b, qb, kb, vb, out_b, lse, slopes, scaling) -> torch.Tensor:
    """Column sums of the policy's prompt scores for sample ``b``: [Hkv, n]. When ``lse`` is None (ALiBi),
    also writes the attention output of each block into ``out_b`` [n, Hq, Dv]. Blocks of ``SCORE_ROWS``
    query rows see keys [0, r1) only, so little of the causal upper triangle is computed."""
    cache, policy = layer.cache, layer.cache.policy
    Hq, n, D = qb.shape
    Hkv = kb.shape[0]
    G = Hq // Hkv
    acc = torch.zeros(Hkv, 1, n, dtype=torch.float32, device=qb.device)
    if lse is not None:  # exp(s - lse) are the attention probabilities: fold scale and -lse into one matmul
        q = torch.cat([qb.float() * scaling, -lse.unsqueeze(-1)], dim=-1).view(Hkv, G, n, D + 1)
        kt = torch.cat([kb.float(), kb.new_ones(Hkv, n, 1, dtype=torch.float32)], dim=-1).transpose(-1, -2)
    else:
        q, kt = qb.float().view(Hkv, G, n, D), kb.float().transpose(-1, -2)
    for r0 in range(0, n, SCORE_ROWS):
        r1 = min(n, r0 + SCORE_ROWS)
        r = r1 - r0
        x = torch.matmul(q[:, :, r0:r1].reshape(Hkv, G * r, -1), kt[:, :, :r1]).view(Hkv, G, r, r1)
        x[..., r0:].masked_fill_(_upper(r0, r1, qb.device)[:, r0:], float("-inf"))
        if lse is not None:
            probs = x.exp_()
        else:  # ALiBi: slope * key position (a per-row shift of the true distance); output from these logits
            x.mul_(scaling)
            x += slopes.view(Hkv, G, 1, 1).float() * torch.arange(r1, device=qb.device, dtype=torch.float32)
            probs = torch.softmax(x, dim=-1)
            ctx = torch.matmul(probs.view(Hkv, G * r, r1).to(vb.dtype), vb[:, :r1])
            out_b[r0:r1] = ctx.view(Hq, r, -1).transpose(0, 1)
        noise = None
        if policy.uses_noise:
            noise = gumbel.prompt_noise(cache.seeds[b], layer.layer_idx, r0, r1, Hq, qb.device).reshape(Hkv, G, r, r1)
        s = policy.score(probs, step=0, noise=noise).view(Hkv, G * r, r1)
        acc[:, :, :r1] += torch.matmul(s.new_ones(Hkv, 1, G * r), s)  # column sums as a GEMV
    return acc.view(Hkv, n)
