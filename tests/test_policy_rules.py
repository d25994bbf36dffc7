"""Each policy's RULE, checked against a reference written from its paper, independently of its class.

A tiny Llama (2 layers, 4 query / 2 KV heads) generates under the policy with the physical cache; the queries
and keys of every layer are captured as the model computes them, and after every forward (the prompt's and
each decode step's) the positions the cache holds are recorded. The reference then derives, from those
queries and keys alone, in plain Python / torch, which positions the paper's rule keeps at every step, and the
two must be equal for every layer, KV head and step. No reference calls a policy hook (``score``,
``accumulate``, ``after_prompt``, ``priority``, ``layer_budget``, ``head_budgets``); each reads only the
policy's plain knobs (budget, recent, window_size...).

Conventions shared with the implementation (documented in ``docs/semantics``/``base.py``, not the papers'):
GQA scores are summed over the query heads of a KV head and selection is per KV head; ties keep the more
recent token; ``k = floor(n * budget)``, ``w = floor(k * recent)``; the prompt is cut once after its forward.

The mutation harness (``test_rule_check_catches_mutation``) plants one change in a policy's rule at a time
(replace <-> accumulate, a ranking reversed, the recent window off by one, per-layer <-> per-head selection,
pooling removed, the observation window ignored, a uniform pyramid, ...) and requires the rule check to fail.

``test_kvpress_kept_sets_live`` (slow; needs SmolLM2) recomputes our kept sets on the committed kvpress
cross-check prompts (``results/crosscheck_kvpress/``) and requires the committed sets, and kvpress's own sets
up to the documented count difference.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from keyformer import make_cache, make_policy, tiny_model
from keyformer.core import attention as core_attention
from keyformer.core.noise import prompt_noise
from keyformer.core.policies import POLICIES, STEP
from keyformer.run.paths import CONF_DIR, ROOT

pytestmark = pytest.mark.usefixtures("one_thread")

N, NEW, SEED = 40, 8, 11  # prompt tokens, generated tokens (NEW - 1 decode forwards), noise seed
SHARP = 15.0  # query and key scale of the test model (see _model)
Kept = list[list[list[set[int]]]]  # [step][layer][KV head] -> positions held after that forward


# -- the run: captured queries/keys and the kept sets the cache reports --------------------------------------
@dataclasses.dataclass
class Trace:
    """One generation: per layer the logits ``x[l]`` [Hq, T, T] (float64, T = N + NEW - 1 fed tokens, every
    query against every key, unmasked) and the kept sets after every forward."""

    x: list[torch.Tensor]
    kept: Kept
    hkv: int
    layers: int

    @property
    def group(self) -> int:
        return self.x[0].shape[0] // self.hkv


class _Snap(LogitsProcessor):
    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def __call__(self, input_ids, scores):
        self.fn()
        return scores


@contextmanager
def _capture(rec: dict[int, list[tuple[torch.Tensor, torch.Tensor, float]]]):
    """Record, at every layer's forward, its queries [Hq, q, D], new keys [Hkv, q, D] and scaling."""
    orig = core_attention.attend

    def attend(module, layer, query, key, value, **kw):
        q = query.shape[2]
        new = (query[0].double(), key[0, :, -q:].double(), kw["scaling"])
        rec.setdefault(layer.layer_idx, []).append(new)
        return orig(module, layer, query, key, value, **kw)

    core_attention.attend = attend
    try:
        yield
    finally:
        core_attention.attend = orig


_MODEL: dict[str, Any] = {}


def _model():
    """The tiny Llama with its queries and keys scaled by ``SHARP``: a random model's attention is nearly
    uniform (its heads would agree, and rules that differ in a detail would keep the same tokens)."""
    if "m" not in _MODEL:
        model = tiny_model("llama", seed=0)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(SHARP)
                layer.self_attn.k_proj.weight.mul_(SHARP)
        _MODEL["m"] = model
    return _MODEL["m"]


