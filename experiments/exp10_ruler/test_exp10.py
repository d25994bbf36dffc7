"""Experiment 10's own tests: its leaderboard and setting-gap tables by hand, its report sections, queues and
the committed tables' currency."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from experiments.exp10_ruler import analysis as exp10
from keyformer.lab import analysis
from keyformer.run.data.ruler import (
    generate_ruler,
    tokens_to_generate,
)

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "results"
HAS_WONDER = importlib.util.find_spec("wonderwords") is not None
pytestmark = pytest.mark.skipif(not HAS_WONDER, reason="wonderwords not installed")
ESSAY = tuple(" ".join(f"Sentence number {i} is here." for i in range(400)).split())
NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\.")
HAS_CORE = importlib.util.find_spec("keyformer.core.generate") is not None
SCORES = {
    ("full", 1.0): {"vt": [100, 100, 0], "cwe": [50, 50, 100]},
    ("keyformer", 0.5): {"vt": [100, 0, 0], "cwe": [50, 50, 50]},
    ("h2o", 0.5): {"vt": [100, 100, 0], "cwe": [0, 50, 50]},
    ("window", 0.5): {"vt": [0, 0, 0]},  # one task only: no average, no rank
}


def prompt(rec: dict) -> str:
    return f"{rec['document']}\n{rec['question']}{rec['answer_prefix']}"

def _fake_results(root: Path, folder: str, scores: dict) -> None:
    """points.csv / samples.csv as keyformer-collect writes them; ``scores[(policy, budget)][task]`` =
    list."""
    import pandas as pd

    pts, smp = [], []
    for (pol, budget), per_task in scores.items():
        for task, vals in per_task.items():
            point = f"task={task},budget={budget},policy={pol}"
            pts.append({"point": point, "policy": pol, "budget": budget, "complete": True})
            smp += [{"point": point, "id": f"ruler-{task}-L4096-{i:04d}", "string_match_all": v}
                    for i, v in enumerate(vals)]
    pts.append({"point": "partial", "policy": "tova", "budget": 0.5, "complete": False})
    smp.append({"point": "partial", "id": "ruler-vt-L4096-0000", "string_match_all": 100.0})
    (root / folder).mkdir(parents=True)
    pd.DataFrame(pts).to_csv(root / folder / "points.csv", index=False)
    pd.DataFrame(smp).to_csv(root / folder / "samples.csv", index=False)


@pytest.mark.slow  # loads Gemma's tokenizer from the converted model
def test_gemma_exp10_points_generate_in_gemma_tokens():
    """The Gemma 3 tiers of experiment 10 compose to Gemma with its own tokenizer, and their records fill 4096
    Gemma tokens (minus the answer tokens)."""
    from experiments.exp10_ruler import queue as exp10_make
    from keyformer.run.loading import gemma3_available, load_tokenizer
    from keyformer.run.paths import compose

    tiers = exp10_make.gemma_tiers()
    lines = [ln for _, ls in tiers.values() for ln in ls]
    assert len(lines) == len({ln.split()[0] for ln in lines}) == 990  # one folder a point
    assert len([ln for _, ls in list(tiers.values())[:4] for ln in ls]) == 198  # 1-2b: 9 policies x 11 x 2
    field = {ln.split("policy=")[1].split()[0] for ln in tiers["gemma_field.txt"][1]}
    assert field == {"expected_attention", "keydiff", "kvzip", "rkv", "tova", "pyramidkv", "streaming"}
    assert len(tiers["gemma_budgets.txt"][1]) == 4 * 3 * 11 * 2  # tier 3: 4 policies x 3 ratios x 11 x 2
    assert len(tiers["gemma_field.txt"][1]) == (4 * 3 + 3 * 4) * 11 * 2  # 2025 methods' ratio 0.5: 1b/2b
    assert {ln.split("policy=")[1].split()[0] for ln in tiers["gemma_current_agnostic.txt"][1]} == {
        "expected_attention", "keydiff", "kvzip", "rkv"}
    folder, records, *overrides = tiers["gemma_core_agnostic.txt"][1][-1].split()  # query-agnostic window
    cfg = compose(overrides)
    assert cfg["model"]["source"] == "gemma3_gguf" and cfg["dataset"]["tokenizer"] == "model"
    assert cfg["dataset"]["query_agnostic"] and int(records) == cfg["n_samples"] == 5
    from omegaconf import OmegaConf

    conf = ROOT / "experiments" / "exp10_ruler" / "conf" / "experiment"
    sweep = OmegaConf.load(conf / "exp10_ruler_gemma.yaml").hydra.sweep.dir
    assert folder.startswith(f"{sweep}/agnostic/task=fwe,budget=0.5,policy=window")
    if not gemma3_available():
        pytest.skip("Gemma 3 270M not installed or converted")
    tok = load_tokenizer(cfg["model"])
    r = generate_ruler("fwe", 4096, 1, tok)[0]
    n = len(tok(prompt(r), add_special_tokens=False)["input_ids"])
    target = 4096 - tokens_to_generate("fwe")
    assert target - 40 <= n <= target and n == r["ruler_tokens"]


def test_ruler_leaderboard_by_hand(tmp_path):
    from experiments.exp10_ruler.analysis import ruler_leaderboard
    from keyformer.lab.analysis import load_experiment

    _fake_results(tmp_path / "exp10_ruler", "aware", SCORES)
    pts, smp = load_experiment(str(tmp_path / "exp10_ruler"), "aware", complete_only=True)
    t = ruler_leaderboard(pts, smp, n_boot=200).set_index(["policy", "task"])
    # hand-computed: average = mean of the task means
    assert t.loc[("keyformer", "average"), "mean"] == pytest.approx((100 / 3 + 50) / 2)
    assert t.loc[("h2o", "average"), "mean"] == pytest.approx((200 / 3 + 100 / 3) / 2)
    assert t.loc[("full", "average"), "mean"] == pytest.approx((200 / 3 + 200 / 3) / 2)
    # paired differences: h2o - keyformer per task (vt: 0,+100,0; cwe: -50,0,0), then their mean over tasks
    assert t.loc[("h2o", "vt"), "vs_keyformer"] == pytest.approx(100 / 3)
    assert t.loc[("h2o", "average"), "vs_keyformer"] == pytest.approx((100 / 3 - 50 / 3) / 2)
    assert t.loc[("keyformer", "average"), "vs_full"] == pytest.approx((-100 / 3 - 50 / 3) / 2)
    lo, hi = t.loc[("h2o", "average"), ["vs_keyformer_lo", "vs_keyformer_hi"]]
    assert lo <= t.loc[("h2o", "average"), "vs_keyformer"] <= hi
    assert ("window", "average") not in t.index and t.loc[("window", "vt"), "mean"] == 0.0
    assert t.loc[("h2o", "average"), "rank"] == 1 and t.loc[("keyformer", "average"), "rank"] == 2
    assert ("tova", "vt") not in t.index  # the partial point is left out
    assert t.loc[("h2o", "average"), "ratio"] == 0.5


def test_ruler_leaderboard_kv_held_by_hand(tmp_path, capsys):
    """``kv_held``: the mean over a policy's samples of kv_bytes / kv_bytes_full, on the averages only."""
    import pandas as pd

    from experiments.exp10_ruler.analysis import ruler_leaderboard
    from experiments.exp10_ruler.findings import ruler
    from keyformer.lab.analysis import load_experiment

    root = tmp_path / "exp10_ruler"
    _fake_results(root, "aware", SCORES)
    smp = pd.read_csv(root / "aware" / "samples.csv")
    full = {"vt": 1000.0, "cwe": 2000.0}  # bytes the full cache holds, per task
    held = {"full": 1.0, "keyformer": 0.5, "h2o": 0.25}  # one vt record of keyformer's and h2o's holds more
    task = smp["id"].str.split("-").str[1]
    pol = smp["point"].str.extract(r"policy=(\w+)")[0]
    smp["kv_bytes_full"] = task.map(full)
    smp["kv_bytes"] = smp["kv_bytes_full"] * pol.map(held).fillna(1.0)
    extra = (smp["id"] == "ruler-vt-L4096-0000") & pol.isin(["keyformer", "h2o"])
    smp.loc[extra, "kv_bytes"] = smp.loc[extra, "kv_bytes_full"]  # that record holds everything
    smp.to_csv(root / "aware" / "samples.csv", index=False)
    t = ruler_leaderboard(*load_experiment(str(root), "aware", complete_only=True), n_boot=50)
    t = t.set_index(["policy", "task"])
    assert t.loc[("full", "average"), "kv_held"] == pytest.approx(1.0)
    # the mean of the six per-sample ratios (not the ratio of summed bytes: 5000 / 9000 for keyformer)
    assert t.loc[("keyformer", "average"), "kv_held"] == pytest.approx((1 + 5 * 0.5) / 6)
    assert t.loc[("h2o", "average"), "kv_held"] == pytest.approx((1 + 5 * 0.25) / 6)
    assert t.loc[("h2o", "vt"), "kv_held"] != t.loc[("h2o", "vt"), "kv_held"]  # NaN: averages only
    ruler(tmp_path)
    rows = {ln.split(" | ")[0]: ln for ln in capsys.readouterr().out.splitlines() if "| 0.5 | 0.5 |" in ln}
    assert rows["| h2o"].endswith("| 6 | 0.375 |") and rows["| keyformer"].endswith("| 6 | 0.583 |")


