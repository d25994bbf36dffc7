"""Attention over an evicting cache, with the policy's scores computed in the same pass.

* Policies that need no attention scores use SDPA (Llama, GPT-J, GPT-2) or MPT's own eager math with ALiBi
  at the kept tokens' *original* distances.
* Scoring policies, at the prompt: one blocked pass per layer, vectorised over samples, whose softmax gives
  both the output and the scores (no n x n matrix, no second ``Q K^T``). At a decode step: logits once, used
  for the output and the score; noise only at the held slots.
* GQA: scores are computed per query head and **summed over the query heads of each KV-head group**, so
  state and selection are per KV head.

The attention function finds the cache layer through the ``_kf_layer`` attribute that
:meth:`keyformer.core.cache.EvictingLayer.update` sets on the key view it returns; with any other cache the
model's usual SDPA path runs unchanged. A policy sees a :class:`keyformer.core.policies.base.Context`; this
module only builds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import noise as gumbel
from . import scheduler
from .cache import EvictingLayer


def _rows_setting(value, name: str) -> int:
    """``value`` as a row count, or one ValueError line naming it and the valid choices."""
    try:
        rows = int(value)
    except (TypeError, ValueError):
        rows = 0
    if isinstance(value, bool) or rows < 1 or (not isinstance(value, str) and rows != value):
        raise ValueError(f"{name}={value!r} is not a valid row count; valid: an int >= 1 (query rows per "
                         f"prompt block)")
    return rows


SCORE_BLOCK_FLOATS = 16 * 2**20  # fp32 logits per prompt block (B * Hq * rows * keys), 64 MB
# at most this many query rows per prompt block (the chunk of the scores' kernel path); a setting:
# KEYFORMER_SCORE_ROWS in the environment, or this attribute
SCORE_ROWS = _rows_setting(os.environ.get("KEYFORMER_SCORE_ROWS", "128"), "KEYFORMER_SCORE_ROWS")
PREFILL_FLASH = True  # observe_rows policies: prompt output from SDPA, logits for the observed rows only


class _NoCudnnSDPA:
    """Turns cuDNN's SDPA off for one call and back on after (entered only while it is on). Two flag writes:
    ``torch.nn.attention.sdpa_kernel`` costs ~12 us per entry, which adds up at every layer of every step."""

    def __enter__(self) -> None:
        torch.backends.cuda.enable_cudnn_sdp(False)

    def __exit__(self, *exc: object) -> None:
        torch.backends.cuda.enable_cudnn_sdp(True)


_NO_CUDNN = _NoCudnnSDPA()


def _sdpa_backends(device: torch.device):
    """SDPA without cuDNN on CUDA; the other backends stay as the caller set them. cuDNN's SDPA, PyTorch's
    first choice on Hopper, plans a graph per key length, and every decode step has a new one: on an H200,
    GPT-J-6B at batch 1 decoded at 96.6 ms/step with it and 33.4 with flash (``results/bench/gpu``)."""
    if device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
        return _NO_CUDNN
    return contextlib.nullcontext()


def keyformer_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``AttentionInterface`` entry: our path for our cache, plain SDPA otherwise (eager math when the model
    soft-caps its logits, which SDPA cannot). ``sliding_window`` (the model's window of this layer, or None)
    is checked against the cache's; ``softcap`` (Gemma 2) caps the logits, ``tanh(x / c) * c``."""
    record = getattr(key, "_kf_record", None)  # a KVzip reconstruction forward: its recorder attends
    if record is not None:  # (keyformer.core.policies.kvzip.Recorder, carried by its cache's keys)
        return record.attention(module, query, key, value, scaling=scaling, **kwargs), None
    layer = getattr(key, "_kf_layer", None)
    softcap = kwargs.get("softcap")
    if layer is None:
        if softcap is not None:
            return _eager(query, key, value, attention_mask, None, scaling, softcap), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    window = kwargs.get("sliding_window")
    known_full = layer.cache.windows_known and layer.window is None  # a window past the context: full
    if window is not None and window != layer.window and not known_full:
        raise RuntimeError(f"layer {layer.layer_idx} slides with window {window} but its cache layer has "
                           f"window {layer.window}: build the cache with keyformer.make_cache(model, ...)")
    return attend(module, layer, query, key, value, scaling=scaling, dropout=dropout, softcap=softcap), None


