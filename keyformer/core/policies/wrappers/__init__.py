"""Wrappers, one small file each, found automatically: a :class:`~keyformer.core.policies.compose.Wrapper`
subclass with a ``wrap_name`` in a module of this package registers itself in ``WRAPPERS``."""

from __future__ import annotations

import importlib
import pkgutil

for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
