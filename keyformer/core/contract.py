"""The policy contract, callable from your own tests: :func:`check_policy` runs a policy on tiny random models
(:func:`keyformer.tiny_model`) through the checks every built-in policy passes.

* ``physical == mask``: physical eviction gives the tokens, logits and kept positions of the mask simulation;
* ``budget``: after the prompt and at every decode step the live KV bytes are at most the budget rule's
  (``floor(n * budget)`` tokens, or an int budget, plus the decode tokens the schedule buffers between cuts);
* ``padded batch``: a left-padded batch gives each prompt's output alone;
* ``naive reference`` (policies that read attention probabilities): one eager forward over prompt + generated
  tokens whose per-layer, per-KV-head masks come from a slow row-by-row simulation over the full cache that
  applies the policy's own ``score``/``accumulate``/``after_prompt``/``priority`` hooks gives the same tokens.

With ``rule=fn`` (:mod:`keyformer.core.rule_check`), the kept positions are also checked against your own
naive rule at every step, layer and KV head.

A failing check raises :class:`ContractError` (an ``AssertionError``) naming the check, the policy, the
architecture and the first differing token::

    from keyformer.core.contract import check_policy
    check_policy(mypkg.MyPolicy)                       # a Policy subclass, built with budget=...
    check_policy(lambda budget: MyPolicy(budget=budget, sharpen=3.0), archs=("llama",))
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from keyformer.core.generate import generate, left_pad, make_cache
from keyformer.core.models import layer_windows, tiny_model
from keyformer.core.noise import prompt_noise
from keyformer.core.policies.base import Context, Policy

CHECKS = ("physical == mask", "budget", "padded batch", "naive reference")
NAIVE_ATTENTION = "keyformer_contract_naive"  # the attention implementation the naive forward runs
RowScore = Callable[[Policy, torch.Tensor, torch.Tensor, int, int], torch.Tensor]


class ContractError(AssertionError):
    """A policy broke one contract check; ``check``, ``policy``, ``arch`` say which, where."""

    def __init__(self, check: str, policy: str, arch: str, detail: str):
        self.check, self.policy, self.arch, self.detail = check, policy, arch, detail
        super().__init__(f"contract check {check!r} failed for policy {policy} on {arch}: {detail}")


@dataclass
class ContractReport:
    """What :func:`check_policy` ran: ``passed`` and ``skipped`` (with why) as (check, arch, budget)."""

    policy: str
    passed: list[tuple[str, str, float | int]] = field(default_factory=list)
    skipped: list[tuple[str, str, float | int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"{self.policy}: {len(self.passed)} checks passed, {len(self.skipped)} skipped"]
        lines += [f"  ok    {c} [{a}, budget={b}]" for c, a, b in self.passed]
        lines += [f"  skip  {c} [{a}, budget={b}]: {why}" for c, a, b, why in self.skipped]
        return "\n".join(lines)


def adaptive(policy: Policy) -> bool:
    """Whether the policy shares a layer's budget among its heads (Ada-KV): it writes ``head_budgets``."""
    return type(policy).head_budgets is not Policy.head_budgets


def policy_row_score(policy: Policy, probs: torch.Tensor, noise: torch.Tensor, step: int,
                     horizon: int) -> torch.Tensor:
    """One query row's scores [S] from its attention probabilities [S], through the policy's ``score``."""
    ctx = Context(step=step, horizon=horizon, noise=lambda draw=0: noise.view(1, 1, 1, 1, -1))
    return policy.score(probs.view(1, 1, 1, 1, -1).clone(), ctx).view(-1)


def compresses_sliding(policy: Policy, windows: Sequence[int | None]) -> bool:
    """Whether ``policy`` acts on the sliding layers of a model whose layers have these ``windows``
    (:func:`keyformer.core.models.layer_windows`): an evicting policy with ``sliding='policy'``, or
    ``'auto'`` where every layer slides (docs/models.md). Restated from the documented rule, not by calling
    :meth:`Policy.compresses_sliding`, so the naive reference does not inherit a bug in the cache's answer."""
    every = all(w is not None for w in windows)
    return policy.evicts and (policy.sliding == "policy" or (policy.sliding == "auto" and every))