def test_ruler_report_section(tmp_path, capsys):
    from experiments.exp10_ruler.findings import ruler

    ruler(tmp_path)
    assert "no complete points" in capsys.readouterr().out
    _fake_results(tmp_path / "exp10_ruler", "aware", SCORES)
    _fake_results(tmp_path / "exp10_ruler", "agnostic", SCORES)
    ruler(tmp_path)
    out = capsys.readouterr().out
    assert "**question-aware**" in out and "**query-agnostic**" in out and "| h2o | 0.5 | 0.5 | 50.0 |" in out
    assert "Question-aware vs query-agnostic" in out
    assert "| keyformer | 0.5 | 41.7 | 41.7 | +0.00 [+0.00, +0.00] | 6 |" in out
    assert "| vs Keyformer [findings] | p (Holm) | verdict |" in out  # read from findings.json


def test_ruler_report_prompt_sharing(tmp_path, capsys):
    """share_prompt points: the report compares a point's wall time with its own prompt forwards against one
    whose records all reused another budget's; partly reused points and points without the column (tiers
    1-2) are in neither group; no line without both groups."""
    import pandas as pd

    from experiments.exp10_ruler.findings import ruler
    from keyformer.lab.collect import point_rows

    preds = [{"id": f"r{i}", "prompt_tokens": 9, "generated_tokens": 2, "prediction": "x", "rouge1": 0.0,
              "rouge2": 0.0, "rougeL": 0.0, "rougeLsum": 0.0, "prompt_reused": i > 0} for i in range(3)]
    row, s = point_rows("p", {"n_samples": 3}, preds, {"complete": True})
    assert row["n_prompt_reused"] == 2 and s["prompt_reused"].tolist() == [False, True, True]
    plain = [{k: v for k, v in r.items() if k != "prompt_reused"} for r in preds]
    row, s = point_rows("q", {"n_samples": 3}, plain, {"complete": True})
    assert "n_prompt_reused" not in row and "prompt_reused" not in s
    _fake_results(tmp_path / "exp10_ruler", "aware", SCORES)
    f = tmp_path / "exp10_ruler" / "aware" / "points.csv"
    pts = pd.read_csv(f)
    ruler(tmp_path)
    assert "Prompt sharing" not in capsys.readouterr().out
    assert len(pts) == 8
    pts["n_done"] = 3
    pts["wall_s"] = [200.0, 180.0, 12.0, 14.0, 40.0, 999.0, 5.0, 1.0]
    pts["n_prompt_reused"] = [0, 0, 3, 3, 3, 1, None, 0]
    pts.to_csv(f, index=False)
    ruler(tmp_path)
    out = capsys.readouterr().out
    # points in order: full vt/cwe (own: 200, 180), keyformer vt/cwe and h2o vt (reused: 12, 14, 40), h2o cwe
    # (partly reused), window vt (no column), the partial point (not complete: left out)
    assert ("2 points ran their own prompt forwards, median 190 s a point [180-200]; "
            "3 points reused them, median 14 s a point [12-40]") in out
    assert "a group of three budgets takes 218 s instead of 570 s: 2.6x less." in out


