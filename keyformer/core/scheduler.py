"""The one place the engine asks a policy's declared lifecycle (``cuts``/``schedule`` and ``reads``).

The cache, the attention path, ``make_cache`` and the graph capture call these functions; none of them reads
a policy's kind itself (``tests/test_policy_lifecycle.py`` counts the engine's reads). Each function answers
one question the engine has at one point of a forward.
"""

from __future__ import annotations

from .policies.base import Policy


def scores_forward(policy: Policy, prompt: bool) -> bool:
    """Whether this forward runs the scoring path (attention probabilities to ``policy.score``): the policy
    reads attention, and this is the prompt or a decode step of a policy that cuts after the prompt."""
    return "attention" in policy.reads and (prompt or policy.schedule.when in ("step", "every"))


KEEP, ONE, ALL = "keep", "one", "all"


def cut(policy: Policy, step: int, prompt: bool) -> str:
    """How this forward (the prompt's, or that of decode step ``step``) ends: ``KEEP`` (no cut: the new tokens
    are appended), ``ONE`` (a decode step of a policy that cuts every step: one victim per new token) or
    ``ALL`` (a cut of everything above the budget at once: the prompt's, or a buffer's every ``n`` steps)."""
    schedule = policy.schedule
    if not schedule.cuts_at(step, prompt):
        return KEEP
    return ONE if not prompt and schedule.when == "step" else ALL


def room(policy: Policy, max_new_tokens: int) -> int:
    """Slots decode tokens take above the budget (see :meth:`Schedule.room`)."""
    return policy.schedule.room(max_new_tokens)


def step_headroom(policy: Policy, max_new_tokens: int) -> int:
    """Slots a decode step needs past the held tokens: its own, plus the room of an evicting policy whose
    cache grows between cuts (a full cache's growth is reserved with the prompt, :func:`room`)."""
    return 1 + (room(policy, max_new_tokens) if policy.schedule.evicts else 0)


def reads_tensors(policy: Policy) -> bool:
    """Whether the policy's :class:`Context` carries held keys, live slots and the layer state."""
    return "tensors" in policy.reads


def prompt_score_rows(policy: Policy, beams: int) -> int:
    """Rows of prompt scores per sample when ``beams`` prompt-once beams share one kept set (1 otherwise):
    one per beam where the policy's noise differs by beam, else 1 (every beam's scores equal the sample's)."""
    return beams if policy.uses_noise else 1


def prepares_on_prompt(policy: Policy) -> bool:
    """Whether ``prepare`` runs over the prompt (an extra forward) rather than once per model."""
    return "prompt" in policy.reads


def graph_refusal(policy: Policy) -> str | None:
    """Why a decode step of this policy cannot be captured as a static graph, or None."""
    if not policy.schedule.evicts:
        return f"policy {policy.name!r} keeps every token: the attended length grows each step"
    if policy.schedule.when != "step":
        return (f"policy {policy.name!r} cuts with schedule {policy.schedule.when!r} (compress): the cache "
                "grows between cuts")
    if reads_tensors(policy):
        return f"policy {policy.name!r} keeps per-step state (reads tensors): not captured"
    if policy.on_evict is not None:
        return f"policy {policy.name!r} has an eviction hook (on_evict): a cut's shapes depend on it"
    return None
