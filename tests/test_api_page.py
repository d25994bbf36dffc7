"""docs/api.md is what the code gives, and docs/add-a-policy.md's examples use public imports and run."""

from __future__ import annotations

import re
import sys
import types

import pytest

from keyformer.lab import api_page
from keyformer.run.paths import ROOT

GUIDE = ROOT / "docs" / "add-a-policy.md"


def test_api_page_is_generated_from_the_code():
    """Regenerate with ``python -m keyformer.lab.api_page`` after changing a hook, a field or a docstring."""
    assert api_page.PAGE.read_text(encoding="utf-8") == api_page.render()


def test_api_page_lists_every_hook_and_context_field():
    import dataclasses

    from keyformer import Context

    page = api_page.render()
    for hook in api_page.HOOKS:
        assert f"### `{hook}(" in page
    for f in dataclasses.fields(Context):
        assert f"| `{f.name}` |" in page


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def test_guide_examples_use_public_imports_and_compile():
    blocks = _python_blocks()
    assert len(blocks) >= 3
    for code in blocks:
        assert not re.search(r"^\s*from \.", code, flags=re.M), code  # no package-relative import
        assert "keyformer.core" not in code, code  # public names only: from keyformer import ...
        compile(code, str(GUIDE), "exec")


@pytest.mark.usefixtures("one_thread")
def test_guide_examples_run(monkeypatch):
    """The self-contained examples (not the ones importing a user's ``mypkg``) run, the rule check too."""
    from keyformer import WRAPPERS, Policy

    before, wrappers = dict(Policy.registry), dict(WRAPPERS)
    try:
        ran = 0
        for i, code in enumerate(_python_blocks()):
            if "mypkg" not in code:
                mod = types.ModuleType(f"add_a_policy_example{i}")  # dataclasses look their module up
                monkeypatch.setitem(sys.modules, mod.__name__, mod)
                exec(compile(code, str(GUIDE), "exec"), mod.__dict__)
                ran += 1
        assert ran >= 2
    finally:  # the examples' policies stay out of the other tests' parametrisations
        Policy.registry.clear()
        Policy.registry.update(before)
        WRAPPERS.clear()
        WRAPPERS.update(wrappers)
