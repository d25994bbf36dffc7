"""One prompt forward for every budget: uncut prompt caches shared by the runs of a budget sweep.

A policy scores the prompt the same way whatever its budget: the prompt attends in full, and its scores,
positions and noise depend on the model, the prompt, the policy's other settings, the seeds, the mode and
the horizon, never on ``k``. Only the cut after the prompt does. So a sweep over budgets can run the prompt
forward (the dominant cost at long prompts) once, keep the cache uncut, and cut a copy for each budget.

:class:`PromptMemo` holds those uncut caches, least recently used first out, within ``max_bytes``. Pass one
to :func:`keyformer.core.generate.generate` or ``generate_from_context`` as ``prompt_memo=``: a miss runs
the prompt forward and keeps a copy of its uncut cache; a hit copies that cache, sets this run's budget and
cuts it (:meth:`KVCache.adopt_prompt`), without a forward. Outputs are identical to runs without the memo
(tests compare every registered policy on four architectures). Greedy decoding only (``num_beams`` 1).

The key fingerprints the model's weights once per model object (sums of every parameter): weights changed
in place afterwards are not noticed, so build a new memo after editing a model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from .cache import KVCache
from .policies import Policy

_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_fingerprint(model: torch.nn.Module) -> str:
    """A digest of ``model``'s config, dtype, device and weights (per-parameter sums of values and squares,
    in float64), computed once per model object."""
    fp = _FINGERPRINTS.get(model)
    if fp is None:
        h = hashlib.sha256()
        config = getattr(model, "config", None)
        h.update((config.to_json_string() if config is not None else type(model).__name__).encode())
        with torch.no_grad():
            for name, p in model.state_dict().items():
                d = p.detach().double()
                h.update(f"{name}{tuple(p.shape)}{p.dtype}{p.device}{float(d.sum())!r}"
                         f"{float((d * d).sum())!r}".encode())
        fp = _FINGERPRINTS[model] = h.hexdigest()
    return fp


def policy_key(policy: Policy) -> str:
    """The policy's class and every setting but ``budget`` and ``recent`` (they only set the cut)."""
    fields = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)
              if f.name not in ("budget", "recent")}
    return f"{type(policy).__module__}.{type(policy).__qualname__}{sorted(fields.items())!r}"


@dataclass
class Entry:
    cache: KVCache  # uncut, after the prompt forward (never decoded)
    logits: torch.Tensor | None  # [B, 1, V] the prompt forward's last logits (generate), None (a context)
    forward_s: float  # the prompt forward's measured seconds
    nbytes: int


class PromptMemo:
    """Uncut prompt caches keyed by everything a prompt forward depends on except the budget (see module
    docstring). ``hits``/``misses`` count lookups; ``last_hit`` says whether the latest run used a kept prompt
    and ``last_forward_s`` what that prompt forward took when it ran."""

    def __init__(self, max_bytes: int = 2 << 30):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes!r} must be an int >= 0")
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, Entry] = OrderedDict()
        self.hits = self.misses = 0
        self.last_hit = False
        self.last_forward_s: float | None = None

    def key(self, model: torch.nn.Module, policy: Policy, input_ids: torch.Tensor,
            attention_mask: torch.Tensor | None, **settings: Any) -> str:
        """The digest of model, policy (less its budget), prompt ids and mask, and ``settings`` (seeds, mode,
        horizon, K/V quantization, ...: whatever else the run passes to the cache)."""
        h = hashlib.sha256()
        h.update(model_fingerprint(model).encode())
        h.update(policy_key(policy).encode())
        for t in (input_ids, attention_mask):
            t = torch.ones_like(input_ids) if t is None else t
            h.update(f"{tuple(t.shape)}".encode())
            h.update(t.detach().to("cpu", torch.long).contiguous().numpy().tobytes())
        h.update(repr(sorted(settings.items())).encode())
        return h.hexdigest()

    def get(self, key: str) -> Entry | None:
        entry = self.entries.get(key)
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
            self.entries.move_to_end(key)
        return entry

    def lookup(self, key: str) -> Entry | None:
        """:meth:`get`, recording in ``last_hit``/``last_forward_s`` what this run will report."""
        entry = self.get(key)
        self.last_hit, self.last_forward_s = entry is not None, entry.forward_s if entry is not None else None
        return entry

    def put(self, key: str, cache: KVCache, logits: torch.Tensor | None, forward_s: float) -> None:
        """Keep ``cache`` (an uncut copy, owned by the memo from now on); drop the least recently used
        entries beyond ``max_bytes``. A cache larger than ``max_bytes`` is not kept."""
        nbytes = sum(t.numel() * t.element_size() for lay in cache.layers if lay.is_initialized
                     for t in (*(getattr(lay, n) for n in lay.slots), lay.pos, lay.score, lay.alive))
        self.entries.pop(key, None)
        if nbytes > self.max_bytes:
            return
        self.entries[key] = Entry(cache, logits, forward_s, nbytes)
        while sum(e.nbytes for e in self.entries.values()) > self.max_bytes:
            self.entries.popitem(last=False)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())
