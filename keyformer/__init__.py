"""Keyformer lab: KV-cache eviction research (full, window, H2O, Keyformer) with physical eviction.

The public names below are imported on first use (PEP 562), so ``import keyformer`` and the light modules
(``keyformer.metrics``, ``keyformer.data``, ``keyformer.results``, ``keyformer.errors``) do not load torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# public name -> the submodule that defines it
_EXPORTS = {
    "KVCache": "cache",
    "GenerationOutput": "generate",
    "generate": "generate",
    "make_cache": "generate",
    "SUPPORTED_ARCHS": "models",
    "prepare_model": "models",
    "tiny_model": "models",
    "POLICIES": "policies",
    "Policy": "policies",
    "make_policy": "policies",
}

__all__ = ["KVCache", "GenerationOutput", "generate", "make_cache", "SUPPORTED_ARCHS", "prepare_model",
           "tiny_model", "POLICIES", "Policy", "make_policy"]

if TYPE_CHECKING:
    from .cache import KVCache
    from .generate import GenerationOutput, generate, make_cache
    from .models import SUPPORTED_ARCHS, prepare_model, tiny_model
    from .policies import POLICIES, Policy, make_policy


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


class _Package(types.ModuleType):
    """``keyformer.generate`` is the function, as with an eager ``from .generate import generate``: importing
    the submodule ``keyformer.generate`` would otherwise bind the module to the package attribute."""

    @property
    def generate(self) -> Any:
        from .generate import generate

        return generate

    @generate.setter
    def generate(self, value: Any) -> None:  # the import system binding the submodule: keep the function
        pass


sys.modules[__name__].__class__ = _Package
