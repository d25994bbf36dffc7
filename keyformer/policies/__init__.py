"""Cache policies, one small file each. ``make_policy(name, **kwargs)`` builds one by name."""

from __future__ import annotations

from .base import Policy
from .full import FullPolicy
from .h2o import H2OPolicy
from .keyformer import KeyformerPolicy
from .window import StreamingPolicy, WindowPolicy

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (FullPolicy, WindowPolicy, StreamingPolicy, H2OPolicy, KeyformerPolicy)
}


def make_policy(name: str, **kwargs) -> Policy:
    """Build a policy by name; unknown names or knobs raise ``ValueError`` listing the valid ones."""
    if name not in POLICIES:
        raise ValueError(f"policy={name!r} is unknown; valid: {', '.join(POLICIES)}")
    cls = POLICIES[name]
    fields = set(cls.__dataclass_fields__)
    bad = sorted(set(kwargs) - fields)
    if bad:
        raise ValueError(f"policy {name!r} has no option(s) {bad}; valid: {sorted(fields)}")
    return cls(**kwargs)


__all__ = ["POLICIES", "Policy", "FullPolicy", "WindowPolicy", "StreamingPolicy", "H2OPolicy",
           "KeyformerPolicy", "make_policy"]
