"""Cache policies, one small file each, found automatically.

A policy is a :class:`Policy` subclass with a ``name`` in a module of this package; configs build it with
Hydra's ``_target_`` (``conf/policy/<name>.yaml``). :func:`make_policy` builds one by name,
:func:`build_policy` from a config node. Adding a policy is one file here plus one YAML.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from .base import NEVER, PROMPT, STEP, Context, Policy, Prompt, Schedule, ScorePolicy, every
from .full import FullPolicy
from .h2o import H2OPolicy
from .keyformer import KeyformerPolicy
from .window import StreamingPolicy, WindowPolicy

for _m in pkgutil.iter_modules(__path__):  # every policy module registers its classes on import
    importlib.import_module(f"{__name__}.{_m.name}")

POLICIES: dict[str, type[Policy]] = Policy.registry


def policy_class(target: str) -> type[Policy]:
    """The policy class of a name (``h2o``) or a ``_target_`` path
    (``keyformer.core.policies.h2o.H2OPolicy``)."""
    if target in POLICIES:
        return POLICIES[target]
    if "." in str(target):
        mod, _, cls = str(target).rpartition(".")
        try:
            obj = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):
            obj = None
        if isinstance(obj, type) and issubclass(obj, Policy) and obj.name in POLICIES:
            return obj
    raise ValueError(f"policy={target!r} is unknown; valid: {', '.join(POLICIES)}")


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build a policy by name; unknown names or knobs raise ``ValueError`` listing the valid ones."""
    cls = policy_class(name)
    fields = {f for f in cls.__dataclass_fields__ if not f.startswith("_")}
    bad = sorted(set(kwargs) - fields)
    if bad:
        raise ValueError(f"policy {cls.name!r} has no option(s) {bad}; valid: {sorted(fields)}")
    return cls(**kwargs)


def split_node(node: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(policy name, keyword arguments) of a config node with ``_target_`` (or a legacy ``name``)."""
    kwargs = dict(node)
    target = kwargs.pop("_target_", None) or kwargs.pop("name", None)
    kwargs.pop("name", None)
    if target is None:
        raise ValueError(f"policy node {dict(node)} has no _target_; valid policies: {', '.join(POLICIES)}")
    return policy_class(str(target)).name, kwargs


def build_policy(node: Mapping[str, Any]) -> Policy:
    """The policy a config node describes (``{_target_: ..., budget: ..., ...}``)."""
    name, kwargs = split_node(node)
    return make_policy(name, **kwargs)


__all__ = ["POLICIES", "Context", "Policy", "ScorePolicy", "Schedule", "Prompt", "NEVER", "PROMPT", "STEP",
           "every", "FullPolicy", "WindowPolicy", "StreamingPolicy", "H2OPolicy", "KeyformerPolicy",
           "make_policy", "build_policy", "split_node", "policy_class"]