# -- the naive reference -------------------------------------------------------------------------------------
MaskFn = Callable[[torch.Tensor, int, int | None], torch.Tensor]  # (logits, layer, sliding window) -> masks
_ACTIVE: list[tuple[MaskFn, bool]] = []  # the running forward's: mask function, policy on sliding layers


def _naive_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: Any, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    B, Hq, S, D = query.shape
    G = Hq // key.shape[1]
    kk, vv = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    logits = (query @ kk.transpose(-1, -2)).float() * (scaling or D**-0.5)  # [1, Hq, S, S]
    if kwargs.get("softcap") is not None:  # Gemma 2: the policy scores the capped logits' softmax
        logits = torch.tanh(logits / kwargs["softcap"]) * kwargs["softcap"]
    window = kwargs.get("sliding_window")
    mask_fn, sliding = _ACTIVE[-1]
    if window is not None and not sliding:  # a sliding layer the policy leaves alone: the model's band
        i, j = torch.arange(S).view(-1, 1), torch.arange(S).view(1, -1)
        mask = ((j <= i) & (j > i - window)).expand(Hq, S, S)
    else:
        mask = mask_fn(logits[0], module.layer_idx, window).repeat_interleave(G, dim=0)  # [Hq, S, S]
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    return (probs.to(vv.dtype) @ vv).transpose(1, 2), None


