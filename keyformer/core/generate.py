"""``generate()`` under a cache policy, with prefill/decode timing and KV-memory measurements."""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel

from . import scheduler
from .cache import KVCache
from .models import layer_windows
from .policies import Policy, Prompt
from .prompt_memo import PromptMemo
from .quant import KVQuant

BEAM_SCORES = ("per_beam", "shared")


@dataclass
class GenerationOutput:
    sequences: torch.Tensor  # [B, T] generated tokens only
    prefill_s: float
    decode_s: float
    n_decode_steps: int
    kv_bytes: list[int]  # per sample: live KV bytes held at the end
    kv_bytes_full: list[int]  # per sample: what a full cache would hold for the same tokens
    kv_tensor_bytes: int  # allocated bytes of the cache's K/V tensors
    cache: KVCache = field(repr=False)
    logits: torch.Tensor | None = field(default=None, repr=False)  # [B, T, V] with output_logits=True
    # prompt_memo: True when the prompt forward was not run but an identical one's uncut cache was cut to this
    # run's budget (prefill_s is then that copy and cut); prompt_forward_s is what the prompt forward took
    prompt_reused: bool = False
    prompt_forward_s: float | None = None
    # per decode step: its seconds (from the clock every run keeps); with step_trace=True also the live KV
    # bytes per sample (mean over the batch's rows) after the prompt (entry 0) and after each decode step
    step_s: list[float] = field(default_factory=list, repr=False)
    step_kv_bytes: list[float] | None = field(default=None, repr=False)


class _StepClock(LogitsProcessor):
    """Records the time of every forward's logits: the first one closes the prompt forward. With a ``cache``,
    also the mean live KV bytes per row after each forward; the seconds that reading takes (``spent``) are
    left out of the times that follow."""

    def __init__(self, sync, cache: KVCache | None = None):
        self.times: list[float] = []
        self.sync = sync
        self.cache = cache
        self.kv: list[float] = []
        self.spent = 0.0

    def __call__(self, input_ids, scores):
        self.sync()
        t = time.perf_counter()
        self.times.append(t - self.spent)
        if self.cache is not None:
            held = self.cache.kv_bytes()
            self.kv.append(sum(held) / max(1, len(held)))
            self.spent += time.perf_counter() - t
        return scores


