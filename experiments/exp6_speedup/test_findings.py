"""Experiment 6's page numbers (a benchmark, no findings.json) on a synthetic bench.json."""

from __future__ import annotations

import json
from pathlib import Path

from experiments.exp6_speedup import findings as exp6


def _row(group: str, policy: str, budget: float | None, speedup: float, lo: float, hi: float) -> dict:
    return {"group": group, "prompt_len": 1024, "batch": 1, "policy": policy, "budget": budget,
            "speedup": speedup, "speedup_stats": {"min": lo, "max": hi, "n": 3}}


def test_observations_compare_keyformer_with_h2o(tmp_path: Path) -> None:
    rows = [_row("g1", "full", None, 1.0, 1.0, 1.0), _row("g1", "keyformer", 0.5, 1.1, 1.0, 1.2),
            _row("g1", "h2o", 0.5, 1.3, 1.25, 1.35), _row("g1", "keyformer", 0.25, 9.0, 9.0, 9.0)]
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench.json").write_text(json.dumps(
        {"rows": rows, "config": {"targets": {"budget": 0.5}}, "environment": {}}))
    (tmp_path / "paper_numbers.csv").write_text(
        "experiment,dataset,model,method,metric,x,value,source\n"
        "exp6,s,m,keyformer,speedup,1024,1.28,x\nexp6,s,m,h2o,speedup,1024,1.12,x\n")
    text = exp6.observations(tmp_path)
    assert "Keyformer 1.10x (1.00-1.20 over 3 rounds), H2O 1.30x" in text  # the budget-0.5 rows only
    assert "below H2O's in 1 of 1 settings, with all its rounds below all of H2O's in 1" in text
    assert "keyformer 1.28x, h2o 1.12x" in text and "above H2O at 1 of 1" in text
    assert exp6.observations(tmp_path / "none") == "(no benchmark yet)"
