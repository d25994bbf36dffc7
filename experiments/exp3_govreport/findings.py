"""Experiment 3's report section: the ROUGE curves per policy and budget, and its findings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.exp1_cnndm import curves
from keyformer.lab import findings as fnd

# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp3_govreport': lambda res: curves.curve_experiment(res, "exp3_govreport"),
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "3: GovReport"
QUESTION = ("On long reports (GovReport), does Keyformer keep more ROUGE-2 than H2O at small KV budgets?")
# pre-registered: the design runs H2O and Keyformer only (no window); "full": the full-cache point
FAMILIES = {
    "exp3.policies": [("keyformer", "h2o")],
    "exp3.vs_full": [("keyformer", "full"), ("h2o", "full")],
}
DEFINITION = {
    "metric": "rouge2",
    "comparison": ("a - b, paired over reports and pooled over the budgets both arms ran: each report's mean "
                   "difference over those budgets (against full: the one full-cache point at every budget)"),
    "families": {fam: [f"exp3.{a}-{b}" for a, b in pairs] for fam, pairs in FAMILIES.items()},
    "design": ("one stratum of per-report pooled differences (the budgets of one report stay together), "
               "paired sign-flip test over reports; Holm within "
               "each family at alpha 0.05 (the policies family has one member: no correction)"),
    "alpha": fnd.ALPHA,
    "margin": 0.5,  # ROUGE-2 points (declared after the data)
    # the families were first written as Holm lists with the findings engine (2026-12-06), after the rows
    "roles": {"exp3.*": "exploratory"},
}


def comparisons(res: Path) -> list[fnd.Comparison]:
    """The pre-registered pooled comparisons: Keyformer against H2O, and both against full."""
    return curves.curve_comparisons(res, "exp3_govreport", FAMILIES, "exp3")


def bullets(doc: dict) -> list[str]:
    """Keyformer against H2O, then both against full."""
    return curves.curve_bullets(doc, "exp3")


def answer(doc: dict) -> str:
    return curves.answer_line(doc, "exp3.policies")


PLACEHOLDERS = {"recent": curves.recent_share("exp3_govreport"),
                "prompt_tokens": curves.prompt_tokens("exp3_govreport")}
