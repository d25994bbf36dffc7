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
    'kvpress_methods': lambda res: kvpress(res, "crosscheck_kvpress/methods"),
    'kvpress_attention': lambda res: kvpress(res, "crosscheck_kvpress/attention"),
    'kvpress_capkv': lambda res: kvpress(res, "crosscheck_kvpress/capkv"),
}


# -- page (keyformer.lab.pages): a correctness check, no paired statistics --------------------------------
TITLE = "Cross-check: kvpress"
QUESTION = "Do our policies keep the same tokens and give the same outputs as NVIDIA kvpress's?"


def _rows(res: Path, folder: str) -> list[dict[str, str]]:
    f = res / folder / "table.md"
    if not f.is_file():
        return []
    lines = [ln for ln in f.read_text(encoding="utf-8").splitlines() if ln.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")), strict=False)) for ln in lines[2:]]


def folders(res: Path) -> list[str]:
    """Every committed run of the cross-check: the folders under ``crosscheck_kvpress`` holding a table.md,
    the top one first."""
    top = res / "crosscheck_kvpress"
    return sorted((p.parent.relative_to(res).as_posix() for p in top.rglob("table.md")),
                  key=lambda f: (f != "crosscheck_kvpress", f))


def agreement_counts(res: Path) -> list[tuple[str, int, int, dict[str, str] | None]]:
    """Per committed run: (folder, rows whose sets are identical in every layer and head, rows, the other
    row with the lowest mean Jaccard or None), read from each run's table.md."""
    out = []
    for folder in folders(res):
        rows = _rows(res, folder)
        if not rows:
            continue
        rest = [r for r in rows if r.get("ident.") != "1.000"]
        low = min(rest, key=lambda r: float(r["Jaccard"])) if rest else None
        out.append((folder, len(rows) - len(rest), len(rows), low))
    return out


def agreement(res: Path, doc: dict | None) -> str:
    """The agreement lines of the page: :func:`agreement_counts`, one line per committed run."""
    out = []
    for folder, same, n, low in agreement_counts(res):
        lowest = (f"; the lowest mean Jaccard: {low['method']} at budget {low['budget']} ({low['Jaccard']})"
                  if low else "")
        out.append(f"- `{folder}`: {same} of {n} rows (method, budget; the `[kv: ...]` variants "
                   f"included) keep identical sets in every layer and head{lowest}.")
    return "\n".join(out)


PLACEHOLDERS = {"agreement": agreement}
