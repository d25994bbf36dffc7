"""Rerun committed greedy records and compare each prediction, as a string, with the committed one.

    python -m keyformer.lab.spot_check --samples results/my_study/samples.csv \
        --point "budget=0.3,policy=keyformer" --out /tmp/spot/mine -- \
        +experiment=my_study policy=keyformer budget=0.3 n_samples=10

Runs ``run.py`` with the overrides after ``--`` into ``--out`` (resumed if it is already there), then prints
one line: the records compared, how many are identical, and the ids that differ. Exit 1 when any differs or a
rerun record has no committed twin, 2 on bad input.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from keyformer.run.paths import ROOT  # the checkout (run.py is not in the wheel)


def committed(samples: Path, point: str) -> dict[str, str]:
    """id -> prediction of the committed rows of ``point`` in a study's ``samples.csv``."""
    csv.field_size_limit(sys.maxsize)
    with samples.open(newline="") as f:
        rows = {r["id"]: r["prediction"] for r in csv.DictReader(f) if r["point"] == point}
    if not rows:
        raise SystemExit(f"error: no rows with point={point!r} in {samples}")
    return rows


def rerun(out: Path) -> dict[str, str]:
    """id -> prediction of a run folder's ``predictions.jsonl``."""
    lines = (out / "predictions.jsonl").read_text().splitlines()
    return {r["id"]: r["prediction"] for r in map(json.loads, lines) if r}


def compare(old: dict[str, str], new: dict[str, str]) -> tuple[int, list[str]]:
    """(identical count, ids that differ or have no committed twin), over the rerun's ids."""
    bad = [i for i in new if old.get(i) != new[i]]
    return len(new) - len(bad), bad


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("error: give run.py's overrides after --")
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=Path, required=True, help="a study's samples.csv")
    p.add_argument("--point", required=True, help="the committed point, as in its 'point' column")
    p.add_argument("--out", type=Path, required=True, help="the rerun's output folder")
    args = p.parse_args(argv[:cut])
    old = committed(args.samples, args.point)
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), *argv[cut + 1:], f"output_dir={args.out}"],
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(r.returncode)
    same, bad = compare(old, rerun(args.out))
    print(f"{args.samples} [{args.point}]: {same} of {same + len(bad)} identical"
          + (f"; differ: {', '.join(bad)}" if bad else ""))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
