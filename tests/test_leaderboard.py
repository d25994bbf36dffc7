"""``keyformer-report --leaderboard ruler --with FOLDER``: a collected sweep ranked in the committed field,
paired by record; a sweep whose settings differ from the field's is refused with exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from keyformer.lab import analysis, cli
from keyformer.lab.collect import TEXT_COLUMNS
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


def _committed() -> tuple[pd.DataFrame, pd.DataFrame]:
    """The committed field's rows, read as keyformer-collect's reader reads them (answers stay text)."""
    return (pd.read_csv(FIELD / "points.csv", dtype={"point": str}),
            pd.read_csv(FIELD / "samples.csv", dtype=TEXT_COLUMNS))


def _copy(policy: str, budget: float = 0.5) -> tuple[pd.DataFrame, pd.DataFrame]:
    p, s = _committed()
    sel = p[(p["policy"] == policy) & (p["budget"] == budget)]
    return sel.assign(policy="mine"), s[s["point"].isin(sel["point"])].copy()


def _field() -> tuple[pd.DataFrame, pd.DataFrame]:
    return analysis.load_experiment(str(FIELD.parent), FIELD.name, complete_only=True)


def test_a_copy_changed_on_one_task_moves_by_the_computed_amount_and_is_not_na() -> None:
    """TOVA's committed rows as "mine", its answers changed on one task that is not the first (every record
    of vt scored 100 - its score): against TOVA the difference is that task's change of mean over the number
    of tasks, with a test of its own (not n/a), inside the family; unchanged, the copy is n/a against TOVA."""
    up, us = _copy("tova")
    field = _field()
    (f_same,) = [f for f in rank(BENCHMARKS["ruler"], (up, us), field)[1] if f.b == "tova"]
    assert f_same.verdict == "n/a" and f_same.estimate == 0
    vt = us["id"].str.startswith("ruler-vt-")
    before = float(us.loc[vt, "string_match_all"].mean())
    n_tasks = us["id"].map(analysis.ruler_task_of).nunique()
    us.loc[vt, "string_match_all"] = 100.0 - us.loc[vt, "string_match_all"]
    us.loc[vt, "prediction"] = "changed"
    (f,) = [f for f in rank(BENCHMARKS["ruler"], (up, us), field)[1] if f.b == "tova"]
    assert before != 50 and f.estimate == pytest.approx((100 - 2 * before) / n_tasks, abs=1e-9)
    assert f.verdict != "n/a" and f.p is not None and f.family_size is not None


def test_the_leaderboard_and_the_page_give_the_same_numbers() -> None:
    """A copy of TOVA against Keyformer on the leaderboard: the same estimate and p as TOVA - Keyformer in
    the committed findings.json (the strata in one order, the random stream keyed by the comparison's shape,
    not its name)."""
    import json

    up, us = _copy("tova")
    (f,) = [f for f in rank(BENCHMARKS["ruler"], (up, us), _field())[1] if f.b == "keyformer"]
    doc = json.loads((ROOT / "results" / "exp10_ruler" / "findings.json").read_text())
    (page,) = [g for g in doc["findings"] if g["id"] == "exp10.exp10_ruler.aware.r0.5.tova"]
    assert f.estimate == pytest.approx(page["estimate"], rel=1e-5)
    assert f.p == pytest.approx(page["p"], rel=1e-5) and f.test == page["test"]


def test_a_small_sweep_gets_no_decisive_verdict() -> None:
    """Two records on each of two tasks, every answer wrong: no p the records can give is below 2/16, so
    every verdict is inconclusive and no interval is printed as if it were one."""
    up, us = _copy("h2o")
    keep = us.groupby(us["id"].map(analysis.ruler_task_of)).head(2)
    keep = keep[keep["id"].map(analysis.ruler_task_of).isin(["niah_single_2", "vt"])].copy()
    keep["string_match_all"], keep["prediction"] = 0.0, "wrong"
    up = up[up["point"].isin(keep["point"])]
    _, found = rank(BENCHMARKS["ruler"], (up, keep), _field())
    assert found and all(f.n == 4 for f in found)
    assert {f.verdict for f in found} <= {"inconclusive"}
    assert all(f.ci_lo is None and "too few records (n = 4)" in f.interval for f in found)


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
    p, s = _committed()
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
    p, s = _committed()
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