def test_ruler_setting_gap_is_paired_by_hand(tmp_path):
    """agnostic - aware per record, mean per task, then over tasks. Keyformer: vt (0, +100, 0) -> +100/3,
    cwe (0, 0, -50) -> -50/3, average +25/3; H2O identical in both settings: exactly 0 with a zero-width
    CI; the window (one task only in both) has a gap too; a policy missing from one setting has none."""
    from experiments.exp10_ruler.analysis import ruler_setting_gap
    from keyformer.lab.analysis import load_experiment

    agn = {**SCORES, ("keyformer", 0.5): {"vt": [100, 100, 0], "cwe": [50, 50, 0]}}
    agn.pop(("full", 1.0))
    _fake_results(tmp_path / "r", "aware", SCORES)
    _fake_results(tmp_path / "r", "agnostic", agn)
    frames = [load_experiment(str(tmp_path / "r"), f, complete_only=True) for f in ("aware", "agnostic")]
    g = ruler_setting_gap(*frames, n_boot=500).set_index("policy")
    assert sorted(g.index) == ["h2o", "keyformer", "window"]  # full ran question-aware only
    assert g.loc["keyformer", "gap"] == pytest.approx(25 / 3)
    assert g.loc["keyformer", "aware"] == pytest.approx((100 / 3 + 50) / 2)
    assert g.loc["keyformer", "agnostic"] == pytest.approx((200 / 3 + 100 / 3) / 2)
    assert g.loc["keyformer", "gap_lo"] < 25 / 3 < g.loc["keyformer", "gap_hi"]
    assert g.loc["keyformer", "n"] == 6
    assert (g.loc["h2o", ["gap", "gap_lo", "gap_hi"]] == 0).all() and g.loc["h2o", "gap_p"] == 1.0
    # unpaired, the same means would differ by the same amount, but a paired CI of a constant shift is a point
    shift = {k: {t: [v + 10 for v in vs] for t, vs in d.items()} for k, d in SCORES.items()}
    _fake_results(tmp_path / "s", "aware", SCORES)
    _fake_results(tmp_path / "s", "agnostic", shift)
    frames = [load_experiment(str(tmp_path / "s"), f, complete_only=True) for f in ("aware", "agnostic")]
    g = ruler_setting_gap(*frames, n_boot=500).set_index("policy")
    assert list(g["gap"]) == pytest.approx([10.0] * 4) and list(g["gap_lo"]) == pytest.approx([10.0] * 4)
    assert (g["gap_p"] == 0.0).all()