def run_policy(policy, prompt_seed: int = 4) -> Trace:
    model = _model()
    ids = torch.randint(3, 256, (1, N), generator=torch.Generator().manual_seed(prompt_seed))
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=NEW, seed=SEED)
    kept: Kept = []
    snap = _Snap(lambda: kept.append([[set(h) for h in cache.kept_positions(li)[0]]
                                      for li in range(len(cache.layers))]))
    rec: dict[int, list] = {}
    with torch.inference_mode(), _capture(rec):
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=NEW,
                       min_new_tokens=NEW, do_sample=False, pad_token_id=0,
                       logits_processor=LogitsProcessorList([snap]))
    x = []
    for li in range(len(cache.layers)):
        q = torch.cat([r[0] for r in rec[li]], dim=1)  # [Hq, T, D]
        k = torch.cat([r[1] for r in rec[li]], dim=1)  # [Hkv, T, D]
        g = q.shape[0] // k.shape[0]
        x.append(q @ k.repeat_interleave(g, dim=0).transpose(-1, -2) * rec[li][0][2])
    return Trace(x=x, kept=kept, hkv=model.config.num_key_value_heads, layers=len(cache.layers))


# -- small hand-written pieces -------------------------------------------------------------------------------
def budget_k(budget: float | int, n: int) -> int:
    return budget if isinstance(budget, int) else max(1, math.floor(n * budget))


def softmax_at(row: torch.Tensor, cols: list[int], tau: float = 1.0,
               noise: torch.Tensor | None = None) -> list[float]:
    """softmax((x + Gumbel) / tau) of the logits ``row`` [T] over the visible positions ``cols``; the Gumbel
    draw is ``-log E`` of the Exp(1) ``noise`` (same length as ``cols``) when given."""
    x = row[cols]
    if noise is not None:
        x = x - noise.double().log()
    return torch.softmax(x / tau, -1).tolist()


def top(scores: dict[int, float], m: int) -> set[int]:
    """The ``m`` highest-scored positions; ties keep the more recent."""
    return set(sorted(scores, key=lambda j: (-scores[j], -j))[: max(m, 0)])


def lowest(scores: dict[int, float], cands: list[int]) -> int:
    """The lowest-scored candidate; ties evict the oldest."""
    return min(cands, key=lambda j: (scores[j], j))


def fed(step: int) -> int:
    """Tokens fed after forward ``step`` (0: the prompt)."""
    return N + step


# -- the rules -----------------------------------------------------------------------------------------------
def rule_full(tr: Trace, p) -> Kept:
    return [[[set(range(fed(t))) for _ in range(tr.hkv)] for _ in range(tr.layers)] for t in range(NEW)]


def rule_window(tr: Trace, p) -> Kept:
    """Sliding window (StreamingLLM with sinks): the first ``sinks`` tokens + the ``k - sinks`` most
    recent."""
    k = budget_k(p.budget, N)
    sinks = min(p.sinks, k)
    out = []
    for t in range(NEW):
        T = fed(t)
        keep = set(range(sinks)) | set(range(max(sinks, T - (k - sinks)), T))
        out.append([[keep for _ in range(tr.hkv)] for _ in range(tr.layers)])
    return out


Budgets = Callable[[int, list[dict[int, float]], int, int], list[int]]  # (layer, scores, k, w) -> per head


def _heavy_hitters(tr: Trace, p, score_row: Callable[[int, int, int, list[int], int], list[float]],
                   budgets: Budgets | None = None) -> Kept:
    """H2O's rule (and Keyformer's, with another per-row score): the prompt's scores summed over all its rows
    and the query heads of a KV head; keep the ``w`` most recent + the top ``k - w``; at every decode step the
    new token's scores over the visible set (held + itself) are added and the lowest-scored token outside the
    recent window leaves. ``budgets`` (Ada-KV) shares the layer's budget among heads at the prompt cut."""
    k = budget_k(p.budget, N)
    w = min(math.floor(k * p.recent), k)
    G = tr.group
    per_layer = []
    for li in range(tr.layers):
        accs = []
        for h in range(tr.hkv):
            acc = dict.fromkeys(range(N), 0.0)
            for i in range(N):
                for g in range(G):
                    row = score_row(li, h * G + g, i, list(range(i + 1)), 0)
                    for j, v in zip(range(i + 1), row, strict=True):
                        acc[j] += v
            accs.append(acc)
        recent = set(range(N - w, N))
        quota = budgets(li, accs, k, w) if budgets else [k] * tr.hkv
        held = [recent | top({j: v for j, v in accs[h].items() if j not in recent}, quota[h] - w)
                if quota[h] < N else set(range(N)) for h in range(tr.hkv)]
        steps = [[set(s) for s in held]]
        for t in range(1, NEW):
            i = N + t - 1  # the position this decode forward feeds
            for h in range(tr.hkv):
                vis = sorted(held[h] | {i})
                accs[h][i] = 0.0
                for g in range(G):
                    for j, v in zip(vis, score_row(li, h * G + g, i, vis, t), strict=True):
                        accs[h][j] += v
                held[h] = set(vis)
                if len(vis) > quota[h]:
                    held[h].discard(lowest(accs[h], [j for j in vis if j <= i - w]))
            steps.append([set(s) for s in held])
        per_layer.append(steps)
    return [[per_layer[li][t] for li in range(tr.layers)] for t in range(NEW)]


