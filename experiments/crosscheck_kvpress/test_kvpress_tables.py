"""The kvpress cross-check's committed table regenerates from its merged rows."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_kvpress_merge_reproduces_the_committed_table(tmp_path: Path) -> None:
    """The merge side of kvpress_compare.py on the committed side outputs gives the committed table."""
    import shutil

    from experiments.crosscheck_kvpress import kvpress_compare

    src = ROOT / "results" / "bench" / "kvpress"
    if not (src / "kvpress.json").is_file():
        pytest.skip("kvpress results not committed")
    for name in ("prompts.json", "ours.json", "kvpress.json"):
        shutil.copy(src / name, tmp_path / name)
    kvpress_compare.main(["--side", "merge", "--out-dir", str(tmp_path)])
    assert (tmp_path / "table.txt").read_text() == (src / "table.txt").read_text()