@contextlib.contextmanager
def naive_attention(mask_fn: MaskFn, sliding: bool = False) -> Iterator[str]:
    """Within the block, models set to the attention implementation it yields (:data:`NAIVE_ATTENTION`)
    attend through ``mask_fn(logits [Hq, S, S], layer, window) -> [Hkv, S, S]``: on full-attention layers
    (``window`` None), and on sliding layers (``window`` = the model's) with ``sliding``; without it a
    sliding layer attends within the model's band. Registration is idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAIVE_ATTENTION, _naive_attention)
    AttentionMaskInterface.register(NAIVE_ATTENTION, sdpa_mask)
    _ACTIVE.append((mask_fn, sliding))
    try:
        yield NAIVE_ATTENTION
    finally:
        _ACTIVE.pop()


def naive_logits(model: Any, policy: Policy, seq: torch.Tensor, n: int, seed: int, horizon: int,
                 layer_k: Callable[[int], int] | None = None,
                 row_score: RowScore | None = None) -> torch.Tensor:
    """Logits [1, S - n + 1, V] from position ``n - 1`` on of one eager forward over ``seq`` [1, S] (a prompt
    of ``n`` tokens and the tokens generated from it) under :func:`naive_masks`, on a copy of ``model``
    (its sliding layers under the policy where :func:`compresses_sliding` says so)."""
    naive = model.__class__(copy.deepcopy(model.config)).eval()
    naive.load_state_dict(model.state_dict())
    hkv = getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads
    sliding = compresses_sliding(policy, layer_windows(model.config))
    with naive_attention(naive_masks(policy, n, hkv, seed=seed, horizon=horizon, layer_k=layer_k,
                                     row_score=row_score), sliding) as impl:
        naive.set_attn_implementation(impl)
        with torch.inference_mode():
            return naive(input_ids=seq, use_cache=False).logits[:, n - 1:]


def naive_masks(policy: Policy, n: int, hkv: int, seed: int, horizon: int,
                layer_k: Callable[[int], int] | None = None, row_score: RowScore | None = None) -> MaskFn:
    """Mask function of the naive attention: python sets, row by row, per KV head. ``layer_k(layer)`` is a
    layer's budget (default: ``k`` everywhere), ``row_score`` one query row's scores (default: the policy's
    own ``score`` hook). On a sliding layer (``window`` W) a row i sees keys (i - W, i] at the prompt, the
    layer holds at most W - 1 tokens, and after each forward the token the window has left is dropped
    before the policy evicts (docs/models.md)."""
    row_score = row_score or policy_row_score
    k = int(policy.budget_tokens(torch.tensor([n]))[0]) if policy.evicts else 10**9
    w = min(int(policy.recent_tokens(torch.tensor([k]))[0]), k) if policy.evicts else 0
    rows = n if policy.observe_rows is None else min(n, policy.observe_rows)

    def prio_of(state, kept, cur, step):
        pos = torch.tensor(kept).view(1, 1, -1)
        ctx = Context(step=step, pos=pos, newest=torch.tensor([cur]), recent_window=torch.tensor([w]))
        p = policy.priority(state[kept].view(1, 1, -1).clone(), ctx)
        return {j: float(v) for j, v in zip(kept, p.view(-1).tolist(), strict=True)}

    def fold(state, idx, s, ctx):
        """The policy's accumulation rule (sum for most; TOVA replaces) on the entries ``idx``."""
        part = state[idx].view(1, 1, -1).clone()
        policy.accumulate(part, s.view(1, 1, -1), ctx)
        state[idx] = part.view(-1)

    def budget_of(layer: int) -> int:
        return layer_k(layer) if layer_k is not None and policy.evicts else k

    def ranked(items):  # (priority, position, head): kept first; ties to the more recent position
        return sorted(items, key=lambda t: (-t[0], -t[1], t[2]))

    def cut(prios: list[dict[int, float]], kl: int) -> list[list[int]]:
        """The prompt cut of every head among the candidates ``prios`` holds: recent window + top priorities,
        per head or shared (Ada-KV)."""
        heads, m = range(len(prios)), len(prios[0])
        pr = [{j: (torch.inf if j > n - 1 - w else p) for j, p in prios[h].items()} for h in heads]
        quota = [min(m, kl)] * len(prios)
        if adaptive(policy) and kl < m:
            safe = int(kl * policy.alpha_safeguard)
            boosted = []
            for h in heads:
                top = {j for _, j, _ in ranked([(p, j, h) for j, p in pr[h].items()])[:safe]}
                boosted += [(torch.inf if j in top else p, j, h) for j, p in pr[h].items()]
            chosen = ranked(boosted)[: kl * len(prios)]
            quota = [sum(1 for _, _, hh in chosen if hh == h) for h in heads]
        return [sorted(j for _, j, _ in ranked([(p, j, h) for j, p in pr[h].items()])[: quota[h]])
                for h in heads]

    def fn(logits, layer, window=None):  # logits [Hq, S, S] -> [Hkv, S, S]
        Hq, S, _ = logits.shape
        G = Hq // hkv
        kl = budget_of(layer) if window is None else min(budget_of(layer), window - 1)
        first = 0 if window is None else max(0, n - window + 1)  # the prompt's tokens the window still holds

        def seen(kept: list[int], i: int) -> list[int]:  # what the window lets a query after position i see
            return kept if window is None else [j for j in kept if j > i + 1 - window]

        masks, states, prios, accs = [], [], [], []
        # one set per layer (TOVA): mean of heads
        layer_mean = getattr(policy, "head_reduction", None) == "layer"
        for h in range(hkv):  # the prompt: full attention (sliding: the band), scores of the observed rows
            m = torch.zeros(S, S, dtype=torch.bool)
            acc = torch.zeros(n)
            for r in range(n):
                lo = 0 if window is None else max(0, r - window + 1)
                m[r, lo : r + 1] = True
                if policy.needs_attention and r >= n - rows:
                    pn = prompt_noise(seed, layer, r, r + 1, Hq, "cpu")[:, 0]
                    for g in range(G):
                        probs = torch.softmax(logits[h * G + g, r, lo : r + 1], -1)
                        acc[lo : r + 1] += row_score(policy, probs, pn[h * G + g, lo : r + 1], 0, horizon)
            masks.append(m)
            accs.append(acc)
        if layer_mean:
            accs = [torch.stack(accs).mean(0)] * hkv
        for h in range(hkv):  # folded into the state, pooled, prioritised
            state = torch.zeros(S)
            if policy.needs_attention:
                ctx = (Context(step=0, horizon=horizon, pos=torch.arange(n).view(1, 1, -1),
                               newest=torch.tensor([n - 1])))
                fold(state, list(range(n)), accs[h], ctx)
                state[:n] = policy.after_prompt(state[:n].view(1, 1, -1).clone(), ctx).view(-1)
            states.append(state)
            prios.append(prio_of(state, list(range(first, n)), n - 1, 0))
        cuts = cut(prios, kl) if kl < n - first else [list(range(first, n))] * hkv
        for h in range(hkv):  # decode: each head at its own budget
            m, state, kept = masks[h], states[h], cuts[h]
            kh = len(kept) if adaptive(policy) else kl
            for i in range(n, S):
                t = i - n + 1
                vis = [*kept, i]
                m[i, vis] = True
                if policy.schedule.when == "prompt" or not policy.evicts:
                    kept = seen(vis, i)
                    continue
                if policy.needs_attention:
                    pn = prompt_noise(seed, layer, i, i + 1, Hq, "cpu")[:, 0]
                    row = torch.zeros(len(vis))
                    # layer mean: every head holds this same set
                    for hh in (range(hkv) if layer_mean else [h]):
                        for g in range(G):
                            probs = torch.softmax(logits[hh * G + g, i, vis], -1)
                            row += row_score(policy, probs, pn[hh * G + g, vis], t, horizon)
                    row = row / hkv if layer_mean else row
                    fold(state, vis, row, Context(step=t, horizon=horizon))
                kept = seen(vis, i)  # the token the window has left goes first
                if policy.schedule.cuts_at(t):  # every step, or every n steps (a buffer cut at once)
                    prio = prio_of(state, kept, i, t)
                    while len(kept) > kh:
                        cands = [j for j in kept if not j > i - w]
                        victim = min(cands or kept, key=lambda j: (prio[j], j))
                        kept = [j for j in kept if j != victim]
        return torch.stack(masks)

    return fn




