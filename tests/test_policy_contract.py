"""Every registered policy, through the same checks (a new policy file is picked up with no edit here):

* physical eviction == mask simulation (tokens, logits, kept positions);
* the budget holds after the prompt and at every decode step;
* a left-padded batch gives each prompt's output alone;
* a hand-written naive reference: one eager forward over prompt + generated tokens whose per-layer,
  per-KV-head masks come from a row-by-row Python simulation of the budget rules (full prompt attention, cut
  to k with the recent window, then at each step: attend to the kept set + itself, fold in its scores with
  the policy's accumulation rule, evict the lowest-priority non-recent token, oldest first). H2O's and
  Keyformer's scores are written out as plain softmax math there.

``mistral_sliding`` is the tiny Mistral with every layer sliding (window 24): there the policy compresses the
sliding layers within the model's window (``sliding='auto'``; ``tests/test_all_sliding.py``).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from keyformer import generate, make_cache, make_policy, tiny_model
from keyformer.core.contract import adaptive, compresses_sliding, naive_logits, policy_row_score
from keyformer.core.generate import left_pad
from keyformer.core.models import layer_windows
from keyformer.core.policies import POLICIES
from keyformer.core.policies.base import Policy

N, NEW = 36, 10
SLIDING_WINDOW = 24  # mistral_sliding: above the budget (18 of 36 tokens), so that the policy chooses; below
# the prompt, so that tokens leave the window
# The naive forward needs the AttentionInterface (MPT: physical == mask only). gemma3_text: hybrid
# sliding/global layers, QK-norm, query_pre_attn_scalar; gemma2: sliding layers and logit soft-capping
# (tests/test_archs.py); mistral_sliding: every layer slides, compressed by the policy. With -m slow: gemma2's
# model tests, mistral, qwen2 (hybrid: layer 0 global, layer 1 sliding), qwen3 and phi3.
_SLOW = tuple(pytest.param(a, marks=pytest.mark.slow) for a in ("mistral", "qwen2", "qwen3", "phi3"))
ARCHS = ("llama", "gptj", "gpt2", "gemma3_text", "gemma2", "mistral_sliding", *_SLOW)
MODEL_ARCHS = ("llama", "gptj", "gpt2", "mpt", "gemma3_text", "mistral_sliding",
               pytest.param("gemma2", marks=pytest.mark.slow), *_SLOW)


def _tiny(arch: str):
    """The tiny model of ``arch``; ``mistral_sliding``: Mistral with ``sliding_window`` on every layer."""
    if arch == "mistral_sliding":
        return tiny_model("mistral", seed=0, sliding_window=SLIDING_WINDOW)
    return tiny_model(arch, seed=0)


def _acts(policy, model) -> list[int]:
    """The layers ``policy`` acts on: the full-attention ones, and the sliding ones it compresses."""
    windows = layer_windows(model.config)
    return [li for li, w in enumerate(windows) if w is None or compresses_sliding(policy, windows)]


def _policy(name: str, **kw):
    """The policy at budget 0.5; observation windows (SnapKV family) shrunk to 8 so that scores decide."""
    if not POLICIES[name].evicts:
        return make_policy(name)
    if "window_size" in POLICIES[name].__dataclass_fields__:
        kw.setdefault("window_size", 8)
    if "buffer" in POLICIES[name].__dataclass_fields__:  # a cut inside the NEW decode steps (R-KV: buffer
        kw.setdefault("buffer", 8)  # >= window)
    kw.setdefault("budget", 0.5)
    return make_policy(name, **kw)


_adaptive = adaptive  # whether the policy shares a layer's budget among its heads (Ada-KV)


def _prompt(seed: int, n: int = N) -> torch.Tensor:
    return torch.randint(3, 256, (1, n), generator=torch.Generator().manual_seed(seed))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", params=MODEL_ARCHS)
def arch(request):
    return request.param


@pytest.fixture(autouse=True)
def _skip_where_the_policy_refuses_the_arch(request):
    """A policy may refuse an architecture in one line (``prepare``: Expected Attention reads the model's
    RoPE): its tests on that arch are skipped with that line."""
    name = getattr(getattr(request.node, "callspec", None), "params", {}).get("name")
    if name is None or "model" not in request.fixturenames:
        return
    try:
        _policy(name).prepare(request.getfixturevalue("model"))
    except ValueError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def model(arch, device):
    return _tiny(arch).to(device)


def _outcome(model, policy, ids, **kw):
    """Tokens, logits and the kept positions of every layer, of one generation."""
    out = generate(model, ids.to(model.device), None, policy, max_new_tokens=NEW, output_logits=True, **kw)
    return out.sequences, out.logits, [out.cache.kept_positions(li) for li in range(len(out.cache.layers))]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_physical_equals_mask(model, name):
    (tok_p, log_p, kept_p), (tok_m, log_m, kept_m) = (
        _outcome(model, _policy(name), _prompt(1), seed=3, mode=mode) for mode in ("physical", "mask"))
    assert torch.equal(tok_p, tok_m) and kept_p == kept_m
    assert (log_p - log_m).abs().max() < 1e-4


class _Every(LogitsProcessor):
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, input_ids, scores):
        self.fn(self.calls)
        self.calls += 1
        return scores


def layer_budgets(policy, k: int, n: int, acts: list[int], layers: int) -> list[int]:
    """Each layer's budget, from the policies' rules rather than their classes: PyramidKV's pyramid over the
    layers it acts on (``acts``; the hand formula of ``test_policy_rules.pyramid_budgets``), ``k`` for every
    other policy (they keep the base rule: a new override needs its formula here)."""
    from test_policy_rules import pyramid_budgets  # noqa: E402  (the rule tests' hand formula)

    if policy.name != "pyramidkv":
        assert type(policy).layer_budget is Policy.layer_budget, f"{policy.name}: write its per-layer rule"
        return [k] * layers
    assert not policy.fallback  # the contract tests run the default (no fallback to uniform budgets)
    per = (pyramid_budgets(k, min(policy.window_size, k), n, policy.beta, len(acts)) if len(acts) > 1
           else [min(max(k, 1), n)])
    return [per[acts.index(li)] if li in acts else k for li in range(layers)]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_budget_holds(model, name):
    """Each layer holds its budget (per-layer policies: the layer's share; Ada-KV: the layer's budget shared
    among its heads, each head's share fixed at the prompt), after the prompt and at every decode step."""
    pol, ids = _policy(name), _prompt(2).to(model.device)
    cache = make_cache(model, pol, torch.ones_like(ids), max_new_tokens=NEW)
    k = int(pol.budget_tokens(torch.tensor([N]))[0]) if pol.evicts else N
    nl, grows = len(cache.layers), pol.schedule.when in ("never", "prompt")
    windows = layer_windows(model.config)
    acts = _acts(pol, model)
    kl = layer_budgets(pol, k, N, acts, nl) if pol.evicts else [N] * nl
    first: dict[int, list[int]] = {}

    def check(step):
        grow = step if grows else step % pol.schedule.n if pol.schedule.when == "every" else 0
        for li, layer in enumerate(cache.layers):
            heads = [len(h) for h in cache.kept_positions(li)[0]]
            if windows[li] is not None and li not in acts:  # keeps the model's window (W - 1 + the spare)
                assert heads == [windows[li] - 1] * len(heads) and layer.keys.shape[2] == windows[li], (li,
                                                                                                        step)
                continue
            if windows[li] is not None:  # compressed within the model's window: at most W - 1, none older
                cur, cap = N - 1 + step, windows[li] - 1
                assert all(p > cur - cap for h in cache.kept_positions(li)[0] for p in h), (li, step)
                assert layer.keys.shape[2] <= windows[li], (li, step)
                if pol.schedule.when == "step":  # the budget, capped at the window
                    assert sum(heads) == len(heads) * min(kl[li], cap), (li, step)
                    assert _adaptive(pol) or heads == [min(kl[li], cap)] * len(heads), (li, step)
                else:  # the cut's budget, then tokens appended since, less those the window has left
                    assert max(heads) <= cap, (li, step)
                    assert sum(heads) <= len(heads) * min(kl[li] + grow, cap), (li, step)
                    assert step or sum(heads) == len(heads) * min(kl[li], cap), li
                continue
            assert sum(heads) == len(heads) * (kl[li] + grow), (li, step)  # the layer's budget
            share = first.setdefault(li, [h - grow for h in heads])
            assert heads == [h + grow for h in share], (li, step)  # each head keeps its share
            if not _adaptive(pol):
                assert all(h == kl[li] + grow for h in heads) and layer.length == kl[li] + grow, (li, step)
            if not grows:  # the budget + one spare slot (+ the buffer between cuts), nothing more
                room = pol.schedule.n - 1 if pol.schedule.when == "every" else 0
                assert layer.keys.shape[2] == max(heads) - grow + room + 1

    every = _Every(check)
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=NEW,
                   do_sample=False, pad_token_id=0, logits_processor=LogitsProcessorList([every]))
    assert every.calls == NEW


