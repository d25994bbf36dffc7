"""docs/configuration.md's option table lists exactly what conf/ holds, group by group."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from keyformer.run.paths import config_dirs

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
DOC = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
# hydra/launcher options that the installed launcher plugins provide (not files of conf/)
PLUGIN_LAUNCHERS = {"joblib", "submitit_slurm", "submitit_local"}
GROUPS = ["model", "dataset", "policy", "generation", "logger", "task", "kv_quant", "experiment", "benchmark",
          "hydra/launcher"]


def _row(group: str) -> str:
    rows = [ln for ln in DOC.splitlines() if ln.startswith(f"| `{group}` |")]
    assert len(rows) == 1, f"docs/configuration.md has {len(rows)} rows for group {group}"
    return rows[0].split("|", 2)[2]


def _outside_parentheses(text: str) -> str:
    depth, out = 0, []
    for ch in text:
        depth += ch == "("
        if depth == 0:
            out.append(ch)
        depth -= ch == ")" and depth > 0
    return "".join(out)


def _options(group: str) -> set[str]:
    return {p.stem for d in config_dirs(CONF) for p in (d / group).glob("*.yaml")}  # the studies' too


@pytest.mark.parametrize("group", GROUPS)
def test_configuration_doc_lists_every_option_of_each_group(group):
    row = _row(group)
    options = _options(group)
    assert options, group
    named = set(re.findall(r"`([^`]+)`", row))
    assert options <= named, f"{group}: conf/{group}/ has {sorted(options - named)}, not in the doc"
    # the names the row's list gives (before its first ';' or ':', outside parenthesised notes) all exist
    head = re.split(r"[;:]", _outside_parentheses(row))[0]
    listed = set(re.findall(r"`([A-Za-z0-9_]+)`", head)) - {"null"}
    if group == "hydra/launcher":
        listed -= PLUGIN_LAUNCHERS
    assert listed and listed <= options, f"{group}: the doc lists {sorted(listed - options)}, not in conf/"


def test_the_drift_check_sees_a_missing_option(monkeypatch):
    """The check above fails when conf/ gains an option the doc does not list."""
    monkeypatch.setattr(__import__(__name__), "_options", lambda group: {"smollm2", "brand_new_model"})
    with pytest.raises(AssertionError, match="brand_new_model"):
        test_configuration_doc_lists_every_option_of_each_group("model")
