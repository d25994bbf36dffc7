"""docs/methods.md is the table the registry generates (``python -m
experiments.crosscheck_kvpress.methods_doc``), and the table has a row for every registered method and
wrapper."""

from __future__ import annotations

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


def test_jaccard_comes_from_the_committed_cross_check():
    j = methods_doc.jaccards()
    assert j["snapkv"][0.5] == 1.0 and 0.0 < j["kvzip"][0.5] < 1.0
    assert "h2o" not in j  # no kvpress row compares it
