"""Keyformer lab: KV-cache eviction research (full, window, H2O, Keyformer) with physical eviction.

The public names below are imported on first use (PEP 562), so ``import keyformer`` and the light modules
(``keyformer.run.metrics``, ``keyformer.run.data``, ``keyformer.run.results``, ``keyformer.run.validate``) do
not load torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS = {
    "KVCache": "core.cache",
    "GenerationOutput": "core.generate",
    "generate": "core.generate",
    "make_cache": "core.generate",
    "SUPPORTED_ARCHS": "core.models",
    "prepare_model": "core.models",
    "tiny_model": "core.models",
    "POLICIES": "core.policies",
    "WRAPPERS": "core.policies",
    "Wrapper": "core.policies",
    "Policy": "core.policies",
    "ScorePolicy": "core.policies",
    "Context": "core.policies",
    "Prompt": "core.policies",
    "Schedule": "core.policies",
    "NEVER": "core.policies",
    "PROMPT": "core.policies",
    "STEP": "core.policies",
    "every": "core.policies",
    "make_policy": "core.policies",
    "check_policy": "core.contract",
    "ContractError": "core.contract",
    "RuleView": "core.rule_check",
    "load": "run.api",
    "apply": "run.api",
}

__all__ = ["KVCache", "GenerationOutput", "generate", "make_cache", "SUPPORTED_ARCHS", "prepare_model",
           "tiny_model", "POLICIES", "WRAPPERS", "Wrapper", "Policy", "ScorePolicy", "Context", "Prompt",
           "Schedule", "NEVER", "PROMPT", "STEP", "every", "make_policy", "check_policy", "ContractError",
           "RuleView", "load", "apply"]

if TYPE_CHECKING:
    from .core.cache import KVCache
    from .core.contract import ContractError, check_policy
    from .core.generate import GenerationOutput, generate, make_cache
    from .core.models import SUPPORTED_ARCHS, prepare_model, tiny_model
    from .core.policies import (
        NEVER,
        POLICIES,
        PROMPT,
        STEP,
        Context,
        Policy,
        Prompt,
        Schedule,
        ScorePolicy,
        every,
        make_policy,
    )
    from .core.rule_check import RuleView
    from .run.api import apply, load


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        try:
            module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
        except AttributeError as e:  # raised inside the submodule: not "no such name" of this package
            raise ImportError(f"importing {__name__}.{_EXPORTS[name]} failed: {e}") from e
        value = getattr(module, name)
        globals()[name] = value  # cached: later lookups do not come here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

