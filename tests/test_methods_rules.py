"""The tensor-reading scorers (KnormPress, Random, LagKV, CurDKV, LeverageScore, Compactor, CapKV) and the
wrappers (Ada-KV, ChunkKV, CriticalKV, cut every n steps, per-layer budgets), each against a reference written
from its paper's rule, independently of its class.

A tiny Llama (2 layers, 4 query / 2 KV heads) generates under the policy with the physical cache; the keys and
values of every layer are captured as the model computes them (post-RoPE, as cached), and after every forward
the positions the cache holds are recorded. The reference derives, from those tensors alone in plain Python /
torch, which positions the rule keeps at every step (prompt cut, then per decode step: the new token joins and
the lowest-priority one outside the recent window leaves; ties keep the more recent), and the two must be
equal for every layer, KV head and step. No reference calls a policy hook. Random draws and Gaussian sketches
are given values (:func:`uniform_hash`, :func:`sketch`), as the Gumbel noise is in ``test_policy_rules``.

Each rule check fails under planted mutations (``MUTATIONS``). Composition: a wrapper list builds the same
method as the named classes (``snapkv+adakv`` is ``adakv_snapkv``, ``snapkv+pyramid`` is ``pyramidkv``), and
every wrapper composes over every policy of the registry it accepts, alone and in pairs, through the contract.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from keyformer import generate, make_cache, make_policy, tiny_model
from keyformer.core import attention as core_attention
from keyformer.core.contract import check_policy
from keyformer.core.policies import POLICIES, WRAPPERS, compose, policy_class
from keyformer.core.policies.leverage import sketch
from keyformer.core.policies.random_scores import uniform_hash

pytestmark = pytest.mark.usefixtures("one_thread")

N, NEW = 40, 8  # prompt tokens, generated tokens (NEW - 1 decode forwards)
Kept = list[list[list[set[int]]]]  # [step][layer][KV head] -> positions held after that forward


@dataclasses.dataclass
class Run:
    """Per layer: keys and values [Hkv, T, D] and queries [Hq, T, D] (float64, T = N + NEW - 1 fed tokens,
    as the model computed them) and the kept sets."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    kept: Kept
    model: Any
    queries: list[torch.Tensor] | None = None  # per layer [Hq, T, D] (post-RoPE)
    held: list | None = None  # [step][layer][KV head] -> {position: held value [Dv]} (float64)

    @property
    def layers(self) -> int:
        return len(self.keys)

    @property
    def hkv(self) -> int:
        return self.keys[0].shape[0]


class _Snap(LogitsProcessor):
    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def __call__(self, input_ids, scores):
        self.fn()
        return scores


@contextmanager
def _capture(rec: dict[int, list[tuple[torch.Tensor, torch.Tensor]]]):
    orig = core_attention.attend

    def attend(module, layer, query, key, value, **kw):
        q = query.shape[2]
        rec.setdefault(layer.layer_idx, []).append((key[0, :, -q:].double(), value[0, :, -q:].double(),
                                                    query[0].double()))
        return orig(module, layer, query, key, value, **kw)

    core_attention.attend = attend
    try:
        yield
    finally:
        core_attention.attend = orig


_MODEL: dict[str, Any] = {}


def _model():
    if "m" not in _MODEL:
        _MODEL["m"] = tiny_model("llama", seed=0)
    return _MODEL["m"]


def run(policy, prompt_seed: int = 4) -> Run:
    model = _model()
    ids = torch.randint(3, 256, (1, N), generator=torch.Generator().manual_seed(prompt_seed))
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=NEW, seed=11)
    kept: Kept = []
    held: list = []

    def snapshot() -> None:
        kept.append([[set(h) for h in cache.kept_positions(li)[0]] for li in range(len(cache.layers))])
        held.append([_held_values(lay) for lay in cache.layers])

    snap = _Snap(snapshot)
    rec: dict[int, list] = {}
    with torch.inference_mode(), _capture(rec):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=NEW,
                       min_new_tokens=NEW, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([snap]))
    keys = [torch.cat([r[0] for r in rec[li]], dim=1) for li in range(len(cache.layers))]
    values = [torch.cat([r[1] for r in rec[li]], dim=1) for li in range(len(cache.layers))]
    queries = [torch.cat([r[2] for r in rec[li]], dim=1) for li in range(len(cache.layers))]
    return Run(keys, values, kept, model, queries, held)


def _held_values(layer) -> list[dict[int, torch.Tensor]]:
    """Sample 0's held values per KV head, by position (what the cache stores now)."""
    S = layer.length
    pos, vals = layer.pos[0, :, :S], layer.values[0, :, :S].double()
    live = pos >= 0
    if layer.cache.mode == "mask":
        live &= layer.alive[0, :, :S]
    return [{int(pos[h, s]): vals[h, s].clone() for s in range(S) if live[h, s]} for h in range(pos.shape[0])]


# -- the shared selection: prompt cut, then one eviction per step (or every n steps) -------------------------
Prio = Callable[[int, int, list[int]], dict[int, float]]  # (layer, head, held positions ascending) -> prio


def top(prio: dict[int, float], m: int) -> set[int]:
    """The ``m`` highest priorities; ties keep the more recent."""
    return set(sorted(prio, key=lambda j: (-prio[j], -j))[: max(m, 0)])


def select(r: Run, prio: Prio, k_of: Callable[[int], list[int]], cut_every: int = 1,
           prompt: Callable[[int, int, int], set[int]] | None = None) -> Kept:
    """No recent window (every new scorer's default): the prompt keeps the top ``k`` (per layer and head,
    ``k_of(layer)``; ``prompt(layer, head, k)``: another prompt cut); each decode step adds its token and, at
    a cut (every ``cut_every`` steps), evicts the lowest priorities (ties: the oldest) down to the budget."""
    per_layer = []
    for li in range(r.layers):
        ks = k_of(li)
        held = [(prompt(li, h, ks[h]) if prompt else top(prio(li, h, list(range(N))), ks[h]))
                if ks[h] < N else set(range(N)) for h in range(r.hkv)]
        steps = [[set(s) for s in held]]
        for t in range(1, NEW):
            i = N + t - 1
            for h in range(r.hkv):
                held[h] = held[h] | {i}
                if t % cut_every == 0:
                    while len(held[h]) > ks[h]:
                        p = prio(li, h, sorted(held[h]))
                        held[h].discard(min(held[h], key=lambda j: (p[j], j)))  # noqa: B023
            steps.append([set(s) for s in held])
        per_layer.append(steps)
    return [[per_layer[li][t] for li in range(r.layers)] for t in range(NEW)]


def k_budget(p) -> int:
    return max(1, math.floor(N * p.budget))


def uniform_k(r: Run, p) -> Callable[[int], list[int]]:
    return lambda li: [k_budget(p)] * r.hkv


# -- the scorers' rules --------------------------------------------------------------------------------------
def knorm_prio(r: Run) -> Prio:
    """KnormPress: the lower the key's L2 norm, the higher its priority."""
    return lambda li, h, held: {j: -float(r.keys[li][h, j].norm()) for j in held}


def rule_knorm(r: Run, p) -> Kept:
    return select(r, knorm_prio(r), uniform_k(r, p))


def random_prio(p) -> Prio:
    """Random: each token's draw from (seed, layer, head, position), the given values."""
    return lambda li, h, held: {j: float(uniform_hash(p.seed, li, torch.tensor(h), torch.tensor(j)))
                                for j in held}


def rule_random(r: Run, p) -> Kept:
    return select(r, random_prio(p), uniform_k(r, p))


