"""The kvpress cross-check's pure-Python parts (kept-set encoding, Jaccard, agreement, merge and tables);
kvpress is not needed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.crosscheck_kvpress import kvpress_crosscheck as xc


def test_kept_encoding_roundtrip_and_jaccard() -> None:
    a, b = xc.encode_kept([0, 3, 7, 100]), xc.encode_kept({3, 7, 8})
    assert xc.decode_kept(a) == {0, 3, 7, 100}
    assert xc.count(a) == 4 and xc.count(b) == 3
    assert xc.jaccard(a, b) == pytest.approx(2 / 5)
    assert xc.jaccard(a, a) == 1.0
    assert xc.jaccard(xc.encode_kept([]), xc.encode_kept([])) == 1.0
    assert xc.jaccard(xc.encode_kept([1]), xc.encode_kept([2])) == 0.0


def test_json_gz_roundtrip(tmp_path: Path) -> None:
    obj = {"a": [1, 2, {"b": "c"}]}
    for name in ("x.json", "x.json.gz"):
        xc.dump_json(tmp_path / name, obj)
        assert xc.load_json(tmp_path / name) == obj
    assert (tmp_path / "x.json.gz").read_bytes()[:2] == b"\x1f\x8b"


def test_agreement() -> None:
    assert xc.agreement([1, 2, 3], [1, 2, 3]) == (True, 3)
    assert xc.agreement([1, 2, 3], [1, 9, 3]) == (False, 1)
    assert xc.agreement([5, 2], [1, 2]) == (False, 0)


def _run(pid: str, tokens: list[int], kept: list[list[list[int]]] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {"id": pid, "n": 10, "tokens": tokens}
    if kept is not None:
        r["kept"] = [[xc.encode_kept(h) for h in layer] for layer in kept]
    return r


def test_compare_runs() -> None:
    # two prompts, two layers, two heads; one set differs by one position (and in size), outputs differ once
    same = [[[0, 1, 2], [0, 5, 9]], [[1, 2, 3], [4, 5, 6]]]
    other = [[[0, 1, 2], [0, 5, 9]], [[1, 2, 3], [4, 5]]]
    ours = [_run("a", [1, 2, 3, 4], same), _run("b", [7, 7, 7, 7], same)]
    kv = [_run("a", [1, 2, 3, 4], same), _run("b", [7, 8, 7, 7], other)]
    full = [_run("a", [1, 2, 0, 0]), _run("b", [7, 7, 7, 7])]
    m = xc.compare_runs(ours, kv, full, full)
    assert m["jaccard"] == pytest.approx((7 + 2 / 3) / 8)
    assert m["jaccard_min"] == pytest.approx(2 / 3)
    assert m["identical"] == pytest.approx(7 / 8)
    assert m["count_differs"] == pytest.approx(1 / 8)
    assert m["kept_ours"] == pytest.approx(3.0) and m["kept_kvpress"] == pytest.approx(23 / 8)
    assert m["layer_jaccard"] == pytest.approx([1.0, (3 + 2 / 3) / 4])
    assert m["cross"] == pytest.approx((0.5, 2.5))  # prompt a identical (4), prompt b prefix 1
    assert m["ours_vs_full"] == pytest.approx((0.5, 3.0))  # a: prefix 2, b: identical (4)
    assert m["kvpress_vs_full"] == pytest.approx((0.0, 1.5))
    with pytest.raises(ValueError, match="prompt order"):
        xc.compare_runs(ours, kv[::-1], full, full)


def _write(tmp: Path, ours_methods: list[dict[str, Any]], kv_methods: list[dict[str, Any]]) -> None:
    (tmp / "prompts.json").write_text(json.dumps({"new_tokens": 2, "budgets": [0.5],
                                                  "prompts": [{"id": "a", "input_ids": list(range(6))}]}))
    full = [_run("a", [1, 2])]
    meta_o = {"transformers": "x", "torch": "t", "threads": 1, "git": {"commit": "abcdef0123", "dirty": []}}
    xc.dump_json(tmp / "ours.json.gz", {"side": "ours", "meta": meta_o, "full": full,
                                        "methods": ours_methods})
    xc.dump_json(tmp / "kvpress.json.gz",
                 {"side": "kvpress", "meta": {"kvpress": "0.5.5", "transformers": "y"},
                                           "full": full, "methods": kv_methods})


def test_merge_and_tables(tmp_path: Path) -> None:
    runs = [_run("a", [1, 2], [[[0, 1, 2]]])]
    ours = [{"name": "SnapKV", "budget": 0.5, "runs": runs},
            {"name": "PyramidKV", "budget": 0.5, "skipped": "policy 'pyramidkv' not registered"},
            {"name": "TOVA", "budget": 0.5, "runs": runs}]
    kv = [{"name": "SnapKV", "budget": 0.5, "runs": [_run("a", [1, 3], [[[0, 1, 3]]])]},
          {"name": "PyramidKV", "budget": 0.5, "runs": runs}]
    _write(tmp_path, ours, kv)
    rows, md, txt = xc.merge(tmp_path)
    assert [r["method"] for r in rows] == ["SnapKV", "PyramidKV", "TOVA"]
    assert rows[0]["metrics"]["jaccard"] == pytest.approx(0.5)
    assert rows[0]["metrics"]["cross"] == pytest.approx((0.0, 1.0))
    assert rows[1]["skipped"].startswith("policy") and rows[2]["skipped"] == "no kvpress run"
    head = "| " + " | ".join(c for c, _ in xc.COLUMNS) + " |"
    assert head in md
    assert "| SnapKV | 0.5 | 0.5 | 0.500 | 0.500 | 0.000 | 3.0 | 3.0 | 0.000 | 0.00 | 1.0 |" in md
    assert "| PyramidKV | 0.5 | 0.5 | skipped: policy 'pyramidkv' not registered |" in md
    lines = txt.splitlines()
    table = lines[lines.index("") + 1:]
    assert len({len(line) for line in table[:3]}) == 1  # header, rule and the full row are aligned
    assert table[3].split()[:3] == ["PyramidKV", "0.5", "0.5"] and "skipped: policy" in table[3]
    assert "ours at git abcdef0 (transformers x)" in txt


def test_method_options_are_valid_for_registered_policies() -> None:
    from keyformer.core.policies import POLICIES, make_policy

    for m in xc.METHODS + xc.DIAGNOSTICS:
        if m["policy"] in POLICIES:  # policies still being written are skipped by the harness, not here
            make_policy(m["policy"], budget=0.5, **m["policy_kw"])
    diag = {m["name"].split(" [")[0] for m in xc.DIAGNOSTICS}
    assert diag <= {m["name"] for m in xc.METHODS}  # every diagnostic changes a compared method


def test_agreement_section_reads_every_committed_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The page's agreement covers every folder holding a table (top run first), counts the rows whose sets
    are identical everywhere and picks the lowest mean Jaccard of the others."""
    from experiments.crosscheck_kvpress import findings

    head = "| method | budget | Jaccard | ident. |\n|---|---|---|---|\n"
    tables = {"crosscheck_kvpress": "| A | 0.5 | 1.000 | 1.000 |\n",
              "crosscheck_kvpress/zeta": "| B | 0.5 | 0.900 | 0.100 |\n| B | 0.2 | 0.700 | 0.000 |\n",
              "crosscheck_kvpress/alpha": "| C | 0.5 | 1.000 | 1.000 |\n| D | 0.2 | 0.990 | 0.500 |\n"}
    for folder, rows in tables.items():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "table.md").write_text("caption\n\n" + head + rows)
    (tmp_path / "crosscheck_kvpress" / "empty").mkdir()
    assert findings.folders(tmp_path) == ["crosscheck_kvpress", "crosscheck_kvpress/alpha",
                                          "crosscheck_kvpress/zeta"]
    counts = [(f, same, n, low and (low["method"], low["budget"])) for f, same, n, low
              in findings.agreement_counts(tmp_path)]
    assert counts == [("crosscheck_kvpress", 1, 1, None), ("crosscheck_kvpress/alpha", 1, 2, ("D", "0.2")),
                      ("crosscheck_kvpress/zeta", 0, 2, ("B", "0.2"))]
    assert len(findings.agreement(tmp_path, None).splitlines()) == 3
