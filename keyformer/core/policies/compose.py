"""Composition: a scorer says how it ranks tokens; wrappers say where and when it cuts.

A wrapper is a small mixin class (one file in ``keyformer/core/policies/wrappers/``) that subclasses
:class:`Wrapper`, sets ``wrap_name`` and overrides the hooks it changes (``schedule``, ``head_budgets``,
``layer_budget``, ``priority``, ...), calling ``super()`` for the scorer's own answer. Its knobs are dataclass
fields (with defaults), so ``+policy.<knob>=...`` sets them like a scorer's.

:func:`compose` builds the class ``Wrapper_n(... Wrapper_1(Scorer))`` for ``wrap = [w1, ..., wn]``: the list
goes from the scorer outwards (``wrap=[criticalkv, chunkkv]``: chunks of the rescaled scores). The class is a
dataclass with every field of the scorer and its wrappers, named ``scorer+w1+...+wn`` (its ``name``, what a
run records as ``policy`` and ``policy_spec.name``), and is not registered in ``POLICIES``: the registry holds
the methods, :data:`WRAPPERS` the wrappers.

A wrapper refuses, in one line, a scorer it cannot wrap (:meth:`Wrapper.refuses`): one whose hook it would
replace is already the scorer's own (Ada-KV over KVzip, a layer budget over PyramidKV), or a knob name the
scorer already has. A wrapper that needs something from the model (``prepare``) returns it with the inner
policy's through :func:`layered` and reads its own part with :func:`own`; the scorer's hooks still see theirs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import Context, Policy, Prompt

WRAPPERS: dict[str, type[Wrapper]] = {}


class Wrapper:
    """Base of the wrappers. ``wrap_name`` registers the class in :data:`WRAPPERS`; ``owns`` lists the hooks
    it replaces (a scorer or an inner wrapper that already has its own refuses the composition);
    ``adds_reads`` what it reads besides the scorer's (:data:`keyformer.core.policies.base.READS`); ``paper``
    and ``family`` label it in the methods table (``docs/methods.md``)."""

    wrap_name: ClassVar[str] = ""
    owns: ClassVar[tuple[str, ...]] = ()
    adds_reads: ClassVar[frozenset[str]] = frozenset()
    paper: ClassVar[str] = ""
    family: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("wrap_name"):
            taken = WRAPPERS.get(cls.wrap_name)
            if taken is not None and taken.__qualname__ != cls.__qualname__:
                raise TypeError(f"wrapper name {cls.wrap_name!r} is taken by {taken.__qualname__}")
            WRAPPERS[cls.wrap_name] = cls

    @classmethod
    def refuses(cls, inner: type[Policy]) -> str | None:
        """Why this wrapper cannot wrap ``inner`` (a policy class, maybe already wrapped), or None: a policy
        that never cuts, the wrapper's own reason (:meth:`refuses_own`), a hook ``inner`` already owns."""
        if not inner.evicts:
            return "it never cuts"
        own = cls.refuses_own(inner)
        if own is not None:
            return own
        for hook in cls.owns:
            mine = getattr(inner, hook)
            if mine is not getattr(Policy, hook):
                return f"{inner.name!r} already has its own {hook}"
        return None

    @classmethod
    def refuses_own(cls, inner: type[Policy]) -> str | None:
        """This wrapper's own reason to refuse ``inner`` (None: none)."""
        return None


@dataclass(frozen=True)
class Layered:
    """What a composed ``prepare`` returns: the inner policy's object and a preparing wrapper's own."""

    inner: Any
    own: Any


def check_int(name: str, value: Any, least: int, what: str) -> None:
    """A wrapper knob that must be an int ``>= least``: ValueError naming it, its value and what it counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r} must be an int >= {least} ({what})")


def layered(inner: Any, own: Any) -> Layered:
    return Layered(inner, own)


def own(ctx: Context) -> Any:
    """The preparing wrapper's own part of ``ctx.prepared``."""
    return ctx.prepared.own if isinstance(ctx.prepared, Layered) else None


def inner_ctx(ctx: Context) -> Context:
    """``ctx`` as the inner policy sees it: its own ``prepared``."""
    if isinstance(ctx.prepared, Layered):
        return dataclasses.replace(ctx, prepared=ctx.prepared.inner)
    return ctx