def attend(module, layer: EvictingLayer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
           scaling: float, dropout: float = 0.0, slopes: torch.Tensor | None = None,
           softcap: float | None = None) -> torch.Tensor:
    """Attention for one layer, then the policy's scoring and the cache's eviction.

    query [B, Hq, q, D]; key/value [B, Hkv, S, D] (S = L + q slots); ``slopes`` [Hq] for ALiBi; ``softcap``:
    logits become ``tanh(x / softcap) * softcap`` before the softmax, and a policy scores these capped
    probabilities (the model's own attention). A sliding layer the policy leaves alone
    (``layer.keeps_window``) is never scored: it keeps its window (:meth:`EvictingLayer._evict_window`).
    Returns [B, q, Hq, Dv].
    """
    policy = layer.cache.policy
    G = query.shape[1] // key.shape[1]
    q = query.shape[2]
    scoring = not layer.keeps_window and scheduler.scores_forward(policy, prompt=layer.length == 0)
    if scoring and layer.length > 0 and q > 1:
        raise NotImplementedError("multi-token forwards over a non-empty evicting cache (chunked prefill) "
                                  "are not supported by scoring policies")
    mask = layer.attention_mask()  # bool, True = attend
    if scoring and q == 1 and layer.length > 0:
        bias = _alibi(layer, slopes) if slopes is not None else None
        out = _decode_with_scores(layer, query, key, value, mask, bias, scaling, softcap)
    elif scoring:
        out = _prompt_with_scores(layer, query, key, value, slopes, scaling, softcap, module=module,
                                  mask=mask)
    elif slopes is not None or softcap is not None:
        bias = None if slopes is None else _alibi(layer, slopes)
        out = _eager(query, key, value, mask, bias, scaling, softcap)
    else:
        if mask is not None and mask.shape[1] > 1 and G > 1:
            mask = mask.repeat_interleave(G, dim=1)
        with _sdpa_backends(query.device):
            out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling)
    if layer.length == 0 and layer.layer_idx == len(layer.cache.layers) - 1:  # the prompt's last layer
        layer.cache.scratch = None  # the prompt blocks' workspace goes before decoding
    layer.evict()
    return out


