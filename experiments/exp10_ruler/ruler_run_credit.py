"""How much of experiment 10's RULER score is credited to counting runs rather than recall.

RULER's ``string_match_all`` credits a reference value when it occurs anywhere in the answer. Small models
often degenerate into counting (``1618572, 1618573, 1618574, ...``): a run that starts a few numbers below a
needle value reaches it and is credited, though the model never recalled it. For every committed answer of
experiment 10 on a task whose values are numbers, this script finds each credited value's occurrences in the
answer and classes the value by its best occurrence:

* ``recall``: a whole number, outside any counting run or the first number of one (the model produced the
  value itself, then perhaps counted on from it);
* ``run``: only inside a counting run, after its first number (reached by counting);
* ``embedded``: only as part of a longer digit string.

A counting run is three or more numbers in a row, each 1 or 2 from the one before (up or down). One row per
credited value: experiment, setting, point, policy, budget, task, record, value, class, and the value's
share of the record's score (``100 / len(answers)``, the points ``string_match_all`` gave it). One caveat:
query-agnostic niah_multiquery asks its keys one question at a time and scores each answer against its own
value, but ``samples.csv`` stores the answers joined, so there a value named in another question's answer is
listed too (its points then add up to more than the record's score).

    python -m experiments.exp10_ruler.ruler_run_credit results/exp10_ruler/run_credit.csv

Reads ``results/<experiment>/<setting>/samples.csv`` and regenerates the records (their answers) as the
experiment did; needs the two real models' tokenizers (``ensure_smollm2``, ``ensure_gemma3``) and
``KEYFORMER_DATA_DIR`` for the essay tasks. The CSV's first line (``#``) gives the commit.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from experiments.exp10_ruler.ruler_kept_depth import code_at, point_records

EXPERIMENTS = ("exp10_ruler", "exp10_ruler_gemma")
SETTINGS = ("aware", "agnostic")
NUMBER = re.compile(r"\d+")
POINT = re.compile(r"task=([^,]+),budget=([^,]+),policy=(.+)")


def runs(numbers: list[int]) -> list[tuple[int, int]]:
    """[start, end) index spans of the counting runs in ``numbers``: three or more in a row, each 1 or 2
    away from the one before."""
    out, start = [], 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or not 1 <= abs(numbers[i] - numbers[i - 1]) <= 2:
            if i - start >= 3:
                out.append((start, i))
            start = i
    return out


def credit_class(prediction: str, value: str) -> str | None:
    """``recall``, ``run`` or ``embedded`` for a numeric ``value`` in ``prediction`` (module docstring), or
    None when ``string_match_all`` would not credit it."""
    if value.lower() not in prediction.lower():
        return None
    found = list(NUMBER.finditer(prediction))
    numbers = [int(m.group()) for m in found]
    inside = {i for a, b in runs(numbers) for i in range(a + 1, b)}  # after a run's first number
    whole = [i for i, m in enumerate(found) if m.group() == value]
    if any(i not in inside for i in whole):
        return "recall"
    return "run" if whole else "embedded"


def answers_by_record(experiment: str, task: str, n: int) -> dict[str, list[str]]:
    """{record id: reference values} of an experiment-10 point of ``task``, regenerated as it ran."""
    return {r["id"]: list(r["answers"]) for r in point_records(experiment, task, n)[1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="CSV to write")
    ap.add_argument("--results", default="results", help="the results folder (default: results)")
    args = ap.parse_args(argv)
    import pandas as pd

    rows, answers = [], {}
    for exp in EXPERIMENTS:
        for setting in SETTINGS:
            folder = Path(args.results) / exp / setting
            s = pd.read_csv(folder / "samples.csv", keep_default_na=False)
            n = pd.read_csv(folder / "points.csv").set_index("point")["n_samples"]
            for _, r in s[s["string_match_all"] > 0].iterrows():
                task, budget, policy = POINT.fullmatch(r["point"]).groups()
                if (exp, task) not in answers:
                    answers[(exp, task)] = answers_by_record(exp, task, int(n[r["point"]]))
                refs = answers[(exp, task)][r["id"]]
                if not all(v.isdigit() for v in refs):
                    continue  # words or uuids: no counting
                for v in refs:
                    c = credit_class(r["prediction"], v)
                    if c is not None:
                        rows.append([exp, setting, r["point"], policy, budget, task, r["id"], v, c,
                                     round(100 / len(refs), 4)])
    with open(args.out, "w", newline="") as f:
        f.write(f"# ruler_run_credit.py at {code_at()}: every credited numeric value of experiment 10's "
                "committed answers, classed by its best occurrence\n")
        w = csv.writer(f)
        w.writerow(["experiment", "setting", "point", "policy", "budget", "task", "record", "value", "class",
                    "points"])
        w.writerows(rows)
    counts = pd.DataFrame(rows, columns=["e", "s", "p", "pol", "b", "t", "r", "v", "c", "pts"]).groupby(
        ["e", "c"]).size()
    print(counts.to_string(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
