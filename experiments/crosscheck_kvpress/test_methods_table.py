"""docs/methods.md is the table the registry generates (``python -m
experiments.crosscheck_kvpress.methods_doc``), and the table has a row for every registered method and
wrapper."""

from __future__ import annotations

import pytest

from experiments.crosscheck_kvpress import methods_doc
from keyformer.core.policies import POLICIES, WRAPPERS
from keyformer.core.policies.methods import rows


def test_committed_methods_table_regenerates():
    assert methods_doc.DOC.read_text(encoding="utf-8") == methods_doc.document(), (
        "docs/methods.md is stale: run python -m experiments.crosscheck_kvpress.methods_doc")


def test_table_rows_come_from_the_registry():
    names = [r[0] for r in rows()]
    assert names == [f"`{n}`" for n in sorted(POLICIES)] + [f"`wrap=[{w}]`" for w in sorted(WRAPPERS)]
    assert all(r[2] != "—" for r in rows()[: len(POLICIES)]), "every method names its paper"


def test_a_wrapper_row_credits_a_composition_under_either_name():
    """A wrapper's cross-check is a composition's row, written with ``+`` or registered under its own name
    (``adakv_snapkv`` is snapkv with the adakv wrapper); a plain scorer's row credits no wrapper."""
    by = {r[0]: r[-1] for r in rows({"adakv_snapkv": {0.5: 0.9, 0.2: 0.8}, "knorm+chunk": {0.5: 0.7},
                                     "snapkv": {0.5: 0.6}})}
    assert by["`wrap=[adakv]`"] == "0.900 / 0.800, over snapkv"
    assert by["`wrap=[chunk]`"] == "0.700 / —, over knorm"
    assert by["`wrap=[every]`"] == "—"


def test_jaccard_comes_from_the_committed_cross_check():
    j = methods_doc.jaccards()
    assert j["snapkv"][0.5] == 1.0 and 0.0 < j["kvzip"][0.5] < 1.0
    assert "keyformer" not in j  # no kvpress row compares it


def test_closest_variant_is_the_highest_mean_jaccard_of_a_policys_kv_rows(tmp_path, monkeypatch):
    """Of two ``[kv: ...]`` rows of one policy, the one with the higher mean Jaccard is shown, beside the
    plain row's; a variant farther from ours than the plain row is not."""
    from experiments.crosscheck_kvpress import kvpress_crosscheck as xc

    diags = [{"name": "A [kv: x]", "policy": "p"}, {"name": "A [kv: y]", "policy": "p"},
             {"name": "B [kv: z]", "policy": "q"}]
    monkeypatch.setattr(xc, "DIAGNOSTICS", diags)
    (tmp_path / "run").mkdir()
    for folder in (tmp_path, tmp_path / "run"):
        (folder / "prompts.json").write_text("[[1, 2, 3]]")
    rows_md = ["| A | 0.5 | 0.500 |", "| A [kv: x] | 0.5 | 0.900 |", "| A [kv: x] | 0.2 | 0.700 |",
               "| A [kv: y] | 0.5 | 0.850 |", "| A [kv: y] | 0.2 | 0.800 |", "| B | 0.5 | 0.990 |",
               "| B [kv: z] | 0.5 | 0.600 |"]
    (tmp_path / "run" / "table.md").write_text("caption\n\n| method | budget | Jaccard |\n|---|---|---|\n"
                                               + "\n".join(rows_md) + "\n")
    monkeypatch.setattr(xc, "METHODS", [{"name": "A", "policy": "p"}, {"name": "B", "policy": "q"}])
    assert methods_doc.closest_variants(tmp_path) == {"p": {0.5: 0.85, 0.2: 0.8}}  # q's variant is farther
    cell = rows({"full": {0.5: 0.5}}, {"full": {0.5: 0.85, 0.2: 0.8}})[sorted(POLICIES).index("full")][-1]
    assert cell.startswith("0.500 / — (0.850 / 0.800")


def _table(folder, rows_md: list[str], prompts: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if prompts is not None:
        (folder / "prompts.json").write_text(prompts)
    head = "| method | budget | Jaccard |\n|---|---|---|\n"
    (folder / "table.md").write_text(head + "\n".join(rows_md) + "\n")


def test_only_runs_on_the_shared_prompts_count_and_a_conflicting_row_raises(tmp_path):
    """A run on other prompts (or with none recorded) is not the table's comparison; the same row name with
    two Jaccards at one budget across runs on the shared prompts is an error, not a silent last-wins."""
    (tmp_path / "prompts.json").write_text("[[1, 2, 3]]")
    _table(tmp_path / "a", ["| A | 0.5 | 0.700 |"], "[[1, 2, 3]]")
    _table(tmp_path / "b_long", ["| A | 0.5 | 0.100 |", "| C | 0.5 | 0.300 |"], "[[4, 5, 6, 7]]")
    _table(tmp_path / "c_none", ["| A | 0.5 | 0.200 |"], None)
    _table(tmp_path / "d", ["| A | 0.2 | 0.600 |", "| A | 0.5 | 0.700 |"], "[[1, 2, 3]]")  # agrees: fine
    assert methods_doc._table_rows(tmp_path) == {"A": {0.5: 0.7, 0.2: 0.6}}
    _table(tmp_path / "e", ["| A | 0.5 | 0.650 |"], "[[1, 2, 3]]")
    with pytest.raises(ValueError, match=r"'A' at budget 0.5 .*0.7.*0.65"):
        methods_doc._table_rows(tmp_path)