# Qwen3's padded keys differ from the unpadded ones in their last bits on the tiny model; leverage (a linear
# solve over a head's held keys) amplifies that past near-ties (test_methods_rules.py leaves it out too).
PAD_SENSITIVE = {("leverage", "qwen3")}  # (policy, the model's model_type)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_padded_batch_equals_alone(model, name):
    arch = model.config.model_type
    if (name, arch) in PAD_SENSITIVE:
        pytest.skip(f"{name} on {arch}: padding's last-bit key differences decide near-tied leverages")
    lengths = (26, 40, 33)
    prompts = [_prompt(10 + i, n)[0] for i, n in enumerate(lengths)]
    ids, mask = left_pad(prompts)
    pol, dev = _policy(name), model.device
    batch = (generate(model, ids.to(dev), mask.to(dev), pol, max_new_tokens=NEW, pad_token_id=0,
                      seeds=[7, 8, 9]))
    for i, p in enumerate(prompts):
        alone = (generate(model, p.view(1, -1).to(dev), None, pol, max_new_tokens=NEW, pad_token_id=0,
                          seeds=[7 + i]))
        a = alone.sequences[0]
        assert torch.equal(batch.sequences[i, : len(a)], a), f"sample {i}"
        if len(a) == NEW:
            assert batch.kv_bytes[i] == alone.kv_bytes[0]


