"""Cache policies, one small file each, found automatically.

A policy is a :class:`Policy` subclass with a ``name`` in a module of this package; configs build it with
Hydra's ``_target_`` (``conf/policy/<name>.yaml``). :func:`make_policy` builds one by name,
:func:`build_policy` from a config node. Adding a policy is one file here plus one YAML. Wrappers
(``wrappers/``, :data:`WRAPPERS`) compose over any policy: ``make_policy("tova", wrap=["adakv"])``,
``make_policy("tova+adakv")`` or a node's ``wrap: [adakv]`` (:mod:`.compose`).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from .base import NEVER, PROMPT, STEP, Context, Policy, Prompt, Schedule, ScorePolicy, every
from .compose import WRAPPERS, Wrapper, compose, parse_wrap, split_name
from .full import FullPolicy
from .h2o import H2OPolicy
from .keyformer import KeyformerPolicy
from .window import StreamingPolicy, WindowPolicy

for _m in pkgutil.iter_modules(__path__):  # every policy module registers its classes on import
    importlib.import_module(f"{__name__}.{_m.name}")

POLICIES: dict[str, type[Policy]] = Policy.registry


def policy_class(target: str) -> type[Policy]:
    """The policy class of a name (``h2o``; ``tova+adakv``: a composition) or a ``_target_`` path: a
    built-in one (``keyformer.core.policies.h2o.H2OPolicy``) or one from any importable module
    (``mypkg.MyPolicy``, a :class:`Policy` subclass with a ``name``; importing it registers it)."""
    if target in POLICIES:
        return POLICIES[target]
    if "+" in str(target):
        head, wrap = split_name(target)
        return compose(policy_class(head), wrap)
    if "." not in str(target):
        raise ValueError(f"policy={target!r} is unknown; valid: {', '.join(POLICIES)}, or a class path "
                         f"mypkg.MyPolicy")
    mod, _, cls = str(target).rpartition(".")
    try:
        obj = getattr(importlib.import_module(mod), cls)
    except ImportError as e:
        raise ValueError(f"policy._target_={target!r} cannot be imported ({type(e).__name__}: {e}); "
                         f"valid: an importable Policy subclass path (is its folder on PYTHONPATH?) "
                         f"or one of {', '.join(POLICIES)}") from None
    except AttributeError:
        raise ValueError(f"policy._target_={target!r}: module {mod!r} has no {cls!r}; valid: a Policy "
                         f"subclass defined there, or one of {', '.join(POLICIES)}") from None
    if not (isinstance(obj, type) and issubclass(obj, Policy)):
        raise ValueError(f"policy._target_={target!r} is {type(obj).__name__} {obj!r}, not a "
                         f"keyformer Policy subclass; valid: a Policy subclass path, or one of "
                         f"{', '.join(POLICIES)}")
    if "name" not in obj.__dict__ and POLICIES.get(obj.name) is not obj:
        raise ValueError(f"policy._target_={target!r} has no name of its own (name={obj.name!r}); set "
                         f"name: ClassVar[str] = '...' on the class (it labels the results)")
    return obj


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build a policy by name; unknown names or knobs raise ``ValueError`` listing the valid ones. ``wrap``
    (a list of :data:`WRAPPERS` names, scorer outwards) composes wrappers over it."""
    cls = compose(policy_class(name), parse_wrap(kwargs.pop("wrap", None)))
    fields = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    bad = sorted(set(kwargs) - fields)
    if bad:
        raise ValueError(f"policy {cls.name!r} has no option(s) {bad}; valid: {sorted(fields)}")
    return cls(**kwargs)


def _target(node: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    kwargs = dict(node)
    target = kwargs.pop("_target_", None) or kwargs.pop("name", None)
    kwargs.pop("name", None)
    if target is None:
        raise ValueError(f"policy node {dict(node)} has no _target_; valid policies: {', '.join(POLICIES)}")
    return str(target), kwargs


def split_node(node: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(policy name, keyword arguments) of a config node with ``_target_`` (or a legacy ``name``); a node's
    ``wrap`` names its wrappers (the name is then the composition's, ``tova+adakv``)."""
    target, kwargs = _target(node)
    wrap = parse_wrap(kwargs.pop("wrap", None))
    return compose(policy_class(target), wrap).name, kwargs


def build_policy(node: Mapping[str, Any]) -> Policy:
    """The policy a config node describes (``{_target_: ..., budget: ..., ...}``): the class its
    ``_target_`` names, even where another class has since taken that class's name."""
    target, kwargs = _target(node)
    return make_policy(target, **kwargs)


__all__ = ["POLICIES", "WRAPPERS", "Wrapper", "compose", "Context", "Policy", "ScorePolicy", "Schedule",
           "Prompt", "NEVER", "PROMPT", "STEP", "every", "FullPolicy", "WindowPolicy", "StreamingPolicy",
           "H2OPolicy", "KeyformerPolicy", "make_policy", "build_policy", "split_node", "policy_class"]
