"""Ada-KV over SnapKV and over Keyformer, as named methods: the ``adakv`` wrapper
(:mod:`keyformer.core.policies.wrappers.adakv`) over each scorer, kept under the names the committed results
use. ``policy=snapkv policy.wrap=[adakv]`` is the same method (same kept tokens, tested).

Scores are comparable across heads because both inner policies score with attention probabilities (SnapKV:
pooled observation-window attention; Keyformer: Gumbel-softmax probabilities). ``adakv_snapkv`` keeps every
generated token (prompt compression only); ``adakv_keyformer`` evicts one token per head at every decode
step, so each head stays at its own budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .keyformer import KeyformerPolicy
from .snapkv import SnapKVPolicy
from .wrappers.adakv import AdaKV, AdaKVMixin, _rank

__all__ = ["AdaKVMixin", "AdaKVSnapKVPolicy", "AdaKVKeyformerPolicy", "_rank"]


@dataclass
class AdaKVSnapKVPolicy(AdaKV, SnapKVPolicy):
    name: ClassVar[str] = "adakv_snapkv"
    paper: ClassVar[str] = "Feng et al. 2024, arXiv 2407.11550"
    family: ClassVar[str] = "attention, head allocation"


@dataclass
class AdaKVKeyformerPolicy(AdaKV, KeyformerPolicy):
    name: ClassVar[str] = "adakv_keyformer"
    paper: ClassVar[str] = "Feng et al. 2024 over Adnan et al. 2024"
    family: ClassVar[str] = "attention, head allocation"