# -- the naive reference -------------------------------------------------------------------------------------
def _row_score(policy, probs: torch.Tensor, noise: torch.Tensor, step: int, horizon: int) -> torch.Tensor:
    """One query row's scores [S] from its attention probabilities [S]; H2O and Keyformer as plain math."""
    if policy.name == "h2o":
        return probs
    if policy.name == "keyformer":
        # logits + Gumbel, up to a row constant
        x = probs.log() - noise.log() if policy.noise else probs.log()
        return torch.softmax(x / policy.tau(step, horizon), -1)
    return policy_row_score(policy, probs, noise, step, horizon)


def _layer_k(policy, n: int, model):
    """Each layer's budget by the hand formula of :func:`layer_budgets` over the layers the policy acts on."""
    k = int(policy.budget_tokens(torch.tensor([n]))[0]) if policy.evicts else n
    acts = _acts(policy, model)
    per = layer_budgets(policy, k, n, acts, model.config.num_hidden_layers) if policy.evicts else None
    return (lambda layer: per[layer]) if per else None


@pytest.mark.parametrize("arch_name", ARCHS)
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_matches_naive_reference(arch_name, name):
    if "tensors" in POLICIES[name].reads:
        pytest.skip("rules on keys and queries (not attention rows): naive references in "
                    "tests/test_new_policies.py")
    model = _tiny(arch_name)
    pol, ids = _policy(name), _prompt(4)
    if name in ("keyformer", "adakv_keyformer"):
        pol = make_policy(name, budget=0.5, recent=0.2)
    out = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=11)
    seq = torch.cat([ids, out.sequences[:, :-1]], dim=1)
    logits = naive_logits(model, pol, seq, N, seed=11, horizon=NEW, layer_k=_layer_k(pol, N, model),
                          row_score=_row_score)
    assert (logits - out.logits).abs().max() < 1e-4
    assert torch.equal(logits.argmax(-1), out.sequences)


@pytest.mark.parametrize("name", ("h2o", "keyformer", "tova", "streaming"))
def test_prefill_only_matches_naive_reference(name):
    """``prefill_only=true`` turns a step policy into a prompt compressor: the cut after the prompt is the
    policy's own, every generated token is then kept (the naive reference's ``PROMPT`` schedule)."""
    model = tiny_model("llama", seed=0)
    pol, ids = make_policy(name, budget=0.5, prefill_only=True), _prompt(5)
    assert pol.schedule.when == "prompt" and make_policy(name, budget=0.5).schedule.when == "step"
    out = generate(model, ids, None, pol, max_new_tokens=NEW, output_logits=True, seed=3)
    k = int(pol.budget_tokens(torch.tensor([N]))[0])
    # the last token is not cached yet
    assert all(len(s) == k + NEW - 1 for s in out.cache.kept_positions(0)[0])
    seq = torch.cat([ids, out.sequences[:, :-1]], dim=1)
    logits = naive_logits(model, pol, seq, N, seed=3, horizon=NEW, layer_k=_layer_k(pol, N, model),
                          row_score=_row_score)
    assert (logits - out.logits).abs().max() < 1e-4