def rule_curdkv(r: Run, p) -> Kept:
    """CurDKV: squared key and value norms, each normalised within windows of ``local_window_size``
    consecutive held tokens, multiplied (``kv_product``); the first ``num_sinks`` held tokens first."""
    w, sinks = p.local_window_size, p.num_sinks

    def prio(li, h, held):
        k2 = [float(r.keys[li][h, j].pow(2).sum()) for j in held]
        v2 = [float(r.values[li][h, j].pow(2).sum()) for j in held]

        def local(x):
            return [x[a] / sum(x[(a // w) * w: (a // w) * w + w]) for a in range(len(x))]

        s = [a * b for a, b in zip(local(k2), local(v2), strict=True)]
        total = sum(s)
        return {j: (1.0 if a < sinks else s[a] / total) for a, j in enumerate(held)}

    return select(r, prio, uniform_k(r, p))


def rule_lagkv(r: Run, p) -> Kept:
    """LagKV: partitions of ``lag_size`` held tokens after the sinks; each scored against the min/max of the
    next partition per channel (std over channels, softmax over the partition; keys and values averaged),
    then ranked within its partition; sinks and the last partition with its remainder first."""
    sink, lag = p.n_sink, p.lag_size

    def part_scores(x: list[list[float]], ref: list[list[float]]) -> list[float]:
        D = len(x[0])
        lo = [min(row[c] for row in ref) for c in range(D)]
        hi = [max(row[c] for row in ref) for c in range(D)]
        sd = [float(torch.tensor([(row[c] - lo[c]) / (hi[c] - lo[c]) for c in range(D)],
                                 dtype=torch.float64).std()) for row in x]
        e = [math.exp(v - max(sd)) for v in sd]
        return [v / sum(e) for v in e]

    def prio(li, h, held):
        m = len(held)
        if m < sink + 2 * lag:
            return {j: (1.0 if a < sink else (a - sink) / (m - sink)) for a, j in enumerate(held)}
        end = sink + ((m - sink) // lag) * lag
        out = {j: 1.0 for j in held}
        for start in range(sink, end - lag, lag):
            idx, ref = held[start: start + lag], held[start + lag: start + 2 * lag]
            ks = part_scores([r.keys[li][h, j].tolist() for j in idx],
                             [r.keys[li][h, j].tolist() for j in ref])
            vs = part_scores([r.values[li][h, j].tolist() for j in idx],
                             [r.values[li][h, j].tolist() for j in ref])
            s = [(a + b) / 2 for a, b in zip(ks, vs, strict=True)]
            order = sorted(range(lag), key=lambda a: s[a])  # noqa: B023
            for rank, a in enumerate(order):
                out[idx[a]] = rank / lag
        return out

    return select(r, prio, uniform_k(r, p))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.cat([-x[..., d:], x[..., :d]], dim=-1)


def _prerope(r: Run) -> list[torch.Tensor]:
    """The keys with RoPE undone by the model's own cos/sin: ``R_p^T k`` (rotate-half RoPE), per layer."""
    rot = r.model.model.rotary_emb
    T = r.keys[0].shape[1]
    c, s = rot(torch.zeros(1), torch.arange(T).view(1, -1))
    c, s = c[0].double(), s[0].double()  # [T, D]
    return [k * c - _rotate_half(k) * s for k in r.keys]


def rule_leverage(r: Run, p) -> Kept:
    """LeverageScore: RoPE undone (the model's own cos/sin), keys centred over the held tokens, sketched by
    the given Gaussian ``Phi``, leverage ``x^T (X^T X + 0.01 I)^-1 x`` by an explicit inverse."""
    pre = _prerope(r)

    def prio(li, h, held):
        x = pre[li][h, held]
        X = (x - x.mean(0)) @ sketch(p.seed, li, r.hkv, x.shape[-1], p.sketch_dimension)[h]
        inv = torch.linalg.inv(X.T @ X + 1e-2 * torch.eye(X.shape[1], dtype=torch.float64))
        return {j: float(X[a] @ inv @ X[a]) for a, j in enumerate(held)}

    return select(r, prio, uniform_k(r, p))


def rule_capkv(r: Run, p) -> Kept:
    """CapKV: per query head, the anchor is the mean of the queries at positions ``n_sink`` .. newest with
    RoPE undone (the model's own cos/sin), times the mean of the RoPE matrices ``cos_t I + sin_t P`` of
    positions newest + 1 .. newest + F; over the held tokens from ``n_sink`` on, ``w_j = exp(tau cos(anchor,
    k_j) - max)``, ``A = I + sum (w + epsilon) v v^T``, ``s_j = w_j v_j^T A^-1 v_j`` by an explicit inverse,
    averaged over the group's query heads; the first ``n_sink`` positions first."""
    rot = r.model.model.rotary_emb
    G = r.queries[0].shape[0] // r.hkv
    D = r.queries[0].shape[-1]
    T = r.keys[0].shape[1]
    c, s = rot(torch.zeros(1), torch.arange(T + p.n_future_positions).view(1, -1))
    c, s = c[0].double(), s[0].double()  # [positions, D]
    P = torch.zeros(D, D, dtype=torch.float64)
    P[D // 2:, : D // 2], P[: D // 2, D // 2:] = torch.eye(D // 2), -torch.eye(D // 2)
    pre_q = [q * c[:T] - _rotate_half(q) * s[:T] for q in r.queries]

    def mean_rope(newest: int) -> torch.Tensor:
        if newest not in memo:
            ts = range(newest + 1, newest + 1 + p.n_future_positions)
            memo[newest] = sum(torch.diag(c[t]) + s[t].view(-1, 1) * P for t in ts) / p.n_future_positions
        return memo[newest]

    memo: dict[int, torch.Tensor] = {}

    def prio(li, h, held):
        newest = max(held)
        R = mean_rope(newest)
        cand = [j for j in held if j >= p.n_sink]
        score = {j: 0.0 for j in cand}
        for g in range(G):
            a = R @ pre_q[li][h * G + g, p.n_sink: newest + 1].mean(0)
            cos = {j: float(r.keys[li][h, j] @ a) / float(r.keys[li][h, j].norm() * a.norm()) for j in cand}
            top_cos = max(cos.values())
            w = {j: math.exp(p.tau * (cos[j] - top_cos)) for j in cand}
            A = torch.eye(D, dtype=torch.float64)
            for j in cand:
                A = A + (w[j] + p.epsilon) * torch.outer(r.values[li][h, j], r.values[li][h, j])
            inv = torch.linalg.inv(A)
            for j in cand:
                score[j] += w[j] * float(r.values[li][h, j] @ inv @ r.values[li][h, j]) / G
        return {j: (math.inf if j < p.n_sink else score[j]) for j in held}

    return select(r, prio, uniform_k(r, p))


def _zscores(rows: list[list[float]]) -> list[list[float]]:
    flat = [v for row in rows for v in row]
    mean = sum(flat) / len(flat)
    std = math.sqrt(sum((v - mean) ** 2 for v in flat) / (len(flat) - 1))
    return [[(v - mean) / std for v in row] for row in rows]


def rule_compactor(r: Run, p) -> Kept:
    """Compactor, prompt only: the first ``sink_size_start`` and last ``sink_size_end`` prompt tokens kept;
    the segment between scored per KV head by ``blend * z(leverage) + z(attention)``: leverage as
    LeverageScore's over the segment; attention: within chunks of ``chunk_size`` segment tokens, every query
    against every key of its chunk, ``softmax(q . k)`` (no scale), summed over the chunk's queries and the
    group's query heads, times ``||v||``, averaged over 3 neighbours (zeros outside); z over the layer's
    heads and segment; ``blend = 1 - budget``; the top ``k - sinks`` kept; every generated token kept."""
    s0, s1, C = p.sink_size_start, p.sink_size_end, p.chunk_size
    seg = list(range(s0, N - s1))
    L = len(seg)
    pre = _prerope(r)
    G = r.queries[0].shape[0] // r.hkv
    blend = 1 - p.budget
    k = k_budget(p)
    cuts = []
    for li in range(r.layers):
        levs, atts = [], []
        for h in range(r.hkv):
            x = pre[li][h, seg]
            X = (x - x.mean(0)) @ sketch(p.seed, li, r.hkv, x.shape[-1], p.sketch_dimension)[h]
            inv = torch.linalg.inv(X.T @ X + 1e-2 * torch.eye(X.shape[1], dtype=torch.float64))
            levs.append([float(X[a] @ inv @ X[a]) for a in range(L)])
            A = [0.0] * L
            for c0 in range(0, L, C):
                idx = seg[c0: c0 + C]
                for g in range(G):
                    probs = torch.softmax(r.queries[li][h * G + g, idx] @ r.keys[li][h, idx].T, dim=-1)
                    for a in range(len(idx)):
                        A[c0 + a] += float(probs[:, a].sum())
            A = [A[a] * float(r.values[li][h, seg[a]].norm()) for a in range(L)]
            atts.append([sum(A[b] for b in (a - 1, a, a + 1) if 0 <= b < L) / 3 for a in range(L)])
        levz, attz = _zscores(levs), _zscores(atts)
        sinks = set(range(s0)) | set(range(N - s1, N))
        cuts.append([sinks | top({seg[a]: blend * levz[h][a] + attz[h][a] for a in range(L)}, k - len(sinks))
                     for h in range(r.hkv)])
    return [[[s | set(range(N, N + t)) for s in cuts[li]] for li in range(r.layers)] for t in range(NEW)]


# -- the wrappers' rules (over KnormPress or Random: their priorities are plain to write) --------------------
def rule_knorm_every(r: Run, p) -> Kept:
    """Cut every ``cut_every`` decode steps: the new tokens wait in a buffer, a cut evicts down to k."""
    return select(r, knorm_prio(r), uniform_k(r, p), cut_every=p.cut_every)


def rule_knorm_layers(r: Run, p) -> Kept:
    """Budget curve: layer l keeps floor(k * c_l / mean(c)), the curve's points spread over the layers."""
    c = list(p.layer_curve)
    assert len(c) == r.layers == 2, "the reference spreads a two-point curve over two layers"
    return select(r, knorm_prio(r), lambda li: [math.floor(k_budget(p) * c[li] / (sum(c) / 2))] * r.hkv)


def rule_knorm_chunkkv(r: Run, p) -> Kept:
    """ChunkKV: a token's priority is the mean over its chunk (``pos // chunk_length``) of the scorer's
    priorities of the held tokens of that chunk in every head of the layer."""
    L = p.chunk_length
    base = knorm_prio(r)
    held_now: dict[int, list[list[int]]] = {}

    def prio(li, h, held):
        # the chunk mean spans every head's held tokens; the reference keeps them in select's order, so it
        # recomputes here over what each head holds (see select): the heads hold the same chunks
        heads = held_now.get(li) or [held] * r.hkv
        vals: dict[int, list[float]] = {}
        for hh in range(r.hkv):
            pr = base(li, hh, heads[hh])
            for j in heads[hh]:
                vals.setdefault(j // L, []).append(pr[j])
        return {j: sum(vals[j // L]) / len(vals[j // L]) for j in held}

    kept = select(r, prio, uniform_k(r, p))
    for t in range(NEW):  # ChunkKV keeps one set per layer: the reference above is exact when they agree
        for li in range(r.layers):
            assert all(s == kept[t][li][0] for s in kept[t][li]), "ChunkKV's heads hold different sets"
    return kept


def rule_random_criticalkv(r: Run, p) -> Kept:
    """CriticalKV over Random: the first ``floor(first_stage_ratio * k)`` by the scorer's priority, then the
    others by ``(priority + epsilon) * mean_g ||v W_o^g||_1`` (W_o^g: the output projection's rows of query
    head g of the group)."""
    base = random_prio(p)
    model = r.model
    G = model.config.num_attention_heads // model.config.num_key_value_heads

    def a_of(li: int, h: int, j: int) -> float:
        wo = model.model.layers[li].self_attn.o_proj.weight.detach().double().t()  # [Hq * D, hidden]
        D = r.values[li].shape[-1]
        v = r.values[li][h, j]
        return sum(float((v @ wo[(h * G + g) * D: (h * G + g + 1) * D]).abs().sum()) for g in range(G)) / G

    k = k_budget(p)
    m = math.floor(p.first_stage_ratio * k)

    def prio(li, h, held):
        pr = base(li, h, held)
        first = top(pr, m)
        scaled = {j: (pr[j] + p.critical_epsilon) * a_of(li, h, j) for j in held}
        lift = max(scaled.values()) - min(pr.values()) + 1.0
        return {j: (pr[j] + lift if j in first else scaled[j]) for j in held}

    return select(r, prio, uniform_k(r, p))


def rule_knorm_adakv(r: Run, p) -> Kept:
    """Ada-KV over KnormPress: every head secures its top ``floor(alpha * k)``; the layer's other places
    places go to the highest priorities of the layer, whichever head; per-head budgets then hold."""
    base = knorm_prio(r)
    k, alpha = k_budget(p), p.alpha_safeguard

    def k_of(li):
        scores = [base(li, h, list(range(N))) for h in range(r.hkv)]
        secured = [top(scores[h], math.floor(alpha * k)) for h in range(r.hkv)]
        pool = sorted(((v, j, h) for h in range(r.hkv) for j, v in scores[h].items() if j not in secured[h]),
                      key=lambda e: (-e[0], -e[1], e[2]))
        extra = r.hkv * k - sum(len(s) for s in secured)
        return [len(secured[h]) + sum(1 for _, _, hh in pool[:extra] if hh == h) for h in range(r.hkv)]

    return select(r, base, k_of)


def rule_knorm_chunk(r: Run, p) -> Kept:
    """Independent chunks over KnormPress: at the prompt, chunk c (positions [c L, (c + 1) L), m_c tokens)
    keeps its top ``max(1, floor(m_c k / n))`` first, the rest of ``k`` goes by priority; decode cuts are
    KnormPress's."""
    L = p.chunk_tokens
    base = knorm_prio(r)

    def prompt(li: int, h: int, k: int) -> set[int]:
        pr = base(li, h, list(range(N)))
        first: set[int] = set()
        for c0 in range(0, N, L):
            js = range(c0, min(c0 + L, N))
            first |= top({j: pr[j] for j in js}, max(1, len(js) * k // N))
        return set(sorted(pr, key=lambda j: (j not in first, -pr[j], -j))[:k])

    return select(r, base, uniform_k(r, p), prompt=prompt)


def keydiff_prio(r: Run) -> Prio:
    """KeyDiff over the given held tokens: ``-cos(k_j, mean_i k_i / ||k_i||)``."""
    def prio(li: int, h: int, held: list[int]) -> dict[int, float]:
        ks = {j: r.keys[li][h, j] for j in held}
        anchor = sum(k / k.norm() for k in ks.values()) / len(ks)
        return {j: -float(k @ anchor / (k.norm() * anchor.norm())) for j, k in ks.items()}

    return prio


def rule_keydiff_block(r: Run, p) -> Kept:
    """Block processing over KeyDiff: the prompt keeps its first ``k`` tokens, then for each block of ``b``
    positions after them the top ``k`` of KeyDiff over the kept and the block's tokens alone; decode cuts are
    KeyDiff's over the held tokens."""
    b, base = p.block_tokens, keydiff_prio(r)

    def prompt(li: int, h: int, k: int) -> set[int]:
        kept = set(range(k))
        for b0 in range(k, N, b):
            cand = kept | set(range(b0, min(b0 + b, N)))
            kept = top(base(li, h, sorted(cand)), k)
        return kept

    return select(r, base, uniform_k(r, p), prompt=prompt)


_LUKV: dict[str, str] = {}


def lukv_curve_file() -> str:
    """A budget curve [99, 2 layers, 2 KV heads] for the tiny Llama: at keep ratio ``q`` (row ``100 (1 - q) -
    1``) layer 0's heads keep ``1.37 q`` and ``0.43 q`` of the prompt, layer 1's ``0.52 q`` and ``1.28 q``
    (each layer 0.9 of the uniform total, so the live bytes stay within the budget)."""
    if "path" not in _LUKV:
        import os
        import tempfile

        import numpy as np

        q = 1 - (np.arange(99) + 1) / 100
        keep = np.stack([np.stack([1.37 * q, 0.43 * q], -1), np.stack([0.52 * q, 1.28 * q], -1)], 1)
        path = os.path.join(tempfile.mkdtemp(prefix="keyformer-lukv-"), "curve.npy")
        np.save(path, np.clip(1 - keep, 0, 1).astype(np.float32))
        _LUKV["path"] = str(path)
    return _LUKV["path"]


def rule_knorm_lukv(r: Run, p) -> Kept:
    """LU-KV over KnormPress: per layer, head h keeps ``floor(r_h n)`` tokens (``r_h = 1 - curve[t, l, h]``,
    ``t = 100 (1 - budget) - 1``), the ``round(sum r_h n) - sum floor(r_h n)`` heads of largest fractional
    part one more; the first ``lukv_sink`` positions and the ``lukv_window`` newest are always kept; each head
    holds its count at every decode step."""
    import numpy as np

    curve = np.load(p.lukv_curve)
    t = round(100 * (1 - p.budget)) - 1

    def counts(li: int) -> list[int]:
        ideal = [(1 - float(curve[t, li, h])) * N for h in range(r.hkv)]
        base = [math.floor(x) for x in ideal]
        extra = round(sum(ideal)) - sum(base)
        by_frac = sorted(range(r.hkv), key=lambda h: (-(ideal[h] - base[h]), h))
        return [base[h] + (h in by_frac[:extra]) for h in range(r.hkv)]

    norms = knorm_prio(r)

    def prio(li: int, h: int, held: list[int]) -> dict[int, float]:
        pr = norms(li, h, held)
        return {j: math.inf if j < p.lukv_sink or j > max(held) - p.lukv_window else v for j, v in pr.items()}

    return select(r, prio, counts)


def rule_random_dms(r: Run, p) -> Kept:
    """DMS over Random: every cut first keeps Random's top ``k`` (the cap), then every held token older than
    the ``dms_window`` newest positions whose draw is below ``dms_threshold`` leaves."""
    base = random_prio(p)
    k, W, T = k_budget(p), p.dms_window, p.dms_threshold

    def judge(li: int, h: int, held: set[int], newest: int) -> set[int]:
        pr = base(li, h, sorted(held))
        return {j for j in held if j > newest - W or pr[j] >= T}

    per_layer = []
    for li in range(r.layers):
        held = [judge(li, h, top(base(li, h, list(range(N))), k), N - 1) for h in range(r.hkv)]
        steps = [[set(s) for s in held]]
        for t in range(1, NEW):
            i = N + t - 1
            for h in range(r.hkv):
                held[h] = held[h] | {i}
                if len(held[h]) > k:
                    pr = base(li, h, sorted(held[h]))
                    held[h].discard(min(held[h], key=lambda j: (pr[j], j)))  # noqa: B023
                held[h] = judge(li, h, held[h], i)
            steps.append([set(s) for s in held])
        per_layer.append(steps)
    return [[per_layer[li][t] for li in range(r.layers)] for t in range(NEW)]


RULES: dict[str, tuple[Callable[[Run, Any], Kept], dict[str, Any]]] = {
    "knorm": (rule_knorm, {}),
    "random": (rule_random, {"seed": 5}),
    "curdkv": (rule_curdkv, {"local_window_size": 8}),
    "lagkv": (rule_lagkv, {"lag_size": 4}),
    "leverage": (rule_leverage, {"sketch_dimension": 8}),
    "compactor": (rule_compactor, {"sink_size_start": 2, "sink_size_end": 2, "chunk_size": 8,
                                   "sketch_dimension": 8}),
    "capkv": (rule_capkv, {}),
    "knorm+every": (rule_knorm_every, {"cut_every": 3}),
    "knorm+layers": (rule_knorm_layers, {"layer_curve": [1.5, 0.5]}),
    "knorm+chunkkv": (rule_knorm_chunkkv, {"chunk_length": 5}),
    "random+criticalkv": (rule_random_criticalkv, {"seed": 6}),  # a seed where both stages decide
    "knorm+adakv": (rule_knorm_adakv, {}),
    "knorm+chunk": (rule_knorm_chunk, {"chunk_tokens": 8}),
    "random+dms": (rule_random_dms, {"seed": 5, "dms_threshold": 0.7, "dms_window": 6}),
    "keydiff+block": (rule_keydiff_block, {"block_tokens": 6}),
    "knorm+lukv": (rule_knorm_lukv, {"lukv_sink": 2, "lukv_window": 1}),
}


def rule_policy(name: str):
    knobs = {**RULES[name][1], **({"lukv_curve": lukv_curve_file()} if name.endswith("+lukv") else {})}
    return make_policy(name, budget=0.5, **knobs)


def check_rule(name: str) -> None:
    """AssertionError unless the cache keeps, at every step, layer and KV head, what ``name``'s rule keeps."""
    policy = rule_policy(name)
    r = run(policy)
    want = RULES[name][0](r, policy)
    assert len(r.kept) == NEW
    for t in range(NEW):
        for li in range(r.layers):
            assert r.kept[t][li] == want[t][li], (
                f"{name}: step {t} layer {li}: cache {[sorted(s) for s in r.kept[t][li]]} "
                f"!= rule {[sorted(s) for s in want[t][li]]}")


@pytest.mark.parametrize("name", sorted(RULES))
def test_method_follows_its_rule(name):
    check_rule(name)


def test_every_tensor_scorer_of_the_registry_has_a_rule_here_or_elsewhere():
    """A registered policy that reads tensors and no attention weights needs a rule reference (here, or in
    tests/test_new_policies.py for KeyDiff; KVzip in tests/test_kvzip*.py; SimLayerKV, whose tensors are its
    layer state, in tests/test_policy_rules.py with the attention readers)."""
    elsewhere = {"keydiff", "kvzip", "expected_attention", "rkv", "simlayerkv"}
    mine = {n for n in POLICIES if "tensors" in POLICIES[n].reads or not POLICIES[n].reads}
    assert mine - set(RULES) - elsewhere - {"full", "window", "streaming"} == set()


def test_rules_act():
    """Positive controls: the scorers keep other sets than a plain window of the same budget, and differ
    from one another; the wrappers change what their scorer keeps."""
    win = run(make_policy("window", budget=0.5)).kept[0]
    sets = {n: run(rule_policy(n)).kept for n in RULES}
    for name in ("knorm", "random", "curdkv", "lagkv", "leverage"):
        assert sets[name][0] != win, name
    assert len({repr(sets[n][0]) for n in ("knorm", "random", "curdkv", "lagkv", "leverage")}) == 5
    for name in ("knorm+every", "knorm+layers", "knorm+chunkkv", "knorm+adakv"):
        assert sets[name] != sets["knorm"], name
    assert sets["random+criticalkv"] != sets["random"]
    assert sets["knorm+chunk"][0] != sets["knorm"][0]  # the shares change the prompt cut
    assert sets["random+dms"] != sets["random"]
    assert sets["keydiff+block"][0] != run(make_policy("keydiff", budget=0.5)).kept[0]  # blocks change it
    assert run(make_policy("random", budget=0.5, seed=6)).kept != sets["random"]
    assert sets["compactor"][0] != win and sets["compactor"][0] != sets["leverage"][0]


# -- planted mutations ---------------------------------------------------------------------------------------
def _cls(name: str) -> type:
    return policy_class(name)


def _mut_reversed(mp, name):  # the ranking reversed
    base = _cls(name).priority
    mp.setattr(_cls(name), "priority", lambda self, state, ctx: -base(self, state, ctx))


def _mut_state_reversed(mp, name):  # scorers that score on the scoring path: their state reversed
    base = _cls(name).accumulate
    mp.setattr(_cls(name), "accumulate", lambda self, state, s, ctx: base(self, state, -s, ctx))


def _mut_no_sinks(mp, name):  # the sinks dropped
    field = "num_sinks" if name == "curdkv" else "n_sink"
    base = _cls(name).score

    def score(self, probs, ctx):
        saved = getattr(self, field)
        setattr(self, field, 0)
        try:
            return base(self, probs, ctx)
        finally:
            setattr(self, field, saved)
    mp.setattr(_cls(name), "score", score)


def _mut_no_local(mp, name):  # CurDKV's local windows off
    from keyformer.core.policies import curdkv

    orig = curdkv.curdkv_scores
    mp.setattr(curdkv, "curdkv_scores", lambda k, v, pos, live, window, kind, sinks:
               orig(k, v, pos, live, 0, kind, sinks))


def _mut_cross(mp, name):  # LagKV's within-partition rank replaced by the raw softmax score
    from keyformer.core.policies import lagkv

    orig = lagkv.lagkv_row
    mp.setattr(lagkv, "lagkv_row", lambda k, v, sink, lag, cross: orig(k, v, sink, lag, True))


def _mut_rope_kept(mp, name):  # leverage of the post-RoPE keys (RoPE not undone)
    from keyformer.core.policies import leverage

    mp.setattr(leverage, "unrotate_keys", lambda keys, pos, info: keys)


def _mut_no_centring(mp, name):  # leverage without centring the keys
    from keyformer.core.policies import leverage

    def uncentred(x, phi):
        X = x @ phi.to(x.device)
        G = X.T @ X + leverage.JITTER * torch.eye(X.shape[-1], dtype=X.dtype)
        return (X * torch.linalg.solve(G, X.T).T).sum(-1)
    mp.setattr(leverage, "leverage", uncentred)


def _mut_seed_ignored(mp, name):  # Random's seed ignored
    from keyformer.core.policies import random_scores

    orig = random_scores.uniform_hash
    mp.setattr(random_scores, "uniform_hash", lambda seed, layer, heads, pos: orig(0, layer, heads, pos))


def _mut_no_leverage(mp, name):  # Compactor's attention alone
    from keyformer.core.policies.compactor import CompactorPolicy

    mp.setattr(CompactorPolicy, "blend", lambda self, n: torch.zeros(n.shape, dtype=torch.float64))


def _mut_causal_chunks(mp, name):  # Compactor's chunk attention made causal
    from keyformer.core.policies import compactor

    def causal(q, k, chunk):
        Hq, L, _ = q.shape
        G = Hq // k.shape[0]
        out = q.new_zeros(k.shape[0], L)
        for c0 in range(0, L, chunk):
            qc, kc = q[:, c0: c0 + chunk], k[:, c0: c0 + chunk].repeat_interleave(G, dim=0)
            x = qc @ kc.transpose(-1, -2)
            c = x.shape[-1]
            x = x.masked_fill(torch.ones(c, c, dtype=torch.bool).triu(1), float("-inf"))
            out[:, c0: c0 + chunk] = torch.softmax(x, -1).sum(-2).view(k.shape[0], G, -1).sum(1)
        return out
    mp.setattr(compactor, "chunk_attention", causal)


def _mut_one_chunk(mp, name):  # Compactor's chunks ignored: one chunk over the whole segment
    from keyformer.core.policies import compactor

    orig = compactor.chunk_attention
    mp.setattr(compactor, "chunk_attention", lambda q, k, chunk: orig(q, k, q.shape[1]))


def _mut_compactor_rope_kept(mp, name):  # Compactor's leverage of the post-RoPE keys
    from keyformer.core.policies import compactor

    mp.setattr(compactor, "unrotate_keys", lambda keys, pos, info: keys)


def _mut_capkv_no_sqrt(mp, name):  # CapKV's capacity matrix from (w + eps) v, not sqrt(w + eps) v
    from keyformer.core.policies import capkv

    def squared(values, w, cand, epsilon):
        v = values * cand.unsqueeze(-1)
        A = torch.eye(v.shape[-1], dtype=v.dtype) + torch.einsum("bhgs,bhsd,bhse->bhgde", (w + epsilon) ** 2,
                                                                 v, v)
        sol = torch.linalg.solve(A, v.transpose(-1, -2).unsqueeze(2))
        return w * (v.transpose(-1, -2).unsqueeze(2) * sol).sum(-2)
    mp.setattr(capkv, "capacity_scores", squared)


def _mut_capkv_raw_keys(mp, name):  # CapKV's keys not normalised (the anchor still is)
    from keyformer.core.policies import capkv

    def raw(keys, anchor, cand, tau):
        x = torch.einsum("bhsd,bhgd->bhgs", keys, torch.nn.functional.normalize(anchor, dim=-1))
        x = (tau * x).masked_fill(~cand.unsqueeze(2), -math.inf)
        return torch.exp(x - x.amax(-1, keepdim=True))
    mp.setattr(capkv, "alignment_weights", raw)


def _mut_capkv_sinks_unprotected(mp, name):  # CapKV's sinks ranked by their score (0), not kept
    mp.setattr(_cls(name), "priority", lambda self, state, ctx: state)


def _mut_capkv_max_heads(mp, name):  # CapKV's mean over a group's query heads replaced by the max
    from keyformer.core.policies import capkv

    orig = capkv.capacity_scores
    mp.setattr(capkv, "capacity_scores", lambda values, w, cand, epsilon:
               orig(values, w, cand, epsilon).amax(2, keepdim=True).expand_as(w))


def _mut_capkv_no_rope_mean(mp, name):  # CapKV's anchor not rotated by the averaged future RoPE
    base = _cls(name).future_mean

    def unrotated(self, ctx):
        R, mu = base(self, ctx)
        return torch.eye(R.shape[-1], dtype=R.dtype).expand_as(R), mu
    mp.setattr(_cls(name), "future_mean", unrotated)


def _mut_every_step(mp, name):  # the schedule wrapper ignored: a cut at every step
    from keyformer.core.policies.base import STEP
    from keyformer.core.policies.wrappers.schedule import Every

    mp.setattr(Every, "schedule", property(lambda self: STEP))


def _mut_uniform_layers(mp, name):  # the budget curve ignored
    from keyformer.core.policies.wrappers.layers import Layers

    mp.setattr(Layers, "layer_budget", lambda self, k, n, ctx: k)


def _mut_chunk_per_head(mp, name):  # chunk means per head instead of over the layer's heads
    from keyformer.core.policies.wrappers import chunkkv

    orig = chunkkv.chunk_means
    mp.setattr(chunkkv, "chunk_means", lambda prio, pos, live, length: torch.cat(
        [orig(prio[:, h:h + 1], pos[:, h:h + 1], live[:, h:h + 1], length) for h in range(prio.shape[1])], 1))


def _mut_chunk_sum(mp, name):  # chunk sums instead of means (chunks the heads hold fewer of lose)
    from keyformer.core.policies.wrappers import chunkkv

    def sums(prio, pos, live, length):
        B, H, S = prio.shape
        use = live & (pos >= 0)
        cid = torch.where(use, pos // length, 0).reshape(B, H * S)
        p = torch.where(use, prio.double(), 0.0).reshape(B, H * S)
        total = p.new_zeros(B, int(cid.max()) + 1).scatter_add_(1, cid, p)
        return total.gather(1, cid).view(B, H, S)
    mp.setattr(chunkkv, "chunk_means", sums)


def _mut_no_first_stage(mp, name):  # CriticalKV without its first stage
    from keyformer.core.policies.wrappers.criticalkv import CriticalKV

    base = CriticalKV.priority

    def priority(self, state, ctx):
        saved, self.first_stage_ratio = self.first_stage_ratio, 0.0
        try:
            return base(self, state, ctx)
        finally:
            self.first_stage_ratio = saved
    mp.setattr(CriticalKV, "priority", priority)


def _mut_no_projection(mp, name):  # CriticalKV with plain value norms (W_o ignored)
    from keyformer.core.policies.wrappers import criticalkv

    mp.setattr(criticalkv, "projected_norms", lambda values, wo: values.float().abs().sum(-1))


def _mut_uniform_heads(mp, name):  # Ada-KV's sharing off
    from keyformer.core.policies.wrappers.adakv import AdaKV

    mp.setattr(AdaKV, "head_budgets", lambda self, prio, keep_n, ctx: keep_n)


def _mut_no_shares(mp, name):  # independent chunks off: the scorer's own prompt cut
    from keyformer.core.policies.wrappers.chunk import Chunk

    mp.setattr(Chunk, "priority", lambda self, state, ctx: super(Chunk, self).priority(state, ctx))


def _mut_long_chunks(mp, name):  # chunks twice as long
    from keyformer.core.policies.wrappers import chunk

    orig = chunk.chunk_shares
    mp.setattr(chunk, "chunk_shares", lambda prio, pos, length, k, n: orig(prio, pos, 2 * length, k, n))


def _mut_no_delay(mp, name):  # DMS judges the window's tokens too
    from keyformer.core.policies.wrappers.dms import DMS

    mp.setattr(DMS, "on_evict", lambda self, keep, prio, ctx: keep & ~(prio < self.dms_threshold))


def _mut_no_threshold(mp, name):  # DMS's threshold never evicts
    from keyformer.core.policies.wrappers.dms import DMS

    mp.setattr(DMS, "on_evict", lambda self, keep, prio, ctx: keep)


def _mut_no_blocks(mp, name):  # block processing off: the scorer's own prompt cut
    from keyformer.core.policies.wrappers.block import Block

    mp.setattr(Block, "priority", lambda self, state, ctx: super(Block, self).priority(state, ctx))


def _mut_long_blocks(mp, name):  # blocks twice as long
    from keyformer.core.policies.wrappers.block import Block

    orig = Block.priority

    def priority(self, state, ctx):
        b = self.block_tokens
        self.block_tokens = 2 * b  # the rule reads the knob: double it only while the cut selects
        try:
            return orig(self, state, ctx)
        finally:
            self.block_tokens = b

    mp.setattr(Block, "priority", priority)


def _mut_whole_prompt_ranks(mp, name):  # each round ranks its candidates by the whole prompt's priorities
    from keyformer.core.policies.wrappers import block

    orig = block.Block._ranked
    mp.setattr(block.Block, "_ranked", lambda self, state, ctx, live: torch.where(
        live, orig(self, state, ctx, torch.ones_like(live)), torch.iinfo(torch.long).max))


def _mut_lukv_uniform(mp, name):  # the curve ignored: every head at the layer's budget
    from keyformer.core.policies.wrappers.lukv import LUKV

    mp.setattr(LUKV, "head_budgets", lambda self, prio, keep_n, ctx: keep_n)


def _mut_lukv_no_sinks(mp, name):  # the sinks and the newest not protected
    from keyformer.core.policies.wrappers.lukv import LUKV

    mp.setattr(LUKV, "priority", lambda self, state, ctx: super(LUKV, self).priority(state, ctx))


def _mut_lukv_other_layer(mp, name):  # the curve's other layer
    import dataclasses as dc

    from keyformer.core.policies.wrappers.lukv import LUKV

    orig = LUKV._rates
    mp.setattr(LUKV, "_rates", lambda self, ctx: orig(self, dc.replace(ctx, layer=1 - ctx.layer)))


def _mut_lukv_no_remainder(mp, name):  # the rounding remainder not given out
    from keyformer.core.policies.wrappers import lukv

    mp.setattr(lukv, "lukv_counts", lambda rates, n: (rates.float().view(1, -1) * n.float().view(-1, 1))
               .floor().long().clamp(min=1))


MUTATIONS: list[tuple[str, str, Callable[[pytest.MonkeyPatch, str], None]]] = [
    ("knorm", "ranking reversed", _mut_reversed),
    ("random", "ranking reversed", _mut_reversed),
    ("random", "seed ignored", _mut_seed_ignored),
    ("curdkv", "ranking reversed", _mut_state_reversed),
    ("curdkv", "sinks dropped", _mut_no_sinks),
    ("curdkv", "local windows off", _mut_no_local),
    ("lagkv", "ranking reversed", _mut_state_reversed),
    ("lagkv", "sinks dropped", _mut_no_sinks),
    ("lagkv", "raw scores, not ranks", _mut_cross),
    ("leverage", "ranking reversed", _mut_reversed),
    ("leverage", "RoPE not undone", _mut_rope_kept),
    ("leverage", "keys not centred", _mut_no_centring),
    ("compactor", "no leverage", _mut_no_leverage),
    ("compactor", "causal chunks", _mut_causal_chunks),
    ("compactor", "one chunk", _mut_one_chunk),
    ("compactor", "RoPE not undone", _mut_compactor_rope_kept),
    ("capkv", "ranking reversed", _mut_state_reversed),
    ("capkv", "no sqrt in the capacity matrix", _mut_capkv_no_sqrt),
    ("capkv", "keys not normalised", _mut_capkv_raw_keys),
    ("capkv", "sinks not protected", _mut_capkv_sinks_unprotected),
    ("capkv", "sinks scored", _mut_no_sinks),
    ("capkv", "max over the group's heads", _mut_capkv_max_heads),
    ("capkv", "anchor not rotated", _mut_capkv_no_rope_mean),
    ("knorm+every", "cut at every step", _mut_every_step),
    ("knorm+layers", "uniform layers", _mut_uniform_layers),
    ("knorm+chunkkv", "chunks per head", _mut_chunk_per_head),
    ("knorm+chunkkv", "chunk sums", _mut_chunk_sum),
    ("random+criticalkv", "no first stage", _mut_no_first_stage),
    ("random+criticalkv", "W_o ignored", _mut_no_projection),
    ("knorm+adakv", "uniform head budgets", _mut_uniform_heads),
    ("knorm+chunk", "shares ignored", _mut_no_shares),
    ("knorm+chunk", "chunks twice as long", _mut_long_chunks),
    ("random+dms", "no delayed window", _mut_no_delay),
    ("random+dms", "threshold ignored", _mut_no_threshold),
    ("keydiff+block", "blocks ignored", _mut_no_blocks),
    ("keydiff+block", "blocks twice as long", _mut_long_blocks),
    ("keydiff+block", "candidates ranked over the whole prompt", _mut_whole_prompt_ranks),
    ("knorm+lukv", "curve ignored", _mut_lukv_uniform),
    ("knorm+lukv", "sinks not protected", _mut_lukv_no_sinks),
    ("knorm+lukv", "the other layer's curve", _mut_lukv_other_layer),
    ("knorm+lukv", "remainder not given out", _mut_lukv_no_remainder),
]


@pytest.mark.parametrize("name,label,mutate", MUTATIONS, ids=[f"{n}:{m}" for n, m, _ in MUTATIONS])
def test_rule_check_catches_mutation(name, label, mutate, monkeypatch):
    mutate(monkeypatch, name)
    with pytest.raises(AssertionError):
        check_rule(name)


def test_every_rule_has_a_mutation():
    assert set(RULES) <= {n for n, _, _ in MUTATIONS}


# -- merge-on-evict: CaM's merged values against a naive computation from the captured tensors ---------------
CAM = {"merge_budget": 3, "cam_seed": 1}
Held = list[list[list[dict[int, torch.Tensor]]]]  # [step][layer][KV head] -> {position: value}


def cam_reference(r: Run, p) -> Held:
    """CaM over KnormPress (whose kept sets are ``rule_knorm``'s: merging never changes a key). Per layer and
    KV head: ``A_j`` sums, over the scored query rows (the prompt's last one: KnormPress reads no attention;
    then each decode query over the tokens held), the softmax attention ``q . k / sqrt(D)`` of the group's
    query heads, averaged over them. At each cut every evicted token ``e`` with kept tokens after it is
    spread over the next ``merge_budget`` of them (``W``): each gets ``v_e / |W|`` when the draw ``u_e`` (the
    given hash of (cam_seed ^ SALT, layer, head, e)) is below ``clamp(A_e / mean_W A, 0, 1)``; the merges of
    a cut read the values from before it."""
    from keyformer.core.policies.wrappers.cam import SALT

    kept = rule_knorm(r, p)
    hq = r.queries[0].shape[0]
    G, D, M = hq // r.hkv, r.queries[0].shape[-1], p.merge_budget
    out: Held = [[[{} for _ in range(r.hkv)] for _ in range(r.layers)] for _ in range(NEW)]
    for li in range(r.layers):
        for h in range(r.hkv):
            A: dict[int, float] = {}

            def attend(row: int, cols: list[int]) -> None:
                for g in range(G):
                    q = r.queries[li][h * G + g, row]  # noqa: B023
                    logits = torch.stack([q @ r.keys[li][h, j] for j in cols]) / math.sqrt(D)  # noqa: B023
                    for j, a in zip(cols, torch.softmax(logits, 0).tolist(), strict=True):
                        A[j] = A.get(j, 0.0) + a / G  # noqa: B023

            vals = {j: r.values[li][h, j].clone() for j in range(N)}
            held = set(range(N))
            attend(N - 1, list(range(N)))
            for t in range(NEW):
                if t > 0:
                    i = N + t - 1
                    held = held | {i}
                    vals[i] = r.values[li][h, i].clone()
                    attend(i, sorted(held))
                keep = kept[t][li][h]
                new = {j: vals[j].clone() for j in keep}
                for e in sorted(held - keep):
                    win = sorted(j for j in keep if j > e)[:M]
                    if not win:
                        continue
                    mean = sum(A[j] for j in win) / len(win)
                    prob = (1.0 if A[e] > 0 else 0.0) if mean == 0 else min(max(A[e] / mean, 0.0), 1.0)
                    u = float(uniform_hash(p.cam_seed ^ SALT, li, torch.tensor(h), torch.tensor(e)))
                    if u < prob:
                        for j in win:
                            new[j] = new[j] + vals[e] / len(win)
                vals, held = new, set(keep)
                out[t][li][h] = {j: v.clone() for j, v in vals.items()}
    return out


def _mut_cam_no_merge(mp):
    from keyformer.core.policies.wrappers import cam

    mp.setattr(cam, "cam_merge", lambda *a, **k: None)


def _mut_cam_always(mp):  # the Bernoulli draw ignored: every evicted token with p > 0 merges
    from keyformer.core.policies.wrappers import cam

    mp.setattr(cam, "uniform_hash", lambda seed, layer, heads, pos: torch.zeros(pos.shape).double())


def _mut_cam_one_survivor(mp):  # the whole value to the next survivor only
    from keyformer.core.policies.wrappers import cam

    orig = cam.merge_windows

    def first_only(keep, live, pos, m):
        slots, valid = orig(keep, live, pos, m)
        valid = valid.clone()
        valid[..., 1:] = False
        return slots, valid
    mp.setattr(cam, "merge_windows", first_only)


def merging_reference(r: Run, p) -> Held:
    """kvpress's merging over KnormPress (kept sets: ``rule_knorm``'s): at each cut every evicted token ``e``
    goes to the kept token ``t`` of highest key cosine similarity ``s`` (norms clamped at 1e-6), when ``s >=``
    the threshold, with weight ``max(s, 0) |v_e| / (|v_e| + |v_t| + 1e-6)``; ``t`` then holds ``(v_t + sum w_e
    v_e) / (1 + sum w_e)``, all from the values before the cut."""
    kept = rule_knorm(r, p)
    out: Held = [[[{} for _ in range(r.hkv)] for _ in range(r.layers)] for _ in range(NEW)]
    for li in range(r.layers):
        for h in range(r.hkv):
            def unit(j: int) -> torch.Tensor:
                k = r.keys[li][h, j]  # noqa: B023
                return k / max(float(k.norm()), 1e-6)

            vals = {j: r.values[li][h, j].clone() for j in range(N)}
            held = set(range(N))
            for t in range(NEW):
                if t > 0:
                    i = N + t - 1
                    held = held | {i}
                    vals[i] = r.values[li][h, i].clone()
                keep = kept[t][li][h]
                sums: dict[int, tuple[torch.Tensor, float]] = {}
                for e in sorted(held - keep):
                    sim = {j: float(unit(e) @ unit(j)) for j in keep}
                    tgt = max(sorted(keep), key=lambda j: sim[j])  # noqa: B023
                    if sim[tgt] < p.similarity_threshold:
                        continue
                    ne, nt = float(vals[e].norm()), float(vals[tgt].norm())
                    w = max(sim[tgt], 0.0) * ne / (ne + nt + 1e-6)
                    acc, ws = sums.get(tgt, (torch.zeros_like(vals[e]), 0.0))
                    sums[tgt] = (acc + w * vals[e], ws + w)
                vals = {j: ((vals[j] + sums[j][0]) / (1 + sums[j][1]) if j in sums and sums[j][1] > 0
                            else vals[j]) for j in keep}
                held = set(keep)
                out[t][li][h] = {j: v.clone() for j, v in vals.items()}
    return out


MERGERS = {"cam": (cam_reference, CAM), "merging": (merging_reference, {"similarity_threshold": 0.45})}


def check_merge(wrapper: str) -> int:
    """AssertionError unless ``knorm+<wrapper>`` keeps KnormPress's sets and holds the reference's merged
    values at every step, layer and KV head; returns how many held values are merged ones."""
    reference, knobs = MERGERS[wrapper]
    policy = make_policy(f"knorm+{wrapper}", budget=0.5, **knobs)
    r = run(policy)
    want = reference(r, policy)
    merged = 0
    for t in range(NEW):
        for li in range(r.layers):
            for h in range(r.hkv):
                got, ref = r.held[t][li][h], want[t][li][h]
                assert set(got) == set(ref), f"step {t} layer {li} head {h}: {sorted(got)} != {sorted(ref)}"
                for j in ref:
                    assert torch.allclose(got[j], ref[j], rtol=1e-5, atol=1e-5), (
                        f"{wrapper}: step {t} layer {li} head {h} position {j}: the held value differs "
                        f"from the reference's by {float((got[j] - ref[j]).abs().max()):.2e}")
                    merged += not torch.allclose(ref[j], r.values[li][h, j], rtol=1e-5, atol=1e-5)
    return merged


@pytest.mark.parametrize("wrapper", sorted(MERGERS))
def test_merge_on_evict_follows_its_rule(wrapper):
    assert check_merge(wrapper) > 0  # positive control: some survivors hold merged values


def _mut_merging_unnormalised(mp):  # the sum without the (1 + sum w) normalisation
    from keyformer.core.policies.wrappers import merging

    orig = merging.merge_nearest

    def plain(values, keys, keep, live, threshold):
        before = values.clone()
        orig(values, keys, keep, live, threshold)
        target, sim = merging.nearest_kept(keys, keep)
        ok = live & ~keep & (sim >= threshold)
        w = torch.where(ok, sim.clamp(min=0) * before.norm(dim=-1) / (before.norm(dim=-1)
                        + before.norm(dim=-1).gather(-1, target) + 1e-6), 0.0)
        wsum = torch.zeros_like(w).scatter_add_(-1, target, w)
        values.mul_((1.0 + wsum).unsqueeze(-1))  # undo the normalisation
    mp.setattr(merging, "merge_nearest", plain)


def _mut_merging_threshold(mp):  # the threshold ignored
    from keyformer.core.policies.wrappers import merging

    orig = merging.merge_nearest
    mp.setattr(merging, "merge_nearest", lambda values, keys, keep, live, threshold:
               orig(values, keys, keep, live, -1.0))


MERGE_MUTATIONS = [("cam", "no merge", _mut_cam_no_merge), ("cam", "draw ignored", _mut_cam_always),
                   ("cam", "one survivor", _mut_cam_one_survivor),
                   ("merging", "not normalised", _mut_merging_unnormalised),
                   ("merging", "threshold ignored", _mut_merging_threshold)]


@pytest.mark.parametrize(("wrapper", "mutate"), [(w, m) for w, _, m in MERGE_MUTATIONS],
                         ids=[f"{w}:{n}" for w, n, _ in MERGE_MUTATIONS])
def test_merge_check_catches_mutation(wrapper, mutate, monkeypatch):
    mutate(monkeypatch)
    with pytest.raises(AssertionError):
        check_merge(wrapper)


def test_an_eviction_hook_that_changes_nothing_keeps_the_scorer_outputs():
    """The engine's hook path (every decode cut through the general path) keeps what the steady path keeps:
    DMS with no threshold that can bite over KnormPress is KnormPress: tokens, kept sets and logits (the slots
    are laid out in another order, so the sums of the attention differ in the last bits)."""
    a = _outcome(make_policy("knorm", budget=0.5))
    b = _outcome(make_policy("knorm+dms", budget=0.5, dms_threshold=-math.inf, dms_window=4))
    assert torch.equal(a[0], b[0]) and a[2] == b[2]
    assert float((a[1] - b[1]).abs().max()) < 1e-4


# -- composition ---------------------------------------------------------------------------------------------
def _outcome(policy, arch: str = "llama"):
    model = tiny_model(arch, seed=0)
    ids = torch.randint(3, 256, (2, 36), generator=torch.Generator().manual_seed(3))
    out = generate(model, ids, None, policy, max_new_tokens=8, output_logits=True, seed=3)
    return out.sequences, out.logits, [out.cache.kept_positions(li) for li in range(len(out.cache.layers))]


@pytest.mark.parametrize(("named", "composed", "knobs"), [
    ("adakv_snapkv", "snapkv+adakv", {"window_size": 8}),
    ("adakv_keyformer", "keyformer+adakv", {}),
    ("pyramidkv", "snapkv+pyramid", {"window_size": 8}),
])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_named_methods_are_their_compositions(named, composed, knobs, arch):
    """The named classes and the wrapper lists keep the same tokens and give the same outputs."""
    a = _outcome(make_policy(named, budget=0.5, **knobs), arch)
    extra = {"pyramid_beta": 20} if named == "pyramidkv" else {}
    b = _outcome(make_policy(composed, budget=0.5, **knobs, **extra), arch)
    assert torch.equal(a[0], b[0]) and a[2] == b[2]
    assert float((a[1] - b[1]).abs().max()) == 0.0


def _composable(wrap: tuple[str, ...]) -> list[str]:
    out = []
    for name in sorted(POLICIES):
        try:
            compose(POLICIES[name], wrap)
        except ValueError:
            continue
        out.append(name)
    return out


def _knobs(name: str, wrap: tuple[str, ...] = ()) -> dict[str, Any]:
    fields = policy_class(name).__dataclass_fields__
    kw: dict[str, Any] = {}
    if {"adakv", "criticalkv", "lukv"} & set(wrap) and "head_reduction" in fields:  # per-head wrappers
        kw["head_reduction"] = "per_head"  # (TOVA's default is one set per layer)
    if "pyramid" in wrap:  # beta 20 leaves the last of two layers one token: two keys tie exactly (KeyDiff)
        kw["pyramid_beta"] = 2
    if "window_size" in fields:
        kw["window_size"] = 8
    if "buffer" in fields:
        kw["buffer"] = 8
    if "lag_size" in fields:
        kw["lag_size"] = 4
    if "dms" in wrap:  # a window below the prompt, so that the threshold judges tokens
        kw["dms_window"] = 8
    if "chunk" in wrap:  # chunks below the prompt, so that the shares decide
        kw["chunk_tokens"] = 8
    if "block" in wrap:  # several blocks per prompt
        kw["block_tokens"] = 8
    if "lukv" in wrap:  # the tiny Llama's curve
        kw["lukv_curve"] = lukv_curve_file()
    if "sketch_dimension" in fields:  # below head_dim: with m held keys <= rank + 1, every leverage ties
        kw["sketch_dimension"] = 8
    return kw


WRAPPED = [(w, n) for w in sorted(WRAPPERS) for n in _composable((w,))]


@pytest.mark.parametrize(("wrapper", "name"), WRAPPED, ids=[f"{n}+{w}" for w, n in WRAPPED])
def test_every_wrapper_over_every_policy_keeps_the_contract(wrapper, name):
    """Every wrapper over every registered policy it accepts: physical == mask and the live-byte budget
    (the naive reference too, where the policy reads attention only), on the tiny Llama."""
    check_policy(lambda budget: make_policy(f"{name}+{wrapper}", budget=budget, **_knobs(name, (wrapper,))),
                 archs=("llama",), checks=("physical == mask", "budget", "naive reference"))


PAIRS = [(a, b) for a, b in itertools.permutations(sorted(WRAPPERS), 2) if "h2o" in _composable((a, b))]


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"h2o+{a}+{b}" for a, b in PAIRS])
def test_any_two_wrappers_compose(first, second):
    knobs = {"lukv_curve": lukv_curve_file()} if "lukv" in (first, second) else {}  # its file, no default
    check_policy(lambda budget: make_policy("h2o", budget=budget, wrap=[first, second], **knobs),
                 archs=("llama",), checks=("physical == mask", "budget", "padded batch"))


@pytest.mark.parametrize("name", ["knorm", "random", "curdkv", "lagkv", "leverage", "compactor"])
@pytest.mark.parametrize("arch", ["llama", "gptj", "gpt2", "mpt", "gemma3_text", "qwen3"])
def test_new_scorers_padded_and_mask_on_every_tiny_arch(name, arch):
    """The contract of the new scorers on the tiny architectures (``tests/test_policy_contract.py`` runs them
    too, through the registry; this adds MPT's and Qwen3's here at little cost)."""
    checks = ("physical == mask", "budget", "padded batch")
    # their padded keys differ from the unpadded ones in the last bits, and the leverage (a linear solve)
    # amplifies that past near-ties
    if name in ("leverage", "compactor") and arch in ("mpt", "qwen3"):
        checks = checks[:2]
    check_policy(lambda budget: make_policy(name, budget=budget, **_knobs(name)), archs=(arch,),
                 checks=checks)


# -- the command line: wrap is validated and recorded -------------------------------------------------------
def test_bad_wrap_names_the_valid_wrappers():
    from keyformer.core.policies import parse_wrap

    with pytest.raises(ValueError, match=r"wrap=\['adakvv'\]: 'adakvv' is not a wrapper; valid: adakv, "):
        parse_wrap(["adakvv"])
    with pytest.raises(ValueError, match="cannot wrap policy 'kvzip'"):
        make_policy("kvzip", wrap=["adakv"])
    with pytest.raises(ValueError, match="head_reduction='layer'"):
        make_policy("tova", wrap=["adakv"])
    with pytest.raises(ValueError, match="names a wrapper twice"):
        make_policy("h2o", wrap="adakv,adakv")


def test_config_wrap_is_checked_and_recorded():
    """``policy.wrap`` from a composed config: a bad wrapper is one ConfigError naming policy.wrap and the
    valid wrappers; a good one builds the composition, and the record's name says what ran."""
    from keyformer.run.paths import compose as compose_cfg
    from keyformer.run.scaffold import policy_fields
    from keyformer.run.validate import ConfigError, _check_policy_kwargs

    cfg = compose_cfg(["policy=h2o", "policy.wrap=[adakv,criticalkv]", "model=tiny_llama"])
    policy = _check_policy_kwargs(cfg)
    rec = policy_fields(policy)
    assert rec["policy"] == rec["policy_spec"]["name"] == "h2o+adakv+criticalkv"
    assert rec["policy_spec"]["alpha_safeguard"] == 0.2 and rec["policy_spec"]["first_stage_ratio"] == 0.5
    from keyformer.lab.collect import point_config

    row = point_config(cfg, rec)  # a collected row names the composition and its wrappers' knobs
    assert row["policy"] == "h2o+adakv+criticalkv" and row["policy.alpha_safeguard"] == 0.2
    assert point_config(cfg)["policy"] == "h2o+adakv+criticalkv"  # from the config node alone, too
    bad = compose_cfg(["policy=h2o", "policy.wrap=[adakvv]", "model=tiny_llama"])
    with pytest.raises(ConfigError, match=r"adakvv.*valid: adakv") as e:
        _check_policy_kwargs(bad)
    assert e.value.key == "policy.wrap"


@pytest.mark.parametrize(("wrap", "knobs"), [("cam", {"merge_budget": 32, "cam_seed": 0}),
                                             ("merging", {"similarity_threshold": 0.0}),
                                             ("dms", {"dms_threshold": 0.0, "dms_window": 128}),
                                             ("chunk", {"chunk_tokens": 1024})])
def test_merge_threshold_and_chunk_wrappers_are_recorded(wrap, knobs):
    """A run over ``h2o`` with one of these wrappers records the composition's name and the wrapper's knobs in
    ``policy_spec``; a bad knob is one line naming it."""
    from keyformer.run.scaffold import policy_fields

    rec = policy_fields(make_policy("h2o", wrap=[wrap]))
    assert rec["policy"] == rec["policy_spec"]["name"] == f"h2o+{wrap}"
    assert {k: rec["policy_spec"][k] for k in knobs} == knobs
    bad = next(iter(knobs))
    with pytest.raises(ValueError, match=rf"^{bad}="):
        make_policy("h2o", wrap=[wrap], **{bad: "x"})


def test_block_wrapper_is_recorded_and_refuses_attention_scorers():
    """``wrap=[block]`` over key norm records its knob; over a scorer that ranks by the prompt's attention it
    is refused in one line naming the wrapper, the scorer and the valid choices; a bad knob names it."""
    from keyformer.run.scaffold import policy_fields

    rec = policy_fields(make_policy("knorm", wrap=["block"], block_tokens=64))
    assert rec["policy"] == rec["policy_spec"]["name"] == "knorm+block"
    assert rec["policy_spec"]["block_tokens"] == 64
    for name in ("h2o", "snapkv", "kvzip"):
        with pytest.raises(ValueError, match=rf"wrapper 'block' cannot wrap policy '{name}'.*valid: "):
            make_policy(name, wrap=["block"])
    with pytest.raises(ValueError, match=r"^block_tokens=0 "):
        make_policy("knorm", wrap=["block"], block_tokens=0)


# -- key re-rotation: the kept keys' RoPE moved to the ranks 0 .. m - 1 --------------------------------------
def _rope_rotate(k: torch.Tensor, delta: float, theta: float) -> torch.Tensor:
    """Hugging Face's rotate-half RoPE by ``delta`` positions, written out: ``k cos + rotate_half(k) sin``."""
    D = k.shape[-1]
    freqs = delta / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    emb = torch.cat([freqs, freqs])
    return k * emb.cos() + torch.cat([-k[D // 2:], k[: D // 2]]) * emb.sin()


def check_rerotate(budget: float = 0.5) -> None:
    """AssertionError unless, after the prompt, every kept key of ``knorm+rerotate`` is the model's key at
    position ``p`` rotated by ``r - p`` (``r`` its rank by position among the kept), and the kept sets are
    Knorm's prompt cut."""
    model = _model()
    theta = float(model.config.rope_parameters["rope_theta"])
    ids = torch.randint(3, 256, (1, N), generator=torch.Generator().manual_seed(4))
    policy = make_policy("knorm+rerotate", budget=budget)
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=2)
    rec: dict[int, list] = {}
    with torch.inference_mode(), _capture(rec):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=2,
                       min_new_tokens=2, do_sample=False, pad_token_id=0)
    plain = run(make_policy("knorm", budget=budget, prefill_only=True)).kept[0]
    for li, layer in enumerate(cache.layers):
        prompt_keys = rec[li][0][0]  # [Hkv, N, D] as the prompt forward computed them (RoPE at p)
        for h, kept in enumerate(cache.kept_positions(li)[0]):
            kept_prompt = sorted(p for p in kept if p < N)
            assert set(kept_prompt) == plain[li][h], (li, h)
            S = layer.length
            held = {int(p): layer.keys[0, h, s].double() for s, p in enumerate(layer.pos[0, h, :S]) if p >= 0}
            for r, p in enumerate(kept_prompt):
                want = _rope_rotate(prompt_keys[h, p], float(r - p), theta)
                assert torch.allclose(held[p], want, atol=1e-5), (li, h, p, r)


def test_rerotate_follows_its_rule():
    check_rerotate()
    check_rerotate(budget=1.0)  # nothing evicted: every key stays


def _mut_rerotate_sign(mp):  # rotated by p - r
    from keyformer.core.policies.wrappers import rerotate

    orig = rerotate.rotate
    mp.setattr(rerotate, "rotate", lambda keys, delta, info: orig(keys, -delta, info))


def _mut_rerotate_all_ranks(mp):  # ranks counted over every slot, evicted ones included (no rotation)
    from keyformer.core.policies.wrappers import rerotate

    mp.setattr(rerotate, "ranks_among_kept", lambda keep, pos: torch.where(keep, pos, 0))


def _mut_rerotate_off(mp):  # the hook rotates nothing
    from keyformer.core.policies.wrappers.rerotate import Rerotate

    mp.setattr(Rerotate, "on_evict", lambda self, keep, prio, ctx: keep)


@pytest.mark.parametrize("mutate", [_mut_rerotate_sign, _mut_rerotate_all_ranks, _mut_rerotate_off])
def test_rerotate_check_catches_mutation(mutate, monkeypatch):
    mutate(monkeypatch)
    with pytest.raises(AssertionError):
        check_rerotate()


def test_rerotate_refuses_what_it_cannot_rotate():
    """No RoPE (GPT-2's learned positions, MPT's ALiBi), a quantized cache, another schedule or eviction hook:
    one line each, naming what is wrong."""
    for arch in ("gpt2", "mpt"):
        with pytest.raises(ValueError, match=rf"rerotate.*{arch}.*not RoPE; valid: "):
            make_cache(tiny_model(arch, seed=0), make_policy("knorm+rerotate"),
                       torch.ones(1, 8, dtype=torch.long), max_new_tokens=1)
    for wrap in (["every", "rerotate"], ["merging", "rerotate"]):
        with pytest.raises(ValueError, match=r"wrapper 'rerotate' cannot wrap.*already has its own"):
            make_policy("knorm", wrap=wrap)
    for wrap in (["criticalkv", "rerotate"], ["rerotate", "criticalkv"]):  # two wrappers preparing
        with pytest.raises(ValueError, match=r"prepares from the model; two such wrappers do not compose"):
            make_policy("h2o", wrap=wrap)


def test_rerotate_on_gptj_matches_hugging_face_rope():
    """GPT-J (interleaved planes, partial rotary): each kept key equals the model's pre-RoPE key rotated at
    its rank by Hugging Face's own GPT-J RoPE (``create_sinusoidal_positions``, ``apply_rotary_pos_emb``)."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    model = tiny_model("gptj", seed=0)
    rd, H = model.config.rotary_dim, model.config.n_head
    ids = torch.randint(3, 256, (1, N), generator=torch.Generator().manual_seed(4))
    pre: dict[int, torch.Tensor] = {}

    def keep_prompt(li: int, out: torch.Tensor) -> None:  # returns None: the module's output stays
        pre.setdefault(li, out[0].detach().double().view(out.shape[1], H, -1))

    hooks = [blk.attn.k_proj.register_forward_hook(lambda mod, inp, out, li=li: keep_prompt(li, out))
             for li, blk in enumerate(model.transformer.h)]
    policy = make_policy("knorm+rerotate", budget=0.5)
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=2)
    try:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=2,
                           min_new_tokens=2, do_sample=False, pad_token_id=0)
    finally:
        for hk in hooks:
            hk.remove()
    sincos = create_sinusoidal_positions(N, rd).double()
    moved = 0
    for li, layer in enumerate(cache.layers):
        for h, kept in enumerate(cache.kept_positions(li)[0]):
            S = layer.length
            held = {int(p): layer.keys[0, h, s].double() for s, p in enumerate(layer.pos[0, h, :S]) if p >= 0}
            for r, p in enumerate(sorted(q for q in kept if q < N)):
                k = pre[li][p, h]
                sin, cos = sincos[r, : rd // 2].view(1, 1, -1), sincos[r, rd // 2:].view(1, 1, -1)
                rot = apply_rotary_pos_emb(k[:rd].view(1, 1, 1, rd), sin, cos).view(rd)
                assert torch.allclose(held[p], torch.cat([rot, k[rd:]]), atol=1e-5), (li, h, p, r)
                moved += r != p
    assert moved > 0  # the check saw keys that moved


def test_lukv_refuses_a_missing_or_misfit_curve(tmp_path):
    """The trained-parameters design: no curve, a missing file, a curve of another model's shape, an absolute
    budget: one line each, naming the bad value and what is valid."""
    import numpy as np

    with pytest.raises(ValueError, match=r"^lukv_curve=None: .*valid: a path"):
        make_policy("knorm", wrap=["lukv"])
    with pytest.raises(ValueError, match=r"^lukv_curve='.*nope.npy': no such file; valid: "):
        make_policy("knorm", wrap=["lukv"], lukv_curve=str(tmp_path / "nope.npy"))
    with pytest.raises(ValueError, match=r"^budget=64: .*valid: a fraction"):
        make_policy("knorm", wrap=["lukv"], lukv_curve=lukv_curve_file(), budget=64)
    bad = tmp_path / "other.npy"
    np.save(bad, np.zeros((99, 3, 2), dtype=np.float32))
    with pytest.raises(ValueError, match=r"has shape \(99, 3, 2\); valid: \(99, 2, 2\)"):
        make_cache(_model(), make_policy("knorm", wrap=["lukv"], lukv_curve=str(bad)),
                   torch.ones(1, 8, dtype=torch.long), max_new_tokens=1)
