"""The declared lifecycle: three policies written here, in the test file (a scorer, a key reader and an
every-n cutter), run through the shared contract of ``tests/test_policy_contract.py`` with no change to the
engine; and the engine consults a policy's kind only through :mod:`keyformer.core.scheduler`, at a pinned
list of sites."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from keyformer import make_cache, make_policy, tiny_model
from keyformer.core.policies import POLICIES, Context, Policy, Schedule, ScorePolicy, every
from keyformer.core.policies.base import PROMPT, STEP

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ("keyformer/core/cache.py", "keyformer/core/attention.py", "keyformer/core/generate.py",
          "keyformer/core/graphs.py", "keyformer/core/prompt_memo.py")


# -- three policies, one file each in real use ---------------------------------------------------------------
@dataclass
class SquaredAttention(ScorePolicy):
    """A scorer: the squared attention probability, accumulated (sharper than H2O)."""

    name: ClassVar[str] = "test_squared"

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        return probs.square_()


@dataclass
class KeyNorm(Policy):
    """A key reader: keep the keys of largest L2 norm (no attention weights)."""

    name: ClassVar[str] = "test_keynorm"
    reads: ClassVar[frozenset[str]] = frozenset({"tensors"})

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        return ctx.keys.float().norm(dim=-1)


@dataclass
class EveryFour(ScorePolicy):
    """An every-n cutter: H2O's score, the cache cut back to the budget every 4 decode steps."""

    name: ClassVar[str] = "test_every4"
    cuts: ClassVar[Schedule] = every(4)

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        return probs


LOCAL = {c.name: c for c in (SquaredAttention, KeyNorm, EveryFour)}
for _name in LOCAL:  # defined here, not registered for the other test modules' parametrisations
    Policy.registry.pop(_name)


@pytest.fixture
def registered(monkeypatch):
    for name, cls in LOCAL.items():
        monkeypatch.setitem(POLICIES, name, cls)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=0)


pytestmark = pytest.mark.usefixtures("one_thread", "registered")


def test_declarations_are_what_the_classes_say():
    assert SquaredAttention.reads == {"attention"} and SquaredAttention.cuts == STEP
    assert SquaredAttention.needs_attention and not KeyNorm.needs_attention
    assert make_policy("test_every4", budget=0.5).schedule == Schedule("every", 4)
    assert make_policy("test_every4", budget=0.5, prefill_only=True).schedule == PROMPT


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_contract_physical_equals_mask(llama, name):
    from test_policy_contract import test_physical_equals_mask

    test_physical_equals_mask(llama, name)


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_contract_budget_holds(llama, name):
    from test_policy_contract import test_budget_holds

    test_budget_holds(llama, name)


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_contract_padded_batch_equals_alone(llama, name):
    from test_policy_contract import test_padded_batch_equals_alone

    test_padded_batch_equals_alone(llama, name)


@pytest.mark.parametrize("arch_name", ("llama", "gpt2"))
@pytest.mark.parametrize("name", ("test_squared", "test_every4"))
def test_contract_matches_naive_reference(arch_name, name):
    from test_policy_contract import test_matches_naive_reference

    test_matches_naive_reference(arch_name, name)


def test_every_four_cuts_only_every_fourth_step(llama):
    """Between cuts the held count grows by one per step; at steps 4, 8 it is back at the budget."""
    ids = torch.randint(3, 256, (1, 40), generator=torch.Generator().manual_seed(0))
    pol = make_policy("test_every4", budget=0.5)
    held = []
    cache = make_cache(llama, pol, torch.ones_like(ids), max_new_tokens=9)
    with torch.inference_mode():
        o = llama(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache)
        held.append(len(cache.kept_positions(0)[0][0]))
        tok = o.logits[:, -1:].argmax(-1)
        for _ in range(9):
            o = llama(input_ids=tok, cache=cache)
            held.append(len(cache.kept_positions(0)[0][0]))
            tok = o.logits[:, -1:].argmax(-1)
    k = 20
    assert held == [k, k + 1, k + 2, k + 3, k, k + 1, k + 2, k + 3, k, k + 1]