def test_prefill_only_validation():
    with pytest.raises(ValueError, match="prefill_only"):
        make_policy("h2o", prefill_only="yes")


class _HostSyncs:
    """Counts tensor -> Python reads (``.item()``, ``int()``, ``bool()``): host synchronisations on a GPU."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket.__name__ in ("_local_scalar_dense", "item", "is_nonzero"):
                    outer.n += 1
                return func(*args, **(kwargs or {}))

        self.n, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _steady_syncs(model, policy, n: int = N) -> int:
    ids = torch.cat([_prompt(5, n), _prompt(6, n)]).to(model.device)
    cache = make_cache(model, policy, torch.ones_like(ids), max_new_tokens=8)
    with torch.inference_mode():
        tok = model(input_ids=ids, cache=cache).logits[:, -1:].argmax(-1)
        tok = model(input_ids=tok, cache=cache).logits[:, -1:].argmax(-1)
        with _HostSyncs() as syncs:
            for _ in range(3):
                tok = model(input_ids=tok, cache=cache).logits[:, -1:].argmax(-1)
    return syncs.n


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_steady_decode_step_has_no_host_sync(model, name):
    """Once every sample holds its budget, a decode step (model included) never reads a tensor on the host."""
    pol, windows = _policy(name), layer_windows(model.config)
    if pol.schedule.when != "step" and any(windows) and compresses_sliding(pol, windows):
        pytest.skip("a decode step without a cut compacts a sliding layer under the policy (the token "
                    "leaving the window goes, per head): one host read (docs/models.md)")
    assert _steady_syncs(model, pol) == 0


def test_host_sync_counter_sees_the_growing_path():
    """Positive control: an absolute budget above the prompt takes the growing path, which reads counts."""
    assert _steady_syncs(tiny_model("llama"), make_policy("h2o", budget=N + 20)) > 0


@pytest.mark.parametrize("name", ("h2o", "tova"))
def test_growing_and_full_samples_share_decode_steps(name):
    """An absolute budget between two prompts' lengths: the short sample grows toward it while the long one
    evicts a token per step (the growing path, where the long sample's new token moves into a victim's slot
    and the short one's fills its next slot). Each sample's tokens and kept positions equal its own run
    alone, and physical equals mask, for policies whose scores accumulate (H2O) or are replaced (TOVA)."""
    model = tiny_model("llama")
    prompts = [_prompt(30, 12)[0], _prompt(31, 30)[0]]
    ids, mask = left_pad(prompts)
    pol = make_policy(name, budget=20)
    kw = dict(max_new_tokens=12, pad_token_id=0, seeds=[5, 6])
    phys = generate(model, ids, mask, pol, **kw)
    sim = generate(model, ids, mask, pol, mode="mask", **kw)
    assert torch.equal(phys.sequences, sim.sequences)
    for li in range(len(phys.cache.layers)):
        assert phys.cache.kept_positions(li) == sim.cache.kept_positions(li)
    for i, p in enumerate(prompts):
        alone = generate(model, p.view(1, -1), None, pol, max_new_tokens=12, pad_token_id=0, seeds=[5 + i])
        assert torch.equal(phys.sequences[i, -12:], alone.sequences[0, -12:])
        for li in range(len(phys.cache.layers)):
            assert phys.cache.kept_positions(li)[i] == alone.cache.kept_positions(li)[0]


@pytest.mark.parametrize("name", ("h2o", "keyformer"))
def test_shared_beam_scores(model, name):
    """The authors' beam semantics: beam copies noised independently, scores summed, one kept set per
    sample."""
    ids = torch.cat([_prompt(20), _prompt(21)]).to(model.device)
    pol = _policy(name)
    kw = dict(max_new_tokens=6, num_beams=3, beam_scores="shared", seed=4)
    phys = generate(model, ids, None, pol, **kw)
    sim = generate(model, ids, None, pol, mode="mask", **kw)
    assert torch.equal(phys.sequences, sim.sequences)
    for li in range(len(phys.cache.layers)):
        kept = phys.cache.kept_positions(li)
        assert kept == sim.cache.kept_positions(li)
        assert kept[0] == kept[1] == kept[2] and kept[3] == kept[4] == kept[5]  # one set per sample
    if name == "keyformer":  # the beams' noise fields differ: the summed score is not one beam's score
        per_beam = generate(model, ids, None, pol, max_new_tokens=6, num_beams=3, seed=4)
        assert [per_beam.cache.kept_positions(li) for li in range(2)] != [phys.cache.kept_positions(li)
                                                                          for li in range(2)]



class _Forwards:
    """Counts the model's forwards and the tokens they read."""

    def __init__(self, model):
        self.calls, self.tokens = 0, 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls, self.tokens = self.calls + 1, self.tokens + ids.shape[1]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_shared_prompt_equals_its_own(model, name):
    """PromptMemo: a run whose prompt forward is another budget's (copied uncut, cut to this run's budget and
    recent window) gives the tokens, logits, kept sets and KV bytes of a run with its own forward, and runs
    no prompt forward; a padded batch with per-sample seeds, in both modes."""
    from keyformer.core.prompt_memo import PromptMemo

    lengths = (30, 36)
    ids = torch.zeros(2, max(lengths), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, -n:], mask[i, -n:] = _prompt(40 + i, n)[0], 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    settings = [dict(budget=0.5), dict(budget=0.25), dict(budget=0.75, recent=0.5)]
    for mode in ("physical", "mask"):
        memo = PromptMemo()
        kw = dict(max_new_tokens=NEW, output_logits=True, seeds=[5, 6], mode=mode, pad_token_id=0)
        for i, b in enumerate([*settings, settings[0]]):
            pol = _policy(name, **b)
            own = generate(model, ids, mask, pol, **kw)
            counter = _Forwards(model)
            try:
                shared = generate(model, ids, mask, pol, prompt_memo=memo, **kw)
            finally:
                counter.handle.remove()
            assert shared.prompt_reused == (i > 0) and not own.prompt_reused
            # a reused prompt runs no prompt forward (nor KVzip's reconstruction): only the decode steps'
            assert counter.tokens == NEW - 1 if i > 0 else counter.tokens >= ids.shape[1] + NEW - 1
            assert torch.equal(shared.sequences, own.sequences), (mode, b)
            assert torch.equal(shared.logits, own.logits), (mode, b)
            assert shared.kv_bytes == own.kv_bytes
            for li in range(len(own.cache.layers)):
                assert shared.cache.kept_positions(li) == own.cache.kept_positions(li), (mode, b, li)
        assert (memo.misses, memo.hits, len(memo.entries)) == (1, 3, 1)


@pytest.mark.parametrize("name", ("h2o", "keyformer", "snapkv", "kvzip", "rkv", "expected_attention",
                                  "capkv"))
def test_shared_context_equals_its_own(model, name):
    """Query-agnostic runs (a context compressed once, then questions): the same with a shared context
    forward as with its own."""
    from keyformer.core.generate import generate_from_context
    from keyformer.core.prompt_memo import PromptMemo

    ctx = _prompt(50, N).to(model.device)
    questions = [[5, 6, 7], [9, 10]]
    memo = PromptMemo()
    for i, b in enumerate((0.5, 0.25)):
        pol = _policy(name, budget=b)
        _, own = generate_from_context(model, ctx, questions, pol, max_new_tokens=6, seed=3)
        _, shared = generate_from_context(model, ctx, questions, pol, max_new_tokens=6, seed=3,
                                          prompt_memo=memo)
        assert memo.last_hit == (i > 0)
        assert [(o.tokens, o.kv_bytes) for o in shared] == [(o.tokens, o.kv_bytes) for o in own], b
    assert (memo.misses, memo.hits) == (1, 1)


def test_prompt_memo_key_separates_what_changes_the_prompt_forward():
    """No sharing across prompts, masks, seeds, modes, horizons, policy settings other than the budget, or
    models with other weights; the least recently used entry leaves first beyond ``max_bytes``."""
    from keyformer.core.prompt_memo import PromptMemo

    model, other = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    ids = _prompt(60)
    memo = PromptMemo()
    base = dict(model=model, policy=make_policy("keyformer", budget=0.5), ids=ids, seed=3, mode="physical",
                new=NEW)
    variants = [dict(), dict(model=other), dict(ids=_prompt(61)), dict(seed=4), dict(mode="mask"),
                dict(new=NEW + 1), dict(policy=make_policy("keyformer", budget=0.5, tau_end=3.0)),
                dict(policy=make_policy("h2o", budget=0.5))]
    for v in variants:
        a = {**base, **v}
        generate(a["model"], a["ids"], None, a["policy"], max_new_tokens=a["new"], seed=a["seed"],
                 mode=a["mode"], prompt_memo=memo)
    assert (memo.misses, memo.hits) == (len(variants), 0)
    generate(model, ids, None, make_policy("keyformer", budget=0.25, recent=0.1), max_new_tokens=NEW, seed=3,
             prompt_memo=memo)
    assert memo.hits == 1
    one = next(iter(memo.entries.values())).nbytes
    small, h2o = PromptMemo(max_bytes=2 * one), make_policy("h2o", budget=0.5)
    for s in (3, 4, 5):
        generate(model, ids, None, h2o, max_new_tokens=NEW, seed=s, prompt_memo=small)
    assert len(small.entries) == 2 and small.nbytes <= 2 * one
    generate(model, ids, None, h2o, max_new_tokens=NEW, seed=3, prompt_memo=small)
    assert small.hits == 0  # seed 3's entry left first
    with pytest.raises(ValueError, match="num_beams=2"):
        generate(model, ids, None, make_policy("h2o"), max_new_tokens=2, num_beams=2, prompt_memo=memo)
    with pytest.raises(ValueError, match="max_bytes"):
        PromptMemo(max_bytes=-1)

def test_right_padding_is_refused():
    model, ids = tiny_model("llama"), torch.cat([_prompt(30), _prompt(31)])
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # right-padded row
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, ids, mask, _policy("h2o"), max_new_tokens=2)