def rule_h2o(tr: Trace, p) -> Kept:
    """H2O: accumulated softmax attention (heavy hitters) + the recent window."""
    return _heavy_hitters(tr, p, lambda li, hq, i, cols, t: softmax_at(tr.x[li][hq, i], cols))


_NOISE: dict[tuple[int, int, int], torch.Tensor] = {}


def _noise_row(li: int, i: int, heads: int) -> torch.Tensor:
    """The run's Exp(1) noise of the query at position ``i`` of layer ``li`` over keys [0, i]:
    [heads, i + 1]."""
    if (li, i, heads) not in _NOISE:
        _NOISE[(li, i, heads)] = prompt_noise(SEED, li, i, i + 1, heads, "cpu")[:, 0]
    return _NOISE[(li, i, heads)]


def _keyformer_row(tr: Trace, p):
    """Keyformer's score of one row: softmax((x + Gumbel) / tau_t), tau_t = tau_init + t (tau_end - tau_init)
    / T over the T generated tokens, Gumbel from the run's seeded Exp(1) noise (the values are given, not the
    rule); ``noise_samples`` fields averaged."""
    T = p.max_new_tokens or NEW

    def row(li, hq, i, cols, t):
        tau = p.tau_init + t * (p.tau_end - p.tau_init) / T
        if not p.noise:
            return softmax_at(tr.x[li][hq, i], cols, tau)
        fields = []
        for d in range(p.noise_samples):
            assert d == 0, "the rule reference draws the core's first noise field only"
            noise = _noise_row(li, i, tr.x[0].shape[0])[hq, cols]
            fields.append(softmax_at(tr.x[li][hq, i], cols, tau, noise))
        return [sum(f[c] for f in fields) / len(fields) for c in range(len(cols))]

    return row


def rule_keyformer(tr: Trace, p) -> Kept:
    """Keyformer: H2O's selection with Gumbel-softmax scores at an annealed temperature."""
    return _heavy_hitters(tr, p, _keyformer_row(tr, p))


def _window_scores(tr: Trace, p, li: int) -> list[dict[int, float]]:
    """SnapKV's scores per KV head: the attention of the last ``window_size`` prompt queries to the keys
    before the window, summed over those rows and the group's query heads, then average-pooled (kernel
    ``kernel_size``, zero padding, over the pre-window keys only: ``avg_pool1d(attn[..., -W:, :-W])``)."""
    W, ks, G = p.window_size, p.kernel_size, tr.group
    out = []
    for h in range(tr.hkv):
        a = [0.0] * (N - W)
        for i in range(N - W, N):
            for g in range(G):
                probs = softmax_at(tr.x[li][h * G + g, i], list(range(i + 1)))
                for j in range(N - W):
                    a[j] += probs[j]
        r = ks // 2
        out.append({j: sum(a[j + d] for d in range(-r, r + 1) if 0 <= j + d < N - W) / ks
                    for j in range(N - W)})
    return out


