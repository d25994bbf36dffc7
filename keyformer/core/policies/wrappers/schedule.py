"""When a scorer cuts, whatever it declares: ``every`` (after the prompt, then every ``cut_every`` decode
steps; the new tokens are buffered between cuts, as R-KV and kvpress's ``DecodingPress`` with its
``compression_interval``), ``step`` (after the prompt and at every decode step: a prompt compressor such as
SnapKV made per-step) and ``prompt`` (once after the prompt, every generated token kept: kvpress's setting;
the same as the ``prefill_only`` knob). A cut on a byte threshold is ``every``: the cache holds the budget
plus at most ``cut_every - 1`` tokens per layer and head, so its live bytes stay below the budget's plus that
many tokens' bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..base import PROMPT, STEP, Schedule, every
from ..compose import Wrapper, check_int


class _ScheduleWrapper(Wrapper):
    owns: ClassVar[tuple[str, ...]] = ("schedule",)
    family: ClassVar[str] = "schedule"


@dataclass
class Every(_ScheduleWrapper):
    cut_every: int = 16

    wrap_name: ClassVar[str] = "every"
    cuts: ClassVar[Schedule] = every(1)  # the class's; an instance cuts every ``cut_every`` steps
    paper: ClassVar[str] = "kvpress DecodingPress; R-KV's buffer"

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        check_int("cut_every", self.cut_every, 1, "decode steps between cuts")

    @property
    def schedule(self) -> Schedule:
        return PROMPT if self.prefill_only else every(self.cut_every)  # type: ignore[attr-defined]


@dataclass
class Step(_ScheduleWrapper):
    wrap_name: ClassVar[str] = "step"
    cuts: ClassVar[Schedule] = STEP

    @property
    def schedule(self) -> Schedule:
        return PROMPT if self.prefill_only else STEP  # type: ignore[attr-defined]


@dataclass
class PromptOnce(_ScheduleWrapper):
    wrap_name: ClassVar[str] = "prompt"
    cuts: ClassVar[Schedule] = PROMPT
    paper: ClassVar[str] = "kvpress presses (prefill compression)"

    @property
    def schedule(self) -> Schedule:
        return PROMPT
