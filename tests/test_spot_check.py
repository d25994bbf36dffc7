"""The output spot check compares reruns with committed records by id, as strings."""

from __future__ import annotations

import csv
import json

import pytest

from keyformer.lab.spot_check import committed, compare, rerun


def test_compare_counts_identical_and_names_the_rest(tmp_path):
    samples = tmp_path / "samples.csv"
    with samples.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["point", "id", "prediction"])
        w.writeheader()
        w.writerows([{"point": "budget=0.3,policy=h2o", "id": "a", "prediction": "x, \"y\"\nz"},
                     {"point": "budget=0.3,policy=h2o", "id": "b", "prediction": "same"},
                     {"point": "budget=0.5,policy=h2o", "id": "a", "prediction": "other point"}])
    (tmp_path / "predictions.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prediction": "x, \"y\"\nz"}, {"id": "b", "prediction": "same "},
        {"id": "c", "prediction": "no twin"}]) + "\n")
    old = committed(samples, "budget=0.3,policy=h2o")
    assert old == {"a": "x, \"y\"\nz", "b": "same"}
    assert compare(old, rerun(tmp_path)) == (1, ["b", "c"])
    with pytest.raises(SystemExit, match="no rows with point='budget=0.9'"):
        committed(samples, "budget=0.9")