def test_ruler_leaderboard_holm_over_policies(tmp_path):
    """vs_keyformer_p_holm: Holm over the policies' averages at one budget (by hand from vs_keyformer_p);
    Keyformer's own row and full's have none."""
    import numpy as np

    from experiments.exp10_ruler.analysis import ruler_leaderboard
    from keyformer.lab.analysis import holm, load_experiment

    scores = {**SCORES, ("window", 0.5): {"vt": [0, 0, 0], "cwe": [0, 0, 0]},
              ("snapkv", 0.5): {"vt": [100, 100, 100], "cwe": [100, 100, 100]}}
    _fake_results(tmp_path / "r", "aware", scores)
    t = ruler_leaderboard(*load_experiment(str(tmp_path / "r"), "aware", complete_only=True), n_boot=500)
    avg = t[(t["task"] == "average") & (t["budget"] == 0.5)].set_index("policy")
    others = ["h2o", "snapkv", "window"]
    np.testing.assert_allclose(avg.loc[others, "vs_keyformer_p_holm"],
                               holm(avg.loc[others, "vs_keyformer_p"].to_numpy()))
    assert np.isnan(avg.loc["keyformer", "vs_keyformer_p_holm"])
    assert avg.loc["snapkv", "vs_keyformer_p"] == 0.0 and avg.loc["snapkv", "vs_keyformer_p_holm"] == 0.0
    assert avg.loc["h2o", "vs_keyformer_p_holm"] >= avg.loc["h2o", "vs_keyformer_p"]