def _finch_scores(tr: Trace, p, li: int) -> list[dict[int, float]]:
    """Finch's scores per KV head: the attention of the last ``window_size`` prompt queries to the keys before
    the window, each row times its count of non-zero weights (the model's float32 softmax over the keys it
    sees), summed over those rows and the group's query heads; no pooling."""
    W, G = p.window_size, tr.group
    out = []
    for h in range(tr.hkv):
        a = dict.fromkeys(range(N - W), 0.0)
        for i in range(N - W, N):
            for g in range(G):
                row = tr.x[li][h * G + g, i]
                probs = softmax_at(row, list(range(i + 1)))
                nonzero = int((torch.softmax(row[: i + 1].float(), -1) > 0).sum())
                for j in range(N - W):
                    a[j] += nonzero * probs[j]
        out.append(a)
    return out


def _prompt_compressor(tr: Trace, p, layer_k: Callable[[int, int, int], int],
                       heads_k: Budgets | None = None,
                       scores_of: Callable[[Trace, Any, int], list[dict[int, float]]] = _window_scores,
                       ) -> Kept:
    """SnapKV's cut: the observation window (``w = min(window_size, k)``) + the top pooled scores (or
    ``scores_of``'s), once after the prompt; every generated token is then kept."""
    k = budget_k(p.budget, N)
    w = min(p.window_size, k)
    cut = []
    for li in range(tr.layers):
        scores = scores_of(tr, p, li)
        kl = layer_k(li, k, w)
        quota = heads_k(li, scores, kl, w) if heads_k else [kl] * tr.hkv
        recent = set(range(N - w, N))
        cut.append([recent | top(scores[h], quota[h] - w) if quota[h] < N else set(range(N))
                    for h in range(tr.hkv)])
    return [[[s | set(range(N, fed(t))) for s in cut[li]] for li in range(tr.layers)] for t in range(NEW)]


def rule_snapkv(tr: Trace, p) -> Kept:
    return _prompt_compressor(tr, p, lambda li, k, w: k)


def rule_finch(tr: Trace, p) -> Kept:
    return _prompt_compressor(tr, p, lambda li, k, w: k, scores_of=_finch_scores)


def lazy_masses(tr: Trace, p) -> list[float]:
    """SimLayerKV's statistic per layer: the last ``n_last`` prompt rows' attention, averaged over those rows
    and every query head, summed over the first ``n_initial`` and the last ``n_recent`` prompt tokens."""
    Hq = tr.x[0].shape[0]
    near = set(range(p.n_initial)) | set(range(N - p.n_recent, N))
    rows = range(N - p.n_last, N)
    out = []
    for li in range(tr.layers):
        total = 0.0
        for hq in range(Hq):
            for i in rows:
                probs = softmax_at(tr.x[li][hq, i], list(range(i + 1)))
                total += sum(probs[j] for j in near if j <= i)
        out.append(total / (Hq * len(rows)))
    return out


def rule_simlayerkv(tr: Trace, p) -> Kept:
    """SimLayerKV: a layer whose statistic (:func:`lazy_masses`) is above ``lazy_threshold`` is lazy and keeps
    ``min(k, n_initial + n_recent)`` tokens, any other layer ``k``; each keeps the first ``n_initial`` tokens
    and then the most recent, after the prompt and at every decode step (StreamingLLM within that budget)."""
    k = budget_k(p.budget, N)
    per_layer = []
    for mass in lazy_masses(tr, p):
        kl = min(k, p.n_initial + p.n_recent) if mass > p.lazy_threshold else k
        assert kl > p.n_initial, "the reference covers budgets above the initial tokens"
        steps = []
        for t in range(NEW):
            T = fed(t)
            steps.append(set(range(p.n_initial)) | set(range(T - (kl - p.n_initial), T)))
        per_layer.append(steps)
    return [[[per_layer[li][t]] * tr.hkv for li in range(tr.layers)] for t in range(NEW)]


def pyramid_budgets(k: int, w: int, n: int, beta: float, layers: int) -> list[int]:
    """PyramidKV (KVCache-Factory's ``PyramidKVCluster``): outside the window, the budget falls linearly from
    ``max`` (first layer) to ``min = (k - w) / beta`` (last), ``max = 2 (k - w) - min``, capped at
    ``n - w``."""
    kk = k - w
    lo, hi = kk / beta, 2 * kk - kk / beta
    if hi >= n - w:
        hi = n - w
        lo = 2 * kk - hi
    return [min(n, max(1, w + round(hi - li * (hi - lo) / max(layers - 1, 1)))) for li in range(layers)]


