"""CUDA-graph capture of the steady decode step (greedy), with the eager step as the fallback.

Once every layer holds its budget, a decode step of a step-evicting policy has static shapes and no host
synchronisation (:mod:`keyformer.core.cache`), so the whole step (model, attention, scoring, eviction and
the greedy argmax) can be recorded once as a CUDA graph and replayed: one launch per step instead of
hundreds of small kernels.

What changes between steps, and how a replay sees it:

* **Tensors updated in place** (the cache's K/V, positions, scores): the graph reads and writes the same
  buffers, nothing to do.
* **Tensors the cache re-binds each step** (``next_pos``, ``cur``, ``recent_floor``, ...): found by comparing
  the cache's tensor attributes before and after the capture. The graph reads the old object ("in") and
  writes a new one ("out"); before every replay but the first, "out" is copied into "in".
* **Python numbers**: each layer's ``seen`` counter is advanced by hand after a replay; the token's position
  is read inside the graph from ``next_pos``; ``cache_position`` is a buffer filled before each replay.
  Keyformer's temperature anneals with the step, so while capturing its ``tau`` returns a device scalar
  (:class:`DeviceTau`) refilled before each replay; a policy whose ``tau`` is constant keeps its float.

Not captured (eager, with the reason returned): CPU tensors, ``full`` and prompt-compressing policies (the
attended length grows every step), mask simulation, and any step before every layer is steady.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from . import scheduler
from .cache import KVCache


def capture_reason(cache: KVCache) -> str | None:
    """Why this cache's next decode step cannot be captured, or None when it can."""
    refusal = scheduler.graph_refusal(cache.policy)
    if refusal is not None:
        return refusal
    if cache.mode != "physical":
        return "mask simulation never shrinks the cache"
    layers = [lay for lay in cache.layers if lay.is_initialized]
    if len(layers) != len(cache.layers) or not all(lay.steady for lay in layers):
        return "not every layer holds its budget yet (no static shapes)"
    if layers[0].device.type != "cuda":
        return f"CUDA graphs need a CUDA device (cache on {layers[0].device.type})"
    return None


def _objects(cache: KVCache) -> list[Any]:
    return [cache, *cache.layers]


def _tensor_attrs(cache: KVCache) -> dict[tuple[int, str], torch.Tensor]:
    return {(i, k): v for i, obj in enumerate(_objects(cache)) for k, v in vars(obj).items()
            if isinstance(v, torch.Tensor)}


class DeviceTau:
    """A float-like temperature for a graph capture: ``1.0 / tau`` returns the device scalar ``inv``
    (refilled before each replay), and ``tau != 1.0`` is True (``x ** 1`` would be ``x`` anyway)."""

    def __init__(self, inv: torch.Tensor):
        self.inv = inv

    def __rtruediv__(self, other: float) -> torch.Tensor:
        if other != 1.0:
            raise TypeError("DeviceTau supports only 1.0 / tau")
        return self.inv

    def __ne__(self, other: object) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def eager_step(model: Any, cache: KVCache, tok: torch.Tensor) -> torch.Tensor:
    """One greedy decode step, eager: the next tokens [B, 1] after ``tok`` [B, 1]. The same call as the
    captured one (explicit positions: the token's real position, ``next_pos``)."""
    seen = cache.layers[0].seen
    out = model(input_ids=tok, position_ids=cache.next_pos.view(-1, 1).clone(),
                cache_position=torch.full((1,), seen, device=tok.device), cache=cache, logits_to_keep=1)
    return out.logits[:, -1].argmax(-1, keepdim=True)


