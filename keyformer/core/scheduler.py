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


def cuts_now(policy: Policy, step: int, prompt: bool) -> bool:
    """Whether this forward (the prompt's, or that of decode step ``step``) ends with a cut to the budget."""
    return policy.schedule.cuts_at(step, prompt)


def one_per_step(policy: Policy) -> bool:
    """Whether a decode-step cut evicts exactly one token (every step cuts), not a buffer at once."""
    return policy.schedule.when == "step"


def room(policy: Policy, max_new_tokens: int) -> int:
    """Slots decode tokens take above the budget (see :meth:`Schedule.room`)."""
    return policy.schedule.room(max_new_tokens)


def step_headroom(policy: Policy, max_new_tokens: int) -> int:
    """Slots a decode step needs past the held tokens: its own, plus the room of an evicting policy whose
    cache grows between cuts (a full cache's growth is reserved with the prompt, :func:`room`)."""
    return 1 + (room(policy, max_new_tokens) if policy.schedule.evicts else 0)


def keeps_scores(policy: Policy) -> bool:
    """Whether the cache holds a per-slot score state for the policy (it reads attention)."""
    return "attention" in policy.reads


def reads_tensors(policy: Policy) -> bool:
    """Whether the policy's :class:`Context` carries held keys, live slots and the layer state."""
    return "tensors" in policy.reads


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
    return None