def parse_wrap(wrap: Any) -> tuple[str, ...]:
    """The wrapper names of a ``wrap`` value: None or [] (none), a name, a list of names, or names joined by
    commas or ``+``; ValueError naming the bad value and the valid wrappers."""
    if wrap is None:
        return ()
    if isinstance(wrap, str):
        items: Iterable[Any] = [w for part in wrap.split(",") for w in part.split("+")]
    elif isinstance(wrap, Iterable):
        items = list(wrap)
    else:
        raise ValueError(f"wrap={wrap!r} must be a list of wrapper names; valid: "
                         f"{', '.join(sorted(WRAPPERS))}")
    names = tuple(str(w).strip() for w in items if str(w).strip())
    bad = [w for w in names if w not in WRAPPERS]
    if bad:
        raise ValueError(f"wrap={list(names)!r}: {bad[0]!r} is not a wrapper; valid: "
                         f"{', '.join(sorted(WRAPPERS))}")
    if len(set(names)) != len(names):
        raise ValueError(f"wrap={list(names)!r} names a wrapper twice; valid: each of "
                         f"{', '.join(sorted(WRAPPERS))} at most once")
    return names


def split_name(name: str) -> tuple[str, tuple[str, ...]]:
    """``"tova+adakv+criticalkv"`` -> ``("tova", ("adakv", "criticalkv"))``; a plain name has no wrappers."""
    head, *rest = str(name).split("+")
    return head, parse_wrap(rest) if rest else ()


@functools.cache
def compose(inner: type[Policy], wrap: tuple[str, ...]) -> type[Policy]:
    """The policy class of ``inner`` wrapped by ``wrap`` (scorer outwards); ``inner`` itself when ``wrap`` is
    empty. ValueError (one line, naming the wrapper and the scorer) where a wrapper refuses."""
    if not wrap:
        return inner
    cls = inner
    for w in wrap:
        wcls = WRAPPERS[w]
        why = wcls.refuses(cls)
        if why is None:
            have = {f.name for f in dataclasses.fields(cls)}
            clash = sorted(have & set(getattr(wcls, "__dataclass_fields__", {})))
            why = f"{cls.name!r} already has the knob(s) {clash}" if clash else None
        if why:
            others = ", ".join(n for n in sorted(WRAPPERS) if n not in wrap)
            raise ValueError(f"wrap={list(wrap)!r}: wrapper {w!r} cannot wrap policy {inner.name!r}: {why}; "
                             f"valid: {others + ' or ' if others else ''}another policy")
        reads = frozenset(cls.reads) | wcls.adds_reads
        name = f"{cls.name}+{w}"
        ns: dict[str, Any] = {"reads": reads, "__module__": __name__,
                              "__qualname__": f"{inner.__qualname__}[{'+'.join(wrap[: wrap.index(w) + 1])}]"}
        if "attention" in reads and "attention" not in cls.reads:  # the wrapper reads the forward's values:
            ns["observe_rows"] = 1  # the scoring path runs for it, on one prompt row
        if "cuts" in wcls.__dict__:
            ns["cuts"] = wcls.__dict__["cuts"]
        new = dataclass(type(name, (wcls, cls), ns))
        new.name = name  # set after creation: a composition is not registered in POLICIES
        new.wrapped = (*cls.wrapped, w)
        new.scorer = cls.scorer or cls
        cls = new
    return cls


class PreparingWrapper(Wrapper):
    """A wrapper whose ``prepare`` adds something of its own (:class:`Layered`): every hook passes the inner
    policy its own ``prepared``. Subclasses write ``prepare_own(model)``. A composition holds at most one (the
    generic hooks sit once in the method order, so a second level would not be unwrapped)."""

    @classmethod
    def refuses(cls, inner: type[Policy]) -> str | None:
        if issubclass(inner, PreparingWrapper):  # one Layered level per composition: the hooks strip one
            return (f"{inner.name!r} already has a wrapper that prepares from the model; two such wrappers "
                    "do not compose")
        return super().refuses(inner)  # type: ignore[misc]

    def prepare_own(self, model: Any) -> Any:
        raise NotImplementedError

    def prepare(self, model: Any, prompt: Prompt | None = None) -> Any:
        return layered(super().prepare(model, prompt), self.prepare_own(model))  # type: ignore[misc]

    def score(self, probs: torch.Tensor, ctx: Context) -> torch.Tensor:
        return super().score(probs, inner_ctx(ctx))  # type: ignore[misc]

    def accumulate(self, state: torch.Tensor, s: torch.Tensor, ctx: Context) -> None:
        super().accumulate(state, s, inner_ctx(ctx))  # type: ignore[misc]

    def after_prompt(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        return super().after_prompt(state, inner_ctx(ctx))  # type: ignore[misc]

    def priority(self, state: torch.Tensor, ctx: Context) -> torch.Tensor:
        return super().priority(state, inner_ctx(ctx))  # type: ignore[misc]

    def layer_budget(self, k: torch.Tensor, n: torch.Tensor, ctx: Context) -> torch.Tensor:
        return super().layer_budget(k, n, inner_ctx(ctx))  # type: ignore[misc]

    def head_budgets(self, prio: torch.Tensor, keep_n: torch.Tensor, ctx: Context) -> torch.Tensor | None:
        return super().head_budgets(prio, keep_n, inner_ctx(ctx))  # type: ignore[misc]