# -- the checks ----------------------------------------------------------------------------------------------
def _first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """Where two token sequences [L] first differ, in words."""
    n = min(len(a), len(b))
    diff = (a[:n] != b[:n]).nonzero()
    if len(diff):
        i = int(diff[0])
        return f"first differing token at step {i}: {int(a[i])} vs {int(b[i])}"
    return f"lengths {len(a)} vs {len(b)}" if len(a) != len(b) else "tokens equal"


def _prompt(seed: int, n: int, vocab: int = 256) -> torch.Tensor:
    return torch.randint(3, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def _budget_rule(policy: Policy, n: int) -> int:
    """The shared budget rule on the policy's ``budget`` field, not its (overridable) hooks."""
    return int(Policy.budget_tokens(policy, torch.tensor([n]))[0]) if policy.evicts else n


def _check_physical_mask(model: Any, policy: Policy, ids: torch.Tensor, new: int) -> str | None:
    outs = [generate(model, ids, None, policy, max_new_tokens=new, output_logits=True, seed=3, mode=m)
            for m in ("physical", "mask")]
    (tp, lp, cp), (tm, lm, cm) = ((o.sequences, o.logits, o.cache) for o in outs)
    if not torch.equal(tp, tm):
        return f"physical vs mask: {_first_difference(tp[0], tm[0])}"
    for li in range(len(cp.layers)):
        if cp.kept_positions(li) != cm.kept_positions(li):
            return f"physical vs mask: the kept positions of layer {li} differ (tokens equal)"
    gap = float((lp - lm).abs().max())
    return None if gap < 1e-4 else f"physical vs mask: logits differ by {gap:.2e} (tokens equal)"


def _check_budget(model: Any, policy: Policy, ids: torch.Tensor, new: int) -> str | None:
    from transformers import LogitsProcessor, LogitsProcessorList

    n = ids.shape[1]
    k = _budget_rule(policy, n)
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=new)
    sched = policy.schedule
    problems: list[str] = []

    class Every(LogitsProcessor):
        step = 0

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            t = self.step
            grow = (t if sched.when in ("never", "prompt") else t % sched.n if sched.when == "every" else 0)
            limit = 0
            for layer in cache.layers:
                per_token = layer.keys.shape[1] * layer.slot_bytes()
                held = k + grow  # a sliding layer: at most its window (all of it when the policy leaves it)
                if layer.window is not None:
                    held = layer.window - 1 if layer.keeps_window else min(held, layer.window - 1)
                limit += per_token * held
            used = cache.kv_bytes()[0]
            if used > limit and not problems:
                problems.append(f"step {t}: {used} live KV bytes > {limit} (budget {policy.budget!r}: {k} of "
                                f"{n} prompt tokens + {grow} buffered)")
            self.step += 1
            return scores

    every = Every()
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=new,
                   do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([every]))
    return problems[0] if problems else None


