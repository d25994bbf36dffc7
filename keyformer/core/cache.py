"""A transformers ``Cache`` that physically evicts, per sample and per KV head.

Layout of one layer (physical mode)::

    keys, values : [B, H, C, D]   preallocated buffers (C = capacity); with ``kv_quant`` the uint8 codes of
                                  each token, plus kscale/kzero/vscale/vzero [B, H, C, D / group] (fp16)
    pos          : [B, H, C]      original (logical) position of each slot, -1 = empty or pad
    score        : [B, H, C]      the policy's per-slot state (fp32)
    count        : [B]            live slots of each sample; they are slots [0, count[b]) in every head

``L = count.max()`` slots are in use. New tokens are written at slots [L, L + q); after attention the layer
evicts down to the budget and compacts the survivors back into [0, count[b]). After the prompt the buffers are
re-allocated at the budget plus one spare slot, so the bytes held are the bytes of the tensors.

**Steady state.** Once every sample holds its budget (always, right after the prompt, unless an absolute
budget exceeds a prompt), a decode step has static shapes and no host synchronisation. Per layer: write the
new token into the spare slot ``L``, attend over the ``L + 1`` slots, fold its scores into the state, pick
one victim per (sample, head) among the non-recent slots (lowest priority, ties: the oldest), and move the
spare into the victim's slot. The full policy preallocates ``prompt + max_new_tokens`` slots and only writes
the new token.

Mask-simulation mode (``mode="mask"``, what the authors' code does) applies the same policy but never moves
or frees anything: evicted slots are only masked out of attention. It is the naive reference in the tests.

Positions are the tokens' real positions (pads excluded), so kept tokens keep their original RoPE phase
(baked into cached keys), learned absolute position, or ALiBi distance.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from . import noise as hashnoise
from . import scheduler
from .policies import FullPolicy, Policy
from .policies.base import Context
from .quant import KVQuant

MODES = ("physical", "mask")
LONG_MAX = torch.iinfo(torch.long).max
KV = ("keys", "values")
KV_QUANT = ("keys", "values", "kscale", "kzero", "vscale", "vzero")


class EvictingLayer(CacheLayerMixin):
    """One layer's evicting cache; the policy logic lives in :mod:`keyformer.core.policies`."""

    is_sliding = False
    is_croppable = False
    window: int | None = None  # sliding layer: the model's window W (a query at position i sees (i - W, i])
    keeps_window = False  # a sliding layer the policy leaves alone: it holds its W - 1 newest tokens

    def __init__(self, cache: KVCache, layer_idx: int):
        super().__init__()
        self.cache, self.layer_idx = cache, layer_idx
        self.seen = 0  # logical columns processed (padded prompt + generated): what generate() expects
        self.length = 0  # physical slots in use (L)
        self.dense = True  # physical mode: every slot in [0, L) is live for every sample
        self.steady = False  # physical mode: every (sample, head) holds exactly its budget
        self.ragged = False  # physical mode: the heads of a sample hold different numbers of tokens (Ada-KV)
        self.k_bh: torch.Tensor | None = None  # [B, H] per-head budgets fixed at the prompt cut (Ada-KV)
        self.pending = False  # update() ran but evict() has not yet

    # -- transformers cache API -----------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, H, _, D = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.dims = D, value_states.shape[-1]
        qz = self.cache.kv_quant
        if qz is None:
            self.slots = KV
            self.keys = key_states.new_empty(B, H, 0, D)
            self.values = value_states.new_empty(B, H, 0, value_states.shape[-1])
        else:
            self.slots = KV_QUANT
            for d in self.dims:
                qz.check_dim(d)
            u8 = dict(dtype=torch.uint8, device=self.device)
            f16 = dict(dtype=torch.float16, device=self.device)
            (kd, vd), g = self.dims, qz.group_size
            self.keys = torch.empty(B, H, 0, qz.code_width(kd), **u8)
            self.values = torch.empty(B, H, 0, qz.code_width(vd), **u8)
            self.kscale = torch.empty(B, H, 0, kd // g, **f16)
            self.kzero = torch.empty(B, H, 0, kd // g, **f16)
            self.vscale = torch.empty(B, H, 0, vd // g, **f16)
            self.vzero = torch.empty(B, H, 0, vd // g, **f16)
        self.pos = torch.empty(B, H, 0, dtype=torch.long, device=self.device)
        self.score = torch.empty(B, H, 0, dtype=torch.float32, device=self.device)
        self.alive = torch.empty(B, H, 0, dtype=torch.bool, device=self.device)  # mask mode only
        self.count = torch.zeros(B, dtype=torch.long, device=self.device)
        self.k_bh = None
        self.state: dict = {}  # the policy's per-layer state (policies that read tensors), one generation
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # The model's own mask is not used by our attention; keep its shape consistent anyway.
        return self.length + query_length, max(0, self.seen - self.length)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if not self.is_initialized:
            return
        idx = beam_idx.to(self.device)
        for name in (*self.slots, "pos", "score", "alive", "count"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        if self.k_bh is not None:
            self.k_bh = self.k_bh.index_select(0, idx)
        for key, val in getattr(self, "state", {}).items():  # batch-major tensors follow their rows
            if isinstance(val, torch.Tensor):
                self.state[key] = val.index_select(0, idx)

    def reorder_rows(self, idx: torch.Tensor, rows: torch.Tensor) -> None:
        """Beam reorder (``idx`` [B]: row b becomes a copy of row idx[b]) that copies only the ``rows`` [m]
        whose source differs (idx[b] != b): in place, gathered before written, so equal to
        :meth:`reorder_cache`."""
        if not self.is_initialized or rows.numel() == 0:
            return
        if 2 * rows.numel() > idx.numel():  # most rows move: one gather per tensor is cheaper
            self.reorder_cache(idx)
            return
        src = idx.index_select(0, rows)
        for name in (*self.slots, "pos", "score", "alive", "count"):
            t = getattr(self, name)
            t.index_copy_(0, rows, t.index_select(0, src))
        if self.k_bh is not None:
            self.k_bh = self.k_bh.index_select(0, idx)
        for key, val in getattr(self, "state", {}).items():
            if isinstance(val, torch.Tensor):
                self.state[key] = val.index_select(0, idx)

    def reset(self) -> None:
        self.is_initialized, self.seen, self.length, self.dense, self.steady = False, 0, 0, True, False
        self.ragged, self.k_bh, self.state = False, None, {}
        self.keys = self.values = None

    # -- storage --------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    def _reserve(self, needed: int) -> None:
        """Grow the buffers to hold ``needed`` slots (amortised doubling; a no-op in steady state)."""
        if needed <= self.capacity:
            return
        cap = max(needed, self.cache.capacity_hint(needed), 2 * self.capacity)
        if self.window is not None and self.cache.mode == "physical":  # a sliding layer holds at most W slots
            limit = self.window  # in a decode step (the mask simulation keeps them all), and never more than
            prompt = getattr(self.cache, "prompt_len", None)  # the prompt and the generation when known
            if self.cache.max_new_tokens and prompt:
                limit = min(limit, prompt + self.cache.max_new_tokens)
            cap = max(needed, min(cap, limit))
        grow = cap - self.capacity
        def pad(t: torch.Tensor, fill: float | int | bool) -> torch.Tensor:
            return torch.cat([t, t.new_full((*t.shape[:2], grow, *t.shape[3:]), fill)], dim=2)

        for name in self.slots:
            setattr(self, name, pad(getattr(self, name), 0))
        self.pos, self.score, self.alive = pad(self.pos, -1), pad(self.score, 0.0), pad(self.alive, False)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``q`` new tokens at slots [L, L + q); return views over the L + q slots to attend."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif self.pending and self.length == 0 and self.cache.defer_prompt_cut:
            raise RuntimeError(f"policy {self.cache.policy.name!r} cuts the prompt after scoring it in one "
                               "more forward, which the hook of keyformer.make_cache runs when the prompt "
                               "forward gets this cache as cache= or past_key_values=; it did not run")
        elif self.pending:
            raise RuntimeError("the model's attention did not run our evicting path on the previous forward; "
                               "call keyformer.prepare_model(model) and keep its attention implementation")
        B, H, q, _ = key_states.shape
        L = self.length
        self._reserve(L + q)
        rows = self._rows(key_states, value_states)
        for name, r in zip(self.slots, rows, strict=True):
            getattr(self, name)[:, :, L : L + q] = r
        # [B, q] each
        new_pos, new_real = self.cache.new_positions(self.layer_idx, self.seen, q, B, self.device)
        self.pos[:, :, L : L + q] = new_pos.unsqueeze(1)
        # a one-token step moves its row into the victim's slot; a prompt's rows are in the buffers already,
        # and holding them would keep every layer's uncut prompt K/V alive through the whole prompt forward
        self.new_kv = rows if q == 1 else None
        # a new slot's policy state (score) is 0 already: slots past the held length always hold 0 (the
        # buffers grow and compact with zeros; a cut that leaves the slot past the length behind resets it)
        if self.cache.mode == "mask":
            self.alive[:, :, L : L + q] = new_real.unsqueeze(1)
        self.seen += q
        self.q_len, self.new_real, self.pending = q, new_real, True
        if self.slots is KV:
            k, v = self.keys[:, :, : L + q], self.values[:, :, : L + q]
        elif L == 0:  # the prompt attends in full precision; the cache keeps its quantized rows
            k, v = key_states, value_states
        else:
            qz, S = self.cache.kv_quant, L + q
            k = qz.dequantize(self.keys[:, :, :S], self.kscale[:, :, :S], self.kzero[:, :, :S], self.dtype)
            v = qz.dequantize(self.values[:, :, :S], self.vscale[:, :, :S], self.vzero[:, :, :S], self.dtype)
        k._kf_layer = self  # how our attention function finds this layer (see keyformer.core.attention)
        return k, v

    def _rows(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What is stored for new tokens, in the order of ``self.slots``."""
        qz = self.cache.kv_quant
        if qz is None:
            return key_states, value_states
        kc, ks, kz = qz.quantize(key_states)
        vc, vs, vz = qz.quantize(value_states)
        return kc, vc, ks, kz, vs, vz

    # -- what the attention needs -----------------------------------------------------------------------
    @property
    def policy(self) -> Policy:
        return self.cache.policy

    def context(self, **tensors) -> Context:
        """The :class:`Context` of this forward (the slots [0, L + q))."""
        return self.context_at(self.length + self.q_len, **tensors)

    def context_at(self, S: int, **tensors) -> Context:
        """The :class:`Context` over the slots [0, S)."""
        cache = self.cache
        if scheduler.reads_tensors(cache.policy):  # rules on keys and queries (KeyDiff, Expected Attention)
            tensors.setdefault("keys", self.held_keys(S))
            tensors.update(live=self.held(S), layer_state=self.state, prepared=cache.prepared)
        return Context(layer=self.layer_idx, num_layers=len(cache.layers), step=cache.step_of(self),
                       horizon=cache.max_new_tokens, pos=self.pos[:, :, :S], newest=cache.cur_pos(),
                       recent_window=cache.w, **tensors)

    def held(self, S: int) -> torch.Tensor:
        """[B, H, S] bool: the slots [0, S) that hold a token (mask mode: not yet evicted)."""
        live = self.pos[:, :, :S] >= 0
        return live & self.alive[:, :, :S] if self.cache.mode == "mask" else live

    def held_keys(self, S: int) -> torch.Tensor:
        """[B, H, S, D] the keys of the slots [0, S) in the model's dtype (dequantized if stored
        quantized)."""
        if self.slots is KV:
            return self.keys[:, :, :S]
        qz = self.cache.kv_quant
        return qz.dequantize(self.keys[:, :, :S], self.kscale[:, :, :S], self.kzero[:, :, :S], self.dtype)

    def live_mask(self) -> torch.Tensor:
        """[B, H or 1, L + q] bool: slots this forward's queries may attend to (before causality)."""
        S = self.length + self.q_len
        if self.cache.mode == "mask":
            return self.alive[:, :, :S]
        if self.ragged:  # per-head budgets: each head has its own dead slots
            return self.pos[:, :, :S] >= 0
        return (self.pos[:, 0, :S] >= 0).unsqueeze(1)  # physical: dead slots and pads hold position -1

    def attention_mask(self) -> torch.Tensor | None:
        """Bool mask [B, 1 or H, q, L + q] for this forward, or None when plain causal attention is exact."""
        L, q = self.length, self.q_len
        band = self.window is not None and q > 1 and L + q > self.window  # sliding layer, multi-token forward
        if (self.cache.mode == "physical" and self.dense and self.cache.fwd_all_real and (q == 1 or L == 0)
                and not band):
            return None  # decode over a dense cache, or an unpadded prompt: is_causal handles it
        live = self.live_mask().unsqueeze(2)  # [B, h, 1, L + q]
        if q == 1:
            return live
        rows = torch.arange(q, device=self.device).view(q, 1)
        cols = torch.arange(L + q, device=self.device).view(1, -1) - L
        mask = live & (cols <= rows)  # old slots (cols < 0) are in every new token's past
        if band:  # the model's window: a query at position i sees keys at positions (i - W, i]
            qpos = self.pos[:, :1, L : L + q].unsqueeze(-1)  # [B, 1, q, 1]
            mask = mask & (self.pos[:, :1, : L + q].unsqueeze(2) > qpos - self.window)
        # a pad row would see nothing (NaN in SDPA): let it see itself; nothing ever attends to a pad
        return mask | (cols == rows)

    # -- eviction ---------------------------------------------------------------------------------------
    def budget(self) -> torch.Tensor:
        """Tokens this layer keeps: [B, H] per-head budgets (Ada-KV, after the prompt) or [B, 1]; a sliding
        layer: at most its window minus one ([B, 1] when it keeps its window)."""
        if self.keeps_window:
            return torch.full_like(self.count, self.window - 1).view(-1, 1)
        k = self.k_bh if self.k_bh is not None else self.cache.layer_k(self.layer_idx).view(-1, 1)
        return k if self.window is None else k.clamp(max=self.window - 1)

    def evict(self) -> None:
        """Cut the cache back to the budget after this forward's attention (see module docstring). With
        ``cache.defer_prompt_cut`` the prompt's cut waits (the layer stays pending) for
        :meth:`KVCache.cut_prompt`, after the whole prompt forward. A policy with an eviction hook
        (``on_evict``: merge-on-evict, threshold eviction) cuts every decode step through the general path
        below, so that the hook sees each cut's kept set before the evicted slots go; without one, nothing
        changes (one attribute read)."""
        cache, q, L = self.cache, self.q_len, self.length
        if L == 0 and cache.defer_prompt_cut:
            return
        S = L + q
        self.pending = False
        if self.keeps_window:
            self._evict_window()
            return
        policy = cache.policy
        cut = scheduler.cut(policy, cache.step_of(self), prompt=L == 0)  # the one question asked here
        if cut == scheduler.KEEP:
            if self.window is not None:  # no cut, but the tokens leaving the model's window still go
                self._trim_window()
                return
            if cache.mode == "physical" and not (self.dense and cache.fwd_all_real):
                self.count = torch.full_like(self.count, S)
                self.dense = False
            self.length = S
            return
        hook = policy.on_evict  # None unless a wrapper rewrites or narrows what a cut keeps (merge-on-evict)
        one = cut == scheduler.ONE and q == 1 and hook is None  # a decode step that evicts one token
        if one and self.steady:
            self._evict_steady()  # every sample is at its budget: the common decode step
            return
        live = self.live_mask().expand(-1, self.keys.shape[1], -1)  # [B, H, S]
        n_live = live.sum(-1)  # [B, H]
        k = self.budget()
        if one and cache.mode == "physical":
            over = n_live > k
            if self.window is not None:  # a token leaving the model's window goes (first), over budget or not
                over = over | (live & ~self._in_window(S)).any(-1)
            self._evict_one(live, over)
            return
        if self.window is not None:  # a token outside the model's window is never kept
            live = live & self._in_window(S)
            n_live = live.sum(-1)
        keep_n = torch.minimum(n_live, k)
        prio = self._keep_priority(live, S)
        pos = self.pos[:, :, :S]
        shared = policy.head_budgets(prio, keep_n, self.context_at(S)) if L == 0 else None
        if shared is not None:  # the prompt cut shares the layer's budget among its heads (Ada-KV)
            keep_n = shared
            self.k_bh = torch.where(n_live > k, keep_n, k.expand_as(keep_n))
        by_pos = pos.argsort(dim=-1, descending=True, stable=True)  # ties: keep the more recent
        order = by_pos.gather(-1, prio.gather(-1, by_pos).argsort(dim=-1, descending=True, stable=True))
        rank = (torch.empty_like(order).scatter_(-1, order,
                                                 torch.arange(S, device=self.device).expand_as(order)))
        keep = rank < keep_n.unsqueeze(-1)
        if hook is not None:
            keep = self._on_evict(hook, keep, prio, S)
            keep_n = keep.sum(-1)
        if cache.mode == "mask":
            self.alive[:, :, :S] = keep
            self.length = S
            return
        new_len = int(keep_n.max())
        key = torch.where(keep, pos, LONG_MAX)
        idx = key.argsort(dim=-1, stable=True)[..., :new_len]  # survivors in position order, then junk
        self._compact(idx, new_len, keep_n)

    def _on_evict(self, hook: Callable[..., torch.Tensor], keep: torch.Tensor, prio: torch.Tensor,
                  S: int) -> torch.Tensor:
        """The policy's eviction hook at a cut (``keep`` [B, H, S]: the slots the cut keeps, ``prio``: the
        keep-priorities it ranked): the hook may write the kept slots of ``ctx.values`` in place (merged
        values) and returns the slots to keep, a subset of ``keep``."""
        if self.slots is not KV:
            raise ValueError(f"policy {self.cache.policy.name!r} rewrites the kept values at a cut, which a "
                             "quantized cache cannot hold exactly; valid: kv_quant=null")
        return keep & hook(keep, prio, self.context_at(S, values=self.values[:, :, :S]))

    def _evict_window(self) -> None:
        """A sliding layer the policy leaves alone keeps the model's own window: after a forward whose newest
        token is ``cur``, the tokens at positions (cur - W + 1, cur], i.e. the ``W - 1`` newest, as the stock
        ``DynamicSlidingWindowLayer`` holds; the next query attends to them and itself (W tokens). Never
        scored."""
        cache, q, L = self.cache, self.q_len, self.length
        if cache.mode == "physical" and q == 1 and L > 0:
            if self.steady:  # static shapes: the oldest token (leaving the window) gives its slot to the new
                victim = self.pos[:, :, :L].argmin(dim=-1, keepdim=True)  # [B, H, 1]
                vic = victim.unsqueeze(-1)
                for name, r in zip(self.slots, self.new_kv, strict=True):
                    getattr(self, name).scatter_(2, vic.expand(-1, -1, 1, r.shape[-1]), r)
                self.pos.scatter_(2, victim, cache.cur.view(-1, 1, 1).expand_as(victim))
                return
            live = self.live_mask().expand(-1, self.keys.shape[1], -1)
            self._evict_one(live, live.sum(-1) > self.window - 1)  # growing: at most one token leaves
            return
        self._trim_window()

    def _in_window(self, S: int) -> torch.Tensor:
        """[B, H, S] bool: slots [0, S) at positions the next query still sees, (cur - W + 1, cur]."""
        return self.pos[:, :, :S] > self.cache.cur.view(-1, 1, 1) - self.window + 1

    def _trim_window(self) -> None:
        """Evict the held tokens the model's window has left, nothing else: mask mode clears their flags,
        physical mode compacts the others (per head: a sliding layer under a policy may then hold different
        numbers of tokens in its heads)."""
        S = self.length + self.q_len
        pos = self.pos[:, :, :S]
        keep = self.live_mask().expand_as(pos) & self._in_window(S)
        if self.cache.mode == "mask":
            self.alive[:, :, :S] = keep
            self.length = S
            return
        n_keep = keep.sum(-1)  # [B, H]
        new_len = int(n_keep.max())
        idx = torch.where(keep, pos, LONG_MAX).argsort(dim=-1, stable=True)[..., :new_len]
        self._compact(idx, new_len, n_keep)

    def _priority(self, S: int) -> torch.Tensor:
        return self.cache.policy.priority(self.score[:, :, :S], self.context_at(S))

    def _keep_priority(self, live: torch.Tensor, S: int) -> torch.Tensor:
        """Priority over slots: recent window +inf, other live tokens the policy's priority, dead -inf; on a
        sliding layer a token outside the model's window -inf, recent or not (a sliding layer the policy
        leaves alone: the position, so the oldest goes first)."""
        if self.keeps_window:
            return torch.where(live, self.pos[:, :, :S].to(torch.float64), -torch.inf)
        recent = self.pos[:, :, :S] > self.cache.recent_floor
        prio = torch.where(recent, torch.inf, self._priority(S).to(torch.float64))
        if self.window is not None:
            prio = prio.masked_fill(~self._in_window(S), -torch.inf)
        return torch.where(live, prio, -torch.inf)

    def _evict_steady(self) -> None:
        """Static-shape decode step: every sample holds its budget. Evict the lowest-priority non-recent token
        of each (sample, head) (ties: the oldest; a sliding layer: the token leaving the model's window
        first) and move the new token (slot L) into its slot."""
        L = self.length
        S = L + 1
        pos = self.pos[:, :, :S]
        prio = self._priority(S).masked_fill(pos > self.cache.recent_floor, torch.inf)
        if self.window is not None:
            prio = prio.masked_fill((pos >= 0) & ~self._in_window(S), -torch.inf)
        # samples below the longest budget: their dead slots (position -1) are never victims
        if not self.dense:
            prio = prio.masked_fill(pos < 0, torch.inf)
        lowest = prio == prio.amin(dim=-1, keepdim=True)
        if not self.dense:
            lowest &= pos >= 0
        victim = pos.masked_fill(~lowest, LONG_MAX).argmin(dim=-1, keepdim=True)  # [B, H, 1]
        vic = victim.unsqueeze(-1)
        # the new token moves into the victim's slot
        for name, r in zip(self.slots, self.new_kv, strict=True):
            getattr(self, name).scatter_(2, vic.expand(-1, -1, 1, r.shape[-1]), r)
        self.pos.scatter_(2, victim, self.cache.cur.view(-1, 1, 1).expand_as(victim))
        new = self.score[:, :, L : L + 1]
        self.score.scatter_(2, victim, new.clone())
        new.zero_()  # the slot past the held length holds 0 again

    def _evict_one(self, live: torch.Tensor, over: torch.Tensor) -> None:
        """Decode step while some sample is still below its budget (absolute budgets above a prompt):
        at most one eviction per (sample, head); the new slot L fills the hole or the next free slot."""
        L = self.length
        prio = torch.where(live, self._keep_priority(live, L + 1), torch.inf)
        lowest = prio == prio.min(dim=-1, keepdim=True).values
        pos = self.pos[:, :, : L + 1]
        victim = torch.where(lowest, pos, LONG_MAX).argmin(dim=-1)  # ties: the oldest
        dest = torch.where(over, victim, self.count.view(-1, 1).expand_as(victim))
        b = torch.arange(dest.shape[0], device=self.device).view(-1, 1)
        h = torch.arange(dest.shape[1], device=self.device).view(1, -1)
        for name in (*self.slots, "pos", "score"):
            t = getattr(self, name)
            t[b, h, dest] = t[:, :, L].clone()  # dest may be L itself (a sample still growing)
        self.pos[:, :, L] = torch.where(dest == L, self.pos[:, :, L], -1)
        self.score[:, :, L] = torch.where(dest == L, self.score[:, :, L], 0.0)  # a vacated slot holds 0
        self.count = self.count + (~over[:, 0]).long()
        self.length = int(self.count.max())
        self.dense = bool((self.count == self.length).all())
        self.steady = bool((self.count.view(-1, 1) == self.budget()).all())
        if self.steady and self.capacity > self.length + 1:
            self._compact(torch.arange(self.length, device=self.device).expand(*pos.shape[:2], -1),
                          self.length,
                          self.count)

    def _compact(self, idx: torch.Tensor, new_len: int, count: torch.Tensor) -> None:
        """Gather slots ``idx`` [B, H, new_len] into fresh buffers sized for the budget plus a spare slot;
        ``count`` [B] or [B, H]: live slots per sample (or per head), at the front of each head."""
        count = count.view(count.shape[0], -1).expand(*idx.shape[:2])
        extra = 1 if self.window is not None else self.cache.headroom()  # sliding: compacts when not cut
        gk = idx.unsqueeze(-1)
        for name in self.slots:
            t = getattr(self, name)
            new = t.new_zeros(*idx.shape[:2], new_len + extra, t.shape[-1])
            new[:, :, :new_len] = t.gather(2, gk.expand(-1, -1, -1, t.shape[-1]))
            setattr(self, name, new)
        pos = torch.full((*idx.shape[:2], new_len + extra), -1, dtype=torch.long, device=self.device)
        score = torch.zeros(pos.shape, dtype=torch.float32, device=self.device)
        pos[:, :, :new_len] = self.pos.gather(2, idx)
        score[:, :, :new_len] = self.score.gather(2, idx)
        junk = torch.arange(new_len + extra, device=self.device).view(1, 1, -1) >= count.unsqueeze(-1)
        pos.masked_fill_(junk, -1)
        self.pos, self.score = pos, score
        self.alive = torch.zeros(pos.shape, dtype=torch.bool, device=self.device)
        self.count, self.length = count.amax(dim=1), new_len
        # host syncs once per prompt, none per decode step
        self.dense = bool((count == new_len).all())
        self.ragged = not self.dense and not bool((count == count[:, :1]).all())
        self.steady = bool((count == self.budget()).all())

    # -- measurements -----------------------------------------------------------------------------------
    def kept_tokens(self) -> torch.Tensor:
        """[B, H] live real tokens held."""
        S = self.length
        live = self.pos[:, :, :S] >= 0
        if self.cache.mode == "mask":
            live &= self.alive[:, :, :S]
        return live.sum(-1)

    def tensor_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored())

    def stored(self) -> list[torch.Tensor]:
        """The tensors that hold K/V (codes, scales and zeros when quantized)."""
        return [getattr(self, name) for name in self.slots]

    def slot_bytes(self) -> int:
        """Bytes one (sample, head, slot) holds across the stored tensors."""
        return sum(t.shape[-1] * t.element_size() for t in self.stored())


class KVCache(Cache):
    """Evicting KV cache for ``generate()``.

    Args:
        policy: what to keep (see :mod:`keyformer.core.policies`); ``None`` means full.
        num_layers: decoder layers of the model.
        prompt_mask: [B, N] attention mask of the (left-padded) prompt; pads are never kept nor scored.
        max_new_tokens: used to preallocate the full cache and as the horizon of schedules (Keyformer's tau).
        seed: noise seed; ``seeds`` ([B] ints) sets one per sample.
        mode: ``physical`` (evict and free) or ``mask`` (simulate eviction with attention masks).
        beam_groups: with beam search, ``num_beams`` for the authors' semantics: the beam copies of a sample
            are noised independently, their scores summed, and one kept set is shared by them; 1 (default):
            every beam row keeps its own scores and set.
    """

    def __init__(self, policy: Policy | None, num_layers: int, *, prompt_mask: torch.Tensor | None = None,
                 max_new_tokens: int = 0, seed: int = 0, seeds: list[int] | None = None,
                 mode: str = "physical",
                 beam_groups: int = 1, kv_quant: KVQuant | None = None,
                 windows: list[int | None] | None = None):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} is unknown; valid: {', '.join(MODES)}")
        if isinstance(beam_groups, bool) or not isinstance(beam_groups, int) or beam_groups < 1:
            raise ValueError(f"beam_groups={beam_groups!r} must be an int >= 1")
        self.beam_groups = beam_groups
        self.kv_quant = kv_quant
        self._step_noise: torch.Tensor | None = None
        self._uniform: bool | None = None  # every layer steady at one length (decided once, after the prompt)
        self.policy = policy if policy is not None else FullPolicy()
        self.prepared = None  # what policy.prepare returned (make_cache; over the prompt: its hook)
        self.scratch: torch.Tensor | None = None  # the prompt blocks' workspace, shared by the layers
        self.mode, self.max_new_tokens = mode, max_new_tokens
        self.seed, self._seeds = seed, seeds
        self.prompt_mask = prompt_mask
        # > 1: the prompt forward runs once per sample, then expand_prompt_rows() (beams)
        self.prompt_expand = 1
        # True: the prompt's cut waits until after the prompt forward (cut_prompt), for a policy that scores
        # the prompt from its keys and values in one more forward (KVzip; set by make_cache)
        self.defer_prompt_cut = False
        # called once with this cache at the start of cut_prompt(), before any layer is cut (PromptMemo's
        # capture of the uncut prompt); cleared when called
        self.on_prompt_cut: Callable[[KVCache], None] | None = None
        super().__init__(layers=[EvictingLayer(self, i) for i in range(num_layers)])
        self._set_windows(windows)

    def _set_windows(self, windows: list[int | None] | None) -> None:
        """Sliding layers (``windows[i]`` = the model's window W, None = full attention; see
        ``keyformer.core.models.layer_windows``) either keep their W - 1 newest tokens, never policy-evicted,
        or are compressed by the policy within their window, as its ``sliding`` says (``auto``: compressed
        where every layer slides)."""
        self.windows_known = windows is not None
        if windows is None:
            return
        if len(windows) != len(self.layers):
            raise ValueError(f"windows has {len(windows)} entries for {len(self.layers)} layers")
        for w in windows:
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 2):
                raise ValueError(f"sliding window={w!r} must be an int >= 2")
        compress = self.policy.compresses_sliding(windows)
        for layer, w in zip(self.layers, windows, strict=True):
            layer.window, layer.keeps_window = w, w is not None and not compress

    def prompt_kv(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Sample ``b``'s prompt keys and values per layer, [1, Hkv, n_b, D] each (its real positions in
        order, pads left out; views of the buffers), held after a deferred prompt forward
        (``defer_prompt_cut``), before its cut."""
        out = []
        for layer in self.layers:
            if not (layer.pending and layer.length == 0) or layer.slots is not KV:
                raise RuntimeError("prompt_kv needs the uncut prompt of an unquantized cache "
                                   "(defer_prompt_cut, before cut_prompt)")
            real = (layer.pos[b, 0, : layer.q_len] >= 0).nonzero().view(-1)
            lo, hi = int(real[0]), int(real[-1]) + 1
            if hi - lo == real.numel():  # left padding: the real positions are one run, a view
                out.append((layer.keys[b: b + 1, :, lo:hi], layer.values[b: b + 1, :, lo:hi]))
            else:
                out.append((layer.keys[b: b + 1, :, real], layer.values[b: b + 1, :, real]))
        return out

    def cut_prompt(self) -> None:
        """The deferred prompt cut of every layer (``defer_prompt_cut``), once ``prepared`` is set."""
        capture, self.on_prompt_cut = self.on_prompt_cut, None
        if capture is not None:
            capture(self)
        was, self.defer_prompt_cut = self.defer_prompt_cut, False
        try:
            for layer in self.layers:
                if layer.pending and layer.length == 0:
                    layer.evict()
        finally:
            self.defer_prompt_cut = was

    def reset(self, prompt_mask: torch.Tensor | None = None) -> None:
        """Empty the cache for a new prompt (the same policy, seeds and layers): the next forward is a prompt.
        ``prompt_mask`` [B, N] is that prompt's attention mask (None keeps the one given so far). Without a
        reset, a second ``generate`` over a used cache continues it, which scoring policies refuse."""
        for layer in self.layers:
            layer.reset()
        self._step_noise, self._uniform = None, None
        if prompt_mask is not None:
            self.prompt_mask = prompt_mask

    # -- per-sample bookkeeping, set at the prompt --------------------------------------------------------
    def _init_prompt(self, q: int, B: int, device: torch.device) -> None:
        m = self.prompt_mask
        if m is None:
            m = torch.ones(B, q, dtype=torch.long)
        m = m.to(device)
        if m.shape[0] != B:  # beam search expands the batch before the prompt forward
            if B % m.shape[0]:
                raise ValueError(f"prompt_mask batch {m.shape[0]} does not divide the model batch {B}")
            m = m.repeat_interleave(B // m.shape[0], dim=0)
        if m.shape[1] != q:
            raise ValueError(f"prompt_mask has {m.shape[1]} columns but the prompt forward has {q} tokens")
        self.real = m.bool()  # [B, N]
        self.n = self.real.sum(-1)  # real prompt lengths [B]
        if not bool((self.real == (torch.arange(q, device=device) >= (q - self.n).view(-1, 1))).all()):
            raise ValueError("prompts must be left-padded (real tokens contiguous at the end)")
        self.prompt_len = q
        self.prompt_pos = torch.where(self.real, self.real.long().cumsum(-1) - 1, -1)
        self.next_pos = self.n.clone()
        self.cur = self.next_pos - 1
        self.fwd_all_real = bool(self.real.all())
        self._init_budget()
        # the decode batch (prompt-once beams: B samples now, B * nb rows later)
        rows = B * self.prompt_expand
        reps = rows // (len(self._seeds) if self._seeds else rows)
        seeds = [s for s in self._seeds for _ in range(reps)] if self._seeds else [self.seed] * rows
        if rows % self.beam_groups:
            raise ValueError(f"beam_groups={self.beam_groups} does not divide the model batch {rows}")
        self.seed_t = hashnoise.seeds_tensor(seeds, device)  # [rows] per-row noise seeds
        # rows are sample-major: beam r % nb of sample r // nb gets its own noise field
        if self.beam_groups > 1:
            beam = torch.arange(rows, device=device) % self.beam_groups
            self.seed_t = hashnoise.mix32((self.seed_t ^ (beam * 0x7FEB352D)) & hashnoise.M32)
        # the beams' seeds wait for expand_prompt_rows; the prompt rows use beam 0's
        if self.prompt_expand > 1:
            self.beam_seed_t, self.seed_t = self.seed_t, self.seed_t[:: self.prompt_expand]

    def _init_budget(self) -> None:
        """The policy's budget ``k`` [B] and recent window ``w`` [B] for the prompt's real lengths ``n``:
        the only state of a prompt forward that depends on the budget (see :meth:`adopt_prompt`)."""
        self.k = self.policy.budget_tokens(self.n)  # the full policy's: every token (LONG_MAX)
        self.w = torch.minimum(self.policy.recent_tokens(self.k), self.k)
        self.recent_floor = (self.next_pos - 1 - self.w).view(-1, 1, 1)  # recent window: pos > this
        self._layer_k: dict[int, torch.Tensor] = {}

    def adopt_prompt(self, other: KVCache) -> None:
        """Become a copy of ``other``: a cache left uncut by a prompt forward (``defer_prompt_cut``, before
        :meth:`cut_prompt`) over the same model, prompt, seeds, mode and horizon, whose policy differs from
        this cache's at most in its budget and recent window (:class:`keyformer.core.prompt_memo.PromptMemo`
        checks that). Scores, positions and noise seeds of the prompt do not depend on the budget; this
        cache's policy then sets ``k`` and ``w`` and :meth:`cut_prompt` cuts as after its own prompt
        forward. ``other`` is not changed."""
        import copy

        if not all(lay.pending and lay.length == 0 for lay in other.layers):
            raise RuntimeError("adopt_prompt needs an uncut prompt cache (defer_prompt_cut, before "
                               "cut_prompt)")
        keep = {"policy": self.policy, "on_prompt_cut": None, "defer_prompt_cut": self.defer_prompt_cut}
        state = copy.deepcopy(other.__dict__, {id(other): self})  # the layers' .cache become this cache
        self.__dict__.update(state)
        self.__dict__.update(keep)
        self._init_budget()

    def new_positions(self, layer_idx: int, seen: int, q: int, B: int, device: torch.device):
        """Positions [B, q] and realness [B, q] of this forward's q new tokens (pads: position -1)."""
        if seen == 0:
            if layer_idx == 0:
                self._init_prompt(q, B, device)
            return self.prompt_pos, self.real
        if layer_idx == 0:
            self.fwd_pos = self.next_pos.view(-1, 1) + torch.arange(q, device=device).view(1, -1)
            if q != getattr(self, "_ones_q", None):
                self._ones = torch.ones(B, q, dtype=torch.bool, device=device)
                self._ones_q = q
            self.fwd_real = self._ones
            self.fwd_all_real = True
            self.next_pos = self.next_pos + q
            self.cur = self.next_pos - 1
            self.recent_floor = (self.next_pos - 1 - self.w).view(-1, 1, 1)
        return self.fwd_pos, self.fwd_real

    def layer_k(self, layer_idx: int) -> torch.Tensor:
        """[B] budget of one layer (the policy's ``layer_budget``; the same for every layer by default)."""
        if layer_idx not in self._layer_k:
            acts = [i for i, lay in enumerate(self.layers) if not lay.keeps_window]
            ctx = Context(layer=layer_idx, num_layers=len(self.layers), horizon=self.max_new_tokens,
                          policy_layer=acts.index(layer_idx) if layer_idx in acts else 0,
                          policy_layers=len(acts))
            self._layer_k[layer_idx] = self.policy.layer_budget(self.k, self.n, ctx)
        return self._layer_k[layer_idx]

    def cur_pos(self) -> torch.Tensor:
        """[B] position of the newest token (updated once per forward)."""
        return self.cur

    def select_rows(self, idx: torch.Tensor) -> None:
        """Make row ``b`` a copy of row ``idx[b]`` (after a prompt forward): fork shared contexts, as
        lm-eval's requests with one context and several continuations do. The batch may grow or shrink."""
        idx = idx.to(self.real.device)
        for layer in self.layers:
            layer.reorder_cache(idx)
        for name in ("real", "n", "prompt_pos", "next_pos", "cur", "k", "w", "recent_floor", "seed_t"):
            setattr(self, name, getattr(self, name).index_select(0, idx))
        self._layer_k = {}
        self.fwd_all_real = bool(self.real.all())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search's reorder: only the rows whose source beam changed are copied (one host read per step
        finds them), not every layer's whole K/V."""
        idx = beam_idx.to(self.layers[0].device if self.layers[0].is_initialized else beam_idx.device)
        rows = (idx != torch.arange(idx.numel(), device=idx.device)).nonzero().flatten()
        for layer in self.layers:
            layer.reorder_rows(idx, rows)

    def expand_prompt_rows(self) -> None:
        """After a prompt forward over the B samples (``prompt_expand`` = nb beams), make the B * nb beam rows
        (sample-major, beam r of sample b at row b * nb + r): cache, positions, budgets and per-beam noise
        seeds become what the prompt forward over B * nb rows would have left."""
        nb, seeds = self.prompt_expand, self.beam_seed_t
        self.select_rows(torch.arange(self.n.numel(), device=self.n.device).repeat_interleave(nb))
        self.seed_t, self.prompt_expand = seeds, 1

    def prompt_beam_rows(self) -> int:
        """Rows per sample the prompt scores need: nb when prompt-once beams share scores (``beam_groups``
        > 1) and the policy's noise differs per beam, else 1 (every beam's score equals the sample's)."""
        nb = self.prompt_expand
        return scheduler.prompt_score_rows(self.policy, nb if self.beam_groups > 1 else 1)

    def pool_prompt(self, s: torch.Tensor) -> torch.Tensor:
        """The prompt's scores, pooled over beams as :meth:`pool_beams` does: ``s`` [B * prompt_beam_rows(),
        H, N] -> [B, H, N] for the prompt rows (prompt-once beams), or [B, H, N] -> [B, H, N] otherwise."""
        nb = self.prompt_expand
        if nb == 1:
            return self.pool_beams(s)
        if self.beam_groups == 1:
            return s  # per-beam scores: every beam of a sample starts from the sample's
        if s.shape[0] == self.n.numel():  # the beams score alike: pool nb copies, as the per-beam rows would
            s = s.repeat_interleave(nb, dim=0)
        return self.pool_beams(s)[::nb]

    def pool_beams(self, s: torch.Tensor) -> torch.Tensor:
        """This forward's per-row scores [B, H, S], summed over the beams of each sample (``beam_groups`` >
        1), so the rows of a sample keep identical states, positions and kept sets."""
        nb = self.beam_groups
        if nb == 1:
            return s
        B = s.shape[0]
        summed = s.view(B // nb, nb, *s.shape[1:]).sum(1, keepdim=True)
        return summed.expand(-1, nb, *s.shape[1:]).reshape(s.shape)

    def capacity_hint(self, needed: int) -> int:
        return needed + scheduler.room(self.policy, self.max_new_tokens)

    def headroom(self) -> int:
        return scheduler.step_headroom(self.policy, self.max_new_tokens)

    def step_of(self, layer: EvictingLayer) -> int:
        """0 during the prompt forward, t during the t-th decode forward."""
        return max(0, layer.seen - self.prompt_len)


    def noise_fn(self, layer: EvictingLayer, group: int):
        """Exp(1) noise of this decode forward at the layer's held slots: a thunk for :class:`Context`.

        In the steady state with one budget for every layer, the first layer's call computes the noise of all
        layers at once (their slots are known: last step's survivors plus the new token in the spare slot),
        so a step pays one kernel launch, not one per layer; values are identical to the per-layer ones."""
        S = layer.length + layer.q_len

        def noise(draw: int = 0) -> torch.Tensor:
            if draw == 0 and layer.steady and self.all_layers_steady(S):
                if layer.layer_idx == 0 or self._step_noise is None:
                    self._step_noise = self._all_layers_noise(S, group)
                return self._step_noise[layer.layer_idx]
            return (hashnoise.noise_at(self.seed_t, layer.layer_idx, self.cur, layer.pos[:, :, :S], group,
                                       draw))

        return noise

    def all_layers_steady(self, S: int) -> bool:
        if self._uniform is None:
            self._uniform = all(lay.steady and lay.length + 1 == S and not lay.keeps_window
                                for lay in self.layers)
        return self._uniform

    def _all_layers_noise(self, S: int, group: int) -> torch.Tensor:
        """[layers, B, Hkv, G, S] noise of this step for every layer."""
        nl = len(self.layers)
        pos = torch.stack([lay.pos[:, :, :S] for lay in self.layers])  # [layers, B, Hkv, S]
        # the spare slot: this step's token, in layers not yet updated
        pos[..., S - 1] = self.cur.view(1, -1, 1)
        B = pos.shape[1]
        layers = torch.arange(nl, device=pos.device).repeat_interleave(B)
        out = (hashnoise.noise_at(self.seed_t.repeat(nl), layers, self.cur.repeat(nl), pos.flatten(0, 1),
                                  group))
        return out.view(nl, B, *out.shape[1:])

    # -- measurements ---------------------------------------------------------------------------------------
    def bytes_per_token(self) -> int:
        """K+V bytes of one token over all layers and KV heads."""
        return sum(layer.keys.shape[1] * layer.slot_bytes() for layer in self.layers if layer.is_initialized)

    def kv_bytes(self) -> list[int]:
        """Per sample: bytes of the live tokens held, summed over layers."""
        out = torch.zeros_like(self.n)
        for layer in self.layers:
            if layer.is_initialized:
                out = out + layer.kept_tokens().sum(-1) * layer.slot_bytes()
        return out.tolist()

    def kv_bytes_full(self) -> list[int]:
        """Per sample: bytes a full cache would hold for the same tokens: the stock cache, whose sliding
        layers hold at most their window minus one token."""
        size = lambda lay: torch.empty((), dtype=lay.dtype).element_size()  # noqa: E731
        out = torch.zeros_like(self.next_pos)
        for lay in self.layers:
            if lay.is_initialized:
                held = self.next_pos if lay.window is None else self.next_pos.clamp(max=lay.window - 1)
                out = out + held * (lay.keys.shape[1] * sum(lay.dims) * size(lay))
        return out.tolist()

    def fp_bytes_per_token(self) -> int:
        """K+V bytes of one token over all layers and KV heads in the model's dtype (unquantized)."""
        size = lambda lay: torch.empty((), dtype=lay.dtype).element_size()  # noqa: E731
        return sum(lay.keys.shape[1] * sum(lay.dims) * size(lay) for lay in self.layers if lay.is_initialized)

    def tensor_bytes(self) -> int:
        return sum(layer.tensor_bytes() for layer in self.layers if layer.is_initialized)

    def kept_positions(self, layer_idx: int) -> list[list[set[int]]]:
        """Positions held by each (sample, head) of a layer, for inspection and tests."""
        layer = self.layers[layer_idx]
        S = layer.length
        pos = layer.pos[:, :, :S]
        live = pos >= 0
        if self.mode == "mask":
            live &= layer.alive[:, :, :S]
        return [[set(pos[b, h][live[b, h]].tolist()) for h in range(pos.shape[1])]
                for b in range(pos.shape[0])]
