"""Full cache: nothing is evicted. Token-identical to plain ``generate()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import NEVER, Policy, Schedule


@dataclass
class FullPolicy(Policy):
    budget: float | int = 1.0
    name: ClassVar[str] = "full"
    cuts: ClassVar[Schedule] = NEVER