def test_pyramid_and_adakv_budgets_act():
    """On a prompt where they can act, PyramidKV's layer budgets differ and average k, and Ada-KV's head
    budgets differ, sum to the layer's budget and respect the safeguard."""
    model, ids = tiny_model("llama", seed=0), _prompt(6, 64)
    k = 32
    pyr = make_policy("pyramidkv", budget=0.5, window_size=4)
    out = generate(model, ids, None, pyr, max_new_tokens=2, seed=1)
    held = [len(out.cache.kept_positions(li)[0][0]) - 1 for li in range(len(out.cache.layers))]
    assert held[0] > held[-1] and abs(sum(held) - k * len(held)) <= len(held) / 2  # mean k, up to rounding
    assert min(held) >= 4  # every layer keeps the observation window
    ada = make_policy("adakv_keyformer", budget=0.5)
    out = generate(model, ids, None, ada, max_new_tokens=2, seed=1)
    for li in range(len(out.cache.layers)):
        heads = [len(h) for h in out.cache.kept_positions(li)[0]]
        assert sum(heads) == k * len(heads) and min(heads) >= int(k * ada.alpha_safeguard)
    assert (any(len({len(h) for h in out.cache.kept_positions(li)[0]}) > 1
                for li in range(len(out.cache.layers))))
    with pytest.raises(ValueError, match="fractional budget"):
        make_policy("adakv_snapkv", budget=16)
    with pytest.raises(ValueError, match="head_reduction"):
        make_policy("adakv_keyformer", head_reduction="shared")
    with pytest.raises(ValueError, match="beta"):
        make_policy("pyramidkv", beta=0)


@pytest.mark.slow
def test_keyformer_physical_is_mask_at_a_long_prompt():
    """At 600 prompt tokens Keyformer draws ~10^6 noise values per layer; a zero draw (fixed in noise.py) made
    its scores NaN and the physical cache evict differently from the mask simulation."""
    model = tiny_model("llama")
    ids = torch.randint(3, model.config.vocab_size, (2, 600), generator=torch.Generator().manual_seed(0))
    pol = make_policy("keyformer", budget=0.5)
    phys = generate(model, ids, None, pol, max_new_tokens=8, seed=4)
    sim = generate(model, ids, None, pol, mode="mask", max_new_tokens=8, seed=4)
    assert torch.equal(phys.sequences, sim.sequences)
    for li in range(len(phys.cache.layers)):
        assert phys.cache.kept_positions(li) == sim.cache.kept_positions(li)
        assert not phys.cache.layers[li].score.isnan().any()
