"""``keyformer-report --leaderboard ruler --with FOLDER``: a collected sweep ranked in the committed field,
paired by record; a sweep whose settings differ from the field's is refused with exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyformer.lab import cli
from keyformer.lab.leaderboard import BENCHMARKS, rank

ROOT = Path(__file__).resolve().parents[1]
FIELD = ROOT / "results" / "exp10_ruler" / "aware"
TASKS = ("niah_single_1", "vt", "qa_1")


def _frames(values: dict[tuple[str, float], list[float]], model: str = "m", prompt: int = 100,
            preds: dict[str, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """RULER-shaped points/samples: ``values[(policy, budget)]`` holds 2 scores per task, in TASKS order."""
    pts, smp = [], []
    for (pol, b), v in values.items():
        name = f"budget={b},policy={pol}"
        pts.append({"point": name, "policy": pol, "budget": b, "dataset": "ruler", "model": model,
                    "max_prompt_tokens": 4200, "chat_template": True, "num_beams": 1, "dtype": "float32",
                    "complete": True})
        for i, x in enumerate(v):
            rid = f"ruler-{TASKS[i // 2]}-L4096-{i % 2:04d}"
            smp.append({"point": name, "id": rid, "string_match_all": x, "prompt_tokens": prompt + i,
                        "prediction": (preds or {}).get(pol, f"{pol} {i}")})
    return pd.DataFrame(pts), pd.DataFrame(smp)


def test_rank_by_hand() -> None:
    """The user's mean over tasks, its rank among the field at its budget, and its difference from each
    policy (per task means averaged: (10+20+30)/3 = 20 for mine, 10 for h2o, so +10)."""
    field = _frames({("h2o", 0.5): [10, 10, 20, 20, 0, 0], ("window", 0.5): [50, 50, 40, 40, 30, 30],
                     ("full", 1.0): [60] * 6})
    user = _frames({("mine", 0.5): [10, 10, 20, 20, 30, 30]})
    table, found = rank(BENCHMARKS["ruler"], user, field)
    got = table.set_index("policy")
    assert got.loc["mine (yours)", "mean"] == 20 and got.loc["h2o", "mean"] == 10
    assert got.loc["window", "rank"] == 1 and got.loc["mine (yours)", "rank"] == 2
    assert np.isnan(got.loc["full", "rank"])  # full is not ranked among the compressed policies
    by = {f.b: f for f in found}
    assert by["h2o"].estimate == pytest.approx(10) and by["window"].estimate == pytest.approx(-20)
    assert by["h2o"].family_size == by["window"].family_size == 2 and by["full"].family is None


def test_a_committed_policy_rerun_ranks_where_it_is_and_is_na_against_itself(tmp_path: Path, capsys) -> None:
    """The committed window at 0.5, collected under another name: the same mean and rank as the window, and
    n/a against it (the same answers on every record)."""
    p, s = pd.read_csv(FIELD / "points.csv"), pd.read_csv(FIELD / "samples.csv")
    sel = p[(p["policy"] == "window") & (p["budget"] == 0.5)].assign(policy="mine")
    smp = s[s["point"].isin(sel["point"])]
    out = tmp_path / "mine"
    out.mkdir()
    sel.to_csv(out / "points.csv", index=False)
    smp.to_csv(out / "samples.csv", index=False)
    assert cli.main(["--leaderboard", "ruler", "--with", str(out), "--results", str(ROOT / "results")]) \
        == 0
    rows = {r.split("|")[2].strip(): r.split("|") for r in capsys.readouterr().out.splitlines()
            if r.startswith("| ")}
    mine = rows["**mine (yours)**"]
    assert mine[3] == rows["window"][3] and rows["window"][1] == mine[1]
    assert rows["window"][7].strip() == "n/a"


def test_a_task_whose_prompts_differ_is_left_out_and_named() -> None:
    """Another haystack changes one task's prompts: that task is left out, the rest ranked over."""
    field = _frames({("h2o", 0.5): [10, 10, 20, 20, 0, 0]})
    user = _frames({("mine", 0.5): [10, 10, 20, 20, 30, 30]})
    user[1].loc[user[1]["id"].str.contains("qa_1"), "prompt_tokens"] += 50
    table, found = rank(BENCHMARKS["ruler"], user, field)
    assert table["strata"].iloc[0] == 2 and table["left_out"].iloc[0] == "qa_1"
    (f,) = found
    assert f.estimate == 0 and f.n_strata == 2  # niah_single_1 and vt only


@pytest.mark.parametrize("change, why", [
    ({"model": "other/model"}, "has no committed ruler field"),
    ({"truncated_tokens": 5}, "were cut to fit max_prompt_tokens"),
    ({"dtype": "bfloat16"}, "dtype bfloat16 differs"),
    ({"budget": 0.3}, "budget 0.3 was never run"),
    ({"prompt_tokens": 7}, "no record is the same prompt"),
    ({"query_agnostic": True}, "the sweep is agnostic"),
])
def test_mismatched_sweeps_are_refused_in_one_line(tmp_path: Path, capsys, change: dict, why: str) -> None:
    p, s = pd.read_csv(FIELD / "points.csv"), pd.read_csv(FIELD / "samples.csv")
    sel = p[(p["policy"] == "h2o") & (p["budget"] == 0.5)].assign(policy="mine")
    smp = s[s["point"].isin(sel["point"])].copy()
    for k, v in change.items():
        if k in sel or k in ("query_agnostic",):
            sel[k] = v
        else:
            smp[k] = v
    out = tmp_path / "mine"
    out.mkdir()
    sel.to_csv(out / "points.csv", index=False)
    smp.to_csv(out / "samples.csv", index=False)
    rc = cli.main(["--leaderboard", "ruler", "--with", str(out), "--results", str(ROOT / "results"),
                      "--setting", "aware"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and why in err[0], err


def test_leaderboard_needs_a_collected_folder(tmp_path: Path, capsys) -> None:
    assert cli.main(["--leaderboard", "ruler", "--with", str(tmp_path)]) == 2
    assert "run keyformer-collect" in capsys.readouterr().err
    assert cli.main(["--leaderboard", "nope", "--with", str(tmp_path)]) == 2
    assert "valid: ruler" in capsys.readouterr().err