def _check_padded(model: Any, policy: Policy, new: int, n: int) -> str | None:
    lengths = (n - 10, n + 4, n - 3)
    prompts = [_prompt(10 + i, m)[0] for i, m in enumerate(lengths)]
    ids, mask = left_pad(prompts)
    batch = generate(model, ids, mask, policy, max_new_tokens=new, pad_token_id=0, seeds=[7, 8, 9])
    for i, p in enumerate(prompts):
        alone = generate(model, p.view(1, -1), None, policy, max_new_tokens=new, pad_token_id=0,
                         seeds=[7 + i]).sequences[0]
        if not torch.equal(batch.sequences[i, : len(alone)], alone):
            return f"padded sample {i} vs alone: {_first_difference(batch.sequences[i], alone)}"
    return None


def _check_naive(model: Any, policy: Policy, ids: torch.Tensor, new: int) -> str | None:
    n = ids.shape[1]
    out = generate(model, ids, None, policy, max_new_tokens=new, output_logits=True, seed=11)
    seq = torch.cat([ids, out.sequences[:, :-1]], dim=1)
    windows = layer_windows(model.config)
    acts = [li for li, w in enumerate(windows) if w is None or compresses_sliding(policy, windows)]
    k = int(policy.budget_tokens(torch.tensor([n]))[0]) if policy.evicts else n

    def layer_k(layer: int) -> int:  # the policy's own per-layer rule (PyramidKV), on the layers it acts on
        if layer not in acts:
            return k
        ctx = Context(layer=layer, num_layers=len(windows), policy_layer=acts.index(layer),
                      policy_layers=len(acts))
        return int(policy.layer_budget(torch.tensor([k]), torch.tensor([n]), ctx)[0])

    logits = naive_logits(model, policy, seq, n, seed=11, horizon=new, layer_k=layer_k)
    tokens = logits.argmax(-1)
    if not torch.equal(tokens, out.sequences):
        return f"naive reference vs generate: {_first_difference(tokens[0], out.sequences[0])}"
    gap = float((logits - out.logits).abs().max())
    return None if gap < 1e-4 else f"naive reference vs generate: logits differ by {gap:.2e} (tokens equal)"


def _naive_skip(policy: Policy) -> str | None:
    if not policy.needs_attention:
        return "reads no attention probabilities (the naive reference replays score hooks)"
    if "tensors" in policy.reads:
        return "reads keys/queries: its rule needs a reference of its own"
    if policy.on_evict is not None:
        return "has an eviction hook (on_evict): its rule needs a reference of its own"
    if adaptive(policy) and not hasattr(policy, "alpha_safeguard"):
        return "shares budgets among heads with its own rule (only Ada-KV's is replayed)"
    return None