def rule_pyramidkv(tr: Trace, p) -> Kept:
    k = budget_k(p.budget, N)
    per = pyramid_budgets(k, min(p.window_size, k), N, p.beta, tr.layers)
    return _prompt_compressor(tr, p, lambda li, k, w: per[li])


def rule_tova(tr: Trace, p) -> Kept:
    """TOVA: the newest query's attention alone decides (no accumulation, no recent window); one set per layer
    from the attention averaged over all heads. The prompt is cut by its last query."""
    assert p.head_reduction == "layer" and p.recent == 0.0, "the reference covers TOVA's defaults"
    k = budget_k(p.budget, N)
    Hq = tr.x[0].shape[0]
    per_layer = []
    for li in range(tr.layers):
        def mean_attn(i: int, cols: list[int]) -> dict[int, float]:
            rows = [softmax_at(tr.x[li][hq, i], cols) for hq in range(Hq)]  # noqa: B023
            return {j: sum(r[c] for r in rows) / Hq for c, j in enumerate(cols)}

        held = top(mean_attn(N - 1, list(range(N))), k) if k < N else set(range(N))
        steps = [held]
        for t in range(1, NEW):
            i = N + t - 1
            vis = sorted(held | {i})
            s = mean_attn(i, vis)  # replaces every score
            held = set(vis)
            if len(vis) > k:
                held.discard(lowest(s, vis))
            steps.append(held)
        per_layer.append(steps)
    return [[[per_layer[li][t]] * tr.hkv for li in range(tr.layers)] for t in range(NEW)]


def ada_budgets(alpha: float, hkv: int) -> Budgets:
    """Ada-KV: every head secures its window and its top ``floor(alpha * k)`` tokens; the rest of the layer's
    ``H * k`` places go to the highest scores of the whole layer, whichever head they are in."""

    def budgets(li: int, scores: list[dict[int, float]], k: int, w: int) -> list[int]:
        secured = []
        for h in range(hkv):
            window = set(range(N - w, N))
            rest = {j: v for j, v in scores[h].items() if j not in window}
            secured.append(window | top(rest, math.floor(alpha * k)))
        pool = [(v, j, h) for h in range(hkv) for j, v in scores[h].items()
                if j not in secured[h] and j < N - w]
        pool.sort(key=lambda e: (-e[0], -e[1], e[2]))
        extra = hkv * k - sum(len(s) for s in secured)
        return [len(secured[h]) + sum(1 for _, _, hh in pool[:extra] if hh == h) for h in range(hkv)]

    return budgets


def rule_adakv_snapkv(tr: Trace, p) -> Kept:
    return _prompt_compressor(tr, p, lambda li, k, w: k, ada_budgets(p.alpha_safeguard, tr.hkv))


def rule_adakv_keyformer(tr: Trace, p) -> Kept:
    return _heavy_hitters(tr, p, _keyformer_row(tr, p), ada_budgets(p.alpha_safeguard, tr.hkv))


RULES: dict[str, Callable[[Trace, Any], Kept]] = {
    "full": rule_full, "window": rule_window, "streaming": rule_window, "h2o": rule_h2o,
    "keyformer": rule_keyformer, "snapkv": rule_snapkv, "pyramidkv": rule_pyramidkv, "tova": rule_tova,
    "adakv_snapkv": rule_adakv_snapkv, "adakv_keyformer": rule_adakv_keyformer, "finch": rule_finch,
    "simlayerkv": rule_simlayerkv,
}
# other knobs: Finch's window long enough that its rows' key counts differ (25 to 40) and below the budget;
# SimLayerKV's windows shrunk to this prompt, its threshold between its two layers' statistics on it
# (test_rules_act checks that one layer is lazy and the other not)
RULE_KNOBS: dict[str, dict[str, Any]] = {
    "finch": {"budget": 0.75, "window_size": 16},
    "simlayerkv": {"n_initial": 2, "n_recent": 6, "n_last": 2, "lazy_threshold": 0.3},
}