def test_exp10_left_queue_drops_committed_complete_points(tmp_path):
    """experiments/exp10_ruler/queue.py's left(): a line whose point is complete in
    results/<setting>/points.csv is dropped; an incomplete point, the same point in the other setting and an
    uncollected one stay."""
    from experiments.exp10_ruler import queue as mk

    lines = [mk.line(s, "vt", p, 0.5) for s in ("aware", "agnostic")
             for p in ("h2o", "keyformer", "kvzip")]
    (tmp_path / "aware").mkdir()
    (tmp_path / "aware" / "points.csv").write_text(
        "point,policy,complete\n\"task=vt,budget=0.5,policy=h2o\",h2o,True\n"
        "\"task=vt,budget=0.5,policy=keyformer\",keyformer,False\n")
    kept = [ln.split()[0].split("/", 2)[2] for ln in mk.left(lines, tmp_path)]
    assert kept == ["aware/task=vt,budget=0.5,policy=keyformer", "aware/task=vt,budget=0.5,policy=kvzip",
                    "agnostic/task=vt,budget=0.5,policy=h2o", "agnostic/task=vt,budget=0.5,policy=keyformer",
                    "agnostic/task=vt,budget=0.5,policy=kvzip"]
    tiers = mk.tiers()
    assert list(tiers) == ["exp10_core.txt", "exp10_current.txt", "exp10_core_agnostic.txt",
                           "exp10_current_agnostic.txt", "exp10_budgets.txt", "exp10_field.txt",
                           "exp10_methods.txt"]
    every = [ln.split()[0] for _, ls in tiers.values() for ln in ls]
    assert len(every) == len(set(every)) == 55 + 44 + 55 + 44 + 264 + 704 + 308  # no point in two tiers
    queues = Path(mk.__file__).parent / "queues"
    for name in ("exp10_core.txt", "exp10_core_agnostic.txt"):  # committed: what the script writes
        what, lines = tiers[name]
        head = mk.HEADER.format(what=what, records=mk.RECORDS)
        assert (queues / name).read_text() == head + "\n".join(lines) + "\n"
    composed = mk.line("agnostic", "vt", "snapkv+criticalkv+adakv", 0.5).split()
    assert composed[0].endswith("/agnostic/task=vt,budget=0.5,policy=snapkv+criticalkv+adakv")
    assert "policy=snapkv" in composed and "policy.wrap=[criticalkv,adakv]" in composed


def test_exp10_tiers_run_every_registered_policy_at_ratio_one_half() -> None:
    """Every policy of the registry has its 22 points (11 tasks, both settings) at budget 0.5 in some tier
    (full at 1.0), read from the queue lines, so a method added to the registry without a tier fails here."""
    import keyformer
    from experiments.exp10_ruler import queue as mk

    lines = [ln for _, lines in mk.tiers().values() for ln in lines]
    for name in keyformer.POLICIES:
        budget = "1.0" if name == "full" else "0.5"
        mine = {ln.split()[0] for ln in lines
                if re.search(rf"(^| )policy={re.escape(name)}( |$)", ln) and "policy.wrap=" not in ln
                and f" budget={budget}" in ln}
        assert len(mine) == 2 * len(mk.TASKS), (name, len(mine))


def test_ruler_prompt_change_pairs_the_same_records(tmp_path: Path, capsys) -> None:
    """``keyformer-report --section exp10_gemma_bos``: per policy with every task in both folders, the mean
    before and after a prompt change and the paired difference over the same record ids (a policy complete in
    one folder only is left out; a setting missing from either folder prints nothing)."""
    from experiments.exp10_ruler.findings import ruler_prompt_change

    ruler_prompt_change(tmp_path, "new", "old")
    assert "(no policy complete in both new and old yet)" in capsys.readouterr().out
    before = {("full", 1.0): {"vt": [0, 0, 100], "cwe": [50, 50, 50]},
              ("keyformer", 0.5): {"vt": [0, 0, 0], "cwe": [0, 50, 50]}}
    after = {("full", 1.0): {"vt": [100, 0, 100], "cwe": [50, 100, 50]},  # +33.3 on vt, +16.7 on cwe
             ("keyformer", 0.5): {"vt": [0, 0, 0], "cwe": [0, 50, 50]},    # unchanged
             ("h2o", 0.5): {"vt": [0, 0, 0], "cwe": [0, 0, 0]}}            # not in "old"
    _fake_results(tmp_path / "old", "aware", before)
    _fake_results(tmp_path / "new", "aware", after)
    ruler_prompt_change(tmp_path, "new", "old", change="X")
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and "policy" not in ln]
    assert "**question-aware**" in out and "query-agnostic" not in out
    assert rows[0] == "| full | 0 | 41.7 | 66.7 | " + rows[0].split(" | ")[4] + " | 6 |"
    assert rows[0].split(" | ")[4].startswith("+25.00 [")  # (33.3 + 16.7) / 2 over tasks, paired by record
    assert rows[1].startswith("| keyformer | 0.5 | 16.7 | 16.7 | +0.00 [+0.00, +0.00] | 6 |")
    assert len(rows) == 2  # h2o has no "before"


