"""Experiment 2's report section: the ROUGE curves per policy and budget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from keyformer.lab.report import PAIRS, curve_experiment

# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp2_dialogsum': lambda res: curve_experiment(res, "exp2_dialogsum", PAIRS),
}