def rule_policy(name: str):
    """The policy under test: budget 0.5; observation windows shrunk to 8 so that the scores decide;
    ``RULE_KNOBS``."""
    if not POLICIES[name].evicts:
        return make_policy(name)
    kw: dict[str, Any] = {"budget": 0.5}
    if "window_size" in POLICIES[name].__dataclass_fields__:
        kw["window_size"] = 8
    return make_policy(name, **{**kw, **RULE_KNOBS.get(name, {})})


def check_rule(name: str, policy=None) -> None:
    """AssertionError unless the cache keeps, at every step, layer and KV head, what ``name``'s rule keeps."""
    policy = policy or rule_policy(name)
    tr = run_policy(policy)
    want = RULES[name](tr, policy)
    assert len(tr.kept) == NEW
    for t in range(NEW):
        for li in range(tr.layers):
            assert tr.kept[t][li] == want[t][li], (
                f"{name}: step {t} layer {li}: cache {[sorted(s) for s in tr.kept[t][li]]} "
                f"!= rule {[sorted(s) for s in want[t][li]]}")


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_policy_follows_its_rule(name):
    if name not in RULES:
        pytest.skip(f"no rule reference for {name!r} in this file (its own rule test must cover it)")
    check_rule(name)


@pytest.mark.parametrize("name", ["h2o", "keyformer"])
def test_rule_at_other_knobs(name):
    """The rule holds off the defaults too: an absolute budget, another recent share, tau and no noise."""
    kw = dict(budget=13, recent=0.45)
    if name == "keyformer":
        kw.update(tau_init=0.6, tau_end=3.0, noise=False)
    check_rule(name, make_policy(name, **kw))


def test_rules_act():
    """Positive controls: on this prompt the scoring rules keep different sets than a plain window, the
    pyramid's layers differ, and Ada-KV's heads hold different numbers of tokens."""
    win = run_policy(rule_policy("window")).kept
    for name in ("h2o", "keyformer", "snapkv", "tova", "finch"):
        assert run_policy(rule_policy(name)).kept[0] != win[0], name
    assert run_policy(rule_policy("finch")).kept[0] != run_policy(rule_policy("snapkv")).kept[0]
    sim = rule_policy("simlayerkv")
    tr = run_policy(sim)
    lazy = [m > sim.lazy_threshold for m in lazy_masses(tr, sim)]
    assert lazy.count(True) == 1, lazy_masses(tr, sim)  # one lazy layer, one not
    assert len(tr.kept[0][0][0]) != len(tr.kept[0][1][0])
    pyr = run_policy(rule_policy("pyramidkv")).kept[0]
    assert len(pyr[0][0]) != len(pyr[-1][0])
    ada = run_policy(rule_policy("adakv_snapkv")).kept[0]
    assert any(len({len(h) for h in layer}) > 1 for layer in ada)


# -- the mutation harness ------------------------------------------------------------------------------------
def _cls(name: str) -> type:
    return POLICIES[name]


def _mut_accumulate_adds(mp, name):  # replace -> accumulate (TOVA behaves like H2O)
    def accumulate(self, state, s, ctx):
        if self.head_reduction == "layer":
            s = s.mean(dim=1, keepdim=True).expand_as(s)
        state += s
    mp.setattr(_cls(name), "accumulate", accumulate)


def _mut_replace(mp, name):  # accumulate -> replace (H2O forgets the past)
    mp.setattr(_cls(name), "accumulate", lambda self, state, s, ctx: state.copy_(s))


def _mut_reversed(mp, name):  # the ranking reversed: the lowest scores are kept
    base = _cls(name).priority
    mp.setattr(_cls(name), "priority", lambda self, state, ctx: -base(self, state, ctx))


def _mut_recent_plus_one(mp, name):  # the recent window one token too wide
    base = _cls(name).recent_tokens
    mp.setattr(_cls(name), "recent_tokens", lambda self, k: base(self, k) + 1)


def _mut_per_layer(mp, name):  # per-head -> one set per layer (scores summed over the KV heads)
    base = _cls(name).priority
    mp.setattr(_cls(name), "priority",
               lambda self, state, ctx: base(self, state, ctx).sum(dim=1, keepdim=True).expand_as(state))