def left_pad(prompts: Sequence[Sequence[int] | torch.Tensor], pad_id: int = 0,
             device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` [B, max length] of token lists, left-padded with ``pad_id`` (the
    layout every prompt forward here expects)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def make_cache(model: PreTrainedModel, policy: Policy | None, attention_mask: torch.Tensor | None = None, *,
               max_new_tokens: int = 0, seed: int = 0, seeds: list[int] | None = None,
               mode: str = "physical", beam_groups: int = 1, kv_quant: KVQuant | None = None) -> KVCache:
    """A :class:`KVCache` for ``model`` (pass it as ``cache=`` to ``model.generate``)."""
    layers = model.config.get_text_config(decoder=True).num_hidden_layers  # multimodal Gemma 3: the text's
    cache = KVCache(policy, layers, prompt_mask=attention_mask,
                    max_new_tokens=max_new_tokens, seed=seed, seeds=seeds, mode=mode, beam_groups=beam_groups,
                    kv_quant=kv_quant, windows=layer_windows(model.config))  # sliding layers: their window
    cache.prepared = cache.policy.prepare(model)  # what the rule needs of the model (RoPE, ALiBi)
    if scheduler.prepares_on_prompt(cache.policy):
        if kv_quant is None and model.config.model_type != "mpt":
            _prepare_after_prompt(model, cache)
        else:  # quantized rows or MPT's wrapped attention: the prompt runs once more, before the real one
            _prepare_at_prompt(model, cache)
    return cache


def _prepare_after_prompt(model: PreTrainedModel, cache: KVCache) -> None:
    """Run ``policy.prepare(model, Prompt(input_ids, attention_mask, kv=cache.prompt_kv))`` (KVzip's
    reconstruction over the prompt's own keys and values) right after each prompt forward that uses
    ``cache``, then the cut it defers (``cache.defer_prompt_cut``): the prompt runs once. A forward hook that
    holds the cache weakly and removes itself once the cache is gone; it acts only after a prompt forward
    (so a :meth:`KVCache.reset` cache is prepared again)."""
    cache.defer_prompt_cut = True

    def act(c: KVCache, module, ids: torch.Tensor, mask: torch.Tensor) -> None:
        first = c.layers[0]
        if first.pending and first.length == 0:
            c.prepared = c.policy.prepare(module, Prompt(ids, mask, kv=c.prompt_kv))
            c.cut_prompt()

    _hook_prompt(model, cache, act, after=True)


def _prepare_at_prompt(model: PreTrainedModel, cache: KVCache) -> None:
    """Run ``policy.prepare(model, Prompt(input_ids, attention_mask))`` (an extra forward, KVzip's
    reconstruction) just before the first forward that uses ``cache``, its prompt; its result becomes
    ``cache.prepared``. A
    one-shot forward pre-hook (it holds the cache weakly and removes itself), so ``generate()``,
    ``model.generate`` and a bare forward all run it, inside the prompt's time."""

    def act(c: KVCache, module, ids: torch.Tensor, mask: torch.Tensor) -> bool:
        if not c.layers[0].is_initialized:  # not a cache that adopted a prepared prompt (PromptMemo)
            c.prepared = c.policy.prepare(module, Prompt(ids, mask))
        return True  # once

    _hook_prompt(model, cache, act, after=False)


def _hook_prompt(model: PreTrainedModel, cache: KVCache, act, *, after: bool) -> None:
    """A forward hook (``after``) or pre-hook on ``model`` that calls ``act(cache, model, input_ids,
    attention_mask)`` on each forward given ``cache`` (as ``cache=`` or ``past_key_values=``); it holds the
    cache weakly, and removes itself once the cache is gone or ``act`` returns True."""
    ref = weakref.ref(cache)

    def hook(module, args, kwargs, *output):
        c = ref()
        if c is None:
            handle.remove()
            return
        if (kwargs.get("cache") or kwargs.get("past_key_values")) is not c:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        if act(c, module, ids, torch.ones_like(ids) if mask is None else mask):
            handle.remove()

    register = model.register_forward_hook if after else model.register_forward_pre_hook
    handle = register(hook, with_kwargs=True)


_BATCH_KWARGS = ("attention_mask", "position_ids", "token_type_ids", "inputs_embeds")


@contextlib.contextmanager
def _prefill_once(model: PreTrainedModel, cache: KVCache):
    """While active, transformers' prefill (its prompt forward over ``B * nb`` rows, beam ``r`` of sample
    ``b`` at row ``b * nb + r``) runs on the ``B`` distinct rows only; the cache is then expanded to the
    beams and the logits repeated. A no-op unless ``cache.prompt_expand`` > 1."""
    nb = cache.prompt_expand
    if nb == 1:
        yield
        return
    original = model._prefill

    def prefill(input_ids, generation_config, model_kwargs, *args, **kw):
        rows = input_ids.shape[0]
        if rows % nb:
            raise ValueError(f"prefill batch {rows} is not a multiple of num_beams={nb}")
        sub = dict(model_kwargs)
        for name in _BATCH_KWARGS:
            t = sub.get(name)
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] == rows:
                sub[name] = t[::nb]
        out = original(input_ids[::nb], generation_config, sub, *args, **kw)
        cache.expand_prompt_rows()
        out.logits = out.logits.repeat_interleave(nb, dim=0)
        return out

    model._prefill = prefill  # an instance attribute shadows the method for this call only
    try:
        yield
    finally:
        del model._prefill


def _memo_key(memo: PromptMemo | None, model: PreTrainedModel, cache: KVCache, ids: torch.Tensor,
              mask: torch.Tensor | None, **settings) -> str | None:
    """``memo``'s key for this prompt forward, or None without a memo."""
    if memo is None:
        return None
    return memo.key(model, cache.policy, ids, mask, windows=[lay.window for lay in cache.layers], **settings)


def _forward_and_keep(forward, cache: KVCache, memo: PromptMemo, key: str, last_logits) -> tuple[Any, float]:
    """Run the prompt ``forward()`` with the cut deferred, keep a copy of the uncut cache in ``memo`` (taken
    at the start of :meth:`KVCache.cut_prompt`, after a policy's ``prepare`` hook where it has one), then cut.
    Returns the forward's output and its seconds."""
    import copy

    held: list[KVCache] = []
    was = cache.defer_prompt_cut
    cache.defer_prompt_cut = True
    cache.on_prompt_cut = lambda c: held.append(copy.deepcopy(c))
    t0 = time.perf_counter()
    out = forward()
    if cache.on_prompt_cut is not None:  # no hook cut the prompt: cut it here
        cache.cut_prompt()
    seconds = time.perf_counter() - t0
    cache.defer_prompt_cut = was
    memo.put(key, held[0], last_logits(out), seconds)
    return out, seconds


@contextlib.contextmanager
def _prefill_shared(model: PreTrainedModel, cache: KVCache, memo: PromptMemo | None, key: str | None):
    """While active, transformers' prefill is served from ``memo`` (a copy of the uncut prompt cache, cut to
    this cache's budget, and the prompt's last logits), or runs and leaves its uncut cache there. A no-op
    without a key."""
    if key is None:
        yield
        return
    from transformers.modeling_outputs import CausalLMOutputWithPast

    entry = memo.lookup(key)
    original = model._prefill

    def prefill(input_ids, generation_config, model_kwargs, *args, **kw):
        if entry is not None:
            cache.adopt_prompt(entry.cache)
            cache.cut_prompt()
            return CausalLMOutputWithPast(logits=entry.logits.clone(), cache=cache)
        out, memo.last_forward_s = _forward_and_keep(
            lambda: original(input_ids, generation_config, model_kwargs, *args, **kw), cache, memo, key,
            lambda o: o.logits[:, -1:].clone())
        return out

    model._prefill = prefill
    try:
        yield
    finally:
        del model._prefill


@torch.inference_mode()
def generate(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             policy: Policy | None, max_new_tokens: int = 64, num_beams: int = 1, seed: int = 0,
             seeds: list[int] | None = None, mode: str = "physical",
             eos_token_id: int | list[int] | None = None,
             pad_token_id: int | None = None, min_new_tokens: int = 0, beam_scores: str = "per_beam",
             kv_quant: KVQuant | None = None, prompt_once: bool = True, prompt_memo: PromptMemo | None = None,
             step_trace: bool = False, **kwargs) -> GenerationOutput:
    """Greedy, beam or sampled generation with ``policy`` over a left-padded batch (``do_sample=True`` with
    ``temperature``/``top_p``/``top_k`` in ``kwargs``: transformers' sampling, drawn from torch's generator).

    ``seed``/``seeds`` set Keyformer's Gumbel noise (one seed for all samples, or one per sample);
    ``mode`` is ``physical`` or ``mask`` (simulation); ``beam_scores`` is ``per_beam`` (each beam row its own
    scores and kept set) or ``shared`` (the authors' code: beam copies noised independently, scores summed,
    one kept set per sample); ``kv_quant`` stores the held K/V quantized (:mod:`keyformer.core.quant`).
    ``prompt_once`` (default): with beams, the prompt forward runs once per sample and the cache is then
    expanded to the beams (transformers would run it once per beam); ``False`` keeps transformers' way (the
    reference the tests compare with: same sequences). ``prompt_memo``
    (:class:`keyformer.core.prompt_memo.PromptMemo`, greedy only): run a prompt forward once for every
    budget of the same policy (same outputs; ``prompt_reused`` says whether this run ran its own).
    ``step_trace``: also record the live KV bytes after every forward (``step_kv_bytes``; each decode step's
    seconds are always in ``step_s``). Extra ``kwargs`` go to ``model.generate``.
    """
    if prompt_memo is not None and num_beams != 1:
        raise ValueError(f"prompt_memo shares greedy prompt forwards; num_beams={num_beams} needs None")
    if beam_scores not in BEAM_SCORES:
        raise ValueError(f"beam_scores={beam_scores!r} is unknown; valid: {', '.join(BEAM_SCORES)}")
    if kwargs.get("pixel_values") is not None:
        raise ValueError("pixel_values: image inputs are not supported (the evicting cache does not model "
                         "attention over image tokens, bidirectional in Gemma 3); pass text-only prompts")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    cache = make_cache(model, policy, attention_mask, max_new_tokens=max_new_tokens, seed=seed, seeds=seeds,
                       mode=mode, beam_groups=num_beams if beam_scores == "shared" else 1, kv_quant=kv_quant)
    if num_beams > 1 and prompt_once:
        cache.prompt_expand = num_beams
    # the key (its weights fingerprint, once per model object) is not part of the timed prefill
    key = _memo_key(prompt_memo, model, cache, input_ids, attention_mask, kind="generate", seed=seed,
                    seeds=seeds, mode=mode, horizon=max_new_tokens, kv_quant=repr(kv_quant))
    sync = torch.cuda.synchronize if input_ids.device.type == "cuda" else (lambda: None)
    clock = _StepClock(sync, cache if step_trace else None)
    pad = pad_token_id if pad_token_id is not None else (eos_token_id if isinstance(eos_token_id, int) else 0)
    sync()
    t0 = time.perf_counter()
    if eos_token_id is not None:
        kwargs["eos_token_id"] = eos_token_id
    with _prefill_once(model, cache), _prefill_shared(model, cache, prompt_memo, key):
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, cache=cache, max_new_tokens=max_new_tokens,
            min_new_tokens=min_new_tokens, num_beams=num_beams, do_sample=kwargs.pop("do_sample", False),
            pad_token_id=pad,
            logits_processor=LogitsProcessorList([clock]), return_dict_in_generate=True, **kwargs,
        )
    sync()
    t_end = time.perf_counter() - clock.spent
    times = clock.times
    prefill = times[0] - t0 if times else t_end - t0
    decode = t_end - times[0] if times else 0.0
    return GenerationOutput(
        sequences=out.sequences[:, input_ids.shape[1]:], prefill_s=prefill, decode_s=decode,
        n_decode_steps=max(0, len(times) - 1), kv_bytes=cache.kv_bytes(), kv_bytes_full=cache.kv_bytes_full(),
        kv_tensor_bytes=cache.tensor_bytes(), cache=cache,
        logits=torch.stack(out.logits, dim=1) if getattr(out, "logits", None) else None,
        prompt_reused=key is not None and prompt_memo.last_hit,
        prompt_forward_s=prompt_memo.last_forward_s if key is not None else prefill,
        step_s=[b - a for a, b in zip(times, times[1:], strict=False)],
        step_kv_bytes=clock.kv if step_trace else None,
    )


@dataclass
class QuestionOutput:
    """One question answered over a compressed context (:func:`generate_from_context`)."""

    tokens: list[int]  # generated tokens (up to and including eos)
    question_s: float  # reading the question tokens
    decode_s: float  # generating the answer
    n_decode_steps: int  # forwards after the question (one per generated token but the last)
    kv_bytes: int  # live KV bytes held at the end
    kv_bytes_full: int  # what a full cache would hold for the same tokens


@torch.inference_mode()
def generate_from_context(model: PreTrainedModel, context_ids: torch.Tensor, questions: list[list[int]],
                          policy: Policy | None, max_new_tokens: int = 64, seed: int = 0,
                          mode: str = "physical", eos_token_id: int | None = None,
                          kv_quant: KVQuant | None = None,
                          prompt_memo: PromptMemo | None = None) -> tuple[float, list[QuestionOutput]]:
    """Query-agnostic generation: compress the context once, then answer each question from a copy of it.

    ``context_ids`` [1, N]: one unpadded context. Its prefill is the prompt forward of ``policy`` (its prompt
    cut happens here, without any question). Each question (token ids) then runs on a deep copy of that cache:
    its tokens are fed one per forward, exactly as decode steps (a step-wise policy keeps evicting one token
    per token read; a prompt-only policy appends them), then the answer is generated greedily, one token per
    forward, until ``eos_token_id`` or ``max_new_tokens``. The cache's horizon (Keyformer's tau schedule, the
    full cache's preallocation) is the longest question plus ``max_new_tokens``; decode steps count from the
    end of the context. Returns (context prefill seconds, one :class:`QuestionOutput` per question).
    ``prompt_memo`` shares the context's forward across budgets as in :func:`generate` (its ``last_hit``
    says whether this call ran it; the prefill seconds are then the copy and cut).
    """
    import copy

    if context_ids.shape[0] != 1:
        raise ValueError(f"context_ids has batch {context_ids.shape[0]}; one context at a time (batch 1)")
    if not questions or any(len(q) == 0 for q in questions):
        raise ValueError("questions must be a non-empty list of non-empty token lists")
    horizon = max(len(q) for q in questions) + max_new_tokens
    cache = make_cache(model, policy, torch.ones_like(context_ids), max_new_tokens=horizon, seed=seed,
                       seeds=[seed], mode=mode, kv_quant=kv_quant)
    device = context_ids.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(c: KVCache, token: int) -> torch.Tensor:
        ids = torch.tensor([[token]], dtype=torch.long, device=device)
        return model(input_ids=ids, cache=c, use_cache=True).logits[0, -1]

    key = _memo_key(prompt_memo, model, cache, context_ids, None, kind="context", seed=seed, mode=mode,
                    horizon=horizon, kv_quant=repr(kv_quant))
    entry = prompt_memo.lookup(key) if key is not None else None

    def forward():
        return model(input_ids=context_ids, cache=cache, use_cache=True, logits_to_keep=1)

    sync()
    t0 = time.perf_counter()
    if entry is not None:
        cache.adopt_prompt(entry.cache)
        cache.cut_prompt()
    elif key is not None:
        _, prompt_memo.last_forward_s = _forward_and_keep(forward, cache, prompt_memo, key, lambda o: None)
    else:
        forward()
    sync()
    prefill_s = time.perf_counter() - t0
    outs = []
    for q in questions:
        c = copy.deepcopy(cache)
        t1 = time.perf_counter()
        for tok in q:
            logits = step(c, tok)
        sync()
        t2 = time.perf_counter()
        gen: list[int] = []
        steps = 0
        while True:
            nxt = int(logits.argmax())
            gen.append(nxt)
            if nxt == eos_token_id or len(gen) >= max_new_tokens:
                break
            logits = step(c, nxt)
            steps += 1
        sync()
        outs.append(QuestionOutput(tokens=gen, question_s=t2 - t1, decode_s=time.perf_counter() - t2,
                                   n_decode_steps=steps, kv_bytes=int(c.kv_bytes()[0]),
                                   kv_bytes_full=int(c.kv_bytes_full()[0])))
    return prefill_s, outs
