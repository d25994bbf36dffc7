"""The declared lifecycle: three policies written here, in the test file (a scorer, a key reader and an
every-n cutter), run through the shared contract of ``tests/test_policy_contract.py`` with no change to the
engine; and the engine consults a policy's kind only through :mod:`keyformer.core.scheduler`, at a pinned
list of sites; no policy registers a global attention implementation or keeps module state (KVzip)."""

from __future__ import annotations

import ast
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


# -- no global attention implementation, no module state (KVzip's reconstruction, issue #59) ---------------
REGISTER = re.compile(r"\b(?:AttentionInterface|AttentionMaskInterface|ALL_(?:MASK_)?ATTENTION_FUNCTIONS)"
                      r"\s*\.\s*register\b|\bALL_(?:MASK_)?ATTENTION_FUNCTIONS\s*\[[^]]*\]\s*=(?!=)")
# The lines under keyformer/ that write transformers' global attention tables, per file. models.py's is how a
# prepared model reaches keyformer.core.attention (transformers looks ``config._attn_implementation``, a
# string, up in that global table; a model cannot be given a function of its own). contract.py (the contract
# tests' naive attention) and lm_eval's per-row scoring register theirs too. No policy does: KVzip's
# reconstruction reaches its recorder through the forward's cache (keyformer/core/policies/kvzip.py).
REGISTERS = {"keyformer/core/models.py": 2, "keyformer/core/contract.py": 2,
             "keyformer/run/tasks/lm_eval/per_row.py": 2}
MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque",
                 "local", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet", "ContextVar"}
SWITCHES = {"AttentionInterface", "AttentionMaskInterface", "set_attn_implementation", "_attn_implementation"}


def _registrations() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted((ROOT / "keyformer").rglob("*.py")):
        n = sum(1 for line in path.read_text().splitlines()
                if not line.lstrip().startswith("#") and REGISTER.search(line))
        if n:
            found[str(path.relative_to(ROOT))] = n
    return found


def _module_state(source: str) -> list[str]:
    """What a module keeps as mutable state: names bound at module level (outside functions and classes) to
    a dict, list or set (literal, comprehension or constructor call, e.g. ``defaultdict(list)``), and every
    ``global`` statement (a function rebinding a module name)."""
    found: list[str] = []

    def mutable(v: ast.expr | None) -> bool:
        if isinstance(v, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
            return True
        if isinstance(v, ast.Call):
            f = v.func
            return (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "") \
                in MUTABLE_CALLS
        return False

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if targets and mutable(node.value):
                found.extend(ast.unparse(t) for t in targets)
            for field in ("body", "orelse", "finalbody", "handlers"):  # if / try / with at module level
                visit(getattr(node, field, []))

    tree = ast.parse(source)
    visit(tree.body)
    found.extend(f"global {', '.join(g.names)}" for g in ast.walk(tree) if isinstance(g, ast.Global))
    return found


def _names(source: str) -> set[str]:
    """The names a module's code uses (names, attributes, imports; not its docstrings or comments)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(a.name.rsplit(".", 1)[-1] for a in node.names)
    return out


def test_no_policy_registers_a_global_attention_implementation():
    found = _registrations()
    assert found == REGISTERS
    assert not [f for f in found if f.startswith("keyformer/core/policies/")]


def test_kvzip_keeps_no_module_state():
    """KVzip's recording lives in a ``Recorder`` made per reconstruction forward: kvzip.py binds no mutable
    container at module level, rebinds no global, and never switches a model's attention implementation."""
    source = (ROOT / "keyformer/core/policies/kvzip.py").read_text()
    assert _module_state(source) == []
    assert _names(source) & SWITCHES == set()


def test_the_checks_see_planted_registrations_and_state():
    """The two checks are not blind: planted registrations and module state (the shapes KVzip had) are seen,
    and constants are not."""
    for line in ('AttentionInterface.register(RECORD_IMPL, _record_attention)',
                 "    AttentionMaskInterface.register(RECORD_IMPL, sdpa_mask)",
                 'ALL_ATTENTION_FUNCTIONS["kf"] = fn',
                 "ALL_MASK_ATTENTION_FUNCTIONS.register('kf', sdpa_mask)"):
        assert REGISTER.search(line), line
    assert not REGISTER.search('if ALL_ATTENTION_FUNCTIONS["kf"] == fn:')
    planted = """
import collections
RECORD_IMPL = "keyformer_kvzip_record"
BLOCK_FLOATS = 2 * 2**20
PIECES = (1, 2)
_RECORD: dict[str, Any] = {}
_SEEN = collections.defaultdict(list)
if True:
    _STACK = []

class Holder:
    table = {}

def record(x):
    global _LAST
    local = {}
    _RECORD["scores"] = x
"""
    assert _module_state(planted) == ["_RECORD", "_SEEN", "_STACK", "global _LAST"]
    switch = "from transformers import AttentionInterface\nmodel.set_attn_implementation(impl)\n"
    assert _names(switch) & SWITCHES == {"AttentionInterface", "set_attn_implementation"}
    prose = '"""Not an AttentionInterface."""\n# model.config._attn_implementation\n'
    assert _names(prose) & SWITCHES == set()