def test_key_reader_keeps_the_largest_keys(llama):
    """The prompt cut keeps the recent window plus the largest-norm older keys, per head, computed here
    from the keys a full cache holds after the same prompt."""
    ids = torch.randint(3, 256, (1, 40), generator=torch.Generator().manual_seed(1))
    n, pol = 40, make_policy("test_keynorm", budget=0.5, recent=0.25)
    k, w = 20, 5
    full = make_cache(llama, make_policy("full"), torch.ones_like(ids))
    cache = make_cache(llama, pol, torch.ones_like(ids))
    with torch.inference_mode():
        llama(input_ids=ids, attention_mask=torch.ones_like(ids), cache=full)
        llama(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache)
    for li in range(len(cache.layers)):
        keys = full.layers[li].keys[0, :, :n].float()  # [Hkv, n, D], positions in order
        for h, kept in enumerate(cache.kept_positions(li)[0]):
            norms = keys[h].norm(dim=-1)[: n - w]
            top = set(torch.topk(norms, k - w).indices.tolist())
            assert sorted(kept) == sorted(top | set(range(n - w, n))), (li, h)


# -- where the engine asks a policy's kind ------------------------------------------------------------------
KIND = re.compile(r"scheduler\.\w+\(|policy\.(evicts|uses_noise|observe_rows|needs_attention|reads|cuts"
                  r"|schedule|prefill_only)\b")
GONE = re.compile(r"needs_context|adaptive_heads|\.compress\b|model_info|(?<!schedule)\.cuts_at\("
                  r"|\.interval\b|hasattr\([\w.]*policy")
# Every engine line that consults a policy's declared kind (through the scheduler or a derived attribute).
# Adding one fails this test: route the question through keyformer/core/scheduler.py and list it here.
SITES = {
    ("cache.py", "scheduler.cut"): 1,  # evict(): keep (append), one victim per step, or a cut to the budget
    ("cache.py", "scheduler.reads_tensors"): 1,  # the Context carries keys, live slots, layer state
    ("cache.py", "scheduler.room"): 1,  # buffer capacity (a value)
    ("cache.py", "scheduler.step_headroom"): 1,  # decode headroom (a value)
    ("cache.py", "scheduler.prompt_score_rows"): 1,  # prompt score rows per beam (a value)
    ("attention.py", "scheduler.scores_forward"): 1,  # scoring path or plain SDPA
    ("attention.py", "policy.observe_rows"): 1,  # prompt rows scored (a value)
    ("generate.py", "scheduler.prepares_on_prompt"): 1,  # prepare over the prompt (KVzip)
    ("graphs.py", "scheduler.graph_refusal"): 1,  # static-graph capture
}
VALUES = ("scheduler.room", "scheduler.step_headroom", "scheduler.prompt_score_rows", "policy.observe_rows")


def _engine_sites() -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for rel in ENGINE:
        for line in (ROOT / rel).read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            for what in {m.group(0).rstrip("(") for m in KIND.finditer(line)}:  # a line counts once
                key = (Path(rel).name, what)
                found[key] = found.get(key, 0) + 1
    return found


def test_engine_consults_the_kind_only_at_the_listed_sites():
    assert _engine_sites() == SITES
    branches = sum(v for (f, what), v in SITES.items() if what not in VALUES)
    assert branches <= 5


def test_the_replaced_flags_and_hooks_are_gone():
    files = [*ENGINE, "keyformer/core/scheduler.py",
             *(str(p.relative_to(ROOT)) for p in (ROOT / "keyformer/core/policies").glob("*.py"))]
    hits = [(f, i + 1, line) for f in files for i, line in enumerate((ROOT / f).read_text().splitlines())
            if GONE.search(line)]
    assert hits == []


def test_the_pattern_sees_a_planted_site():
    """The counter is not blind: a planted flag read and a planted scheduler call are both counted."""
    planted = "    if cache.policy.uses_noise and scheduler.cut(p, 1, prompt=False) == scheduler.ONE:"
    assert [m.group(0) for m in KIND.finditer(planted)] == ["policy.uses_noise", "scheduler.cut("]
    assert GONE.search("if policy.needs_context:") and GONE.search("hasattr(self.policy, 'x')")
