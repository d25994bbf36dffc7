"""KVzip (Kim et al. 2025, arXiv 2505.23416; kvpress ``KVzipPress``): query-agnostic prompt compression scored
by how much the model needs each cached token to *reconstruct the context*.

Before generation, one extra forward runs over ``prompt + repeat_ids + prompt`` (the model asked to repeat its
context). ``repeat_ids = "auto"`` (default) is kvpress's instruction ``"\\n\\nRepeat the previous context
exactly."`` followed by the chat template's assistant header (or ``"\\n"``), tokenized by the tokenizer stored
with the model (``config.name_or_path``, local files only); where none is stored (tiny random test models) the
prompt is repeated with no instruction, as with ``None``; a list gives the ids. The score of prompt token
``j`` in (layer, KV head) is the maximum, over the queries of everything after the prompt (the repeat
instruction and the repeated prompt, as the authors' ``KVScore`` and kvpress take every row of the repeat
input) and the query heads of the group, of its softmax attention probability (the softmax over the prompt and
the tokens after it so far, causal). The first ``n_sink`` positions are always kept (kvpress gives them the
highest score plus 1). Prompts longer than ``chunk_size`` (2048) are reconstructed chunk by chunk as kvpress
does (:func:`reconstruction_scores`).

The cut is per layer and head-adaptive: a layer keeps ``H * k`` (head, token) pairs, the highest-scored across
its ``H`` KV heads, with no per-head safeguard (kvpress's ``layerwise=True``; its default,
``layerwise=False``, shares one budget across *all* layers, which our per-layer budgets cannot express; see
docs/policies_2025.md). Every generated token is then kept (prompt compression, as kvpress).

**Cost.** The reconstruction forward covers about twice the prompt (``2 n + r`` tokens, its attention over up
to ``2 n + r`` keys) on top of the normal prefill: roughly one to three extra prefills of compute (kvpress:
"2-3 times the initial prefilling cost"). ``scripts/kvzip_cost.py`` measures it. It runs per sample on the
unpadded prompt (so a sample's result does not depend on its batchmates), from a one-shot forward pre-hook
that :func:`keyformer.core.generate.make_cache` installs; a cache made otherwise refuses with one line."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .adakv import AdaKVMixin
from .base import Context, Policy

RECORD_IMPL = "keyformer_kvzip_record"
_RECORD: dict[str, Any] = {}


def _record_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager causal attention (batch 1, no pads) that records, per KV head, the max over the rows at or after
    ``_RECORD["from"]`` and the group's query heads of their probabilities at the keys of the chunk being
    reconstructed (:func:`_chunk_max`; one chunk: keys [0, ``_RECORD["n"]``))."""
    B, Hq, T, D = query.shape
    Hkv = key.shape[1]
    G = Hq // Hkv
    k, v = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    logits = (query.float() @ k.float().transpose(-1, -2)) * (scaling if scaling is not None else D**-0.5)
    if kwargs.get("softcap"):  # Gemma 2 logit soft-capping
        logits = torch.tanh(logits / kwargs["softcap"]) * kwargs["softcap"]
    i = torch.arange(T, device=query.device)
    hide = i.view(1, -1) > i.view(-1, 1)  # causal
    if kwargs.get("sliding_window"):  # a sliding layer sees keys (i - W, i]
        hide |= i.view(1, -1) <= i.view(-1, 1) - kwargs["sliding_window"]
    logits = logits.masked_fill(hide, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    s = _chunk_max(probs[:, :, _RECORD["from"]:])
    _RECORD["scores"][module.layer_idx] = s.view(B, Hkv, G, -1).amax(dim=2)
    return (probs.to(v.dtype) @ v).transpose(1, 2), None


def _chunk_max(rows: torch.Tensor) -> torch.Tensor:
    """[B, H, R, T] probabilities of the rows after the prompt -> [B, H, end - start]: per key of the chunk
    ``[start, end)`` of the prompt being reconstructed, the max over the rows of its probability in the
    softmax restricted to the sinks ``[0, sink)``, the chunk and everything after the prompt (kvpress's
    ``_compute_cross_attention``): the probabilities renormalised over those keys. A single chunk covering the
    whole prompt restricts nothing (the plain probabilities)."""
    n, start, end, sink = _RECORD["n"], _RECORD["start"], _RECORD["end"], _RECORD["sink"]
    if start == 0 and end == n:
        return rows[..., :n].amax(dim=2)
    keep = torch.zeros(rows.shape[-1], dtype=torch.bool, device=rows.device)
    keep[:sink] = True
    keep[start:end] = True
    keep[n:] = True
    r = rows.float() * keep
    r = r / r.sum(dim=-1, keepdim=True)
    return r[..., start:end].amax(dim=2)


AttentionInterface.register(RECORD_IMPL, _record_attention)
AttentionMaskInterface.register(RECORD_IMPL, sdpa_mask)


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
                          chunk_size: int | None = None, n_sink: int = 0) -> list[torch.Tensor]:
    """Per layer [Hkv, n]: KVzip's scores of one unpadded prompt ``ids`` [n]. With one chunk (``chunk_size``
    None or >= n): one forward over ``ids + repeat + ids``, the max over every row after the prompt (the
    instruction's included). Longer prompts are reconstructed chunk by chunk as kvpress does: for chunk ``c``
    (prompt positions ``[c * chunk_size, ...)``), one forward over ``ids + extra_c + chunk_c``
    (:class:`RepeatPieces`; a plain id list is ``first`` and ``later`` alike, no suffix), each key of the
    chunk scored by its max probability, over the rows after the prompt, in the softmax restricted to the
    first ``min(n_sink, start)`` keys, the chunk and the rows after the prompt (:func:`_chunk_max`)."""
    n = ids.numel()
    pieces = repeat_ids if isinstance(repeat_ids, RepeatPieces) else RepeatPieces(
        tuple(repeat_ids or ()), tuple(repeat_ids or ()))
    chunk = n if chunk_size is None or chunk_size >= n else int(chunk_size)
    layers = model.config.get_text_config().num_hidden_layers
    out: list[torch.Tensor] | None = None
    for c in range((n + chunk - 1) // chunk):
        start, end = c * chunk, min(n, (c + 1) * chunk)
        extra = torch.tensor(pieces.extra(ids, c, chunk), dtype=ids.dtype, device=ids.device)
        seq = torch.cat([ids, extra, ids[start:end]]).view(1, -1)
        _RECORD.update(scores=[None] * layers, n=n, start=start, end=end, sink=min(n_sink, start),
                       **{"from": n})
        _record_forward(model, seq)
        if out is None:
            out = [sc.new_zeros(sc.shape[1], n) for sc in _RECORD["scores"]]
        for o, sc in zip(out, _RECORD["scores"], strict=True):
            o[:, start:end] = sc[0]
    assert out is not None
    return out


def _record_forward(model: Any, seq: torch.Tensor) -> None:
    """One forward over ``seq`` [1, T] with the recording attention (MPT: its eager attention, wrapped)."""
    if model.config.model_type == "mpt":  # MPT's own eager attention returns its probabilities: wrap it
        blocks = model.transformer.blocks
        saved = [b.attn.forward for b in blocks]
        for b in blocks:
            b.attn.forward = _mpt_recorder(b.attn)
        try:
            model(input_ids=seq, use_cache=False)
        finally:
            for b, f in zip(blocks, saved, strict=True):
                b.attn.forward = f
    else:
        impl = model.config._attn_implementation
        model.set_attn_implementation(RECORD_IMPL)
        try:
            model(input_ids=seq, use_cache=False)
        finally:
            model.set_attn_implementation(impl)


def _mpt_recorder(attn: Any):
    orig = attn._kf_orig_forward

    def forward(hidden_states, position_bias, cache=None, attention_mask=None, **kwargs):
        out, probs = orig(hidden_states, position_bias, cache=None, attention_mask=attention_mask, **kwargs)
        _RECORD["scores"][attn.layer_idx] = _chunk_max(probs.float()[:, :, _RECORD["from"]:])
        return out, probs

    return forward


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
    compress: ClassVar[str] = "prompt"
    needs_context: ClassVar[bool] = True

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

    def prepare(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, Any]:
        """The reconstruction scores of every sample, per layer [B, Hkv, N] indexed by prompt position (the
        extra forward; see the module docstring)."""
        B, N = input_ids.shape
        out: list[torch.Tensor] | None = None
        repeat = (self.repeat_ids if self.repeat_ids != "auto"
                  else instruction_pieces(model.config.name_or_path))
        for b in range(B):
            ids = input_ids[b][attention_mask[b].bool()]
            per_layer = reconstruction_scores(model, ids, repeat, self.chunk_size, self.n_sink)
            if out is None:
                out = [s.new_zeros(B, s.shape[0], N) for s in per_layer]
            for li, s in enumerate(per_layer):
                out[li][b, :, : s.shape[-1]] = s
        return {"scores": out}

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        info = ctx.model_info
        if not isinstance(info, dict) or "scores" not in info:
            raise ValueError("policy 'kvzip' scores the prompt in a reconstruction forward that the cache of "
                             "keyformer.core.generate.make_cache runs; valid: make_cache / generate")
        s = info["scores"][ctx.layer].to(state.device)
        pos = ctx.pos
        if s.shape[0] != pos.shape[0]:  # beam rows: sample-major copies of each sample
            s = s.repeat_interleave(pos.shape[0] // s.shape[0], dim=0)
        prio = s.gather(-1, pos.clamp(min=0, max=s.shape[-1] - 1)).double()
        return prio.masked_fill(pos < self.n_sink, torch.inf)
