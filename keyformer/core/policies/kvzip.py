"""KVzip (Kim et al. 2025, arXiv 2505.23416; kvpress ``KVzipPress``): query-agnostic prompt compression scored
by how much the model needs each cached token to *reconstruct the context*.

Before generation, the model reads ``prompt + repeat_ids + prompt`` (asked to repeat its context; the prompt's
keys and values computed once and cached, the repeat read over them). ``repeat_ids = "auto"`` (default) is
kvpress's instruction ``"\\n\\nRepeat the previous context exactly."`` followed by the chat template's
assistant header (or ``"\\n"``), tokenized by the tokenizer stored with the model (``config.name_or_path``,
local files only); where none is stored (tiny random test models) the prompt is repeated with no instruction,
as with ``None``; a list gives the ids. The score of prompt token ``j`` in (layer, KV head) is the maximum,
over the queries of everything after the prompt (the repeat instruction and the repeated prompt, as the
authors' ``KVScore`` and kvpress take every row of the repeat input) and the query heads of the group, of its
softmax attention probability (the softmax over the prompt and the tokens after it so far, causal). The first
``n_sink`` positions are always kept (kvpress gives them the highest score plus 1). Prompts longer than
``chunk_size`` (2048) are reconstructed chunk by chunk as kvpress does (:func:`reconstruction_scores`).

The cut is per layer and head-adaptive: a layer keeps ``H * k`` (head, token) pairs, the highest-scored across
its ``H`` KV heads, with no per-head safeguard (kvpress's ``layerwise=True``; its default,
``layerwise=False``, shares one budget across *all* layers, which our per-layer budgets cannot express; see
docs/policies_2025.md). Every generated token is then kept (prompt compression, as kvpress).

**Cost.** After the real prompt forward (its cut deferred: ``KVCache.defer_prompt_cut``), each chunk's repeat
rows (``r + chunk`` tokens) run over the prompt's keys and values as that forward computed them, with the
recording attention, an fp32 softmax over up to ``n + r + chunk`` keys in blocks of query rows (kvpress: "2-3
times the initial prefilling cost"); then the prompt is cut (measured: ``results/bench/kvzip_cost/``). It
runs per sample over views of that sample's real positions (pads left out), from the policy's
``prepare(model, prompt)``, which a forward hook that :func:`keyformer.core.generate.make_cache` installs
calls; a cache made otherwise refuses with one line. With a quantized cache (whose stored rows are not the
prompt's) and on MPT (whose attention is wrapped, not an ``AttentionInterface``), a one-shot pre-hook first
runs each sample's unpadded prompt once more.

**Recording.** Each reconstruction forward records into a :class:`Recorder` of its own, which it reaches
through its cache alone: the keys the cache's layers return carry it (``_kf_record``, as an evicting layer
is found through ``_kf_layer``), and the project's attention
(:func:`keyformer.core.attention.keyformer_attention`, installed by
:func:`keyformer.core.models.prepare_model`) hands it that layer's attention; MPT's wrapped attention hands it
its probabilities. Nothing global is registered, no module state is written and the model's attention
implementation is never switched: two models, or two calls, share nothing."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers.cache_utils import DynamicLayer

from .adakv import AdaKVMixin
from .base import PROMPT, Context, Policy, Prompt, Schedule

ROWS_PER_BLOCK = 256  # at most this many query rows' logits held at once (one layer: Hq x rows x S floats)
# and at most this many floats per block tensor (8 MB): larger blocks are fresh mmaps of the allocator, whose
# page faults (13M a 4k reconstruction at 256 rows, 0.2M at 64) cost more than the attention they hold
BLOCK_FLOATS = 2 * 2**20


class Recorder:
    """What one reconstruction forward (one chunk ``[start, end)`` of a prompt of ``n`` tokens) records: per
    layer, the scores of the chunk's keys, [1, Hkv, end - start] (``scores``). Made by
    :func:`reconstruction_scores` for that forward alone, and reached only through the forward's cache
    (:func:`_recording_cache`): the keys its layers return carry it as ``_kf_record``, and the project's
    attention (:func:`keyformer.core.attention.keyformer_attention`) hands such a layer's attention to
    :meth:`attention`; MPT's wrapped attention (:mod:`keyformer.core.models`) hands it its probabilities
    (:meth:`probs`). Nothing global is registered or written, so two models or two calls share nothing."""

    def __init__(self, layers: int, n: int, start: int, end: int, sink: int):
        self.n, self.start, self.end, self.sink = n, start, end, sink
        self.scores: list[torch.Tensor | None] = [None] * layers

    def attention(self, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  scaling: float | None = None, **kwargs: Any) -> torch.Tensor:
        """Causal attention (batch 1, no pads; fp32 softmax, in blocks of query rows: ``ROWS_PER_BLOCK``
        at most, fewer where their logits would pass ``BLOCK_FLOATS``) that records, per KV head, the max over
        the rows after the prompt (absolute positions >= ``n``) and the group's query heads of their
        probabilities at the keys of the chunk being reconstructed, in the softmax restricted to the sinks
        ``[0, sink)``, the chunk ``[start, end)`` and everything after the prompt (kvpress's
        ``_compute_cross_attention``: the probabilities renormalised over those keys; a single chunk covering
        the whole prompt restricts nothing). The queries are the last ``T`` of the ``S`` key positions
        (``S > T``: the prompt's keys come from the cache). ``sliding_window`` and ``softcap`` (Gemma 2) as
        the model passes them. Returns [B, T, Hq, D]."""
        B, Hq, T, D = query.shape
        Hkv, S = key.shape[1], key.shape[2]
        G = Hq // Hkv
        n, start, end, sink = self.n, self.start, self.end, self.sink
        first = max(0, n - (S - T))  # the first query row after the prompt
        scale = scaling if scaling is not None else D**-0.5
        softcap = kwargs.get("softcap")  # Gemma 2 logit soft-capping
        kt = key.repeat_interleave(G, dim=1).float().transpose(-1, -2)
        v = value.repeat_interleave(G, dim=1).float()
        j = torch.arange(S, device=query.device).view(1, -1)
        out = query.new_empty(B, Hq, T, D, dtype=torch.float32)
        best = None
        rows_per_block = max(1, min(ROWS_PER_BLOCK, BLOCK_FLOATS // (B * Hq * S)))
        for r0 in range(0, T, rows_per_block):
            r1 = min(T, r0 + rows_per_block)
            i = torch.arange(S - T + r0, S - T + r1, device=query.device).view(-1, 1)  # the rows' positions
            hide = j > i  # causal
            if kwargs.get("sliding_window"):  # a sliding layer sees keys (i - W, i]
                hide |= j <= i - kwargs["sliding_window"]
            logits = (query[:, :, r0:r1].float() * scale) @ kt
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            probs = torch.softmax(logits.masked_fill_(hide, float("-inf")), dim=-1)
            out[:, :, r0:r1] = probs @ v
            if r1 > first:
                rows = probs[:, :, max(r0, first) - r0:]
                chunk = rows[..., start:end]
                if not (start == 0 and end == n):  # renormalise over the sinks, the chunk and the rows after
                    kept = rows[..., :sink].sum(-1, keepdim=True) + chunk.sum(-1, keepdim=True)
                    chunk = chunk / (kept + rows[..., n:].sum(-1, keepdim=True))
                part = chunk.amax(dim=2)
                best = part if best is None else torch.maximum(best, part)
        assert best is not None, "no query row after the prompt"
        self.scores[module.layer_idx] = best.view(B, Hkv, G, -1).amax(dim=2)
        return out.to(value.dtype).transpose(1, 2)

    def probs(self, layer_idx: int, probs: torch.Tensor) -> None:
        """MPT's path (its own eager attention returns the probabilities [B, H, T, T] of the whole sequence):
        the same restricted maximum as :meth:`attention`'s, over the rows after the prompt."""
        n, start, end, sink = self.n, self.start, self.end, self.sink
        rows = probs.float()[:, :, n:]
        if start == 0 and end == n:
            self.scores[layer_idx] = rows[..., :n].amax(dim=2)
            return
        keep = torch.zeros(rows.shape[-1], dtype=torch.bool, device=rows.device)
        keep[:sink] = True
        keep[start:end] = True
        keep[n:] = True
        r = rows * keep
        r = r / r.sum(dim=-1, keepdim=True)
        self.scores[layer_idx] = r[..., start:end].amax(dim=2)


@dataclass(frozen=True)
class RepeatPieces:
    """The token ids around each reconstructed chunk (kvpress's ``KVzipPress.prepare``): chunk 0 is preceded
    by ``first`` (instruction + assistant header); chunk ``c >= 1`` by ``later`` (the "part of the context"
    instruction), the last ``overlap`` tokens of chunk ``c - 1``, then ``suffix`` (the assistant header)."""

    first: tuple[int, ...] = ()
    later: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    overlap: int = 8

    def extra(self, ids: torch.Tensor, c: int, chunk: int) -> list[int]:
        if c == 0:
            return list(self.first)
        prev = ids[(c - 1) * chunk: c * chunk][-self.overlap:].tolist()
        return [*self.later, *prev, *self.suffix]


@torch.inference_mode()
def reconstruction_scores(model: Any, ids: torch.Tensor, repeat_ids: list[int] | RepeatPieces | None,
                          chunk_size: int | None = None, n_sink: int = 0,
                          prompt_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                          ) -> list[torch.Tensor]:
    """Per layer [Hkv, n]: KVzip's scores of one unpadded prompt ``ids`` [n]. With one chunk (``chunk_size``
    None or >= n): one forward over ``ids + repeat + ids``, the max over every row after the prompt (the
    instruction's included). Longer prompts are reconstructed chunk by chunk as kvpress does: for chunk ``c``
    (prompt positions ``[c * chunk_size, ...)``), one forward over ``ids + extra_c + chunk_c``
    (:class:`RepeatPieces`; a plain id list is ``first`` and ``later`` alike, no suffix), each key of the
    chunk scored by its max probability, over the rows after the prompt, in the softmax restricted to the
    first ``min(n_sink, start)`` keys, the chunk and the rows after the prompt (:class:`Recorder`).
    ``prompt_kv``: the prompt's keys and values per layer ([1, Hkv, n, D] each), as the real prompt forward
    computed them (the cache's, :meth:`KVCache.prompt_kv`); None runs the prompt here first. Each forward
    records into a :class:`Recorder` of its own, reached through its cache; ``model`` must be prepared
    (:func:`keyformer.core.models.prepare_model`), whose attention hands the recorder each layer."""
    n = ids.numel()
    pieces = repeat_ids if isinstance(repeat_ids, RepeatPieces) else RepeatPieces(
        tuple(repeat_ids or ()), tuple(repeat_ids or ()))
    chunk = n if chunk_size is None or chunk_size >= n else int(chunk_size)
    layers = model.config.get_text_config().num_hidden_layers
    out: list[torch.Tensor] | None = None
    prompt = _prompt_kv(model, ids) if prompt_kv is None else prompt_kv
    for c in range((n + chunk - 1) // chunk):
        start, end = c * chunk, min(n, (c + 1) * chunk)
        extra = torch.tensor(pieces.extra(ids, c, chunk), dtype=ids.dtype, device=ids.device)
        tail = torch.cat([extra, ids[start:end]])
        rec = Recorder(layers, n, start, end, min(n_sink, start))
        if prompt is None:  # MPT: the whole sequence, its own eager attention (wrapped) hands over its rows
            model(input_ids=torch.cat([ids, tail]).view(1, -1), cache=_recording_cache(rec, layers),
                  use_cache=False)
        else:  # the prompt's keys and values from its one forward; only the repeat rows run here
            model(input_ids=tail.view(1, -1), cache=_recording_cache(rec, layers, prompt), use_cache=True,
                  logits_to_keep=1)
        if any(s is None for s in rec.scores):
            raise RuntimeError("KVzip's reconstruction forward did not reach keyformer's attention at every "
                               "layer; call keyformer.prepare_model(model) and keep its attention "
                               "implementation")
        if out is None:
            out = [sc.new_zeros(sc.shape[1], n) for sc in rec.scores]
        for o, sc in zip(out, rec.scores, strict=True):
            o[:, start:end] = sc[0]
    assert out is not None
    return out


def _prompt_kv(model: Any, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The prompt's keys and values at every layer (every position, the sliding layers' windows applied by
    the recorder's mask), from one forward with the model's own attention; None for MPT (its attention is
    wrapped, not an ``AttentionInterface``: the prompt is run again with each chunk)."""
    if model.config.model_type == "mpt":
        return None
    from transformers import DynamicCache

    cache = DynamicCache()
    model(input_ids=ids.view(1, -1), cache=cache, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


class _RecordingLayer(DynamicLayer):
    """One layer of a reconstruction forward's cache: the prompt's keys and values (``kv``; None: MPT, whose
    forward runs the whole sequence), read and never grown. A forward over them attends to the prompt
    followed by its own rows (concatenated for that layer's attention only, then dropped), so each chunk's
    forward finds the prompt as it was and nothing is copied into the cache; the keys returned carry the
    forward's :class:`Recorder` as ``_kf_record`` (how the project's attention finds it, as it finds an
    evicting layer through ``_kf_layer``)."""

    def __init__(self, recorder: Recorder, kv: tuple[torch.Tensor, torch.Tensor] | None):
        super().__init__()
        self.recorder = recorder
        if kv is not None:
            self.keys, self.values = kv
            self.device, self.is_initialized = self.keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.is_initialized:
            key_states = torch.cat([self.keys, key_states], dim=-2)
            value_states = torch.cat([self.values, value_states], dim=-2)
        key_states._kf_record = self.recorder
        return key_states, value_states


def _recording_cache(recorder: Recorder, layers: int,
                     kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
    """The cache of one reconstruction forward: a ``DynamicCache`` of :class:`_RecordingLayer`, one per layer
    (over the views ``kv``, not copies: peak memory is the prompt's keys and values once plus one layer's
    prompt + chunk), carrying ``recorder`` (``_kf_record``: MPT's wrapped attention reads it there)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layers = [_RecordingLayer(recorder, None if kv is None else kv[i]) for i in range(layers)]
    cache._kf_record = recorder
    return cache


INSTRUCTION = "\n\nRepeat the previous context exactly."
PART_INSTRUCTION = "\n\nRepeat the part of the previous context exactly, starting with"


@functools.lru_cache(maxsize=8)
def instruction_pieces(path: str) -> RepeatPieces | None:
    """kvpress's repeat inputs in the tokenizer stored with the model at ``path`` (local files only): chunk 0
    after the instruction and the chat template's assistant header (``"\\n"`` without a template), later
    chunks after the "part" instruction, the previous chunk's last 8 tokens and the header; None where no
    tokenizer is stored there (tiny random test models)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError):
        return None
    suffix = "\n"
    if tok.chat_template is not None:  # the assistant header, as kvpress extracts it
        dummy = "dummy context"
        sep = "\n" + "#" * len(dummy)
        text = tok.apply_chat_template([{"role": "user", "content": dummy + sep}], add_generation_prompt=True,
                                       tokenize=False)
        suffix = text.split(sep)[1]

    def enc(t: str) -> tuple[int, ...]:
        return tuple(tok.encode(t, add_special_tokens=False))

    return RepeatPieces(enc(INSTRUCTION) + enc(suffix), enc(PART_INSTRUCTION), enc(suffix))


def instruction_ids(path: str) -> list[int] | None:
    """The ids before the first (or only) reconstructed chunk: kvpress's instruction + assistant header."""
    pieces = instruction_pieces(path)
    return None if pieces is None else list(pieces.first)


@dataclass
class KVzipPolicy(AdaKVMixin, Policy):
    recent: float = 0.0
    n_sink: int = 4
    repeat_ids: list[int] | str | None = "auto"
    chunk_size: int | None = 2048  # prompts longer than this are reconstructed chunk by chunk (kvpress)
    alpha_safeguard: float = 0.0  # KVzip shares a layer's budget among its heads with no safeguard

    name: ClassVar[str] = "kvzip"
    paper: ClassVar[str] = "Kim et al. 2025, arXiv 2505.23416"
    family: ClassVar[str] = "context reconstruction"
    cuts: ClassVar[Schedule] = PROMPT
    reads: ClassVar[frozenset[str]] = frozenset({"tensors", "prompt"})  # prepare runs the reconstruction

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_ada()
        if isinstance(self.n_sink, bool) or not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise ValueError(f"n_sink={self.n_sink!r} must be an int >= 0")
        if isinstance(self.repeat_ids, str):
            if self.repeat_ids != "auto":
                raise ValueError(f"repeat_ids={self.repeat_ids!r} is unknown; "
                                 "valid: auto, null or a list of token ids")
        elif self.repeat_ids is not None:
            self.repeat_ids = [int(t) for t in self.repeat_ids]
        if self.chunk_size is not None and (isinstance(self.chunk_size, bool)
                                            or not isinstance(self.chunk_size, int) or self.chunk_size < 1):
            raise ValueError(f"chunk_size={self.chunk_size!r} must be an int >= 1 or null (one chunk)")

    def prepare(self, model: Any, prompt: Prompt | None = None) -> dict[str, Any] | None:
        """The reconstruction scores of every sample, per layer [B, Hkv, N] indexed by prompt position (the
        extra forward; see the module docstring). ``prompt.kv(b)``: sample ``b``'s prompt keys and values per
        layer from the real prompt forward (:meth:`KVCache.prompt_kv`; None: the prompt runs again here).
        Without a prompt (the cache being made): nothing yet."""
        if prompt is None:
            return None
        input_ids, attention_mask, prompt_kv = prompt.input_ids, prompt.attention_mask, prompt.kv
        B, N = input_ids.shape
        out: list[torch.Tensor] | None = None
        repeat = (self.repeat_ids if self.repeat_ids != "auto"
                  else instruction_pieces(model.config.name_or_path))
        for b in range(B):
            ids = input_ids[b][attention_mask[b].bool()]
            per_layer = reconstruction_scores(model, ids, repeat, self.chunk_size, self.n_sink,
                                              None if prompt_kv is None else prompt_kv(b))
            if out is None:
                out = [s.new_zeros(B, s.shape[0], N) for s in per_layer]
            for li, s in enumerate(per_layer):
                out[li][b, :, : s.shape[-1]] = s
        return {"scores": out}

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        info = ctx.prepared
        if not isinstance(info, dict) or "scores" not in info:
            raise ValueError("policy 'kvzip' scores the prompt in a reconstruction forward that the cache of "
                             "keyformer.core.generate.make_cache runs; valid: make_cache / generate")
        s = info["scores"][ctx.layer].to(state.device)
        pos = ctx.pos
        if s.shape[0] != pos.shape[0]:  # beam rows: sample-major copies of each sample
            s = s.repeat_interleave(pos.shape[0] // s.shape[0], dim=0)
        prio = s.gather(-1, pos.clamp(min=0, max=s.shape[-1] - 1)).double()
        return prio.masked_fill(pos < self.n_sink, torch.inf)