class DecodeGraph:
    """The captured greedy decode step of ``model`` over ``cache`` (which must be capturable, see
    :func:`capture_reason`). ``step(tok)`` replays it and returns the next tokens [B, 1] (a buffer the next
    replay overwrites: copy it to keep it). Construct right after an eager step."""

    def __init__(self, model: Any, cache: KVCache, tok: torch.Tensor):
        reason = capture_reason(cache)
        if reason is not None:
            raise RuntimeError(f"cannot capture this decode step: {reason}")
        self.model, self.cache = model, cache
        dev = tok.device
        self.tok = tok.clone()
        self.cache_position = torch.tensor([cache.layers[0].seen], device=dev)
        pol = cache.policy
        self.tau_fn = getattr(pol, "tau", None)
        h = cache.max_new_tokens
        anneals = callable(self.tau_fn) and self.tau_fn(0, h) != self.tau_fn(1, h)
        self.inv_tau = torch.zeros((), dtype=torch.float32, device=dev) if anneals else None
        self._fill_tau(cache.step_of(cache.layers[0]) + 1)
        before = _tensor_attrs(cache)
        seen = [lay.seen for lay in cache.layers]
        self.graph = torch.cuda.CUDAGraph()
        if self.inv_tau is not None:
            pol.tau = lambda step, horizon=None: DeviceTau(self.inv_tau)  # instance attribute while capturing
        try:
            with torch.cuda.graph(self.graph):
                out = model(input_ids=self.tok, position_ids=cache.next_pos.view(-1, 1).clone(),
                            cache_position=self.cache_position, cache=cache, logits_to_keep=1)
                self.next_tok = out.logits[:, -1].argmax(-1, keepdim=True)
        finally:
            if self.inv_tau is not None:
                del pol.tau
        after = _tensor_attrs(cache)
        # re-bound tensors: the graph reads `before` ("in") and writes `after` ("out")
        self.rebound = [(before[k], after[k]) for k in before if k in after and after[k] is not before[k]]
        for t_in, t_out in self.rebound:
            if t_in.shape != t_out.shape or t_in.dtype != t_out.dtype:
                raise RuntimeError(f"a cache tensor changed shape in the captured step: {tuple(t_in.shape)} "
                                   f"-> {tuple(t_out.shape)}; the step is not static")
        self.seen = seen  # each layer's counter before the first replay (the capture advanced them once)
        self.first = True

    def _fill_tau(self, step: int) -> None:
        if self.inv_tau is not None:
            self.inv_tau.fill_(1.0 / self.tau_fn(step, self.cache.max_new_tokens))

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """Replay one decode step after ``tok`` [B, 1]; returns the next tokens [B, 1]."""
        if not self.first:
            for t_in, t_out in self.rebound:
                t_in.copy_(t_out)
        for lay, s in zip(self.cache.layers, self.seen, strict=True):
            lay.seen = s + 1
        self.seen = [s + 1 for s in self.seen]
        self.cache_position.fill_(self.seen[0] - 1)
        self._fill_tau(self.cache.step_of(self.cache.layers[0]))
        if tok.data_ptr() != self.tok.data_ptr():
            self.tok.copy_(tok)
        self.graph.replay()
        self.first = False
        return self.next_tok


def greedy_decode(model: Any, cache: KVCache, tok: torch.Tensor, steps: int, capture: bool = True
                  ) -> tuple[torch.Tensor, dict[str, Any]]:
    """``steps`` greedy decode steps after the first token ``tok`` [B, 1] (the prompt forward already ran;
    with left pads, give it generate()'s positions, ``mask.cumsum(-1) - 1``: the steps use real positions).
    With ``capture``, eager steps run until the step is capturable, one more (warm-up), then the rest replay
    a CUDA graph. Returns the tokens [B, steps] and {"captured_steps", "eager_steps", "reason"}."""
    toks: list[torch.Tensor] = []
    info: dict[str, Any] = {"captured_steps": 0, "eager_steps": 0, "reason": None}
    graph: DecodeGraph | None = None
    for _ in range(steps):
        if graph is not None:
            tok = graph.step(tok)
            toks.append(tok.clone())
            info["captured_steps"] += 1
            continue
        warm = capture and info["eager_steps"] >= 1 and capture_reason(cache) is None
        if warm:  # the step before the capture runs on a side stream (lazy per-stream initialisations)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                tok = eager_step(model, cache, tok)
            torch.cuda.current_stream().wait_stream(side)
        else:
            tok = eager_step(model, cache, tok)
        toks.append(tok)
        info["eager_steps"] += 1
        if warm:
            graph = DecodeGraph(model, cache, tok)
        elif capture:
            info["reason"] = capture_reason(cache)
    if graph is not None:
        info["reason"] = None
    elif not capture:
        info["reason"] = "capture off"
    return (torch.cat(toks, dim=1) if toks else tok.new_empty(tok.shape[0], 0)), info


def iter_rebound(graph: DecodeGraph) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The (in, out) tensor pairs a replay carries from one step to the next (for inspection and tests)."""
    yield from graph.rebound
