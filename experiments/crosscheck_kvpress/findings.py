"""The kvpress cross-check's report sections: its committed tables."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def kvpress(res: Path, name: str = "crosscheck_kvpress") -> None:
    """The kvpress cross-check's table as committed by ``kvpress_crosscheck.py``
    (``table.md``)."""
    f = res / name / "table.md"
    if not f.exists():
        return
    rows = [line for line in f.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    print(f"\n### {name}: ours vs kvpress, kept sets after the prompt and greedy outputs ({name}/table.md)\n")
    print("\n".join(rows))


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'kvpress': kvpress,
    'kvpress_new': lambda res: kvpress(res, "crosscheck_kvpress/new_policies"),
    'kvpress_kvzip': lambda res: kvpress(res, "crosscheck_kvpress/kvzip"),
    'kvpress_kvzip_long': lambda res: kvpress(res, "crosscheck_kvpress/kvzip_long"),
}