def _mut_per_head(mp, name):  # TOVA's per-layer set -> one set per KV head
    mp.setattr(_cls(name), "accumulate", lambda self, state, s, ctx: state.copy_(s))


def _mut_no_pooling(mp, name):  # pooling removed (the window still zeroed)
    def after_prompt(self, state, ctx):
        n = state.shape[-1]
        return state.masked_fill(ctx.pos[..., :n] > (ctx.newest - self.window_size).view(-1, 1, 1), 0.0)
    mp.setattr(_cls(name), "after_prompt", after_prompt)


def _mut_all_rows(mp, name):  # the observation window ignored: every prompt row scores
    mp.setattr(_cls(name), "observe_rows", property(lambda self: None))


def _mut_uniform(mp, name):  # a uniform pyramid: every layer the same budget
    mp.setattr(_cls(name), "layer_budget", lambda self, k, n, ctx: k)


def _mut_uniform_heads(mp, name):  # Ada-KV's sharing off: every head the same budget
    mp.setattr(_cls(name), "head_budgets", lambda self, prio, keep_n, ctx: keep_n)


def _mut_no_noise(mp, name):  # Keyformer without its Gumbel noise
    mp.setattr(_cls(name), "uses_noise", property(lambda self: False))
    base = _cls(name).score

    def score(self, probs, ctx):
        saved, self.noise = self.noise, False
        try:
            return base(self, probs, ctx)
        finally:
            self.noise = saved
    mp.setattr(_cls(name), "score", score)


def _mut_fixed_tau(mp, name):  # no temperature schedule: tau stays tau_init
    mp.setattr(_cls(name), "tau", lambda self, step, horizon=None: self.tau_init)


def _mut_no_sinks(mp, name):  # StreamingLLM's sinks dropped
    base = _cls(name).priority

    def priority(self, state, ctx):
        saved, self.sinks = self.sinks, 0
        try:
            return base(self, state, ctx)
        finally:
            self.sinks = saved
    mp.setattr(_cls(name), "priority", priority)


def _mut_no_row_counts(mp, name):  # Finch without its row normalisation (SnapKV's rows, no pooling)
    mp.setattr(_cls(name), "score", lambda self, probs, ctx: probs)


def _mut_row_index(mp, name):  # Finch's rows weighed by their index in the window (not their key count)
    def score(self, probs, ctx):
        r = probs.shape[-2]
        return probs * torch.arange(1, r + 1, dtype=probs.dtype).view(-1, 1)
    mp.setattr(_cls(name), "score", score)


def _mut_never_lazy(mp, name):  # SimLayerKV: lazy layers keep their budget
    mp.setattr(_cls(name), "head_budgets", lambda self, prio, keep_n, ctx: keep_n)


def _mut_always_lazy(mp, name):  # SimLayerKV: every layer lazy
    base = _cls(name).after_prompt

    def after_prompt(self, state, ctx):
        out = base(self, state, ctx)
        ctx.layer_state["lazy"] = torch.ones_like(ctx.layer_state["lazy"])
        return out
    mp.setattr(_cls(name), "after_prompt", after_prompt)


def _mut_no_initial(mp, name):  # SimLayerKV's initial tokens dropped (a plain window)
    mp.setattr(_cls(name), "priority", lambda self, state, ctx: ctx.pos.to(torch.float64))


def _mut_last_row_only(mp, name):  # SimLayerKV's statistic from the last row alone (n_last ignored)
    mp.setattr(_cls(name), "observe_rows", property(lambda self: 1))


def _mut_evicts_one(mp, name):  # the full cache drops its oldest token
    mp.setattr(_cls(name), "cuts", STEP)
    mp.setattr(_cls(name), "evicts", True)
    mp.setattr(_cls(name), "budget_tokens", lambda self, n: n - 1)


