"""Keyformer lab: KV-cache eviction research (full, window, H2O, Keyformer) with physical eviction."""

from .cache import KVCache
from .generate import GenerationOutput, generate, make_cache
from .models import SUPPORTED_ARCHS, prepare_model, tiny_model
from .policies import POLICIES, Policy, make_policy

__all__ = ["KVCache", "GenerationOutput", "generate", "make_cache", "SUPPORTED_ARCHS", "prepare_model",
           "tiny_model", "POLICIES", "Policy", "make_policy"]