def _alibi(layer: EvictingLayer, slopes: torch.Tensor) -> torch.Tensor:
    """ALiBi bias at the kept tokens' original distances: slope * (pos_j - newest), [B, Hq, 1, S]."""
    S = layer.length + layer.q_len
    dist = layer.pos[:, :, :S] - layer.cache.cur_pos().view(-1, 1, 1)  # [B, Hkv, S], per head
    dist = dist.repeat_interleave(slopes.numel() // dist.shape[1], dim=1).float()
    return (dist * slopes.view(1, -1, 1)).unsqueeze(2).to(layer.dtype)


def _eager(query, key, value, mask, bias, scaling, softcap=None):
    """MPT's and Gemma 2's own attention math (eager; ALiBi ``bias`` or None; logits soft-capped when
    ``softcap``; finfo.min fill), at kept positions. ``mask`` bool, True = attend, or None (causal)."""
    G = query.shape[1] // key.shape[1]
    if G > 1:
        key, value = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    q, S = query.shape[2], key.shape[2]
    if mask is None and q > 1:  # plain causal (no pads, empty cache)
        mask = torch.ones(q, S, dtype=torch.bool, device=query.device).tril(S - q).view(1, 1, q, S)
    if mask is not None:
        if mask.shape[1] > 1 and G > 1:
            mask = mask.repeat_interleave(G, dim=1)
        scores = scores.masked_fill(~mask, torch.finfo(query.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(value.dtype)
    return torch.matmul(probs, value).transpose(1, 2)


def _decode_with_scores(layer, query, key, value, mask, bias, scaling, softcap=None):
    """One query token: logits once, used for the output and for the policy score. Noise, when the policy
    asks for it, is evaluated at the held slots only."""
    policy = layer.cache.policy
    B, Hq, _, D = query.shape
    Hkv, S = key.shape[1], key.shape[2]
    G = Hq // Hkv
    qg = query.reshape(B, Hkv, G, D)
    logits = torch.matmul(qg, key.transpose(-1, -2)).float() * scaling  # [B, Hkv, G, S]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if bias is not None:
        logits = logits + bias.view(B, Hkv, G, S)
    if mask is not None:
        logits = logits.masked_fill(~mask.view(B, -1, 1, S), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value)  # [B, Hkv, G, Dv]
    ctx = layer.context(query=query, keys=key, values=value, group=G)
    thunk = layer.cache.noise_fn(layer, G)  # computed only if the policy draws it
    ctx.noise = lambda draw=0: thunk(draw).unsqueeze(3)
    s = policy.score(probs.unsqueeze(3), ctx)  # [B, Hkv, G, 1, S]
    policy.accumulate(layer.score[:, :, :S], layer.cache.pool_beams(s.sum((2, 3))), ctx)
    return out.reshape(B, Hq, 1, -1).transpose(1, 2)


def _prompt_with_scores(layer: EvictingLayer, query, key, value, slopes, scaling, softcap=None, *,
                        module=None, mask=None) -> torch.Tensor:
    """Prompt attention and the policy's prompt scores in ONE blocked pass, vectorised over samples.

    Blocks of ``R`` query rows see keys [0, r1) only. Each block's logits are computed once; their softmax
    gives both the attention output (``P @ V``) and the scores, whose column sums (over the scored rows and
    the query heads of a GQA group) are a weighted GEMV. No n x n matrix is held. Prompts are left-padded:
    pad keys are masked, pad rows are never scored; a sliding layer's row i sees keys (i - W, i] only (the
    model's band). ALiBi (MPT) adds ``slope * key position`` (a per-row shift of the true distance, which the
    softmax ignores). Returns [B, N, Hq, Dv].

    A policy that observes only its last ``observe_rows`` rows (SnapKV, TOVA) gets the output from SDPA (the
    flash path, as a policy without scores does; ``module`` and ``mask`` are what it needs) and logits for
    those rows only. With prompt-once beams whose shared scores are noised per beam
    (``cache.prompt_beam_rows()`` = nb), the output is computed once and each beam's scores apart.
    """
    cache, policy = layer.cache, layer.cache.policy
    B, Hq, N, D = query.shape
    Hkv, Dv = key.shape[1], value.shape[-1]
    G = Hq // Hkv
    dev, f32 = query.device, torch.float32
    off = N - cache.n  # [B] left-pad offsets
    kpos = torch.arange(N, device=dev).view(1, -1) - off.view(-1, 1)  # [B, N] real positions (pads < 0)
    padded = not cache.fwd_all_real  # left padding is checked once, when the cache reads the prompt mask
    rows_from = 0 if policy.observe_rows is None else max(0, N - int(policy.observe_rows))
    flash = PREFILL_FLASH and rows_from > 0 and slopes is None and softcap is None and module is not None
    if flash:  # the output of every row from SDPA; the loop below only scores the observed rows
        m = mask.repeat_interleave(G, dim=1) if mask is not None and mask.shape[1] > 1 and G > 1 else mask
        with _sdpa_backends(dev):
            flash_out, _ = sdpa_attention_forward(module, query, key, value, m, scaling=scaling)
    else:
        out = query.new_empty(B, Hkv, G, N, Dv)
    nb = cache.prompt_beam_rows()  # > 1: each beam's noise, so each beam's scores (prompt-once beams)
    Bs = B * nb
    kpos_s = kpos.repeat_interleave(nb, dim=0) if nb > 1 else kpos
    seeds = cache.beam_seed_t if nb > 1 else cache.seed_t
    acc = torch.zeros(Bs, Hkv, 1, N, dtype=f32, device=dev)
    ctx = layer.context(query=query, keys=key, values=value, group=G)
    batched = ("pos", "newest", "recent_window", "query", "keys", "values")
    sctx = ctx if nb == 1 else dataclasses.replace(
        ctx, **{f: getattr(ctx, f).repeat_interleave(nb, dim=0) for f in batched
                if getattr(ctx, f) is not None})
    heads = torch.arange(Hq, device=dev)
    if not flash:  # the values expanded over each GQA group once, after the blocks' part of the workspace
        nx, nq = B * Hq * min(score_rows(B, Hq, N), N) * N, B * Hq * N * D
        V = value.unsqueeze(2).expand(B, Hkv, G, N, Dv)
        if value.dtype == f32:
            V = _workspace(cache, nx + 2 * nq + B * Hq * N * Dv, dev)[nx + 2 * nq :][: B * Hq * N * Dv].view(
                B, Hkv, G, N, Dv).copy_(V)
        else:
            V = V.contiguous()
    blocks = prompt_blocks(query, key, scaling, kpos, rows_from=rows_from if flash else 0,
                           window=layer.window, slopes=slopes, softcap=softcap, padded=padded, scratch=cache)
    for r0, r1, p in blocks:
        if not flash:
            out[:, :, :, r0:r1] = torch.matmul(p.to(V.dtype), V[..., :r1, :])
        a = max(r0, rows_from)
        if a >= r1:
            continue
        sctx.noise, sctx.noised = _prompt_noise(seeds, layer.layer_idx, heads, kpos_s[:, a:r1],
                                                kpos_s[:, :r1], Hkv, G)  # thunks: drawn only if used
        ps = p[:, :, :, a - r0 :]
        s = policy.score(ps.repeat_interleave(nb, dim=0) if nb > 1 else ps, sctx)  # [Bs, Hkv, G, r1 - a, r1]
        _add_column_sums(acc, s, kpos_s[:, a:r1] >= 0)
    state = layer.score[:, :, :N]
    policy.accumulate(state, cache.pool_prompt(acc.view(Bs, Hkv, N)), ctx)
    state.copy_(policy.after_prompt(state, ctx))
    if flash:
        return flash_out
    return out.view(B, Hq, N, Dv).transpose(1, 2)


def _add_column_sums(acc: torch.Tensor, s: torch.Tensor, real_rows: torch.Tensor) -> None:
    """``acc[..., :c] += `` the column sums of the block scores ``s`` [B, Hkv, G, r, c] over its real rows
    (``real_rows`` [B, r] bool) and the G query heads of each KV head, as one weighted GEMV."""
    Bs, Hkv, G, r, c = s.shape
    wrow = real_rows.to(acc.dtype).repeat(1, G).view(Bs, 1, 1, G * r)
    acc[..., :c] += torch.matmul(wrow, s.reshape(Bs, Hkv, G * r, c))


def score_rows(B: int, Hq: int, N: int, chunk_rows: int | None = None) -> int:
    """Query rows per prompt block: ``chunk_rows`` when given, else ``SCORE_ROWS`` lowered (to no fewer than
    16) until a block's fp32 logits, ``B * Hq * rows * N``, fit ``SCORE_BLOCK_FLOATS``."""
    if chunk_rows is not None:
        return _rows_setting(chunk_rows, "chunk_rows")
    return min(SCORE_ROWS, max(16, SCORE_BLOCK_FLOATS // max(1, B * Hq * N)))


def prompt_blocks(query: torch.Tensor, key: torch.Tensor, scaling: float, kpos: torch.Tensor | None = None, *,
                  rows_from: int = 0, chunk_rows: int | None = None, window: int | None = None,
                  slopes: torch.Tensor | None = None, softcap: float | None = None, padded: bool = True,
                  scratch=None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """The causal prompt attention's probabilities, one block of query rows at a time (the one kernel path of
    every attention-reading policy's prompt scores).

    ``query`` [B, Hq, N, D], ``key`` [B, Hkv, N, D] (GQA: Hq = G * Hkv), ``scaling`` the logits' scale,
    ``kpos`` [B, N] each slot's real position (left pads < 0; default: none). Yields ``(r0, r1, p)`` for the
    blocks of rows [r0, r1) from ``rows_from`` on (``chunk_rows`` rows each, default :func:`score_rows`):
    ``p`` [B, Hkv, G, r1 - r0, r1] fp32, the row softmax of the masked logits over keys [0, r1) (0 above the
    causal frontier, at pad keys and outside a sliding ``window``; a pad row sees only itself), with ALiBi
    ``slopes`` [Hq] and ``softcap`` as the model applies them. Every row sees all of its keys in its block,
    so each row's softmax is complete and exact: chunking over query rows needs no online normalisation (only
    chunking over keys would). ``p`` is a view of one workspace reused by the next block: consume it before
    asking for the next. ``scratch``: an object whose ``scratch`` attribute holds that workspace across calls
    (the cache, across the layers of one prompt forward), or None. No ``[N, N]`` matrix is ever held.
    """
    B, Hq, N, D = query.shape
    Hkv = key.shape[1]
    G = Hq // Hkv
    dev, f32 = query.device, torch.float32
    R = score_rows(B, Hq, N, chunk_rows)
    # one workspace: the block's logits (then, in place, its probabilities), the scaled queries and the keys
    # expanded over each GQA group (so a block's matmul copies nothing); kept on ``scratch`` between calls, so
    # the prompt's blocks and layers allocate nothing (allocator and page-fault costs depend on the host)
    nx, nq = B * Hq * min(R, N) * N, B * Hq * N * D
    work = _workspace(scratch, nx + 2 * nq, dev)
    Q = work[nx : nx + nq].view(B, Hkv, G, N, D)
    torch.mul(query.view(B, Hkv, G, N, D).to(f32), scaling, out=Q)  # scaled once (exact for powers of 2)
    K = work[nx + nq : nx + 2 * nq].view(B, Hkv, G, N, D)
    K.copy_(key.unsqueeze(2).expand(B, Hkv, G, N, D))  # fp32 (a bf16 key converts exactly)
    if kpos is None:
        kpos, padded = torch.arange(N, device=dev).expand(B, N), False
    slope = None if slopes is None else slopes.to(dev, f32).view(1, Hkv, G, 1, 1)
    for r0 in range(rows_from, N, R):
        r1 = min(N, r0 + R)
        r = r1 - r0
        x = work[: B * Hkv * G * r * r1].view(B, Hkv, G, r, r1)
        torch.matmul(Q[:, :, :, r0:r1], K[..., :r1, :].transpose(-1, -2), out=x)
        if softcap is not None:
            x.div_(softcap).tanh_().mul_(softcap)
        if slope is not None:
            x += slope * kpos[:, :r1].to(f32).view(B, 1, 1, 1, r1)
        x[..., r0:r1].masked_fill_(_upper(r0, r1, dev)[:, r0:], float("-inf"))
        if window is not None and r1 > window:  # keys the model's window has left
            x.masked_fill_(_outside_band(r0, r1, window, dev), float("-inf"))
        if padded:  # pad keys are invisible; a pad row sees only itself (nothing ever attends to a pad)
            diag = torch.arange(r1, device=dev).view(1, -1) == torch.arange(r0, r1, device=dev).view(-1, 1)
            hide = (kpos[:, :r1] < 0).view(B, 1, r1) & ~diag
            x.masked_fill_(hide.view(B, 1, 1, r, r1), float("-inf"))
        if x.device.type == "cpu":  # in place: the same bits as softmax, and no new block
            yield r0, r1, torch.ops.aten._softmax.out(x, -1, False, out=x)
        else:  # a device's caching allocator reuses blocks anyway (in-place softmax is not checked there)
            yield r0, r1, torch.softmax(x, dim=-1)


def _workspace(scratch, numel: int, device) -> torch.Tensor:
    """A flat fp32 tensor of at least ``numel`` floats: ``scratch.scratch`` when it is one, else a new one
    (kept there when ``scratch`` is not None)."""
    work = getattr(scratch, "scratch", None)
    if work is None or work.numel() < numel or work.device != device:
        work = torch.empty(numel, dtype=torch.float32, device=device)
        if scratch is not None:
            scratch.scratch = work
    return work


def attention_column_scores(query: torch.Tensor, key: torch.Tensor, scaling: float, *,
                            kpos: torch.Tensor | None = None, rows_from: int = 0,
                            score: Callable[[torch.Tensor, int, int], torch.Tensor] | None = None,
                            chunk_rows: int | None = None, window: int | None = None,
                            slopes: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Column sums of the prompt's attention scores without the attention matrix: [B, Hkv, N] fp32.

    For each key j: the sum over the real query rows i >= ``rows_from`` and over the G query heads of each KV
    head of ``score(P)[i, j]``, with ``P`` the causal, masked row softmax of :func:`prompt_blocks` (same
    arguments). ``score(p, a, r1)`` maps a block's probabilities of rows [a, r1) ([B, Hkv, G, r1 - a, r1]; it
    may work in place) to per-entry scores of the same shape: Keyformer draws its noise there from the rows'
    and keys' positions; default the probabilities themselves (H2O's column sums; ``rows_from = N - w``: an
    observation window's, ``N - 1``: the last row's, TOVA). Blocks of ``chunk_rows`` query rows (default
    :func:`score_rows`), so memory is one block, never ``[Hq, N, N]``; the sums equal the engine's prompt
    scores before its ``accumulate``/``after_prompt`` hooks.
    """
    B, _, N, _ = query.shape
    Hkv = key.shape[1]
    real = torch.ones(B, N, dtype=torch.bool, device=query.device) if kpos is None else kpos >= 0
    acc = torch.zeros(B, Hkv, 1, N, dtype=torch.float32, device=query.device)
    for r0, r1, p in prompt_blocks(query, key, scaling, kpos, rows_from=rows_from, chunk_rows=chunk_rows,
                                   window=window, slopes=slopes, softcap=softcap, padded=kpos is not None):
        a = max(r0, rows_from)
        ps = p[:, :, :, a - r0 :]
        _add_column_sums(acc, ps if score is None else score(ps, a, r1), real[:, a:r1])
    return acc.view(B, Hkv, N)


def _prompt_noise(seeds, layer_idx, heads, qpos, kpos, Hkv, G):
    """Thunks ``noise(draw)``: Exp(1) noise of query rows at ``qpos`` [B, r] over keys at ``kpos`` [B, c] ->
    [B, Hkv, G, r, c], and ``noised(probs, draw)``: ``normalise(probs / noise(draw))`` in place without the
    noise field (:func:`keyformer.core.noise.gumbel_fast`); ``noised`` is None where that loop is not in use,
    so no block computes its keys twice."""

    def keys(draw: int) -> tuple[torch.Tensor, torch.Tensor]:
        B, r = qpos.shape
        rk = gumbel.row_keys(gumbel.draw_seeds(seeds, draw), layer_idx, heads, qpos.clamp(min=0))
        return rk.view(B, Hkv, G, r, 1), gumbel.col_keys(kpos.clamp(min=0)).view(B, 1, 1, 1, -1)

    def noise(draw: int = 0) -> torch.Tensor:
        return gumbel.exp_noise_fast(*keys(draw))

    def noised(probs: torch.Tensor, draw: int = 0) -> torch.Tensor | None:
        return gumbel.gumbel_fast(*keys(draw), probs)

    return noise, (noised if gumbel.gumbel_fast_available(kpos) else None)


def _outside_band(r0: int, r1: int, window: int, device) -> torch.Tensor:
    """[r1 - r0, r1] True where key j is older than row i's window: j <= i - window."""
    rows = torch.arange(r0, r1, device=device).view(-1, 1)
    return torch.arange(r1, device=device).view(1, -1) <= rows - window


def _upper(r0: int, r1: int, device) -> torch.Tensor:
    """[r1 - r0, r1] True above the causal frontier of rows r0..r1."""
    return torch.arange(r1, device=device).view(1, -1) > torch.arange(r0, r1, device=device).view(-1, 1)
