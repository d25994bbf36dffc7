"""Replace points of a curated results folder with the same-named points of another (both written by
``keyformer-collect``): the rows of ``points.csv`` and ``samples.csv`` of every point in ``NEW`` replace those
of ``INTO``; the other points of ``INTO`` stay. For re-runs of some points of an experiment whose other run
folders are no longer on disk, e.g. experiment 1's Keyformer points after the zero-noise fix:

    keyformer-collect multirun/exp1_cnndm_nanfix /tmp/exp1_kf
    python scripts/merge_results.py /tmp/exp1_kf results/exp1_cnndm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd


def merge(new: Path, into: Path) -> list[str]:
    """Write the merged files into ``into``; return the replaced or added point names."""
    p_new, s_new = pd.read_csv(new / "points.csv"), pd.read_csv(new / "samples.csv", dtype={"id": str})
    p_old, s_old = pd.read_csv(into / "points.csv"), pd.read_csv(into / "samples.csv", dtype={"id": str})
    names = list(p_new["point"])
    order = list(p_old["point"]) + [n for n in names if n not in set(p_old["point"])]  # replaced in place
    rank = {n: i for i, n in enumerate(order)}
    points = pd.concat([p_old[~p_old["point"].isin(names)], p_new], ignore_index=True)
    samples = pd.concat([s_old[~s_old["point"].isin(names)], s_new], ignore_index=True)
    points.sort_values("point", key=lambda c: c.map(rank)).to_csv(into / "points.csv", index=False)
    samples.sort_values("point", key=lambda c: c.map(rank), kind="stable").to_csv(into / "samples.csv", index=False)
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", type=Path, help="results folder with the new points")
    ap.add_argument("into", type=Path, help="results folder whose same-named points they replace")
    args = ap.parse_args(argv)
    for name in merge(args.new, args.into):
        print(f"{args.into}: {name} <- {args.new}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
