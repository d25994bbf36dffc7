"""The policy interface the docs describe is the code's: every hook written as ``name(args)`` in
docs/semantics.md and docs/add-a-policy.md has those parameters, in that order, in ``Policy``."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from keyformer.core.policies.base import Policy

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ("prepare", "score", "accumulate", "after_prompt", "priority", "layer_budget", "head_budgets")
CALL = re.compile(r"`(" + "|".join(HOOKS) + r")\(([^`)]*)\)")


def _documented(doc: str) -> list[tuple[str, list[str]]]:
    text = " ".join((ROOT / "docs" / doc).read_text().split())  # a call may wrap across lines
    return [(m[1], [a.split("=")[0].strip() for a in m[2].split(",") if a.strip()])
            for m in CALL.finditer(text)]


@pytest.mark.parametrize("doc", ["semantics.md", "add-a-policy.md"])
def test_documented_hooks_match_the_policy_class(doc: str) -> None:
    found = _documented(doc)
    assert found, f"docs/{doc} names no hook"
    for name, args in found:
        params = [p for p in inspect.signature(getattr(Policy, name)).parameters if p != "self"]
        assert args == params, f"docs/{doc}: {name}({', '.join(args)}) but Policy.{name}({', '.join(params)})"


def test_every_hook_is_documented_in_the_recipe() -> None:
    assert {name for name, _ in _documented("add-a-policy.md")} == set(HOOKS)
