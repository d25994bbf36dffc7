"""The methods table, generated from the registry (``POLICIES`` and ``WRAPPERS``): one row per method and per
wrapper, from their classes' declarations (``paper``, ``family``, ``cuts``/``schedule``, ``reads``) and, where
a committed kvpress cross-check compares it, its mean kept-set Jaccard. ``docs/methods.md`` is this table
(``python -m experiments.crosscheck_kvpress.methods_doc`` writes it; a test checks it regenerates)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import Policy
from .compose import WRAPPERS, Wrapper

HEADER = ("| method | kind | paper | family | cuts | reads | kvpress Jaccard (0.5 / 0.2) |\n"
          "|---|---|---|---|---|---|---|")


def cuts_of(policy: Policy) -> str:
    """When a policy's default instance cuts, in words."""
    s = policy.schedule
    return {"never": "never", "prompt": "prompt only", "step": "every step"}.get(s.when, f"every {s.n} steps")


def reads_of(cls: type) -> str:
    reads = sorted(getattr(cls, "reads", ()) or getattr(cls, "adds_reads", ()))
    return ", ".join(reads) or "positions"


def parts_of(cls: type[Policy]) -> tuple[str, list[str]]:
    """(scorer name, wrapper names) of a registered policy class: a composition's parts, or (its name, [])."""
    wrappers = [c.wrap_name for c in cls.__mro__ if issubclass(c, Wrapper) and c.__dict__.get("wrap_name")]
    base = next((c for c in cls.__mro__[1:] if issubclass(c, Policy) and "name" in c.__dict__), None)
    return (base.name, wrappers) if wrappers and base is not None else (cls.name, [])


def kind_of(cls: type[Policy]) -> str:
    base, wrappers = parts_of(cls)
    return f"composition: {base}+{'+'.join(wrappers)}" if wrappers else "scorer"


def _pair(j: Mapping[float, float]) -> str:
    return " / ".join(f"{j[b]:.3f}" if b in j else "—" for b in (0.5, 0.2))


def _jaccard(name: str, jaccard: Mapping[str, Mapping[float, float]],
             variant: Mapping[str, Mapping[float, float]]) -> str:
    j = jaccard.get(name)
    if not j:
        return "—"
    v = variant.get(name)
    return _pair(j) + (f" ({_pair(v)} with kvpress changed)" if v else "")


def rows(jaccard: Mapping[str, Mapping[float, float]] | None = None,
         variant: Mapping[str, Mapping[float, float]] | None = None) -> list[list[str]]:
    """The table's rows: methods (registry order: by name), then wrappers (by name). ``jaccard``: the
    cross-check's mean Jaccard per policy and budget; ``variant``: the same for the kvpress variant (a
    ``[kv: ...]`` row) closest to ours, shown beside it."""
    from . import POLICIES, make_policy  # the package imports this module while it registers

    jaccard, variant = jaccard or {}, variant or {}
    out = []
    for name in sorted(POLICIES):
        cls = POLICIES[name]
        out.append([f"`{name}`", kind_of(cls), cls.paper or "—", cls.family or "—",
                    cuts_of(make_policy(name)), reads_of(cls), _jaccard(name, jaccard, variant)])
    composed = {k: (k.split("+")[0], k.split("+")[1:]) if "+" in k else parts_of(POLICIES[k])
                for k in jaccard if "+" in k or k in POLICIES}
    for name in sorted(WRAPPERS):
        w: Any = WRAPPERS[name]
        cuts = "sets the schedule" if "schedule" in w.owns else "the scorer's"
        # a composition the cross-check ran: written with +, or registered under its own name (adakv_snapkv)
        over = sorted((parts[0], k) for k, parts in composed.items() if name in parts[1])
        xcheck = f"{_jaccard(over[0][1], jaccard, variant)}, over {over[0][0]}" if over else "—"
        out.append([f"`wrap=[{name}]`", "wrapper", w.paper or "—", w.family or "—", cuts,
                    f"+ {reads_of(w)}" if w.adds_reads else "the scorer's", xcheck])
    return out


def render(jaccard: Mapping[str, Mapping[float, float]] | None = None,
           variant: Mapping[str, Mapping[float, float]] | None = None) -> str:
    """The markdown table (:func:`rows`)."""
    lines = [HEADER] + ["| " + " | ".join(r) + " |" for r in rows(jaccard, variant)]
    return "\n".join(lines) + "\n"