def test_exp10_kv_held_column_reads_as_its_footnote_says() -> None:
    """The leaderboard's "K/V held" column (SmolLM2, ratio 0.5, both settings): per record, the decode-time
    evictors hold the same bytes whatever their answer's length, and the policies that keep generated tokens
    (SnapKV and KVzip, prompt-only; R-KV between its cuts) hold more on every record."""
    for folder in ("aware", "agnostic"):
        s = pd.read_csv(RES / "exp10_ruler" / folder / "samples.csv")
        s = s[s["point"].str.contains("budget=0.5,")]
        s = s.assign(policy=s["point"].str.split("policy=").str[1])
        b = s.pivot_table(index="id", columns="policy", values="kv_bytes")
        g = s.pivot_table(index="id", columns="policy", values="generated_tokens")
        evictors = ["keyformer", "h2o", "window", "expected_attention", "keydiff"]
        assert all((b[p] == b["keyformer"]).all() for p in evictors)
        assert (g["window"] != g["keyformer"]).any()  # whatever their answer's length
        assert all((b[p] > b["keyformer"]).all() for p in ("snapkv", "kvzip", "rkv"))


def test_exp10_equal_bytes_csv_is_current_and_its_same_budget_rows_are_the_table(tmp_path: Path) -> None:
    """``results/exp10_ruler/equal_bytes.csv`` is what ``ruler_equal_bytes.py`` writes from the committed rows
    now; its rows are the (setting, policy, ratio) whose K/V held exceeds Keyformer's, and its same-budget
    differences are the leaderboard's ``vs_keyformer`` (the pairing is the leaderboard's)."""
    from experiments.exp10_ruler import ruler_equal_bytes

    out = tmp_path / "eb.csv"
    ruler_equal_bytes.main([str(out)])
    committed = RES / "exp10_ruler" / "equal_bytes.csv"
    assert out.read_text().splitlines()[1:] == committed.read_text().splitlines()[1:]
    eb = pd.read_csv(committed, comment="#")
    for setting in ("aware", "agnostic"):
        t = exp10.ruler_leaderboard(*analysis.load_experiment(str(RES / "exp10_ruler"), setting,
                                                                 complete_only=True))
        avg = t[(t["task"] == "average") & (t["policy"] != "full")].set_index(["policy", "ratio"])
        kf = avg.xs("keyformer", level="policy")["kv_held"]
        more = {(pol, r) for (pol, r), v in avg["kv_held"].items()
                if pol != "keyformer" and v > kf[r] + 0.005}
        rows = eb[eb["setting"] == setting].set_index(["policy", "ratio"])
        assert set(rows.index) == more
        for key, r in rows.iterrows():
            assert (r["same_diff"], r["same_lo"], r["same_hi"]) == pytest.approx(
                tuple(avg.loc[key, ["vs_keyformer", "vs_keyformer_lo", "vs_keyformer_hi"]]), abs=1e-6), key


@pytest.mark.parametrize("model", ["tiny", "tiny_gemma3"])
def test_kvzip_cost_script_quick(tmp_path, model):
    """kvzip_cost.py (experiment 10) on the tiny models: the four configs, both KVzip paths keep the same
    sets, the table and the JSON are written, and the JSON names the code it measured."""
    from experiments.exp10_ruler import kvzip_cost

    r = kvzip_cost.main(["--model", model, "--n", "48", "--rounds", "1", "--out", str(tmp_path)])
    assert [row["config"] for row in r["rows"]] == ["full", "snapkv", "kvzip", "kvzip_again"]
    assert r["same_kept_sets"] == [True] and r["rows"][0]["ratio_median"] == 1.0
    assert json.loads((tmp_path / "cost.json").read_text())["code"] == r["code"]
    assert "kvzip_again / kvzip" in (tmp_path / "cost.txt").read_text()
