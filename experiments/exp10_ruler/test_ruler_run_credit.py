"""ruler_run_credit.py (which RULER credits come from counting runs): the classifier on hand-made
answers, and its committed CSV against the committed answers and scores."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from experiments.exp10_ruler import ruler_run_credit as CREDIT

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "results"
NUMERIC = {"niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multikey_2", "niah_multivalue",
           "niah_multiquery"}  # the RULER tasks whose values are numbers (docs/ruler.md)


def test_runs_by_hand() -> None:
    runs = CREDIT.runs
    assert runs([5, 6, 7]) == [(0, 3)]
    assert runs([5, 6]) == []  # two numbers are not a run
    assert runs([9, 7, 5, 100, 101, 103, 50]) == [(0, 3), (3, 6)]  # steps of 2 count, down too
    assert runs([5, 5, 5]) == []  # repeating is not counting
    assert runs([1, 2, 3, 10, 11]) == [(0, 3)]
    assert runs([]) == []


@pytest.mark.parametrize(("prediction", "value", "expected"), [
    ("The number is 8227054.", "8227054", "recall"),
    (": 1618572, 1618573, 1618574", "1618572", "recall"),  # the run's first number
    (": 1618570, 1618571, 1618572, 1618573", "1618572", "run"),  # reached by counting
    (": 1618572, 1618573, 1618574 and later 1618572 again", "1618572", "recall"),  # its best occurrence
    (": 1583491, 1583490, 1583489", "1583489", "run"),  # counting down
    ("82270542.", "8227054", "embedded"),
    ("1. 57287201\n2. 12", "5728720", "embedded"),
    ("nothing here", "8227054", None),
    ("1. 2695450\n2. 3181295\n3. 4", "3181295", "recall"),  # list numbers around it are not its run
])
def test_credit_class_by_hand(prediction: str, value: str, expected: str | None) -> None:
    assert CREDIT.credit_class(prediction, value) == expected


def _credit() -> pd.DataFrame:
    return pd.read_csv(RES / "exp10_ruler" / "run_credit.csv", comment="#", dtype={"value": str})


def _samples(exp: str, setting: str) -> pd.DataFrame:
    return pd.read_csv(RES / exp / setting / "samples.csv", keep_default_na=False)


def test_committed_csv_is_the_committed_answers() -> None:
    """Every credited answer of a numeric task, in both models and settings, is in the CSV; its values' points
    add up to the committed ``string_match_all`` (so the regenerated answers are the ones that were scored),
    each value occurs in the committed prediction and has the class the classifier gives it."""
    c = _credit()
    assert set(c["task"]) == NUMERIC and set(c["class"]) <= {"recall", "run", "embedded"}
    for (exp, setting), rows in c.groupby(["experiment", "setting"]):
        s = _samples(exp, setting).set_index(["point", "id"])
        got = rows.groupby(["point", "record"])["points"].sum()
        task = s.index.get_level_values("point").str.extract(r"task=([^,]+)", expand=False)
        credited = s[(s["string_match_all"] > 0) & task.isin(NUMERIC)]
        assert set(got.index) == set(credited.index), (exp, setting)
        for key, pts in got.items():  # query-agnostic niah_multiquery: answers stored joined, a superset
            joined = setting == "agnostic" and "task=niah_multiquery," in key[0]
            want = credited.loc[key, "string_match_all"]
            assert pts >= want - 1e-3 if joined else pts == pytest.approx(want, abs=1e-3), (exp, setting, key)
        for _, r in rows.iterrows():
            pred = s.loc[(r["point"], r["record"]), "prediction"]
            assert CREDIT.credit_class(pred, r["value"]) == r["class"]
            if setting == "agnostic" and r["task"] == "niah_multiquery":  # how the joined answers split
                found = list(re.finditer(r"\d+", pred))  # cannot change a class: every occurrence is recall
                spans = CREDIT.runs([int(f.group()) for f in found])
                inside = {i for a, b in spans for i in range(a + 1, b)}
                assert all(f.group() == r["value"] and i not in inside for i, f in enumerate(found)
                           if r["value"] in f.group())


