"""``keyformer-bench --floors``: the arithmetic of each floor by hand, and a quick end-to-end run."""

from __future__ import annotations

import json
import sys

import pytest

from keyformer.lab.bench import floors


def _runs(ms: dict[str, float]) -> dict[str, dict]:
    return {k: {"stats": {"median": v}, "x_full": {"median": v / ms["full"]}} for k, v in ms.items()}


def test_decode_floors_by_hand():
    ms = {"full": 100.0, "window": 82.0, "h2o": 85.0, "keyformer-nonoise": 87.0, "keyformer": 90.0,
          "floor": 60.0}
    w, per, L, B, n, gbs = 1000, 10, 200, 2, 9, 1e-6  # bytes; read bandwidth 1e-6 GB/s = 1 byte per ms
    f = floors.decode_floors(_runs(ms), 0.5, w, per, L, B, n, gbs, 1.05, 0.9)
    assert f["kv_ms"] == 40.0 and f["ideal_ms"] == 80.0  # 60 + 0.5 * 40
    assert f["bound_speedup"] == pytest.approx(1.25)
    full_bytes = 1000 + 2 * 10 * (200 + 1 + 4)  # weights + B * per_token * (L + 1 + (n - 1) / 2)
    pol_bytes = 1000 + 2 * 10 * (100 + 1)
    assert f["bytes_speedup"] == pytest.approx(full_bytes / pol_bytes)
    assert f["bytes_model_ms"]["full"] == pytest.approx(full_bytes)
    assert f["max_share_of_bytes"] == pytest.approx(1.25 * pol_bytes / full_bytes)
    assert f["target3_reachable"] is (1.25 * pol_bytes / full_bytes >= 0.9)
    assert f["window_vs_ideal"] == pytest.approx(82 / 80)
    assert f["speedup"]["keyformer"] == pytest.approx(100 / 90)
    kf = f["overhead"]["keyformer"]
    assert (kf["scores_ms"], kf["gumbel_ms"], kf["noise_ms"]) == (3.0, 2.0, 3.0)
    assert kf["x_window"] == pytest.approx(90 / 82) and kf["x_window_without_noise"] == pytest.approx(87 / 82)


def test_prefill_floors_by_hand():
    s = {"full": 10.0, "h2o": 12.0, "keyformer-nonoise": 13.0, "keyformer": 20.0}
    f = floors.prefill_floors(_runs(s), {"h2o": 1.25, "keyformer": 1.5})
    assert f["components_x_full"] == pytest.approx({"scores": 0.2, "gumbel": 0.1, "noise": 0.7})
    assert f["h2o"]["met"] and not f["keyformer"]["met"] and f["keyformer"]["met_without_noise"]
    assert f["noise_field_x_full"] is None  # a run from before the fused score: no keyformer-field label
    f = floors.prefill_floors(_runs({**s, "keyformer-field": 24.0}), {"h2o": 1.25, "keyformer": 1.5})
    assert f["noise_field_x_full"] == pytest.approx(0.4)
    assert f["components_x_full"]["noise"] == pytest.approx(0.7)


def test_e2e_floors_by_hand():
    bench = {"environment": {"git_commit": "abc"},
             "throughput": {"prompt_len": 64, "new_tokens": 100, "e2e_gain": 1.1, "gain": 2.0,
                            "full": {"label": "full", "batch": 4, "prefill_s": 20.0, "decode_tok_s": 20.0},
                            "policy": {"label": "keyformer@0.5", "batch": 8, "prefill_s": 80.0,
                                       "decode_tok_s": 40.0}}}
    e = floors.e2e_floors(bench)
    assert e["full"]["decode_s"] == 20.0 and e["policy_parts"]["decode_s"] == 20.0
    assert e["policy_prefill_x_full_per_sample"] == 2.0  # 80 s for 8 vs 20 s for 4
    # full: 400 tokens in 40 s; policy with full's per-sample prefill: 800 tokens in 40 + 20 s
    assert e["e2e_gain_if_prefill_at_full_rate"] == pytest.approx((800 / 60) / (400 / 40))
    assert floors.e2e_floors({"environment": {}}) is None


def test_quick_run_via_keyformer_bench(tmp_path, monkeypatch):
    from keyformer.lab.bench.long import bench_main

    monkeypatch.setenv("KEYFORMER_COMPILE", "0")  # eager noise: no compile in the default suite
    out = tmp_path / "bench" / "floors"
    monkeypatch.setattr(sys, "argv", ["keyformer-bench", "--floors", "--quick", "--profile-steps", "0",
                                      "--out", str(out)])
    bench_main()
    r = json.loads((out / "floors.json").read_text())
    assert set(r["prefill"]["runs"]) == set(floors.PREFILL)
    assert set(r["decode"][0]["runs"]) == set(floors.DECODE) and "e2e" not in r
    assert "Decode L48xB1" in (out / "floors.txt").read_text()
    prof = r["prefill"]["profile"]  # one profiled prompt forward per prefill config, op by op
    assert set(prof) == set(floors.PREFILL) and prof["h2o"]["ops"]["aten::_softmax"]["calls"] > 0
    assert "aten::_softmax" not in prof["full"]["ops"]  # full's prompt runs SDPA: no softmax of its own
    assert "Prefill profile, 48 tokens" in (out / "floors.txt").read_text()
    from keyformer.lab import report

    table = report.render("bench_floors", tmp_path)  # the table docs/performance-analysis.md quotes
    pf = r["prefill"]["floors"]
    assert f"| 2: prefill at 48 tokens vs full | H2O {pf['h2o']['x_full']:.2f}x" in table
    assert "| 1: decode L48xB1 vs window |" in table and "| 3: decode L48xB1, share" in table


def test_bad_options_name_the_value():
    with pytest.raises(SystemExit, match="--rounds=0"):
        floors.main(["--rounds", "0"])
    with pytest.raises(SystemExit, match="--decode-rounds=0"):
        floors.main(["--decode-rounds", "0"])
    with pytest.raises(SystemExit, match="--budget=1.5"):
        floors.main(["--budget", "1.5"])


def test_docs_state_the_default_rounds():
    """docs/performance.md's round counts are the parser's defaults."""
    from pathlib import Path

    a = floors.parser().parse_args([])
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text().split())
    assert f"{a.rounds} prefill rounds, {a.decode_rounds} decode rounds" in doc
