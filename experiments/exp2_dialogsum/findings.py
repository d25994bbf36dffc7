"""Experiment 2's report section: the ROUGE curves per policy and budget, and its findings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.exp1_cnndm import curves
from keyformer.lab import findings as fnd

# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp2_dialogsum': lambda res: curves.curve_experiment(res, "exp2_dialogsum"),
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "2: DialogSum"
QUESTION = ("On dialogue continuation (DialogSum in SODA's prompt format), does Keyformer keep more ROUGE-2 "
            "than H2O and the sliding window as the KV budget shrinks?")
FAMILIES = {  # pre-registered: (a, b) pooled over the budgets both ran; "full": the full-cache point
    "exp2.policies": list(curves.POLICY_PAIRS),
    "exp2.vs_full": [(p, "full") for p in curves.EVICTING],
}
DEFINITION = {
    "metric": "rouge2",
    "comparison": ("a - b, paired over dialogues and pooled over the budgets both arms ran: each dialogue's "
                   "mean difference over those budgets (against full: the one full-cache point at every "
                   "budget)"),
    "families": {fam: [f"exp2.{a}-{b}" for a, b in pairs] for fam, pairs in FAMILIES.items()},
    "design": ("one stratum of per-dialogue pooled differences (the budgets of one dialogue stay together), "
               "paired sign-flip test over dialogues; Holm "
               "within each family at alpha 0.05"),
    "alpha": fnd.ALPHA,
    "margin": 0.5,  # ROUGE-2 points (declared after the data)
    # the families were first written as Holm lists with the findings engine (2026-12-06), after the rows
    "roles": {"exp2.*": "exploratory"},
}


def comparisons(res: Path) -> list[fnd.Comparison]:
    """The pre-registered pooled comparisons between policies and against full."""
    return curves.curve_comparisons(res, "exp2_dialogsum", FAMILIES, "exp2")


def bullets(doc: dict) -> list[str]:
    """The three policy pairs, then the policies against full."""
    return curves.curve_bullets(doc, "exp2")


def answer(doc: dict) -> str:
    return curves.answer_line(doc, "exp2.policies")


PLACEHOLDERS = {"recent": curves.recent_share("exp2_dialogsum"),
                "prompt_tokens": curves.prompt_tokens("exp2_dialogsum")}