def _run(check: str, model: Any, policy: Policy, n: int, new: int) -> str | None:
    """One check on one model: None when it holds, else what differs."""
    if check == "physical == mask":
        return _check_physical_mask(model, policy, _prompt(1, n), new)
    if check == "budget":
        return _check_budget(model, policy, _prompt(2, n), new)
    if check == "padded batch":
        return _check_padded(model, policy, new, n)
    return _check_naive(model, policy, _prompt(4, n), new)


def _build(factory: type[Policy] | Callable[..., Policy], budget: float | int, knobs: dict) -> Policy:
    policy = factory(budget=budget, **knobs)
    if not isinstance(policy, Policy):
        raise TypeError(f"check_policy: {factory!r} built {type(policy).__name__}, not a Policy; valid: a "
                        f"Policy subclass or a callable(budget=...) returning one")
    return policy


def _check_user_rule(report: ContractReport, rule: Callable[..., Any], arch: str, b: float | int,
                     policy: Policy, label: str, n: int, new: int) -> None:
    """The ``rule`` check on a sharpened tiny model of ``arch`` (:mod:`keyformer.core.rule_check`)."""
    from keyformer.core.rule_check import check_rule, rule_skip, sharpened

    model = sharpened(tiny_model(arch, seed=0))
    why = rule_skip(model)
    if why:
        report.skipped.append(("rule", arch, b, why))
        return
    problem = check_rule(model, policy, rule, n, new)
    if problem:
        raise ContractError("rule", label, f"{arch} (budget={b})", problem)
    report.passed.append(("rule", arch, b))


def check_policy(factory: type[Policy] | Callable[..., Policy], archs: Sequence[str] = ("llama", "gptj"),
                 budgets: Sequence[float | int] = (0.5,), checks: Sequence[str] = CHECKS,
                 prompt_tokens: int = 36, new_tokens: int = 10, rule: Callable[..., Any] | None = None,
                 **knobs: Any) -> ContractReport:
    """Run ``checks`` (of :data:`CHECKS`) on ``factory(budget=b, **knobs)`` for every architecture of
    ``archs`` (:data:`keyformer.SUPPORTED_ARCHS`, tiny random models) and budget ``b`` of ``budgets``.
    ``rule``: your rule written naively, ``rule(view) -> kept positions``
    (:class:`keyformer.core.rule_check.RuleView`), checked against the class at every step, layer and KV head
    (check ``"rule"``). Raises :class:`ContractError` at the first failing check; returns what passed and
    what was skipped."""
    bad = sorted(set(checks) - set(CHECKS))
    if bad:
        raise ValueError(f"checks={bad} unknown; valid: {', '.join(CHECKS)}")
    report: ContractReport | None = None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is faster
    try:
        for arch in archs:
            model = tiny_model(arch, seed=0)
            for b in budgets:
                policy = _build(factory, b, knobs)
                label = f"{type(policy).__module__}.{type(policy).__qualname__}"
                report = report or ContractReport(label)
                try:
                    policy.prepare(model)
                except ValueError as e:  # the policy refuses this architecture in one line
                    report.skipped += [(c, arch, b, f"refused: {e}") for c in checks]
                    continue
                for c in checks:
                    why = _naive_skip(policy) if c == "naive reference" else None
                    if why:
                        report.skipped.append((c, arch, b, why))
                        continue
                    problem = _run(c, model, policy, prompt_tokens, new_tokens)
                    if problem:
                        raise ContractError(c, label, f"{arch} (budget={b})", problem)
                    report.passed.append((c, arch, b))
                if rule is not None:
                    _check_user_rule(report, rule, arch, b, policy, label, prompt_tokens, new_tokens)
    finally:
        torch.set_num_threads(threads)
    if report is None:
        raise ValueError("check_policy needs at least one arch and one budget")
    return report
