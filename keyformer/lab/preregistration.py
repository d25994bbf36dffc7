"""Pre-registration as a checked fact: a family is confirmatory only if the commit that defines it came before
every row of its data.

A study declares, in its ``DEFINITION``:

* ``roles``: ``{family or comparison id: role}`` (``confirmatory``, ``exploratory``, ``descriptive``; a key
  ending in ``*`` names every family it begins; a family not named is exploratory; the first match wins);
* ``registered``: for each confirmatory one, ``{"commit": ..., "file": ..., "contains": ..., "rows": [...]}``:
  the commit that defined it, the file that held the definition at that commit and a string the definition
  holds there, and the results folders (under ``results/``) whose ``points.csv`` rows are its data.

:func:`problems` checks each claim against git: the file at that commit holds the string, and the commit is an
ancestor of (or is) the commit every row ran at (``git_commit``). A row without one (backfilled provenance) is
dated by ``committed_in``, the commit that first committed its numbers: the registration must precede that
too. A row with neither cannot be dated, so its family cannot be confirmatory. A family whose rows do not
exist yet (runs still to come) contradicts nothing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

ROLES = ("confirmatory", "exploratory", "descriptive")


def role(definition: dict[str, Any], family: str | None, comparison_id: str) -> str:
    """The role a study's definition gives a comparison (by its family, else its id; default exploratory)."""
    roles = definition.get("roles", {})
    got = "exploratory"
    for key in (family, comparison_id):
        if key is None:
            continue
        hits = [r for k, r in roles.items() if k == key or (k.endswith("*") and key.startswith(k[:-1]))]
        if hits:
            got = hits[0]
            break
    if got not in ROLES:
        raise ValueError(f"role {got!r} of {family or comparison_id}; valid: {', '.join(ROLES)}")
    return got


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)


def row_commits(res: Path, folders: list[str]) -> list[tuple[str, str | None]]:
    """``(point, commit)`` of every row of ``folders``' ``points.csv``: its ``git_commit`` (without
    ``-dirty``), else its ``committed_in``, else None."""
    out = []
    for folder in folders:
        path = res / folder / "points.csv"
        if not path.is_file():  # no rows yet: a registration for runs still to come
            continue
        for _, r in pd.read_csv(path, dtype=str).iterrows():
            c = r.get("git_commit")
            c = c if isinstance(c, str) and c else r.get("committed_in")
            out.append((str(r["point"]), c.removesuffix("-dirty") if isinstance(c, str) and c else None))
    return out


def problems(definition: dict[str, Any], res: Path, repo: Path = Path(".")) -> list[str]:
    """What git contradicts in a definition's confirmatory claims (empty: every claim holds)."""
    out = []
    registered = definition.get("registered", {})
    for key, r in definition.get("roles", {}).items():
        if r != "confirmatory":
            continue
        reg = registered.get(key)
        if not reg:
            out.append(f"{key}: confirmatory without a registration commit")
            continue
        shown = _git(repo, "show", f"{reg['commit']}:{reg['file']}")
        if shown.returncode != 0:
            out.append(f"{key}: {reg['file']} is not in commit {reg['commit']}")
        elif reg["contains"] not in shown.stdout:
            out.append(f"{key}: {reg['file']} at {reg['commit']} does not hold {reg['contains']!r}")
        for point, commit in row_commits(res, reg["rows"]):
            if commit is None:
                out.append(f"{key}: row {point} records no commit: it cannot be dated after the registration")
            elif _git(repo, "merge-base", "--is-ancestor", reg["commit"], commit).returncode != 0:
                out.append(f"{key}: row {point} ran at {commit[:9]}, not after the registration "
                           f"{reg['commit']}")
    return out