MUTATIONS: list[tuple[str, str, Callable[[pytest.MonkeyPatch, str], None]]] = [
    ("full", "evicts one", _mut_evicts_one),
    ("window", "ranking reversed", _mut_reversed),
    ("streaming", "sinks dropped", _mut_no_sinks),
    ("h2o", "ranking reversed", _mut_reversed),
    ("h2o", "recent window off by one", _mut_recent_plus_one),
    ("h2o", "accumulate -> replace", _mut_replace),
    ("h2o", "per-head -> per-layer", _mut_per_layer),
    ("keyformer", "ranking reversed", _mut_reversed),
    ("keyformer", "recent window off by one", _mut_recent_plus_one),
    ("keyformer", "noise removed", _mut_no_noise),
    ("keyformer", "tau schedule removed", _mut_fixed_tau),
    ("keyformer", "per-head -> per-layer", _mut_per_layer),
    ("tova", "replace -> accumulate", _mut_accumulate_adds),
    ("tova", "ranking reversed", _mut_reversed),
    ("tova", "per-layer -> per-head", _mut_per_head),
    ("snapkv", "observation window ignored", _mut_all_rows),
    ("snapkv", "pooling removed", _mut_no_pooling),
    ("snapkv", "ranking reversed", _mut_reversed),
    ("pyramidkv", "uniform pyramid", _mut_uniform),
    ("pyramidkv", "pooling removed", _mut_no_pooling),
    ("adakv_snapkv", "uniform head budgets", _mut_uniform_heads),
    ("adakv_snapkv", "observation window ignored", _mut_all_rows),
    ("adakv_keyformer", "uniform head budgets", _mut_uniform_heads),
    ("adakv_keyformer", "noise removed", _mut_no_noise),
    ("finch", "row counts removed", _mut_no_row_counts),
    ("finch", "rows weighed by index", _mut_row_index),
    ("finch", "observation window ignored", _mut_all_rows),
    ("finch", "ranking reversed", _mut_reversed),
    ("simlayerkv", "no layer lazy", _mut_never_lazy),
    ("simlayerkv", "every layer lazy", _mut_always_lazy),
    ("simlayerkv", "initial tokens dropped", _mut_no_initial),
    ("simlayerkv", "last row only", _mut_last_row_only),
]


@pytest.mark.parametrize("name,label,mutate", MUTATIONS, ids=[f"{n}:{m}" for n, m, _ in MUTATIONS])
def test_rule_check_catches_mutation(name, label, mutate, monkeypatch):
    """Each planted change of a policy's rule makes its rule check fail."""
    mutate(monkeypatch, name)
    with pytest.raises(AssertionError):
        check_rule(name)


def test_every_referenced_policy_has_a_mutation():
    assert set(RULES) <= {n for n, _, _ in MUTATIONS}


# -- conf/policy YAML defaults == dataclass defaults ---------------------------------------------------------
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_yaml_defaults_equal_dataclass_defaults(name):
    """Each ``conf/policy/<name>.yaml`` builds its policy's class, names only its fields, and its literal
    values are the dataclass's defaults; ``${budget}`` / ``${recent}`` (the top-level knobs) resolve to them
    too. Every knob beyond budget, recent, prefill_only and sliding is written out."""
    from omegaconf import OmegaConf

    from keyformer.core.policies import policy_class

    path = CONF_DIR / "policy" / f"{name}.yaml"
    assert path.is_file(), f"policy {name!r} is registered but has no {path.relative_to(ROOT)}"
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    cls = POLICIES[name]
    assert policy_class(str(raw.pop("_target_"))) is cls
    assert raw.pop("wrap", None) == [], f"{path.name}: write `wrap: []` (wrappers, none by default)"
    top_level = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"), resolve=False)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for key, value in raw.items():
        assert key in defaults, f"{path.name}: {key!r} is not a field of {cls.__name__}"
        if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
            value = top_level[value[2:-1]]
        assert value == defaults[key] and type(value) is type(defaults[key]) or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and value == defaults[key]), (
            f"{path.name}: {key}={value!r} but {cls.__name__}.{key} defaults to {defaults[key]!r}")
    knobs = set(defaults) - {"budget", "recent", "prefill_only", "sliding"}
    assert knobs <= set(raw), f"{path.name} does not document {sorted(knobs - set(raw))}"


# -- the kvpress cross-check, live ---------------------------------------------------------------------------
XCHECK = ROOT / "results" / "crosscheck_kvpress"
